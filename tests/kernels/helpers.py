"""Shared test helpers for the kernel tests: random quantized operands and the error metric.

``pack_int4`` is written here independently of ``compress`` (``kernels`` must not depend on it): it
packs q (K, N) in [-8, 7] as ``qweight[k // 8, n] |= (q[k, n] & 0xF) << (4 * (k % 8))``.
"""
from __future__ import annotations

import torch


def rel_error(y: torch.Tensor, ref: torch.Tensor) -> float:
    """||y - ref|| / ||ref|| in float64 (0 when both are zero); NaN in y gives NaN, which fails any bound."""
    diff = (y.double() - ref.double()).norm()
    denom = ref.double().norm()
    return float(diff / denom) if denom > 0 else float(diff)


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """q (K, N) integers in [-8, 7] -> qweight (K/8, N) int32."""
    k, n = q.shape
    q32 = q.to(torch.int32).reshape(k // 8, 8, n)
    packed = torch.zeros((k // 8, n), dtype=torch.int32, device=q.device)
    for j in range(8):
        packed |= (q32[:, j, :] & 0xF) << (4 * j)
    return packed


def random_int4_weight(k: int, n: int, group_size: int, scale_dtype=torch.float32, device="cpu"):
    """Random (qweight (K/8, N) int32, q (K, N) int8, scales (K/G, N)) with positive scales."""
    q = torch.randint(-8, 8, (k, n), dtype=torch.int8, device=device)
    scales = (torch.rand(k // group_size, n, device=device) * 0.02 + 0.001).to(scale_dtype)
    return pack_int4(q), q, scales


def random_int8_weight(n: int, k: int, device="cpu"):
    """Random (w_q (N, K) int8, w_scale (N,) fp32)."""
    w_q = torch.randint(-127, 128, (n, k), dtype=torch.int8, device=device)
    w_scale = torch.rand(n, device=device) * 0.01 + 0.001
    return w_q, w_scale
