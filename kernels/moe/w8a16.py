"""Grouped W8A16 expert GEMM: fp16 / bf16 activations x int8 weights, every expert in one launch.

Weights (each expert's ``W8A16Linear`` buffers, stacked; the contract of ``reference.w8a16_matmul_ref``)::

    w_q (E, N, Kp) int8      w_scale (E, N) per channel or (E, N, Kp/128) per group of 128 inputs

with Kp the layer's K padded to a multiple of 8 (of 128 with groups; zero weights past K). Program
(column tile, block, split) computes ``y^T = W x^T`` tile by tile with the dense W8A16 kernel's product
(:func:`compress_kernels.w8a16.tiled.tile_product`: the int8 tile converted to x's dtype in registers as
the dot's left operand; per-channel scales once in the epilogue, group scales per 128-deep K tile, on
the fp32 product or on the weight before the dot). x past K (the weight's padding) is read as zeros.

* gate/up (``GATED``): two accumulators (gate columns n, up columns N + n of the fused weight) for the
  pairs' token rows of x, then ``SwiGLU`` into the activation buffer;
* down: the activation buffer's slots, the fp32 partial of the split at the pairs' rows.

An expert's last block that holds at most ``SHORT_ROWS`` pairs runs SHORT_ROWS-row tiles, as in the grouped
W4A16 kernel (:mod:`compress_kernels.moe.w4a16`).

Under ``TRITON_INTERPRET=1`` with bf16 the products run on fp32 copies of the same values, and the
int8 -> x dtype conversion is a plain cast (the inline PTX needs a GPU).
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
from compress_kernels.reference import W8A16_GROUP_SIZE
from compress_kernels.w8a16.tiled import tile_product


@triton.jit
def _load_weight(w_ptrs, k0, k_last, offs_k, EVEN_K: tl.constexpr):
    """The (BLOCK_N, BLOCK_K) int8 tile at channel ``k0``, zeros from ``k_last`` on."""
    if EVEN_K:
        return tl.load(w_ptrs)
    return tl.load(w_ptrs, mask=(k0 + offs_k)[None, :] < k_last, other=0)


@triton.jit
def _project_rows(
    a_ptr, w_ptr, s_ptr, out_ptr,  # rows (x or act), w_q (E, Nw, Kp), w_scale (E, Nw (, Kp/128)), out
    pairs_ptr, first_slot, expert, pid_k,  # sorted pairs, this block's first slot, its expert, the K split
    num_pairs, N, K, KP,  # N output columns (gate/up: I, the up columns at N + n); K of x, KP of the weight
    stride_am, stride_ak, stride_we, stride_wn, stride_wk, stride_se, stride_sn, stride_sg, stride_os, stride_om,
    SPLIT_K, TOP_K: tl.constexpr, GATED: tl.constexpr, GROUPED: tl.constexpr, GROUP_SIZE: tl.constexpr,
    SCALE_AFTER_DOT: tl.constexpr, EVEN_K: tl.constexpr, EVEN_N: tl.constexpr,
    FP32_OPERANDS: tl.constexpr, ASM_CONVERT: tl.constexpr,
    ROWS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """The program's column tile (and K split) for the ROWS slots of the sorted pairs from ``first_slot``."""
    slots, pairs, valid, rows = slot_rows(pairs_ptr, first_slot, num_pairs, GATED, TOP_K, ROWS)
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = weight_columns(offs_n, N, BLOCK_N, EVEN_N).to(tl.int64)
    offs_k = tl.arange(0, BLOCK_K)

    k_first, k_last = split_k_range(pid_k, KP, SPLIT_K, BLOCK_K)
    x_last = min(k_last, K)  # x has K channels; the weight's padding meets zeros
    x_ptrs = a_ptr + rows[:, None] * stride_am + (k_first + offs_k)[None, :] * stride_ak  # (ROWS, BK)
    expert = expert.to(tl.int64)
    w_ptrs = w_ptr + expert * stride_we + cols[:, None] * stride_wn + (k_first + offs_k)[None, :] * stride_wk  # (BN,BK)
    s_ptrs = s_ptr + expert * stride_se + cols * stride_sn  # (BN,)

    acc = tl.zeros((BLOCK_N, ROWS), dtype=tl.float32)  # y^T
    acc_up = tl.zeros((BLOCK_N, ROWS), dtype=tl.float32)  # gate/up only
    for k0 in range(k_first, k_last, BLOCK_K):
        if EVEN_K:
            a = tl.load(x_ptrs)
        else:
            a = tl.load(x_ptrs, mask=(k0 + offs_k)[None, :] < x_last, other=0.0)
        w = _load_weight(w_ptrs, k0, k_last, offs_k, EVEN_K)
        acc = tile_product(acc, w, a, s_ptrs, k0, stride_sg, GROUPED, GROUP_SIZE, SCALE_AFTER_DOT, FP32_OPERANDS,
                           ASM_CONVERT)
        if GATED:  # the up columns: same rows, the fused weight's second half
            w = _load_weight(w_ptrs + N * stride_wn, k0, k_last, offs_k, EVEN_K)
            acc_up = tile_product(acc_up, w, a, s_ptrs + N * stride_sn, k0, stride_sg, GROUPED, GROUP_SIZE,
                                  SCALE_AFTER_DOT, FP32_OPERANDS, ASM_CONVERT)
        x_ptrs += BLOCK_K * stride_ak
        w_ptrs += BLOCK_K * stride_wk

    if not GROUPED:  # per-channel scales: once, on the exact integer-weight sums
        acc = acc * tl.load(s_ptrs).to(tl.float32)[:, None]
    if GATED:
        if not GROUPED:
            acc_up = acc_up * tl.load(s_ptrs + N * stride_sn).to(tl.float32)[:, None]
        act = swiglu(tl.trans(acc), tl.trans(acc_up), out_ptr.dtype.element_ty)
        store_activation(act, out_ptr, slots, offs_n, N, stride_om)
    else:
        store_partial(tl.trans(acc), out_ptr, pairs, valid, offs_n, N, pid_k, stride_os, stride_om)


