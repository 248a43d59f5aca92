"""W8A16 at large M: dequantize the int8 weight once, then cuBLAS runs the fp16 / bf16 GEMM.

At large M a matmul is compute bound, and cuBLAS's fp16 GEMM is faster than our tiles that convert
int8 in their main loop. Writing the weight out once costs N K reads of one byte and writes of two, a
share of about ``3 FLOPS / (2 M bandwidth)`` of the GEMM's time (~13% at M = 2048 on an H100). The pass::

    W[n, k] = fp32(w_q[n, k]) * s_w[n]             per channel
    W[n, k] = fp32(w_q[n, k]) * s_w[n, k // 128]   groups of 128
    in x's dtype, (N, K) contiguous: the fp32 product rounded once

one program per (BLOCK_N, BLOCK_K) tile, BLOCK_K dividing the group, then ``y = x @ W.T (+ bias)`` by
``torch.matmul`` / ``torch.addmm`` into the output (the ``nn.Linear`` product cuBLAS runs).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from compress_kernels.common.launch import launch

BLOCK_N = 32  # output channels per program (a config's block_n, when not 0)
BLOCK_K = 128  # input channels per program: one scale group, 4 KiB of int8 per program (or block_k)


@triton.jit
def _dequantize_kernel(
    w_ptr, s_ptr, out_ptr,  # w_q (N, K) int8, scales (N,) or (N, K/G), W out (N, K) contiguous in x's dtype
    N, K, stride_wn, stride_sn, stride_sg,
    GROUPED: tl.constexpr, GROUP_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """W[n, k] = w_q[n, k] * scale in the output's dtype for one (BLOCK_N, BLOCK_K) tile."""
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    k0 = tl.program_id(1) * BLOCK_K
    offs_k = k0 + tl.arange(0, BLOCK_K)
    inside = (offs_n < N)[:, None] & (offs_k < K)[None, :]
    rows = offs_n.to(tl.int64)[:, None]
    q = tl.load(w_ptr + rows * stride_wn + offs_k[None, :], mask=inside, other=0)
    s_ptrs = s_ptr + offs_n * stride_sn
    if GROUPED:
        s_ptrs += (k0 // GROUP_SIZE) * stride_sg
    scale = tl.load(s_ptrs, mask=offs_n < N, other=0.0).to(tl.float32)
    w = q.to(tl.float32) * scale[:, None]
    tl.store(out_ptr + rows * K + offs_k[None, :], w.to(out_ptr.dtype.element_ty), mask=inside)


def dequantize(w_q, w_scale, group_size: int, dtype: torch.dtype, block_n: int = BLOCK_N, block_k: int = BLOCK_K,
               num_warps: int = 4) -> torch.Tensor:
    """Triton dequantization: (N, K) int8 + (N,) or (N, K/G) scales -> W (N, K) in ``dtype``
    (with 2-D scales ``block_k`` divides ``group_size``; validated by the caller)."""
    n, k = w_q.shape
    w = torch.empty((n, k), dtype=dtype, device=w_q.device)
    grouped = w_scale.dim() == 2
    grid = (triton.cdiv(n, block_n), triton.cdiv(k, block_k))
    launch(_dequantize_kernel, grid,
        w_q, w_scale, w, n, k, w_q.stride(0), w_scale.stride(0), w_scale.stride(1) if grouped else 0,
        GROUPED=grouped, GROUP_SIZE=group_size, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=num_warps,
    )
    return w


def launch_dequant(x2, w_q, w_scale, bias, y, cfg, group_size: int) -> None:
    """``y`` (M, N) <- x2 (M, K) @ W.T (+ bias), W dequantized by :func:`dequantize` in x2's dtype with
    ``cfg``'s tile (``block_n``, ``block_k``: 0 for the defaults) and ``num_warps``."""
    w = dequantize(w_q, w_scale, group_size, x2.dtype, cfg.block_n or BLOCK_N, cfg.block_k or BLOCK_K, cfg.num_warps)
    if bias is None:
        torch.matmul(x2, w.T, out=y)
    else:
        torch.addmm(bias.to(x2.dtype), x2, w.T, out=y)
