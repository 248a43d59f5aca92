"""Grouped W4A16 expert GEMM: every expert's rows in one launch, packed int4 weights stacked over experts.

Weights (each expert's ``W4A16Linear`` buffers, stacked; the contract of ``reference.w4a16_matmul_ref``)::

    qweight (E, Kp/8, N) int32     nibble j of qweight[e, r, n] is q[8r + j, n] of expert e (two's complement)
    scales  (E, Kp/G, N)           fp32 or x's dtype;  W_e[n, k] = q[k, n] * scales[e, k // G, n]

with Kp the layer's K padded to a multiple of 8 and of G (zero weights past K), G in {32, 64, 128} or
Kp (per channel). Program (column tile, block, split) of the grid (N / BLOCK_N, blocks, SPLIT_K) reads
its block's expert from ``block_expert`` (-1: nothing to do), its rows (:mod:`compress_kernels.moe.blocks`)
and walks its K slice in tiles inside one scale group, each tile through the dense W4A16 kernel's
product (:mod:`compress_kernels.w4a16.tiled`): as 8 nibble planes straight into the dot (``PLANES``), the
unpacked integers times x with the fp32 product scaled (``SCALE_AFTER_DOT``), or the tile dequantized to
x's dtype before the dot. x past K (the weight's padding) is read as zeros. An expert's last block that
holds at most ``SHORT_ROWS`` pairs (its pairs come first, the padding after them) runs SHORT_ROWS-row
tiles instead of BLOCK_M-row ones (``ProjectionTiles.short_rows``): the same weight stream, fewer MMAs.
With the planes (decode) the x tile and the scale rows of the next K tile are loaded into registers
before this tile's MMAs, leaving Triton's pipeline only the packed words (H200, bf16, group 128, the
2048x7168 layer, 8 / 16 / 32 tokens: 114 / 135 / 129 us -> 99 / 119 / 119; Mixtral's 4096x14336 350 /
379 / 421 -> 333 / 367 / 412; 64 tokens within 1.3%; the dense planes kernel measured 6-12% slower so).

* gate/up (``GATED``): the program holds two accumulators, gate columns ``n`` and up columns ``N + n``
  of the fused (2N-wide) weight, for the same x rows, and writes ``SwiGLU(gate, up)`` (N = I columns);
* down: one accumulator, written as the fp32 partial of its split at the pairs' rows.

Under ``TRITON_INTERPRET=1`` with bf16 the products run on fp32 copies of the same values
(``FP32_OPERANDS``, as in the dense kernel) and the planes are unpacked with plain shifts.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from compress_kernels.common.checks import interpreting
from compress_kernels.common.launch import launch
from compress_kernels.common.tiles import split_k_range, weight_columns
from compress_kernels.moe.blocks import holds_few_pairs, slot_rows, store_activation, store_partial, swiglu
from compress_kernels.moe.dispatch import ProjectionTiles, short_tile_rows
from compress_kernels.moe.routing import Routing
from compress_kernels.w4a16.tiled import load_x_tile, plane_tile_product, tile_product


@triton.jit
def _load_packed(q_ptrs, k0, k_last, offs_kp, EVEN_K: tl.constexpr):
    """The (BLOCK_K/8, BLOCK_N) packed tile at channel ``k0``, zeros from ``k_last`` on."""
    if EVEN_K:
        return tl.load(q_ptrs)
    return tl.load(q_ptrs, mask=(k0 // 8 + offs_kp)[:, None] < k_last // 8, other=0)


@triton.jit
def _scale_rows(s_ptrs, kt, KP, N, group_size, stride_sg, stride_sn, GATED: tl.constexpr):
    """The fp32 scale rows (BN,) of the tile at channel ``kt`` (clamped into the weight: a prefetch past the
    slice reads a real row): the columns' and, gate/up only, the up columns' (N on; down: the same row)."""
    s_ptrs += (tl.minimum(kt, KP - 1) // group_size) * stride_sg
    scale = tl.load(s_ptrs).to(tl.float32)
    scale_up = scale
    if GATED:
        scale_up = tl.load(s_ptrs + N * stride_sn).to(tl.float32)
    return scale, scale_up


@triton.jit
def _product(acc, a, packed, scale, SCALE_AFTER_DOT: tl.constexpr, FP32_OPERANDS: tl.constexpr, PLANES: tl.constexpr,
             ASM_UNPACK: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """acc + one K tile of x rows ``a`` times the packed tile (the dense kernel's products)."""
    if PLANES:
        return plane_tile_product(acc, a, packed, scale, ASM_UNPACK, FP32_OPERANDS, BLOCK_M, BLOCK_N, BLOCK_K)
    return tile_product(acc, a, packed, scale, SCALE_AFTER_DOT, FP32_OPERANDS, BLOCK_K, BLOCK_N)


@triton.jit
def _project_rows(
    a_ptr, qw_ptr, s_ptr, out_ptr,  # rows (x or act), qweight (E, Kp/8, Nw), scales (E, Kp/G, Nw), out
    pairs_ptr, first_slot, expert, pid_k,  # sorted pairs, this block's first slot, its expert, the K split
    num_pairs, N, K, KP, group_size,  # N output columns (gate/up: I, the up columns at N + n); K of x, KP of the weight
    stride_am, stride_ak, stride_qe, stride_qk, stride_qn, stride_se, stride_sg, stride_sn, stride_os, stride_om,
    SPLIT_K, TOP_K: tl.constexpr, GATED: tl.constexpr, EVEN_K: tl.constexpr, EVEN_N: tl.constexpr,
    SCALE_AFTER_DOT: tl.constexpr, FP32_OPERANDS: tl.constexpr, PLANES: tl.constexpr, ASM_UNPACK: tl.constexpr,
    ROWS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """The program's column tile (and K split) for the ROWS slots of the sorted pairs from ``first_slot``."""
    slots, pairs, valid, rows = slot_rows(pairs_ptr, first_slot, num_pairs, GATED, TOP_K, ROWS)
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = weight_columns(offs_n, N, BLOCK_N, EVEN_N)  # contiguous (16-byte loads) or wrapped
    offs_k = tl.arange(0, BLOCK_K)
    offs_kp = tl.arange(0, BLOCK_K // 8)

    k_first, k_last = split_k_range(pid_k, KP, SPLIT_K, BLOCK_K)
    x_last = min(k_last, K)  # x has K channels; the weight's padding (KP - K zero rows) meets zeros
    x_ptrs = a_ptr + rows[:, None] * stride_am + (k_first + offs_k)[None, :] * stride_ak  # (ROWS, BK)
    expert = expert.to(tl.int64)
    q_ptrs = qw_ptr + expert * stride_qe + (k_first // 8 + offs_kp)[:, None] * stride_qk + cols[None, :] * stride_qn
    s_ptrs = s_ptr + expert * stride_se + cols * stride_sn  # (BN,)

    acc = tl.zeros((ROWS, BLOCK_N), dtype=tl.float32)
    acc_up = tl.zeros((ROWS, BLOCK_N), dtype=tl.float32)  # gate/up only
    if PLANES:  # x and the scale rows come one K tile ahead, in registers (module docstring)
        a_next = load_x_tile(x_ptrs, k_first, x_last, offs_k, False)
        scale_next, scale_up_next = _scale_rows(s_ptrs, k_first, KP, N, group_size, stride_sg, stride_sn, GATED)
    for k0 in range(k_first, k_last, BLOCK_K):
        if PLANES:
            a, scale, scale_up = a_next, scale_next, scale_up_next
            a_next = load_x_tile(x_ptrs + BLOCK_K * stride_ak, k0 + BLOCK_K, x_last, offs_k, False)
            scale_next, scale_up_next = _scale_rows(s_ptrs, k0 + BLOCK_K, KP, N, group_size, stride_sg, stride_sn,
                                                    GATED)
        else:
            a = load_x_tile(x_ptrs, k0, x_last, offs_k, EVEN_K)
        packed = _load_packed(q_ptrs, k0, k_last, offs_kp, EVEN_K)
        if not PLANES:
            scale = tl.load(s_ptrs + (k0 // group_size) * stride_sg).to(tl.float32)
        acc = _product(acc, a, packed, scale, SCALE_AFTER_DOT, FP32_OPERANDS, PLANES, ASM_UNPACK, ROWS, BLOCK_N,
                       BLOCK_K)
        if GATED:  # the up columns: same rows, the fused weight's second half
            packed = _load_packed(q_ptrs + N * stride_qn, k0, k_last, offs_kp, EVEN_K)
            if not PLANES:
                scale_up = tl.load(s_ptrs + N * stride_sn + (k0 // group_size) * stride_sg).to(tl.float32)
            acc_up = _product(acc_up, a, packed, scale_up, SCALE_AFTER_DOT, FP32_OPERANDS, PLANES, ASM_UNPACK, ROWS,
                              BLOCK_N, BLOCK_K)
        x_ptrs += BLOCK_K * stride_ak
        q_ptrs += (BLOCK_K // 8) * stride_qk

    if GATED:
        store_activation(swiglu(acc, acc_up, out_ptr.dtype.element_ty), out_ptr, slots, offs_n, N, stride_om)
    else:
        store_partial(acc, out_ptr, pairs, valid, offs_n, N, pid_k, stride_os, stride_om)


@triton.jit
def _moe_w4a16_kernel(
    a_ptr, qw_ptr, s_ptr, out_ptr,  # rows (x or act), qweight (E, Kp/8, Nw), scales (E, Kp/G, Nw), out
    pairs_ptr, expert_ptr,  # routing: sorted pairs (blocks * BLOCK_M,), block experts (blocks,)
    num_pairs, N, K, KP, group_size,  # N output columns (gate/up: I, the up columns at N + n); K of x, KP of the weight
    stride_am, stride_ak, stride_qe, stride_qk, stride_qn, stride_se, stride_sg, stride_sn, stride_os, stride_om,
    SPLIT_K, TOP_K: tl.constexpr, GATED: tl.constexpr, EVEN_K: tl.constexpr, EVEN_N: tl.constexpr,
    SCALE_AFTER_DOT: tl.constexpr, FP32_OPERANDS: tl.constexpr, PLANES: tl.constexpr, ASM_UNPACK: tl.constexpr,
    BLOCK_M: tl.constexpr, SHORT_ROWS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    block = tl.program_id(1)
    expert = tl.load(expert_ptr + block)
    if expert < 0:  # a block past the last expert's
        return
    pid_k = tl.program_id(2)
    first_slot = block * BLOCK_M
    short = False
    if SHORT_ROWS < BLOCK_M:  # an expert's last block with at most SHORT_ROWS pairs runs SHORT_ROWS-row tiles
        short = holds_few_pairs(pairs_ptr, first_slot, num_pairs, SHORT_ROWS)
    if short:
        _project_rows(a_ptr, qw_ptr, s_ptr, out_ptr, pairs_ptr, first_slot, expert, pid_k, num_pairs, N, K, KP,
                      group_size, stride_am, stride_ak, stride_qe, stride_qk, stride_qn, stride_se, stride_sg,
                      stride_sn, stride_os, stride_om, SPLIT_K, TOP_K, GATED, EVEN_K, EVEN_N, SCALE_AFTER_DOT,
                      FP32_OPERANDS, PLANES, ASM_UNPACK, SHORT_ROWS, BLOCK_N, BLOCK_K)
    else:
        _project_rows(a_ptr, qw_ptr, s_ptr, out_ptr, pairs_ptr, first_slot, expert, pid_k, num_pairs, N, K, KP,
                      group_size, stride_am, stride_ak, stride_qe, stride_qk, stride_qn, stride_se, stride_sg,
                      stride_sn, stride_os, stride_om, SPLIT_K, TOP_K, GATED, EVEN_K, EVEN_N, SCALE_AFTER_DOT,
                      FP32_OPERANDS, PLANES, ASM_UNPACK, BLOCK_M, BLOCK_N, BLOCK_K)


def launch_w4a16(rows, qweight, scales, out, routing: Routing, tiles: ProjectionTiles, gated: bool) -> None:
    """One grouped projection. ``gated``: ``rows`` is x (T, K), ``qweight`` the fused gate/up weight (E, Kp/8, 2I)
    and ``out`` the activation buffer (blocks * BLOCK_M, I) in x's dtype; else ``rows`` is that buffer,
    ``qweight`` the down weight (E, Kp/8, H) and ``out`` the fp32 partials (SPLIT_K, P, H)."""
    k = rows.shape[1]
    kp = qweight.shape[1] * 8
    n = qweight.shape[2] // 2 if gated else qweight.shape[2]
    split = 1 if gated else tiles.split_k
    if tiles.planes and tiles.block_k < 128:
        raise ValueError(f"tiles: nibble planes need block_k 128, got {tiles.block_k}")
    grid = (triton.cdiv(n, tiles.block_n), routing.block_expert.shape[0], split)
    interpret = interpreting()
    launch(_moe_w4a16_kernel, grid,
        rows, qweight, scales, out, routing.sorted_pairs, routing.block_expert,
        routing.num_pairs, n, k, kp, kp // scales.shape[1],
        rows.stride(0), rows.stride(1), qweight.stride(0), qweight.stride(1), qweight.stride(2),
        scales.stride(0), scales.stride(1), scales.stride(2), 0 if gated else out.stride(0), out.stride(-2),
        split, TOP_K=routing.top_k, GATED=gated, EVEN_K=k == kp and kp % (tiles.block_k * split) == 0,
        EVEN_N=n % tiles.block_n == 0, SCALE_AFTER_DOT=tiles.scale_after_dot,
        FP32_OPERANDS=interpret and rows.dtype == torch.bfloat16, PLANES=tiles.planes,
        ASM_UNPACK=tiles.planes and not interpret,
        BLOCK_M=routing.block_m, SHORT_ROWS=short_tile_rows(tiles, routing.block_m),
        BLOCK_N=tiles.block_n, BLOCK_K=tiles.block_k, num_warps=tiles.num_warps, num_stages=tiles.num_stages,
    )
