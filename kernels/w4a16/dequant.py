"""W4A16 from 128 rows on: dequantize the packed weight once, then cuBLAS runs the fp16 / bf16 GEMM.

At large M a matmul is compute bound and cuBLAS's fp16 GEMM is faster than any of our tiles that
unpack int4 in their main loop; writing the weight out once costs N K element writes. The pass::

    W^T[k, n] = q[k, n] * scales[k // G, n]      in x's dtype, (K, N) contiguous (fp32 product, one rounding)

one program per (BLOCK_K, BLOCK_N) tile with BLOCK_K inside one scale group
(:func:`compress_kernels.common.int4.unpack_int4_tile`), then ``y = x @ W^T (+ bias)`` by
``torch.matmul`` / ``torch.addmm`` into the output.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from compress_kernels.common.int4 import unpack_int4_tile
from compress_kernels.common.launch import launch


@triton.jit
def _dequantize_kernel(
    qw_ptr, s_ptr, w_ptr,  # qweight (K/8, N), scales (K/G, N), W^T out (K, N) contiguous in x's dtype
    N, K, group_size, stride_qk, stride_qn, stride_sg, stride_sn,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """W^T[k, n] = q[k, n] * scales[k // G, n] in x's dtype for one tile (BLOCK_K divides G)."""
    k0 = tl.program_id(0) * BLOCK_K
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_kp = k0 // 8 + tl.arange(0, BLOCK_K // 8)
    n_ok = offs_n < N
    packed = tl.load(qw_ptr + offs_kp[:, None] * stride_qk + offs_n[None, :] * stride_qn,
                     mask=(offs_kp[:, None] < K // 8) & n_ok[None, :], other=0)
    scale = tl.load(s_ptr + (k0 // group_size) * stride_sg + offs_n * stride_sn, mask=n_ok, other=0.0)
    q = unpack_int4_tile(packed, BLOCK_K, BLOCK_N, tl.float32)
    w = q * scale.to(tl.float32)[None, :]
    offs_k = k0 + tl.arange(0, BLOCK_K)
    out = w_ptr + offs_k[:, None].to(tl.int64) * N + offs_n[None, :]
    tl.store(out, w.to(w_ptr.dtype.element_ty), mask=(offs_k[:, None] < K) & n_ok[None, :])


def dequantize(qweight, scales, group_size: int, dtype: torch.dtype) -> torch.Tensor:
    """Triton dequantization: (K/8, N) packed + (K/G, N) scales -> W^T (K, N) in ``dtype``."""
    k, n = qweight.shape[0] * 8, qweight.shape[1]
    w_t = torch.empty((k, n), dtype=dtype, device=qweight.device)
    block_k = min(64, group_size) if group_size != k else 64
    block_n = 128
    grid = (triton.cdiv(k, block_k), triton.cdiv(n, block_n))
    launch(_dequantize_kernel, grid,
        qweight, scales, w_t, n, k, group_size,
        qweight.stride(0), qweight.stride(1), scales.stride(0), scales.stride(1),
        BLOCK_N=block_n, BLOCK_K=block_k, num_warps=4,
    )
    return w_t


def launch_dequant(x2, qweight, scales, group_size, bias, y) -> None:
    """``y`` (M, N) <- x2 (M, K) @ W^T (+ bias), W^T dequantized by :func:`dequantize` in x2's dtype."""
    w_t = dequantize(qweight, scales, group_size, x2.dtype)  # (K, N)
    if bias is None:
        torch.matmul(x2, w_t, out=y)
    else:
        torch.addmm(bias.to(x2.dtype), x2, w_t, out=y)
