"""W8A8 for one token row per program: quantize the row in the kernel, int8 x int8 on CUDA cores.

Same contract as the quantize pass + GEMM path (``compress_kernels.reference.w8a8_matmul_ref``;
``x`` (M, K) fp16/bf16, ``w_q`` (N, K) int8, ``w_scale`` (N,) fp32, dynamic or static activation
scale)::

    s_x[m]     = max_k |x[m, k]| / 127      (IEEE division; 0 -> 1)   or the static scale (0 -> 1)
    xq[m, k]   = rint(clamp(x[m, k] / s_x[m], -128, 127))              rint = round half to even
    acc[m, n]  = sum_k xq[m, k] * w_q[n, k]                            exact, int32
    y[m, n]    = (acc[m, n] * s_x[m]) * w_scale[n] (+ bias[n])         fp32, stored in x's dtype

Why: at M = 1 the matmul is a stream of int8 weights. The tensor-core GEMM pads the row to a 16-row
tile and needs a separate quantize launch. Here program (row, n tile, k split) owns BLOCK_N outputs
of one row:

1. scale: it reduces its row of x to ``s_x`` itself
   (:func:`compress_kernels.common.quantize.row_scales`, the quantize pass's absmax and division):
   K values read from L2. The first weight tile is loaded before this pass, so its DRAM latency
   overlaps the scale's.
2. main loop over its K slice: loads a (BLOCK_N, BLOCK_K) int8 weight tile (contiguous along K)
   and BLOCK_K values of x, quantizes those to the reference's integers
   (:func:`compress_kernels.common.quantize.quantize_int8_recip`, exact) and accumulates
   ``w * xq`` in int32 per (n, k) lane; the lanes are summed once at the end. Integer sums are
   exact in any order.
3. epilogue: the GEMM's operations in its order, so unsplit (as the dispatch table runs it: 8
   outputs per program, all of K in 1024- or 512-deep steps) the output has the same bits as the
   quantize pass + GEMM path. With SPLIT_K > 1 (a tuning neighbour) each split dequantizes its
   partial sum and the last split of each (row, tile) to finish adds the fp32 partials in split
   order and the bias (:mod:`compress_kernels.common.splitk`): one launch, deterministic.

A NaN or Inf in the row makes its output row NaN, as the reference's NaN scale does. Dynamic: the
scale pass, which reads the whole row, takes a NaN-propagating max and turns an Inf scale into NaN,
so ``s_x`` is NaN. Static (no scale pass): the main loop sums ``v * 0`` over the x values it reads
and adds that (0, or NaN) to ``s_x`` in the epilogue (with split-K, each split over its own slice; the
NaN partial then makes the sum NaN). Keeping work out of the dynamic path matters: the sum in the main
loop cost 9-10% at M = 1 on 4096-wide layers, a second accumulator in the scale pass 25% at
K = 8192, N = 28672 (H100).
"""
from __future__ import annotations

import triton
import triton.language as tl

from compress_kernels.common.launch import launch
from compress_kernels.common.quantize import quantize_int8_recip, row_scales
from compress_kernels.common.splitk import last_split_buffers, last_split_reduces
from compress_kernels.common.tiles import split_k_range

SCALE_BLOCK_MAX = 4096  # x values per load of the scale pass (one row of K <= 4096: a single step)


@triton.jit
def _load_weight_tile(w_ptrs, k0, k_last, offs_k, EVEN_K: tl.constexpr):
    """The (BLOCK_N, BLOCK_K) int8 weight tile at channel ``k0`` (zeros from ``k_last`` on)."""
    if EVEN_K:
        return tl.load(w_ptrs)
    return tl.load(w_ptrs, mask=((k0 + offs_k) < k_last)[None, :], other=0)


@triton.jit
def _accumulate(acc, poison, w, x_ptrs, k0, k_last, offs_k, recip, EVEN_K: tl.constexpr, STATIC: tl.constexpr):
    """``acc += w * xq`` for one K tile: x's BLOCK_K values at channel ``k0`` quantized exactly; with a
    static scale also ``poison += v * 0`` (NaN once a NaN or Inf has been read)."""
    if EVEN_K:
        v = tl.load(x_ptrs)
    else:
        v = tl.load(x_ptrs, mask=(k0 + offs_k) < k_last, other=0.0)
    v = v.to(tl.float32)
    xq = quantize_int8_recip(v, recip)  # (BK,) int8, the reference's integers
    if STATIC:
        poison += v * 0.0
    return acc + w.to(tl.int32) * xq.to(tl.int32)[None, :], poison


