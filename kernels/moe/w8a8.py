"""Grouped W8A8 expert GEMM: int8 activations per token x int8 weights per channel, every expert in one launch.

Weights (each expert's ``W8A8Linear`` buffers, stacked; the contract of ``reference.w8a8_matmul_ref``)::

    w_q (E, N, K) int8      w_scale (E, N) fp32

Activations are quantized per row as the dense W8A8 path does (``s = max|row| / 127``, round half to even,
:mod:`compress_kernels.common.quantize`): x once per token before gate/up
(:func:`compress_kernels.common.quantize.quantize_rows`), and the activation buffer once per routed slot
before down (:func:`quantize_routed_rows`, which skips the padding slots). Program (column tile, block,
split) multiplies its block's int8 rows by its expert's int8 weight tiles with ``tl.dot(out_dtype=int32)``
(exact) and dequantizes in the epilogue, in the dense GEMM's order::

    y[i, n] = (acc[i, n] * s_row[i]) * w_scale[e, n]          fp32

* gate/up (``GATED``): rows are the pairs' tokens of ``xq`` (T, H) with their ``s_x``; two accumulators
  (gate columns n, up columns N + n), then ``SwiGLU`` into the activation buffer (x's dtype);
* down: rows are the slots of the quantized activation buffer with their scales; the fp32 partial of
  the split goes to the pairs' rows of the partials.

An expert's last block that holds at most ``SHORT_ROWS`` pairs runs SHORT_ROWS-row tiles, as in the grouped
W4A16 kernel (:mod:`compress_kernels.moe.w4a16`).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from compress_kernels.common.launch import launch
from compress_kernels.common.quantize import ONE_PASS_MAX_K, TWO_PASS_BLOCK, non_finite_poison, quantize_int8, row_warps
from compress_kernels.common.tiles import split_k_range, weight_columns
from compress_kernels.moe.blocks import holds_few_pairs, slot_rows, store_activation, store_partial, swiglu
from compress_kernels.moe.dispatch import ProjectionTiles, short_tile_rows
from compress_kernels.moe.routing import Routing


@triton.jit
def _quantize_routed_rows_kernel(
    a_ptr, aq_ptr, sa_ptr, pairs_ptr,  # activation (rows, K), int8 copy (rows, K), scales (rows,), sorted pairs (rows,)
    num_pairs, K, stride_am,
    ONE_PASS: tl.constexpr, BLOCK_K: tl.constexpr,
):
    row = tl.program_id(0)
    if tl.load(pairs_ptr + row) >= num_pairs:  # a padding slot: no pair reads it
        return
    a_row = a_ptr + row.to(tl.int64) * stride_am
    aq_row = aq_ptr + row.to(tl.int64) * K
    offs = tl.arange(0, BLOCK_K)
    if ONE_PASS:  # the whole row in registers, read once
        mask = offs < K
        v = tl.load(a_row + offs, mask=mask, other=0.0).to(tl.float32)
        scale = tl.math.div_rn(tl.max(tl.abs(v), axis=0), 127.0)
        scale = tl.where(scale == 0.0, 1.0, scale)
        tl.store(sa_ptr + row, scale + non_finite_poison(v))
        tl.store(aq_row + offs, quantize_int8(v, scale), mask=mask)
    else:  # an absmax pass, then a quantize pass
        absmax = tl.zeros((BLOCK_K,), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            v = tl.load(a_row + k0 + offs, mask=k0 + offs < K, other=0.0)
            absmax = tl.maximum(absmax, tl.abs(v.to(tl.float32)))
        scale = tl.math.div_rn(tl.max(absmax, axis=0), 127.0)
        scale = tl.where(scale == 0.0, 1.0, scale)
        poison = tl.zeros((BLOCK_K,), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            mask = k0 + offs < K
            v = tl.load(a_row + k0 + offs, mask=mask, other=0.0).to(tl.float32)
            poison += v * 0.0
            tl.store(aq_row + k0 + offs, quantize_int8(v, scale), mask=mask)
        tl.store(sa_ptr + row, scale + tl.sum(poison))


def quantize_routed_rows(act: torch.Tensor, routing: Routing):
    """Per-row int8 of the activation buffer ``act`` (rows, K) at the slots that hold a pair: ``(aq int8
    (rows, K), s_a fp32 (rows,))``; the padding slots' values are left unwritten (no pair reads them)."""
    rows, k = act.shape
    aq = torch.empty((rows, k), dtype=torch.int8, device=act.device)
    s_a = torch.empty((rows,), dtype=torch.float32, device=act.device)
    if rows == 0:
        return aq, s_a
    one_pass = k <= ONE_PASS_MAX_K
    block_k = triton.next_power_of_2(k) if one_pass else min(triton.next_power_of_2(k), TWO_PASS_BLOCK)
    launch(_quantize_routed_rows_kernel, (rows,),
        act, aq, s_a, routing.sorted_pairs, routing.num_pairs, k, act.stride(0),
        ONE_PASS=one_pass, BLOCK_K=block_k, num_warps=row_warps(block_k),
    )
    return aq, s_a


