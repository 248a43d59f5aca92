"""W4A16 small-M kernel with swapped operands: the unpacked weight tile is the *left* operand of the dot.

Same operands and contract as :mod:`kernels.w4a16` (``qweight`` (K/8, N) int32, nibble ``j`` of word
``qweight[r, n]`` is ``q[8r + j, n]`` in two's complement; ``scales`` (K/G, N); fp32 accumulation).
It computes the transposed product, output channels along the tile's rows::

    y^T[n, m] = sum_g scales[g, n] * sum_{k in group g} q[k, n] * x[m, k]      (+ bias[n])

Why: at small M a tile of x is at most a few rows, while the weight tile is 64-128 channels wide. In
``y = x @ W^T`` the tensor-core instruction's M side (64 rows per warp group on Hopper) would be
padded x rows and the weight, unpacked in registers, would have to travel through shared memory to
become the right operand. With the roles swapped the weight fills the instruction's M side and, as
the left operand, may be consumed straight from registers (wgmma and mma both take A from
registers), while x^T (the (BLOCK_M, BLOCK_K) x tile, transposed) is the small right operand, BLOCK_M >= 16 (Triton's
smallest dot width); token rows past M are wrapped copies of real rows whose results are not stored.

Tile of packed words: (BLOCK_N, BLOCK_K/8), element [n, r] = ``qweight[k0/8 + r, n]`` (contiguous
along n in memory). Unpacking broadcasts it to (BLOCK_N, BLOCK_K/8, 8), moves nibble j to the top with
``<< (28 - 4j)`` and sign-extends with ``>> 28``; the reshape to (BLOCK_N, BLOCK_K) puts channel
8r + j at column 8r + j. The integers -8..7 are exact in fp16/bf16, so the dot of one K tile is exact
up to fp32 accumulation and its (BLOCK_N, BLOCK_M) result is multiplied by the tile's scale column
(a tile never crosses a scale group). Split-K partials and the bias go through :mod:`kernels._splitk`.

Under ``TRITON_INTERPRET=1`` with bf16 the operands are fp32 copies (``FP32_OPERANDS``, exact for these
values), as in :mod:`kernels.w4a16`.
"""
from __future__ import annotations

import triton
import triton.language as tl

from kernels._tiles import split_k_range, weight_columns


@triton.jit
def _w4a16_swap_kernel(
    x_ptr, qw_ptr, s_ptr, bias_ptr, out_ptr,  # x (M, K), qweight (K/8, N), scales (K/G, N), bias (N,), out
    M, N, K, group_size,
    stride_xm, stride_xk, stride_qk, stride_qn, stride_sg, stride_sn, stride_os, stride_om,
    SPLIT_K, ADD_BIAS: tl.constexpr, EVEN_K: tl.constexpr, EVEN_N: tl.constexpr, FP32_OPERANDS: tl.constexpr,
    EXPANDED_LOAD: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m = tl.program_id(2)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = weight_columns(offs_n, N, BLOCK_N, EVEN_N)  # contiguous (16-byte loads) or wrapped
    m_ok = offs_m < M
    rows = (offs_m % M).to(tl.int64)  # wrapped: the x loads need no mask (so they pipeline), stores are masked
    offs_k = tl.arange(0, BLOCK_K)
    offs_r = tl.arange(0, BLOCK_K // 8)
    j = tl.arange(0, 8)

    k_first, k_last = split_k_range(pid_k, K, SPLIT_K, BLOCK_K)
    if EXPANDED_LOAD:  # (BN, BK): column k reads packed row k // 8 (8 columns share a word, served by L1)
        q_ptrs = qw_ptr + cols[:, None] * stride_qn + ((k_first + offs_k) // 8)[None, :] * stride_qk
    else:  # (BN, BK/8): each packed word read once
        q_ptrs = qw_ptr + cols[:, None] * stride_qn + (k_first // 8 + offs_r)[None, :] * stride_qk
    x_ptrs = x_ptr + rows[:, None] * stride_xm + (k_first + offs_k)[None, :] * stride_xk  # (BM, BK), K contiguous
    s_ptrs = s_ptr + cols * stride_sn

    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for k0 in range(k_first, k_last, BLOCK_K):
        if EVEN_K:
            packed = tl.load(q_ptrs)
            xt = tl.load(x_ptrs)
        else:
            xt = tl.load(x_ptrs, mask=(k0 + offs_k)[None, :] < k_last, other=0.0)
            if EXPANDED_LOAD:
                packed = tl.load(q_ptrs, mask=(k0 + offs_k)[None, :] < k_last, other=0)
            else:
                packed = tl.load(q_ptrs, mask=(k0 // 8 + offs_r)[None, :] < k_last // 8, other=0)
        scale = tl.load(s_ptrs + (k0 // group_size) * stride_sg).to(tl.float32)  # (BN,)
        if EXPANDED_LOAD:  # elementwise from load to dot: no reshape between them
            q = (packed << (28 - (offs_k % 8) * 4)[None, :]) >> 28
        else:
            q = tl.reshape((packed[:, :, None] << (28 - 4 * j)[None, None, :]) >> 28, (BLOCK_N, BLOCK_K))
        if FP32_OPERANDS:
            part = tl.dot(q.to(tl.float32), tl.trans(xt.to(tl.float32)), input_precision="ieee", out_dtype=tl.float32)
        else:
            part = tl.dot(q.to(xt.dtype), tl.trans(xt), out_dtype=tl.float32)
        acc += part * scale[:, None]
        q_ptrs += (BLOCK_K // 8) * stride_qk
        x_ptrs += BLOCK_K * stride_xk

    if ADD_BIAS:  # with split-K the bias is added by the reduce pass
        acc += tl.load(bias_ptr + cols).to(tl.float32)[:, None]
    out_ptrs = out_ptr + pid_k * stride_os + offs_m[None, :].to(tl.int64) * stride_om + offs_n[:, None]
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=m_ok[None, :] & (offs_n[:, None] < N))


def launch_swap(x2, qweight, scales, group_size, bias, out, cfg, fp32_operands: bool) -> None:
    """Launch on validated 2-D ``x2`` (M, K); ``out`` is (M, N) or the (SPLIT_K, M, N) fp32 workspace."""
    m, k = x2.shape
    n = qweight.shape[1]
    grid = (triton.cdiv(n, cfg.block_n), cfg.split_k, triton.cdiv(m, cfg.block_m))
    _w4a16_swap_kernel[grid](
        x2, qweight, scales, bias if bias is not None else scales, out,
        m, n, k, group_size,
        x2.stride(0), x2.stride(1), qweight.stride(0), qweight.stride(1), scales.stride(0), scales.stride(1),
        m * n if cfg.split_k > 1 else 0, out.stride(-2),
        cfg.split_k, ADD_BIAS=bias is not None and cfg.split_k == 1,
        EVEN_K=k % (cfg.block_k * cfg.split_k) == 0, EVEN_N=n % cfg.block_n == 0, FP32_OPERANDS=fp32_operands,
        EXPANDED_LOAD=cfg.expanded_load,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