@triton.jit
def _w8a8_gemv_kernel(
    x_ptr, w_ptr, static_ptr, sw_ptr, bias_ptr, out_ptr,  # x (M, K), w (N, K) i8, static scale, (N,), (N,), out (M, N)
    ws_ptr, cnt_ptr,  # SPLIT_K > 1: fp32 partials (SPLIT_K, M, N), int32 ticket counters (M * N / BLOCK_N,)
    M, N, K,
    stride_xm, stride_xk, stride_wn, stride_wk, stride_om,
    SPLIT_K: tl.constexpr, STATIC: tl.constexpr, STATIC_PER_ROW: tl.constexpr, HAS_BIAS: tl.constexpr,
    EVEN_K: tl.constexpr, EVEN_SCALE_K: tl.constexpr, EVEN_N: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SCALE_BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    rows = row + tl.arange(0, 1)  # this program's row as a 1-element block
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    if EVEN_N:
        cols = offs_n.to(tl.int64)
    else:
        cols = (offs_n % N).to(tl.int64)  # wrapped: loads need no N mask, the store is masked
    offs_k = tl.arange(0, BLOCK_K)

    k_first, k_last = split_k_range(pid_k, K, SPLIT_K, BLOCK_K)
    w_ptrs = w_ptr + cols[:, None] * stride_wn + (k_first + offs_k)[None, :] * stride_wk  # (BN, BK)
    x_ptrs = x_ptr + row.to(tl.int64) * stride_xm + (k_first + offs_k) * stride_xk  # (BK,)
    w_first = _load_weight_tile(w_ptrs, k_first, k_last, offs_k, EVEN_K)  # in flight during the scale pass

    s_x = row_scales(x_ptr, static_ptr, rows, M, K, stride_xm, stride_xk,
                     STATIC, STATIC_PER_ROW, EVEN_SCALE_K, 1, SCALE_BLOCK)  # (1,)
    recip = 1.0 / s_x.to(tl.float64)  # IEEE float64 division, once per program

    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.int32)
    poison = tl.zeros((BLOCK_K,), dtype=tl.float32)
    if k_first < k_last:  # the last split may be empty
        acc, poison = _accumulate(acc, poison, w_first, x_ptrs, k_first, k_last, offs_k, recip, EVEN_K, STATIC)
    for k0 in range(k_first + BLOCK_K, k_last, BLOCK_K):
        w_ptrs += BLOCK_K * stride_wk
        x_ptrs += BLOCK_K * stride_xk
        w = _load_weight_tile(w_ptrs, k0, k_last, offs_k, EVEN_K)
        acc, poison = _accumulate(acc, poison, w, x_ptrs, k0, k_last, offs_k, recip, EVEN_K, STATIC)

    total = tl.sum(acc, axis=1)  # (BN,) int32, exact
    s_w = tl.load(sw_ptr + cols)
    y = total.to(tl.float32) * (s_x + tl.sum(poison)) * s_w  # the tiled kernel's order: (acc * s_x) * s_w
    if SPLIT_K > 1:  # store the partial; the last split of this (row, tile) to arrive reduces
        last_split_reduces(y[None, :], ws_ptr, cnt_ptr, out_ptr, bias_ptr, rows, offs_n, M, N,
                           stride_om, row * tl.num_programs(1) + pid_n, pid_k, SPLIT_K, HAS_BIAS)
    else:
        if HAS_BIAS:
            y += tl.load(bias_ptr + cols).to(tl.float32)
        tl.store(out_ptr + row.to(tl.int64) * stride_om + offs_n, y.to(out_ptr.dtype.element_ty), mask=offs_n < N)


def launch_gemv(x2, w_q, w_scale, bias, x_scale, cfg, y) -> None:
    """Write ``w8a8(x2)`` into ``y`` (M, N) in one launch whatever the K split.

    Inputs are validated by the caller; ``cfg`` has ``block_n``, ``block_k``, ``split_k``,
    ``num_warps`` and ``num_stages`` (``block_m`` is ignored: one row per program); ``x_scale`` is
    None or a static fp32 scalar / (M,) tensor.
    """
    m, k = x2.shape
    n = w_q.shape[0]
    grid = (m, triton.cdiv(n, cfg.block_n), cfg.split_k)
    workspace, counters = last_split_buffers(y, cfg.split_k, m, n, m * grid[1])
    static = x_scale.reshape(-1).contiguous() if x_scale is not None else w_scale  # placeholder when dynamic
    scale_block = min(triton.next_power_of_2(k), SCALE_BLOCK_MAX)
    launch(_w8a8_gemv_kernel, grid,
        x2, w_q, static, w_scale, bias if bias is not None else w_scale, y, workspace, counters,
        m, n, k,
        x2.stride(0), x2.stride(1), w_q.stride(0), w_q.stride(1), y.stride(0),
        cfg.split_k, STATIC=x_scale is not None, STATIC_PER_ROW=x_scale is not None and x_scale.numel() > 1,
        HAS_BIAS=bias is not None, EVEN_K=k % (cfg.block_k * cfg.split_k) == 0, EVEN_SCALE_K=k % scale_block == 0,
        EVEN_N=n % cfg.block_n == 0, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, SCALE_BLOCK=scale_block,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
