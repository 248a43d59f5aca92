"""Grouped W4A16 for one routed row per program (decode): CUDA-core FMAs on the packed tiles, no tensor cores.

Same operands and contract as :mod:`compress_kernels.moe.w4a16` (each expert's ``qweight`` (Kp/8, N) and
``scales`` (Kp/G, N) stacked over experts). Why: at decode an expert gets one or two rows, and the dense
W4A16 kernels measured the one-row CUDA-core kernel well ahead of the 16-row tensor-core tiles there
(H200, 8192x28672: M = 1 61 us on :mod:`compress_kernels.w4a16.fma`, M = 16 115 us on the nibble planes).
So with BLOCK_M = 1 (the routing pads nothing: every block is one pair) program (block, column tile,
split) takes one row and walks its K slice as that kernel does: each packed (BLOCK_K/8, BLOCK_N) tile
and its (BLOCK_K/8, 8) x values through :func:`compress_kernels.common.int4.tile_partial` (three
instructions per nibble, exact fp32 values), scaled once per tile (one scale group), the next tile's loads
issued before the current tile's FMAs; gate/up does the gate and the up tile of the same x values.

Blocks are the grid's fastest axis, so the rows of one expert (adjacent in the sorted pairs) read the same
weight tile at about the same time and all but the first find it in L2: each expert's weights come from
DRAM about once, whatever its number of rows. The epilogues are the tiled kernel's (SwiGLU into the
activation buffer; the fp32 partial of the split at the pair's row).
"""
from __future__ import annotations

import triton
import triton.language as tl

from compress_kernels.common.int4 import tile_partial
from compress_kernels.common.launch import launch
from compress_kernels.common.tiles import split_k_range, weight_columns
from compress_kernels.moe.blocks import block_rows, store_activation, store_partial, swiglu
from compress_kernels.moe.dispatch import ProjectionTiles
from compress_kernels.moe.routing import Routing
from compress_kernels.w4a16.fma import group_shift