@triton.jit
def _project_rows(
    aq_ptr, sa_ptr, w_ptr, sw_ptr, out_ptr,  # int8 rows, their scales, w_q (E, Nw, K), w_scale (E, Nw), out
    pairs_ptr, first_slot, expert, pid_k,  # sorted pairs, this block's first slot, its expert, the K split
    num_pairs, N, K,  # N output columns (gate/up: I, the up columns at N + n)
    stride_am, stride_ak, stride_we, stride_wn, stride_wk, stride_se, stride_sn, stride_os, stride_om,
    SPLIT_K, TOP_K: tl.constexpr, GATED: tl.constexpr, EVEN_K: tl.constexpr, EVEN_N: tl.constexpr,
    ROWS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """The program's column tile (and K split) for the ROWS slots of the sorted pairs from ``first_slot``."""
    slots, pairs, valid, rows = slot_rows(pairs_ptr, first_slot, num_pairs, GATED, TOP_K, ROWS)
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = weight_columns(offs_n, N, BLOCK_N, EVEN_N).to(tl.int64)
    offs_k = tl.arange(0, BLOCK_K)

    k_first, k_last = split_k_range(pid_k, K, SPLIT_K, BLOCK_K)
    a_ptrs = aq_ptr + rows[:, None] * stride_am + (k_first + offs_k)[None, :] * stride_ak  # (ROWS, BK)
    expert = expert.to(tl.int64)
    w_ptrs = w_ptr + expert * stride_we + cols[None, :] * stride_wn + (k_first + offs_k)[:, None] * stride_wk  # (BK,BN)

    acc = tl.zeros((ROWS, BLOCK_N), dtype=tl.int32)
    acc_up = tl.zeros((ROWS, BLOCK_N), dtype=tl.int32)  # gate/up only
    if GATED:  # every row reads x (a padding slot reads token 0)
        row_ok = slots >= 0
    else:  # the padding slots of the quantized activation were never written (quantize_routed_rows skips them)
        row_ok = valid
    for k0 in range(k_first, k_last, BLOCK_K):
        if EVEN_K:
            a = tl.load(a_ptrs, mask=row_ok[:, None], other=0)
            b = tl.load(w_ptrs)
        else:
            a = tl.load(a_ptrs, mask=row_ok[:, None] & ((k0 + offs_k)[None, :] < k_last), other=0)
            b = tl.load(w_ptrs, mask=(k0 + offs_k)[:, None] < k_last, other=0)
        acc = tl.dot(a, b, acc, out_dtype=tl.int32)
        if GATED:  # the up columns: same rows, the fused weight's second half
            if EVEN_K:
                b = tl.load(w_ptrs + N * stride_wn)
            else:
                b = tl.load(w_ptrs + N * stride_wn, mask=(k0 + offs_k)[:, None] < k_last, other=0)
            acc_up = tl.dot(a, b, acc_up, out_dtype=tl.int32)
        a_ptrs += BLOCK_K * stride_ak
        w_ptrs += BLOCK_K * stride_wk

    s_row = tl.load(sa_ptr + rows, mask=row_ok, other=1.0)  # (ROWS,): the token's scale (gate/up) or the slot's (down)
    s_w = tl.load(sw_ptr + expert * stride_se + cols * stride_sn)
    y = acc.to(tl.float32) * s_row[:, None] * s_w[None, :]
    if GATED:
        s_up = tl.load(sw_ptr + expert * stride_se + (N + cols) * stride_sn)
        y_up = acc_up.to(tl.float32) * s_row[:, None] * s_up[None, :]
        store_activation(swiglu(y, y_up, out_ptr.dtype.element_ty), out_ptr, slots, offs_n, N, stride_om)
    else:
        store_partial(y, out_ptr, pairs, valid, offs_n, N, pid_k, stride_os, stride_om)


@triton.jit
def _moe_w8a8_kernel(
    aq_ptr, sa_ptr, w_ptr, sw_ptr, out_ptr,  # int8 rows, their scales, w_q (E, Nw, K), w_scale (E, Nw), out
    pairs_ptr, expert_ptr,  # routing: sorted pairs (blocks * BLOCK_M,), block experts (blocks,)
    num_pairs, N, K,  # N output columns (gate/up: I, the up columns at N + n)
    stride_am, stride_ak, stride_we, stride_wn, stride_wk, stride_se, stride_sn, stride_os, stride_om,
    SPLIT_K, TOP_K: tl.constexpr, GATED: tl.constexpr, EVEN_K: tl.constexpr, EVEN_N: tl.constexpr,
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
        _project_rows(aq_ptr, sa_ptr, w_ptr, sw_ptr, out_ptr, pairs_ptr, first_slot, expert, pid_k, num_pairs, N, K,
                      stride_am, stride_ak, stride_we, stride_wn, stride_wk, stride_se, stride_sn, stride_os,
                      stride_om, SPLIT_K, TOP_K, GATED, EVEN_K, EVEN_N, SHORT_ROWS, BLOCK_N, BLOCK_K)
    else:
        _project_rows(aq_ptr, sa_ptr, w_ptr, sw_ptr, out_ptr, pairs_ptr, first_slot, expert, pid_k, num_pairs, N, K,
                      stride_am, stride_ak, stride_we, stride_wn, stride_wk, stride_se, stride_sn, stride_os,
                      stride_om, SPLIT_K, TOP_K, GATED, EVEN_K, EVEN_N, BLOCK_M, BLOCK_N, BLOCK_K)


def launch_w8a8(aq, s_a, w_q, w_scale, out, routing: Routing, tiles: ProjectionTiles, gated: bool) -> None:
    """One grouped projection. ``gated``: ``aq`` (T, H) int8 and ``s_a`` (T,) are x quantized per token,
    ``w_q`` the fused gate/up weight (E, 2I, H) and ``out`` the activation buffer (blocks * BLOCK_M, I); else
    ``aq`` / ``s_a`` are that buffer quantized per slot, ``w_q`` the down weight (E, H, I) and ``out`` the
    fp32 partials (SPLIT_K, P, H)."""
    k = aq.shape[1]
    n = w_q.shape[1] // 2 if gated else w_q.shape[1]
    split = 1 if gated else tiles.split_k
    grid = (triton.cdiv(n, tiles.block_n), routing.block_expert.shape[0], split)
    launch(_moe_w8a8_kernel, grid,
        aq, s_a, w_q, w_scale, out, routing.sorted_pairs, routing.block_expert,
        routing.num_pairs, n, k,
        aq.stride(0), aq.stride(1), w_q.stride(0), w_q.stride(1), w_q.stride(2), w_scale.stride(0), w_scale.stride(1),
        0 if gated else out.stride(0), out.stride(-2),
        split, TOP_K=routing.top_k, GATED=gated, EVEN_K=k % (tiles.block_k * split) == 0,
        EVEN_N=n % tiles.block_n == 0, BLOCK_M=routing.block_m, SHORT_ROWS=short_tile_rows(tiles, routing.block_m),
        BLOCK_N=tiles.block_n, BLOCK_K=tiles.block_k,
        num_warps=tiles.num_warps, num_stages=tiles.num_stages,
    )
