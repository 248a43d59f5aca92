"""Symmetric quantization math: pure functions next to their inverses, and fake quantization.

Contract (docs/architecture.md, kernels/reference.py): ``q = clamp(round(v / s), qmin, qmax)`` with
``s = absmax / qmax`` in float32, rounding half to even (``torch.round``); a zero scale (all-zero
row or group) is replaced by 1 so its values quantize to 0, never NaN/Inf.

Granularities (W is (N, K) as in ``nn.Linear``):

* per token (rows of activations X (M, K)) -> scales (M,)
* per channel (rows of W) -> scales (N,), int8 (W8A8, W8A16)
* group-wise (G consecutive input channels of one output channel) -> scales (N, K/G), int4 (W4A16)
  or, with ``qmax=INT8_QMAX``, int8 (W8A16 with groups of 128)

int4 packing (the kernels' layout): ``q`` (K, N) int8 in [-8, 7] -> ``qweight`` (K/8, N) int32 with
``qweight[k // 8, n] |= (q[k, n] & 0xF) << (4 * (k % 8))``; :func:`unpack_int4` sign-extends. Stored
32x32 blocks of a block-sparse int4 weight pack each block row the same way (:func:`pack_int4_blocks`:
(nnz, 32, 32) -> (nnz, 32, 4) int32, word ``r`` of row ``i`` holding its channels ``8r .. 8r + 7``).

Fake quantization returns ``dequantize(quantize(v))`` in float32 with a straight-through estimator:
the gradient passes through ``round`` unchanged and is zero where ``clamp`` cut the value. With a
learnable scale the scale receives the LSQ gradient (Esser et al. 2020):
``d out / d s = round(v/s) - v/s`` inside the range and ``qmin`` / ``qmax`` outside, multiplied
by ``1 / sqrt(numel_per_scale * qmax)``.
"""
from __future__ import annotations

import math

import torch

from compress._kernels import reference

INT8_QMIN, INT8_QMAX = -128, 127
INT4_QMIN, INT4_QMAX = -8, 7


def safe_scale(absmax: torch.Tensor, qmax: int) -> torch.Tensor:
    """``absmax / qmax`` in float32 with zeros replaced by 1 (the kernels' reference rule)."""
    return reference.safe_scale(absmax, qmax)


def quantize(v: torch.Tensor, scale: torch.Tensor, qmin: int, qmax: int) -> torch.Tensor:
    """``clamp(round(v / scale), qmin, qmax)`` in float32 (``scale`` broadcasts against ``v``)."""
    return torch.clamp(torch.round(v.float() / scale), qmin, qmax)