@triton.jit
def _load_tile(q_ptrs, x_ptrs, s_ptrs, kt, k_last, x_last, KP, offs_r, offs_j, stride_qk, stride_ak, stride_sg,
               GROUP_SHIFT: tl.constexpr, EVEN_K: tl.constexpr):
    """The packed tile at channel ``kt`` (zeros from ``k_last``), its x values as (BLOCK_K/8, 8) fp32 (zeros
    from ``x_last``: the weight's padding and the dead prefetch past the slice) and its scale row."""
    q_ptrs = q_ptrs + (kt // 8) * stride_qk
    x_ptrs = x_ptrs + kt * stride_ak
    if EVEN_K:  # whole tiles, K = KP: one mask along the packed rows, x loads stay 16 bytes wide
        packed = tl.load(q_ptrs, mask=(kt // 8 + offs_r)[:, None] < k_last // 8, other=0)
        xt = tl.load(x_ptrs, mask=(kt + 8 * offs_r)[:, None] < k_last, other=0.0)
    else:
        packed = tl.load(q_ptrs, mask=(kt // 8 + offs_r)[:, None] < k_last // 8, other=0)
        xt = tl.load(x_ptrs, mask=(kt + 8 * offs_r[:, None] + offs_j[None, :]) < x_last, other=0.0)
    if GROUP_SHIFT >= 0:  # group_size = 2**GROUP_SHIFT; the clamp keeps the dead prefetch in bounds
        s_ptrs += (tl.minimum(kt, KP - 1) >> GROUP_SHIFT) * stride_sg
    return packed, xt.to(tl.float32), tl.load(s_ptrs).to(tl.float32)


@triton.jit
def _moe_w4a16_fma_kernel(
    a_ptr, qw_ptr, s_ptr, out_ptr,  # rows (x or act), qweight (E, Kp/8, Nw), scales (E, Kp/G, Nw), out
    pairs_ptr, expert_ptr,  # routing with BLOCK_M = 1: sorted pairs (blocks,), block experts (blocks,)
    num_pairs, N, K, KP,  # N output columns (gate/up: I, the up columns at N + n); K of x, KP of the weight
    stride_am, stride_ak, stride_qe, stride_qk, stride_qn, stride_se, stride_sg, stride_sn, stride_os, stride_om,
    SPLIT_K, TOP_K: tl.constexpr, GATED: tl.constexpr, GROUP_SHIFT: tl.constexpr, EVEN_K: tl.constexpr,
    EVEN_N: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    block = tl.program_id(0)  # fastest: an expert's rows read each weight tile together
    expert = tl.load(expert_ptr + block)
    if expert < 0:
        return
    pid_k = tl.program_id(2)
    slots, pairs, valid, rows = block_rows(pairs_ptr, block, num_pairs, GATED, TOP_K, 1)  # (1,) each
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = weight_columns(offs_n, N, BLOCK_N, EVEN_N)
    offs_r = tl.arange(0, BLOCK_K // 8)  # packed rows: channels 8r .. 8r + 7 of a tile
    offs_j = tl.arange(0, 8)

    k_first, k_last = split_k_range(pid_k, KP, SPLIT_K, BLOCK_K)
    x_last = min(k_last, K)
    expert = expert.to(tl.int64)
    q_ptrs = qw_ptr + expert * stride_qe + offs_r[:, None] * stride_qk + cols[None, :] * stride_qn  # at channel 0
    x_ptrs = a_ptr + tl.sum(rows) * stride_am + (8 * offs_r[:, None] + offs_j[None, :]) * stride_ak  # (BK/8, 8)
    s_ptrs = s_ptr + expert * stride_se + cols * stride_sn
    up_q, up_s = q_ptrs + N * stride_qn, s_ptrs + N * stride_sn  # gate/up: the fused weight's second half

    acc = tl.zeros((BLOCK_K // 8, BLOCK_N), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK_K // 8, BLOCK_N), dtype=tl.float32)  # gate/up only
    packed, xt, scale = _load_tile(q_ptrs, x_ptrs, s_ptrs, k_first, k_last, x_last, KP, offs_r, offs_j, stride_qk,
                                   stride_ak, stride_sg, GROUP_SHIFT, EVEN_K)
    packed_up = packed
    scale_up = scale
    if GATED:
        packed_up, _, scale_up = _load_tile(up_q, x_ptrs, up_s, k_first, k_last, x_last, KP, offs_r, offs_j,
                                            stride_qk, stride_ak, stride_sg, GROUP_SHIFT, EVEN_K)
    for k0 in range(k_first, k_last, BLOCK_K):  # the next tile's loads are in flight during this one's FMAs
        next_packed, next_xt, next_scale = _load_tile(q_ptrs, x_ptrs, s_ptrs, k0 + BLOCK_K, k_last, x_last, KP,
                                                      offs_r, offs_j, stride_qk, stride_ak, stride_sg, GROUP_SHIFT,
                                                      EVEN_K)
        next_packed_up = next_packed
        next_scale_up = next_scale
        if GATED:
            next_packed_up, _, next_scale_up = _load_tile(up_q, x_ptrs, up_s, k0 + BLOCK_K, k_last, x_last, KP, offs_r,
                                                          offs_j, stride_qk, stride_ak, stride_sg, GROUP_SHIFT, EVEN_K)
            acc_up += tile_partial(packed_up, xt, BLOCK_K) * scale_up[None, :]
        acc += tile_partial(packed, xt, BLOCK_K) * scale[None, :]
        packed, xt, scale, packed_up, scale_up = next_packed, next_xt, next_scale, next_packed_up, next_scale_up

    y = tl.sum(acc, axis=0)[None, :]  # (1, BN)
    if GATED:
        act = swiglu(y, tl.sum(acc_up, axis=0)[None, :], out_ptr.dtype.element_ty)
        store_activation(act, out_ptr, slots, offs_n, N, stride_om)
    else:
        store_partial(y, out_ptr, pairs, valid, offs_n, N, pid_k, stride_os, stride_om)


def launch_w4a16_fma(rows, qweight, scales, out, routing: Routing, tiles: ProjectionTiles, gated: bool) -> None:
    """:func:`compress_kernels.moe.w4a16.launch_w4a16` for a routing with BLOCK_M = 1 (same arguments)."""
    if routing.block_m != 1:
        raise ValueError(f"routing: the one-row kernel takes blocks of one pair, got block_m={routing.block_m}")
    k = rows.shape[1]
    kp = qweight.shape[1] * 8
    n = qweight.shape[2] // 2 if gated else qweight.shape[2]
    split = 1 if gated else tiles.split_k
    grid = (routing.block_expert.shape[0], triton.cdiv(n, tiles.block_n), split)
    launch(_moe_w4a16_fma_kernel, grid,
        rows, qweight, scales, out, routing.sorted_pairs, routing.block_expert,
        routing.num_pairs, n, k, kp,
        rows.stride(0), rows.stride(1), qweight.stride(0), qweight.stride(1), qweight.stride(2),
        scales.stride(0), scales.stride(1), scales.stride(2), 0 if gated else out.stride(0), out.stride(-2),
        split, TOP_K=routing.top_k, GATED=gated, GROUP_SHIFT=group_shift(kp // scales.shape[1], kp),
        EVEN_K=k == kp and kp % (tiles.block_k * split) == 0, EVEN_N=n % tiles.block_n == 0,
        BLOCK_N=tiles.block_n, BLOCK_K=tiles.block_k, num_warps=tiles.num_warps, num_stages=tiles.num_stages,
    )
