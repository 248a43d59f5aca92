"""DDS + W4A16 tensor-core tiles: fp16/bf16 activations x 32x32 blocks of int4 weights, one block per dot.

Layout as in :mod:`compress_kernels.bsr_w4a16.gemv` (``values`` (nnz, 32, 4) int32: word ``r`` of row ``i``
of a stored block packs its channels ``8 r .. 8 r + 7``; ``scales`` (nnz, 32), one per row of a block).
Program (n tile, m tile, share) owns BLOCK_M rows of x and BLOCK_N outputs of one block row. For each
stored block of its share (GROUP of them per loop step, each loaded and multiplied on its own)::

    acc[m, i] += scales[b, i] * sum_{k < 32} x[m, 32 col[b] + k] * q[b, i, k]

as one 32-deep ``tl.dot``: the (BLOCK_M, 32) x tile times the block's (32, BLOCK_N) int4 values, unpacked
in registers to x's dtype (:func:`compress_kernels.common.int4.unpack_int4_tile`: exact, -8..7), then
scaled in fp32. A block's 32 channels share one scale per row, so the dot's operands are exact integers
and x, and the scale multiplies its fp32 result: no rounding of ``q * s`` to x's dtype. Up to 16 rows
one M tile covers every token, so each stored block is read once per launch (the decode case); more
rows take more M tiles (programs of one M tile run together, so x stays in L2 while every block row
reads it). ``SPLIT`` > 1 shares a block row's stored blocks among that many programs (whole GROUP steps
each); the last to finish sums the fp32 partials in share order and adds the bias
(:mod:`compress_kernels.common.splitk`). An empty block row gives zeros (or the bias).

Interpreter note: as for the DDS tiles, Triton's CPU interpreter multiplies the raw bits of bf16
``tl.dot`` operands, so under ``TRITON_INTERPRET=1`` bf16 tiles are upcast to fp32 before the dot.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from compress_kernels.common.checks import interpreting
from compress_kernels.common.int4 import unpack_int4_tile
from compress_kernels.common.launch import launch
from compress_kernels.common.splitk import last_split_buffers, write_tile
from compress_kernels.common.tiles import block_row_share
from compress_kernels.reference import BSR_BLOCK, BSR_INT4_WORDS


@triton.jit
def _bsr_w4a16_gemm_kernel(
    x_ptr, crow_ptr, col_ptr, val_ptr, s_ptr, bias_ptr, y_ptr,  # x (M, K), BSR, values (nnz, 32, 4), (nnz, 32), (N,)
    ws_ptr, cnt_ptr,  # SPLIT > 1: fp32 partials (SPLIT, M, N), int32 ticket counters (one per output tile)
    M, N, stride_xm, stride_ym,
    SPLIT: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    GROUP: tl.constexpr, BLOCK: tl.constexpr, WORDS: tl.constexpr, DOT_IN_FP32: tl.constexpr,
):
    pid_n = tl.program_id(0)  # which BLOCK_N outputs (fastest: programs of one M tile run together)
    pid_m = tl.program_id(1)  # which BLOCK_M rows of x
    pid_s = tl.program_id(2)  # which share of the block row's stored blocks
    block_row, sub, start, end = block_row_share(crow_ptr, pid_n, pid_s, SPLIT, GROUP, BLOCK_N, BLOCK)

    first_row = pid_m * BLOCK_M
    offs_m = tl.arange(0, BLOCK_M)
    m_mask = offs_m < M - first_row  # (BLOCK_M,)
    x_ptr += first_row.to(tl.int64) * stride_xm
    offs_k = tl.arange(0, BLOCK)  # the 32 channels of one block
    offs_w = tl.arange(0, WORDS)  # its 4 words per row

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for p in range(start, end, GROUP):
        for g in tl.static_range(GROUP):
            blk = p + g + tl.zeros((1,), dtype=tl.int32)  # (1,): a tensor, so the masks below broadcast
            valid = blk < end
            col = tl.load(col_ptr + blk, mask=valid, other=0).to(tl.int32)
            a = tl.load(x_ptr + offs_m[:, None] * stride_xm + (col * BLOCK + offs_k)[None, :],
                        mask=m_mask[:, None] & valid[None, :], other=0.0)  # (BLOCK_M, 32)
            w_ptrs = val_ptr + (blk * (BLOCK * WORDS))[:, None] + offs_w[:, None] + sub[None, :] * WORDS
            packed = tl.load(w_ptrs, mask=valid[:, None], other=0)  # (4, BLOCK_N) int32
            s = tl.load(s_ptr + blk * BLOCK + sub, mask=valid, other=0.0).to(tl.float32)  # (BLOCK_N,)
            if DOT_IN_FP32:  # interpreter only: its tl.dot multiplies the raw bits of bf16 operands
                w = unpack_int4_tile(packed, BLOCK, BLOCK_N, tl.float32)
                part = tl.dot(a.to(tl.float32), w)
            else:
                w = unpack_int4_tile(packed, BLOCK, BLOCK_N, a.dtype)  # (32, BLOCK_N), exact
                part = tl.dot(a, w)
            acc += part * s[None, :]

    offs_n = block_row * BLOCK + sub
    # the tile itself, or with SPLIT > 1 its fp32 partial, summed by the last share to finish (common.splitk)
    write_tile(acc, ws_ptr if SPLIT > 1 else y_ptr, cnt_ptr, y_ptr, bias_ptr, offs_n, first_row + offs_m, offs_n,
               M, N, 0, stride_ym, stride_ym, pid_m * tl.num_programs(0) + pid_n, pid_s, SPLIT, HAS_BIAS)


def launch_gemm(x2, crow_indices, col_indices, values, scales, bias, y, cfg) -> None:
    """The tile kernel with ``cfg`` on validated operands: ``x2`` (M, K) with unit column stride, ``y`` (M, N)."""
    m = x2.shape[0]
    n = y.shape[1]
    if cfg.kernel != "gemm" or cfg.block_m < 16 or cfg.block_n not in (16, 32) or cfg.prefetch:
        raise ValueError(f"config: expected a 'gemm' BsrConfig with block_m >= 16, block_n 16 or 32 and no "
                         f"prefetch, got {cfg}")
    grid = (n // cfg.block_n, triton.cdiv(m, cfg.block_m), cfg.split)
    workspace, counters = last_split_buffers(y, cfg.split, m, n, grid[0] * grid[1])
    launch(_bsr_w4a16_gemm_kernel, grid,
        x2, crow_indices, col_indices, values, scales, bias if bias is not None else scales, y, workspace, counters,
        m, n, x2.stride(0), y.stride(0),
        SPLIT=cfg.split, HAS_BIAS=bias is not None, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, GROUP=cfg.group,
        BLOCK=BSR_BLOCK, WORDS=BSR_INT4_WORDS, DOT_IN_FP32=interpreting() and x2.dtype == torch.bfloat16,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
