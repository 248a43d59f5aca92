"""W4A16 kernel for one token row per program: CUDA-core FMAs on the packed tile, no tensor cores.

Same operands and contract as the other W4A16 paths (``qweight`` (K/8, N) int32, nibble ``j`` of word
``qweight[r, n]`` is ``q[8r + j, n]`` in two's complement; ``scales`` (K/G, N); fp32 accumulation)::

    y[m, n] = sum_g scales[g, n] * sum_{k in group g} x[m, k] * q[k, n]      (+ bias[n])

Why: at M = 1 a matmul is a stream of packed weights. The tensor-core kernels must write every
unpacked weight tile to shared memory and read it back in the instruction's operand layout: 16 KB of
shared-memory traffic each way per 4 KB of weights read from DRAM. On an H200 that round trip held
them near 1 TB/s while a kernel that only loads the same tiles reached 3.4 TB/s. Here each thread
keeps its part of the (BLOCK_K/8, BLOCK_N) packed tile in registers and multiply-adds exact fp32
nibble values with the matching x values, three instructions per nibble
(:func:`compress_kernels.common.int4.tile_partial`).

``part`` holds one K tile (inside one scale group, whose row is ``k >> GROUP_SHIFT``), so it is
scaled once per tile into ``acc``; the K rows of ``acc`` are summed once at the end. x comes in as one
(BLOCK_K/8, 8) tile per step, split into its 8 columns in registers. The kernel is bound by DRAM
latency, so each step first issues the loads of the next tile (weights, x, scales) and then
multiplies the current one: the loads are in flight during the FMAs (on an H100 this took the decode
layers 10-20% below loading and then waiting). The dispatch table splits K so that ~4 programs per SM
each stream a run of tiles (:func:`compress_kernels.w4a16.dispatch.fma_split_k`).
Grid: (M, N / BLOCK_N, SPLIT_K) with the token row fastest, so programs that share a weight tile run
together and the tile comes from DRAM once.
With SPLIT_K > 1 the last split of each (row, tile) to finish sums the fp32 partials in split order
and adds the bias (:mod:`compress_kernels.common.splitk`, "the last split reduces"): one launch,
deterministic. The FMA count grows with M, so the table takes this kernel only at M = 1 (from M = 2
the nibble-plane tiles were faster on an H100: 8192x28672 M = 2 75 vs 94 us).
"""
from __future__ import annotations

import triton
import triton.language as tl

from compress_kernels.common.int4 import tile_partial
from compress_kernels.common.launch import launch
from compress_kernels.common.splitk import last_split_buffers, last_split_reduces
from compress_kernels.common.tiles import split_k_range, weight_columns


