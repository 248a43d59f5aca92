"""W8A8 int8 tensor-core GEMM on per-token quantized activations, pointer-loaded tiles, split-K.

With ``xq`` (M, K) int8 and ``s_x`` (M,) fp32 from the quantize pass
(:func:`compress_kernels.common.quantize.quantize_rows`), ``w_q`` (N, K) int8 (K contiguous) and
``w_scale`` (N,) fp32::

    acc[m, n]  = sum_k xq[m, k] * w_q[n, k]                      exact, int32 (tl.dot, out_dtype=int32)
    y[m, n]    = acc[m, n] * s_x[m] * w_scale[n] (+ bias[n])     in fp32, stored in y's dtype

Program (tile, split) owns a BLOCK_M x BLOCK_N output tile (grouped tile order: GROUP_M row tiles share
each weight column tile while it sits in L2) and one split-K slice of K. Rows and columns past M and N
are wrapped for the loads (no mask) and masked at the store. With SPLIT_K > 1 each split writes its
dequantized fp32 partial; the partials are summed in split order by the last split of each 16-row
tile to finish, in the kernel, else by a second launch (:mod:`compress_kernels.common.splitk`). The
kernel is the consumer of a PDL pair with the quantize pass (:mod:`compress_kernels.common.pdl`).
"""
from __future__ import annotations

import triton
import triton.language as tl

from compress_kernels.common.launch import launch
from compress_kernels.common.pdl import launch_options, let_dependents_launch, pdl_enabled, wait_for_inputs
from compress_kernels.common.splitk import last_split_reduces, splitk_reduce, tiled_split_launch
from compress_kernels.common.tiles import grouped_tile, split_k_range


@triton.jit
def _w8a8_matmul_kernel(
    xq_ptr, w_ptr, sx_ptr, sw_ptr, bias_ptr, out_ptr,  # xq (M, K) i8, w (N, K) i8, (M,), (N,), (N,), out
    y_ptr, cnt_ptr,  # REDUCE_SPLIT > 1: the output (M, N) and one ticket counter per output tile
    M, N, K,
    stride_xm, stride_xk, stride_wn, stride_wk, stride_os, stride_om, stride_ym,  # stride_os: between split-K slices
    SPLIT_K, ADD_BIAS: tl.constexpr, EVEN_K: tl.constexpr, REDUCE_SPLIT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    wait_for_inputs(USE_PDL)  # xq and s_x come from the quantize kernel before
    # grouped tile order: GROUP_M row-tiles share each weight column-tile while it sits in L2
    pid_m, pid_n = grouped_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    pid_k = tl.program_id(1)

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = (offs_m % M).to(tl.int64)  # wrapped rows/cols: loads need no M/N mask, stores are masked
    cols = (offs_n % N).to(tl.int64)
    offs_k = tl.arange(0, BLOCK_K)

    k_first, k_last = split_k_range(pid_k, K, SPLIT_K, BLOCK_K)
    x_ptrs = xq_ptr + rows[:, None] * stride_xm + (k_first + offs_k)[None, :] * stride_xk  # (BM, BK)
    w_ptrs = w_ptr + cols[None, :] * stride_wn + (k_first + offs_k)[:, None] * stride_wk  # (BK, BN)

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
    for k0 in range(k_first, k_last, BLOCK_K):
        if EVEN_K:
            a = tl.load(x_ptrs)
            b = tl.load(w_ptrs)
        else:
            a = tl.load(x_ptrs, mask=(k0 + offs_k)[None, :] < K, other=0)
            b = tl.load(w_ptrs, mask=(k0 + offs_k)[:, None] < K, other=0)
        acc = tl.dot(a, b, acc, out_dtype=tl.int32)
        x_ptrs += BLOCK_K * stride_xk
        w_ptrs += BLOCK_K * stride_wk
    let_dependents_launch(USE_PDL)

    s_x = tl.load(sx_ptr + rows)
    s_w = tl.load(sw_ptr + cols)
    y = acc.to(tl.float32) * s_x[:, None] * s_w[None, :]
    if REDUCE_SPLIT > 1:  # out is the fp32 partials (SPLIT_K, M, N); the last split to finish sums them
        last_split_reduces(y, out_ptr, cnt_ptr, y_ptr, bias_ptr, offs_m, offs_n, M, N, stride_ym,
                           tl.program_id(0), pid_k, REDUCE_SPLIT, ADD_BIAS)
    else:
        if ADD_BIAS:
            y += tl.load(bias_ptr + cols).to(tl.float32)[None, :]
        out_ptrs = out_ptr + pid_k * stride_os + offs_m[:, None].to(tl.int64) * stride_om + offs_n[None, :]
        mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
        tl.store(out_ptrs, y.to(out_ptr.dtype.element_ty), mask=mask)


def launch_tiles(xq, s_x, w_q, w_scale, bias, cfg, y) -> None:
    """The GEMM on quantized ``xq`` (M, K) int8 and ``s_x`` (M,) into ``y`` (M, N) with ``cfg``'s tiles."""
    m, k = xq.shape
    n = w_q.shape[0]
    use_pdl = pdl_enabled(xq.device)
    grid, in_kernel, out, counters = tiled_split_launch(y, m, n, cfg.block_m, cfg.block_n, cfg.split_k)
    launch(_w8a8_matmul_kernel, grid,
        xq, w_q, s_x, w_scale, bias if bias is not None else w_scale, out, y, counters,
        m, n, k,
        xq.stride(0), xq.stride(1), w_q.stride(0), w_q.stride(1),
        m * n if cfg.split_k > 1 else 0, out.stride(-2), y.stride(0),
        cfg.split_k, ADD_BIAS=bias is not None and (cfg.split_k == 1 or in_kernel),
        EVEN_K=k % (cfg.block_k * cfg.split_k) == 0, REDUCE_SPLIT=cfg.split_k if in_kernel else 1,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
        GROUP_M=cfg.group_m, USE_PDL=use_pdl, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        **launch_options(use_pdl),
    )
    if cfg.split_k > 1 and not in_kernel:
        splitk_reduce(out, bias, y)