def dequantize(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``q * scale`` in float32: the inverse of :func:`quantize` up to rounding."""
    return q.float() * scale


# ---- per token (activations) -------------------------------------------------------------------
def quantize_per_token(x: torch.Tensor, static_scale: torch.Tensor | None = None):
    """(M, K) -> (xq int8 (M, K), s_x float32 (M,)); ``static_scale`` (scalar) replaces the dynamic one."""
    return reference.quantize_per_token(x, static_scale)


def dequantize_per_token(xq: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """(M, K) int8 and (M,) scales -> (M, K) float32."""
    return dequantize(xq, scale[:, None])


# ---- per channel (weights) -----------------------------------------------------------------------
def per_channel_scale(w: torch.Tensor, qmax: int = INT8_QMAX) -> torch.Tensor:
    """(N, K) -> (N,) float32 scales ``max|W[n,:]| / qmax``."""
    return safe_scale(w.detach().abs().amax(dim=1), qmax)


def quantize_per_channel(w: torch.Tensor, scale: torch.Tensor | None = None):
    """(N, K) -> (w_q int8 (N, K), scale float32 (N,)); ``scale`` given (e.g. learned) or absmax."""
    scale = per_channel_scale(w) if scale is None else scale.detach().float()
    w_q = quantize(w.detach(), scale[:, None], INT8_QMIN, INT8_QMAX).to(torch.int8)
    return w_q, scale


def dequantize_per_channel(w_q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """(N, K) int8 and (N,) -> (N, K) float32."""
    return dequantize(w_q, scale[:, None])


# ---- group-wise (int4 weights) --------------------------------------------------------------------
def _check_groups(k: int, group_size: int) -> None:
    if group_size <= 0 or k % group_size:
        raise ValueError(f"group_size: expected a positive divisor of K={k}, got {group_size}")


def group_scale(w: torch.Tensor, group_size: int, qmax: int = INT4_QMAX) -> torch.Tensor:
    """(N, K) -> (N, K/G) float32 scales ``max|W[n, gG:(g+1)G]| / qmax``."""
    n, k = w.shape
    _check_groups(k, group_size)
    return safe_scale(w.detach().reshape(n, k // group_size, group_size).abs().amax(dim=2), qmax)


def quantize_groupwise(w: torch.Tensor, group_size: int, scale: torch.Tensor | None = None,
                       qmax: int = INT4_QMAX):
    """(N, K) -> (q int8 (N, K) in [-qmax - 1, qmax] (int4's [-8, 7] by default), scale float32 (N, K/G))."""
    scale = group_scale(w, group_size, qmax) if scale is None else scale.detach().float()
    expanded = scale.repeat_interleave(group_size, dim=1)  # (N, K)
    q = quantize(w.detach(), expanded, -qmax - 1, qmax).to(torch.int8)
    return q, scale


def dequantize_groupwise(q: torch.Tensor, scale: torch.Tensor, group_size: int) -> torch.Tensor:
    """(N, K) int8 and (N, K/G) -> (N, K) float32."""
    return dequantize(q, scale.float().repeat_interleave(group_size, dim=1))


# ---- int4 packing ---------------------------------------------------------------------------------
def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """(K, N) integers in [-8, 7] -> (K/8, N) int32, nibble ``k % 8`` of row ``k // 8`` holds ``q[k]``."""
    if q.dim() != 2 or q.shape[0] % 8:
        raise ValueError(f"pack_int4: expected (K, N) with K a multiple of 8, got shape {tuple(q.shape)}")
    if q.numel() and (q.min() < INT4_QMIN or q.max() > INT4_QMAX):
        raise ValueError(f"pack_int4: expected values in [-8, 7], got [{int(q.min())}, {int(q.max())}]")
    k, n = q.shape
    nibbles = (q.to(torch.int32) & 0xF).reshape(k // 8, 8, n)  # (K/8, 8, N)
    shifts = torch.arange(0, 32, 4, dtype=torch.int32, device=q.device)[None, :, None]
    # The nibbles occupy disjoint bits, so the sum equals the bitwise OR; int32 wraps on the top nibble.
    return (nibbles << shifts).sum(dim=1, dtype=torch.int32)


def unpack_int4(qweight: torch.Tensor) -> torch.Tensor:
    """(K/8, N) int32 -> (K, N) int8 in [-8, 7] (sign-extended): the inverse of :func:`pack_int4`."""
    return reference.unpack_int4(qweight)


def pack_int4_blocks(q: torch.Tensor) -> torch.Tensor:
    """(nnz, b, b) integers in [-8, 7] (stored blocks, rows = outputs) -> (nnz, b, b/8) int32: each block
    row packed along K as :func:`pack_int4` packs a column of ``qweight`` (nibble ``j`` of word ``r``: channel
    ``8r + j``)."""
    if q.dim() != 3 or q.shape[-1] % 8:
        raise ValueError(f"pack_int4_blocks: expected (nnz, b, b) with b a multiple of 8, got shape {tuple(q.shape)}")
    rows = q.reshape(-1, q.shape[-1])  # (nnz * b, b): one block row each
    return pack_int4(rows.T).T.reshape(*q.shape[:-1], q.shape[-1] // 8).contiguous()


def unpack_int4_blocks(values: torch.Tensor) -> torch.Tensor:
    """(nnz, b, b/8) int32 -> (nnz, b, b) int8 in [-8, 7]: the inverse of :func:`pack_int4_blocks`."""
    return reference.unpack_int4_blocks(values)


# ---- fake quantization (training) ------------------------------------------------------------------
def round_ste(v: torch.Tensor) -> torch.Tensor:
    """``round(v)`` in the forward, identity in the backward."""
    return v + (torch.round(v) - v).detach()


def scale_gradient(scale: torch.Tensor, factor: float) -> torch.Tensor:
    """``scale`` in the forward (bit-exact); its gradient multiplied by ``factor`` in the backward."""
    scaled = scale * factor
    return scale.detach() + (scaled - scaled.detach())


def fake_quantize(v: torch.Tensor, scale: torch.Tensor, qmin: int, qmax: int) -> torch.Tensor:
    """``clamp(round(v / s), qmin, qmax) * s`` in float32 with STE (and LSQ gradient for ``s``)."""
    scaled = v.float() / scale
    return torch.clamp(round_ste(scaled), qmin, qmax) * scale


def lsq_gradient_factor(numel_per_scale: int, qmax: int) -> float:
    """LSQ's gradient scale ``1 / sqrt(numel * qmax)`` for a scale shared by ``numel`` values."""
    return 1.0 / math.sqrt(max(numel_per_scale, 1) * qmax)


def fake_quantize_per_token(x: torch.Tensor, static_scale: torch.Tensor | None = None) -> torch.Tensor:
    """Per-row int8 fake quantization of x (..., K) in float32; the scale itself gets no gradient."""
    x32 = x.float()
    if static_scale is None:
        scale = safe_scale(x32.detach().abs().amax(dim=-1, keepdim=True), INT8_QMAX)
    else:
        s = static_scale.detach().float()
        scale = torch.where(s == 0, torch.ones_like(s), s)
    return fake_quantize(x32, scale, INT8_QMIN, INT8_QMAX)


def fake_quantize_per_channel(w: torch.Tensor, scale: torch.Tensor | None = None) -> torch.Tensor:
    """Per-output-channel int8 fake quantization of W (N, K); ``scale`` (N,) learnable or absmax."""
    if scale is None:
        scale = per_channel_scale(w)
    else:
        scale = scale_gradient(scale, lsq_gradient_factor(w.shape[1], INT8_QMAX))
    return fake_quantize(w, scale[:, None], INT8_QMIN, INT8_QMAX)


def fake_quantize_groupwise(w: torch.Tensor, group_size: int, scale: torch.Tensor | None = None,
                            qmax: int = INT4_QMAX) -> torch.Tensor:
    """Group-wise fake quantization of W (N, K) to [-qmax - 1, qmax] (int4 by default); ``scale`` (N, K/G)
    learnable or absmax."""
    n, k = w.shape
    if scale is None:
        scale = group_scale(w, group_size, qmax)
    else:
        scale = scale_gradient(scale, lsq_gradient_factor(group_size, qmax))
    grouped = w.reshape(n, k // group_size, group_size)
    return fake_quantize(grouped, scale[:, :, None], -qmax - 1, qmax).reshape(n, k)