@triton.jit
def _moe_w8a16_kernel(
    a_ptr, w_ptr, s_ptr, out_ptr,  # rows (x or act), w_q (E, Nw, Kp), w_scale (E, Nw (, Kp/128)), out
    pairs_ptr, expert_ptr,  # routing: sorted pairs (blocks * BLOCK_M,), block experts (blocks,)
    num_pairs, N, K, KP,  # N output columns (gate/up: I, the up columns at N + n); K of x, KP of the weight
    stride_am, stride_ak, stride_we, stride_wn, stride_wk, stride_se, stride_sn, stride_sg, stride_os, stride_om,
    SPLIT_K, TOP_K: tl.constexpr, GATED: tl.constexpr, GROUPED: tl.constexpr, GROUP_SIZE: tl.constexpr,
    SCALE_AFTER_DOT: tl.constexpr, EVEN_K: tl.constexpr, EVEN_N: tl.constexpr,
    FP32_OPERANDS: tl.constexpr, ASM_CONVERT: tl.constexpr,
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
        _project_rows(a_ptr, w_ptr, s_ptr, out_ptr, pairs_ptr, first_slot, expert, pid_k, num_pairs, N, K, KP,
                      stride_am, stride_ak, stride_we, stride_wn, stride_wk, stride_se, stride_sn, stride_sg,
                      stride_os, stride_om, SPLIT_K, TOP_K, GATED, GROUPED, GROUP_SIZE, SCALE_AFTER_DOT, EVEN_K,
                      EVEN_N, FP32_OPERANDS, ASM_CONVERT, SHORT_ROWS, BLOCK_N, BLOCK_K)
    else:
        _project_rows(a_ptr, w_ptr, s_ptr, out_ptr, pairs_ptr, first_slot, expert, pid_k, num_pairs, N, K, KP,
                      stride_am, stride_ak, stride_we, stride_wn, stride_wk, stride_se, stride_sn, stride_sg,
                      stride_os, stride_om, SPLIT_K, TOP_K, GATED, GROUPED, GROUP_SIZE, SCALE_AFTER_DOT, EVEN_K,
                      EVEN_N, FP32_OPERANDS, ASM_CONVERT, BLOCK_M, BLOCK_N, BLOCK_K)


def launch_w8a16(rows, w_q, w_scale, out, routing: Routing, tiles: ProjectionTiles, gated: bool) -> None:
    """One grouped projection. ``gated``: ``rows`` is x (T, K), ``w_q`` the fused gate/up weight (E, 2I, Kp)
    and ``out`` the activation buffer (blocks * BLOCK_M, I); else ``rows`` is that buffer, ``w_q`` the down
    weight (E, H, Kp) and ``out`` the fp32 partials (SPLIT_K, P, H)."""
    k = rows.shape[1]
    kp = w_q.shape[2]
    n = w_q.shape[1] // 2 if gated else w_q.shape[1]
    grouped = w_scale.dim() == 3
    split = 1 if gated else tiles.split_k
    if grouped and W8A16_GROUP_SIZE % tiles.block_k:
        raise ValueError(f"tiles: with group scales block_k must divide {W8A16_GROUP_SIZE}, got {tiles.block_k}")
    grid = (triton.cdiv(n, tiles.block_n), routing.block_expert.shape[0], split)
    interpret = interpreting()
    launch(_moe_w8a16_kernel, grid,
        rows, w_q, w_scale, out, routing.sorted_pairs, routing.block_expert,
        routing.num_pairs, n, k, kp,
        rows.stride(0), rows.stride(1), w_q.stride(0), w_q.stride(1), w_q.stride(2),
        w_scale.stride(0), w_scale.stride(1), w_scale.stride(2) if grouped else 0,
        0 if gated else out.stride(0), out.stride(-2),
        split, TOP_K=routing.top_k, GATED=gated, GROUPED=grouped, GROUP_SIZE=W8A16_GROUP_SIZE,
        SCALE_AFTER_DOT=tiles.scale_after_dot, EVEN_K=k == kp and kp % (tiles.block_k * split) == 0,
        EVEN_N=n % tiles.block_n == 0, FP32_OPERANDS=interpret and rows.dtype == torch.bfloat16,
        ASM_CONVERT=not interpret, BLOCK_M=routing.block_m, SHORT_ROWS=short_tile_rows(tiles, routing.block_m),
        BLOCK_N=tiles.block_n, BLOCK_K=tiles.block_k,
        num_warps=tiles.num_warps, num_stages=tiles.num_stages,
    )
