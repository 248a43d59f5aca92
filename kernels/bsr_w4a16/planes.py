"""DDS + W4A16 at small M: 32x32 int4 blocks as nibble planes, four stored blocks per 16-deep dot.

Layout as in :mod:`compress_kernels.bsr_w4a16.gemv` (``values`` (nnz, 32, 4) int32: word ``r`` of row ``i``
of a stored block packs its channels ``8 r .. 8 r + 7``; ``scales`` (nnz, 32), one per row of a block).
Program (n tile, m tile, share) owns BLOCK_M rows of x and BLOCK_N outputs of one block row and walks
its stored blocks four at a time (GROUP = 4 or 8 a step). Four gathered blocks ``g = 0..3`` give a
(16, BLOCK_N) tile of packed words, row ``4 g + r`` = word ``r`` of block ``g``. As in the dense W4A16
planes (:mod:`compress_kernels.w4a16.tiled`), plane ``j`` of the packed tile is nibble ``j`` of every
word: channel ``8 r + j`` of block ``g`` at row ``4 g + r``, exact int4 values in x's dtype, unpacked in
registers in the tensor-core operand layout (13 PTX instructions per word,
:func:`compress_kernels.common.int4.nibble_planes`).

A 16-deep dot spans four blocks whose scales differ, so the blocks are kept apart along M: the x tile
has 4 BLOCK_M rows, row ``(g, m)`` holding x row ``m`` at block ``g``'s 32 gathered channels and zeros
at the other blocks' (the load's mask does it: no layout change in registers)::

    xs[(g, m), 32 g' + c] = x[m, 32 col[g] + c] if g' == g else 0
    part[(g, m), i]       = sum_j sum_r xs[(g, m), 8 (4 g + r) + j] * q_j[4 g + r, i]   8 dots, exact q
    acc[(g, m), i]       += part[(g, m), i] * scales[g, i]                                fp32
    y[m, i]               = sum_g acc[(g, m), i]                                            once, at the end

so each block's dot is scaled in fp32 after it, as in the one-row kernel (no rounding of ``q * s``), for
the price of 4 BLOCK_M tensor-core rows (at M <= 4 the 16 rows a tensor-core tile has anyway). Triton's
pipeline carries the words, the column indices and x but not the scale tile (a plain load feeding no dot
operand), so the loop loads the next four blocks' scales one step ahead into registers.
``SPLIT`` > 1 shares a block row's stored blocks among that many programs (whole steps each); the last
to finish sums the fp32 partials in share order and adds the bias (:mod:`compress_kernels.common.splitk`).
Past a block row's last block a step reads zeros (masked words are q = 0, masked x and scales 0).

Triton's CPU interpreter cannot run inline PTX, so there the planes come from plain shifts; with bf16
it also multiplies fp32 copies of the operands (its bf16 arithmetic works on raw bits).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from compress_kernels.bsr.gemm import runs_of_block
from compress_kernels.common.checks import interpreting
from compress_kernels.common.int4 import plane_products
from compress_kernels.common.launch import launch
from compress_kernels.common.splitk import last_split_buffers, write_tile
from compress_kernels.common.tiles import block_row_share
from compress_kernels.reference import BSR_BLOCK, BSR_INT4_WORDS

BLOCKS_PER_DOT = 4  # stored blocks whose 4 words a row make one plane 16 deep
ROW_TILES = (4, 8, 16)  # rows of x per program: 4 BLOCK_M tensor-core rows, at least the 16 of one tile


@triton.jit
def _block_scales(s_ptr, first, end, sub, BLOCK_M: tl.constexpr, BLOCK: tl.constexpr):
    """(4 BLOCK_M, BLOCK_N) scales of stored blocks ``first .. first + 3`` for the stacked rows (g, m): block g's."""
    blk = first + tl.arange(0, 4 * BLOCK_M) // BLOCK_M
    return tl.load(s_ptr + (blk * BLOCK)[:, None] + sub[None, :], mask=(blk < end)[:, None], other=0.0)