@triton.jit
def _load_tile(q_ptrs, x_ptrs, s_ptrs, kt, k_last, K, offs_r, offs_j, stride_qk, stride_xk, stride_sg,
               GROUP_SHIFT: tl.constexpr, EVEN_K: tl.constexpr, BLOCK_K: tl.constexpr):
    """The packed (BLOCK_K/8, BLOCK_N) tile at channel ``kt``, its x values as (BLOCK_K/8, 8) (row r,
    column j: channel kt + 8r + j) and its scales; zeros past ``k_last`` (a whole tile past it loads
    nothing: the prefetch after the last tile)."""
    q_ptrs = q_ptrs + (kt // 8) * stride_qk
    x_ptrs = x_ptrs + kt * stride_xk
    packed = tl.load(q_ptrs, mask=(kt // 8 + offs_r)[:, None] < k_last // 8, other=0)  # constant along N
    if EVEN_K:  # whole tiles: the mask is constant along j too, so x loads stay 16 bytes wide
        xt = tl.load(x_ptrs, mask=(kt + 8 * offs_r)[:, None] < k_last, other=0.0)
    else:
        xt = tl.load(x_ptrs, mask=(kt + 8 * offs_r[:, None] + offs_j[None, :]) < k_last, other=0.0)
    if GROUP_SHIFT >= 0:  # group_size = 2**GROUP_SHIFT; the clamp keeps the dead prefetch in bounds
        s_ptrs += (tl.minimum(kt, K - 1) >> GROUP_SHIFT) * stride_sg
    scale = tl.load(s_ptrs)  # GROUP_SHIFT < 0: one group (per channel), row 0
    return packed, xt.to(tl.float32), scale.to(tl.float32)


@triton.jit
def _w4a16_fma_kernel(
    x_ptr, qw_ptr, s_ptr, bias_ptr, out_ptr,  # x (M, K), qweight (K/8, N), scales (K/G, N), bias (N,), out (M, N)
    ws_ptr, cnt_ptr,  # SPLIT_K > 1: fp32 partials (SPLIT_K, M, N), int32 ticket counters (M * N / BLOCK_N,)
    M, N, K,
    stride_xm, stride_xk, stride_qk, stride_qn, stride_sg, stride_sn, stride_om,
    GROUP_SHIFT: tl.constexpr, SPLIT_K: tl.constexpr, HAS_BIAS: tl.constexpr,
    EVEN_K: tl.constexpr, EVEN_N: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    row = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = weight_columns(offs_n, N, BLOCK_N, EVEN_N)  # contiguous (16-byte loads) or wrapped
    offs_r = tl.arange(0, BLOCK_K // 8)
    offs_j = tl.arange(0, 8)

    k_first, k_last = split_k_range(pid_k, K, SPLIT_K, BLOCK_K)
    q_ptrs = qw_ptr + offs_r[:, None] * stride_qk + cols[None, :] * stride_qn  # (BK/8, BN) at channel 0
    x_ptrs = x_ptr + row.to(tl.int64) * stride_xm + (8 * offs_r[:, None] + offs_j[None, :]) * stride_xk  # (BK/8, 8)
    s_ptrs = s_ptr + cols * stride_sn

    acc = tl.zeros((BLOCK_K // 8, BLOCK_N), dtype=tl.float32)
    packed, xt, scale = _load_tile(q_ptrs, x_ptrs, s_ptrs, k_first, k_last, K, offs_r, offs_j,
                                   stride_qk, stride_xk, stride_sg, GROUP_SHIFT, EVEN_K, BLOCK_K)
    for k0 in range(k_first, k_last, BLOCK_K):  # the next tile's loads are in flight during this one's FMAs
        next_packed, next_xt, next_scale = _load_tile(q_ptrs, x_ptrs, s_ptrs, k0 + BLOCK_K, k_last, K, offs_r, offs_j,
                                                      stride_qk, stride_xk, stride_sg, GROUP_SHIFT, EVEN_K, BLOCK_K)
        acc += tile_partial(packed, xt, BLOCK_K) * scale[None, :]
        packed, xt, scale = next_packed, next_xt, next_scale

    y = tl.sum(acc, axis=0)  # (BN,)
    if SPLIT_K > 1:  # store the partial; the last split of this (row, tile) to arrive reduces
        last_split_reduces(y[None, :], ws_ptr, cnt_ptr, out_ptr, bias_ptr, row + tl.arange(0, 1), offs_n, M, N,
                           stride_om, row * tl.num_programs(1) + pid_n, pid_k, SPLIT_K, HAS_BIAS)
    else:
        if HAS_BIAS:
            y += tl.load(bias_ptr + cols).to(tl.float32)
        tl.store(out_ptr + row.to(tl.int64) * stride_om + offs_n, y.to(out_ptr.dtype.element_ty), mask=offs_n < N)


def group_shift(group_size: int, k: int) -> int:
    """log2 of the scale group (the launcher allows 32, 64, 128), or -1 for one group per channel."""
    if group_size == k:
        return -1
    if group_size & (group_size - 1):
        raise ValueError(f"group_size: expected a power of two or K = {k}, got {group_size}")
    return group_size.bit_length() - 1


def launch_fma(x2, qweight, scales, group_size, bias, y, cfg) -> None:
    """Launch on validated 2-D ``x2`` (M, K), writing ``y`` (M, N) in one launch whatever the K split."""
    m, k = x2.shape
    n = qweight.shape[1]
    grid = (m, triton.cdiv(n, cfg.block_n), cfg.split_k)
    workspace, counters = last_split_buffers(y, cfg.split_k, m, n, m * grid[1])
    launch(_w4a16_fma_kernel, grid,
        x2, qweight, scales, bias if bias is not None else scales, y, workspace, counters,
        m, n, k,
        x2.stride(0), x2.stride(1), qweight.stride(0), qweight.stride(1), scales.stride(0), scales.stride(1),
        y.stride(0), group_shift(group_size, k), cfg.split_k, HAS_BIAS=bias is not None,
        EVEN_K=k % (cfg.block_k * cfg.split_k) == 0, EVEN_N=n % cfg.block_n == 0,
        BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
