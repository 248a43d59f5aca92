"""W4A16 for one token row per program, the whole K axis in one load: CUDA-core FMAs, one DRAM trip.

Same operands and contract as the other W4A16 paths (``qweight`` (K/8, N) int32, nibble ``j`` of word
``qweight[r, n]`` is ``q[8r + j, n]``; ``scales`` (K/G, N); fp32 accumulation)::

    y[m, n] = sum_k scales[k // G, n] * x[m, k] * q[k, n]      (+ bias[n])

Why: on a small layer at M = 1 the time is latency, not bandwidth. The one-row kernel of
:mod:`compress_kernels.w4a16.fma` walks its K slice one tile at a time (each step waits on the load issued
one step before) and sums its K splits through fp32 partials and a ticket counter: several dependent
memory round trips per program. Here program (row, n tile) loads its whole (K/8, BLOCK_N) packed
strip, its x row and its scale rows at once (``BLOCK_K`` >= K, a power of two, rows past K masked),
so every load of the launch is in flight together; then the FMAs of
:func:`compress_kernels.common.int4.tile_partial` (three instructions per nibble, exact), one multiply by the
scale of each packed row's group, one sum over K, the bias, one store. No split, no workspace, no
counters. The scale rows come in as a (BLOCK_K/8, BLOCK_N) tile whose row r reads group
``8r >> GROUP_SHIFT`` (a group spans G/8 packed rows, which read the same addresses).

The strip lives in registers, so ``BLOCK_K`` is capped (:data:`WHOLEK_MAX_K`). Each extra token row
is a program of its own that reads the strip again (from L2) and pays the FMAs again, so the
dispatch table takes this kernel for one or two rows, and up to 16 only on small layers
(:func:`compress_kernels.w4a16.dispatch.wholek_serves`).
"""
from __future__ import annotations

import triton
import triton.language as tl

from compress_kernels.common.int4 import tile_partial
from compress_kernels.common.launch import launch
from compress_kernels.common.tiles import weight_columns
from compress_kernels.w4a16.fma import group_shift

WHOLEK_MAX_K = 8192  # longest K whose strip is loaded at once


@triton.jit
def _w4a16_wholek_kernel(
    x_ptr, qw_ptr, s_ptr, bias_ptr, out_ptr,  # x (M, K), qweight (K/8, N), scales (K/G, N), bias (N,), out (M, N)
    N, K,
    stride_xm, stride_xk, stride_qk, stride_qn, stride_sg, stride_sn, stride_om,
    GROUP_SHIFT: tl.constexpr, HAS_BIAS: tl.constexpr, EVEN_N: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    row = tl.program_id(0)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = weight_columns(offs_n, N, BLOCK_N, EVEN_N)
    offs_r = tl.arange(0, BLOCK_K // 8)  # packed rows: channels 8r .. 8r + 7
    offs_j = tl.arange(0, 8)
    in_k = (offs_r < K // 8)[:, None]

    packed = tl.load(qw_ptr + offs_r[:, None] * stride_qk + cols[None, :] * stride_qn, mask=in_k, other=0)
    x_ptrs = x_ptr + row.to(tl.int64) * stride_xm + (8 * offs_r[:, None] + offs_j[None, :]) * stride_xk
    xt = tl.load(x_ptrs, mask=in_k, other=0.0).to(tl.float32)
    if GROUP_SHIFT >= 0:  # group_size = 2**GROUP_SHIFT
        group = (8 * offs_r) >> GROUP_SHIFT
    else:  # one group per channel: row 0
        group = offs_r * 0
    scale = tl.load(s_ptr + group[:, None] * stride_sg + cols[None, :] * stride_sn, mask=in_k, other=0.0)

    y = tl.sum(tile_partial(packed, xt, BLOCK_K) * scale.to(tl.float32), axis=0)  # (BLOCK_N,)
    if HAS_BIAS:
        y += tl.load(bias_ptr + cols).to(tl.float32)
    tl.store(out_ptr + row.to(tl.int64) * stride_om + offs_n, y.to(out_ptr.dtype.element_ty), mask=offs_n < N)


def launch_wholek(x2, qweight, scales, group_size, bias, y, cfg) -> None:
    """Launch on validated 2-D ``x2`` (M, K), writing ``y`` (M, N); ``cfg.block_k`` must hold K."""
    m, k = x2.shape
    n = qweight.shape[1]
    if cfg.block_k < k or cfg.block_k & (cfg.block_k - 1) or cfg.block_k > WHOLEK_MAX_K:
        raise ValueError(f"config: the wholek path needs block_k a power of two >= K = {k} and <= {WHOLEK_MAX_K}, "
                         f"got {cfg.block_k}")
    if cfg.split_k != 1:
        raise ValueError(f"config: the wholek path loads all of K in one program (split_k 1), got {cfg.split_k}")
    grid = (m, triton.cdiv(n, cfg.block_n))
    launch(_w4a16_wholek_kernel, grid,
        x2, qweight, scales, bias if bias is not None else scales, y,
        n, k,
        x2.stride(0), x2.stride(1), qweight.stride(0), qweight.stride(1), scales.stride(0), scales.stride(1),
        y.stride(0), group_shift(group_size, k), HAS_BIAS=bias is not None, EVEN_N=n % cfg.block_n == 0,
        BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, num_warps=cfg.num_warps, num_stages=1,
    )