@triton.jit
def _four_blocks(acc, scale, x_rows, x_mask, col_ptr, val_ptr, first, end, sub, FP32_OPERANDS: tl.constexpr,
                 ASM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK: tl.constexpr,
                 WORDS: tl.constexpr):
    """acc (4 BLOCK_M, BLOCK_N) + stored blocks ``first .. first + 3`` (those before ``end``), each block's
    rows of the stacked x tile times its planes, scaled by ``scale`` (:func:`_block_scales`)."""
    offs_r = tl.arange(0, 4 * WORDS)  # packed rows: word offs_r % WORDS of block offs_r // WORDS
    blk_r = first + offs_r // WORDS
    packed = tl.load(val_ptr + (blk_r * (BLOCK * WORDS) + offs_r % WORDS)[:, None] + sub[None, :] * WORDS,
                     mask=(blk_r < end)[:, None], other=0)  # (16, BLOCK_N) int32
    offs_k = tl.arange(0, 4 * BLOCK)  # x columns: channel offs_k % 32 of block offs_k // 32
    blk_k = first + offs_k // BLOCK
    valid_k = blk_k < end
    col = tl.load(col_ptr + blk_k, mask=valid_k, other=0).to(tl.int32)
    stacked = tl.arange(0, 4 * BLOCK_M) // BLOCK_M  # the block g of each stacked row
    keep = (stacked[:, None] == (offs_k // BLOCK)[None, :]) & x_mask[:, None] & valid_k[None, :]
    a = tl.load(x_rows + runs_of_block(col * BLOCK + offs_k % BLOCK, BLOCK)[None, :], mask=keep, other=0.0)
    part = plane_products(a, packed, ASM, FP32_OPERANDS, 4 * BLOCK_M, BLOCK_N, 4 * BLOCK)
    return acc + part * scale.to(tl.float32)


@triton.jit
def _bsr_w4a16_planes_kernel(
    x_ptr, crow_ptr, col_ptr, val_ptr, s_ptr, bias_ptr, y_ptr,  # x (M, K), BSR, values (nnz, 32, 4), (nnz, 32), (N,)
    ws_ptr, cnt_ptr,  # SPLIT > 1: fp32 partials (SPLIT, M, N), int32 ticket counters (one per output tile)
    M, N, stride_xm, stride_ym,
    SPLIT: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    GROUP: tl.constexpr, BLOCK: tl.constexpr, WORDS: tl.constexpr, FP32_OPERANDS: tl.constexpr, ASM: tl.constexpr,
):
    pid_m = tl.program_id(0)  # which BLOCK_M rows of x (fastest: the M tiles of one block row read it together)
    pid_n = tl.program_id(1)  # which BLOCK_N outputs
    pid_s = tl.program_id(2)  # which share of the block row's stored blocks
    block_row, sub, start, end = block_row_share(crow_ptr, pid_n, pid_s, SPLIT, GROUP, BLOCK_N, BLOCK)

    first_row = pid_m * BLOCK_M
    stacked_m = tl.arange(0, 4 * BLOCK_M) % BLOCK_M  # the x row of each stacked row (g, m)
    x_mask = stacked_m < M - first_row
    x_rows = x_ptr + first_row.to(tl.int64) * stride_xm + stacked_m[:, None] * stride_xm  # (4 BLOCK_M, 1)

    acc = tl.zeros((4 * BLOCK_M, BLOCK_N), dtype=tl.float32)
    scale_next = _block_scales(s_ptr, start, end, sub, BLOCK_M, BLOCK)
    for p in range(start, end, GROUP):
        for g in tl.static_range(0, GROUP, 4):  # BLOCKS_PER_DOT blocks a dot
            scale = scale_next  # the next four blocks' scales are in flight while these four multiply
            scale_next = _block_scales(s_ptr, p + g + 4, end, sub, BLOCK_M, BLOCK)
            acc = _four_blocks(acc, scale, x_rows, x_mask, col_ptr, val_ptr, p + g, end, sub,
                               FP32_OPERANDS, ASM, BLOCK_M, BLOCK_N, BLOCK, WORDS)
    y = tl.sum(tl.reshape(acc, (4, BLOCK_M, BLOCK_N)), axis=0)  # the four blocks' rows of each x row

    offs_m = tl.arange(0, BLOCK_M)
    offs_n = block_row * BLOCK + sub
    # the tile itself, or with SPLIT > 1 its fp32 partial, summed by the last share to finish (common.splitk)
    write_tile(y, ws_ptr if SPLIT > 1 else y_ptr, cnt_ptr, y_ptr, bias_ptr, offs_n, first_row + offs_m, offs_n,
               M, N, 0, stride_ym, stride_ym, pid_n * tl.num_programs(0) + pid_m, pid_s, SPLIT, HAS_BIAS)


def launch_planes(x2, crow_indices, col_indices, values, scales, bias, y, cfg) -> None:
    """The planes kernel with ``cfg`` on validated operands: ``x2`` (M, K) with unit column stride, ``y`` (M, N)."""
    m = x2.shape[0]
    n = y.shape[1]
    if (cfg.kernel != "planes" or cfg.block_m not in ROW_TILES or cfg.block_n not in (16, 32)
            or cfg.group % BLOCKS_PER_DOT or cfg.prefetch):
        raise ValueError(f"config: expected a 'planes' BsrConfig with block_m in {ROW_TILES}, block_n 16 or 32, "
                         f"group a multiple of {BLOCKS_PER_DOT} and no prefetch, got {cfg}")
    interpret = interpreting()
    grid = (triton.cdiv(m, cfg.block_m), n // cfg.block_n, cfg.split)
    workspace, counters = last_split_buffers(y, cfg.split, m, n, grid[0] * grid[1])
    launch(_bsr_w4a16_planes_kernel, grid,
        x2, crow_indices, col_indices, values, scales, bias if bias is not None else scales, y, workspace, counters,
        m, n, x2.stride(0), y.stride(0),
        SPLIT=cfg.split, HAS_BIAS=bias is not None, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, GROUP=cfg.group,
        BLOCK=BSR_BLOCK, WORDS=BSR_INT4_WORDS, FP32_OPERANDS=interpret and x2.dtype == torch.bfloat16,
        ASM=not interpret, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
