"""DDS + W4A16 for one token row per program: 32x32 blocks of int4 weights on CUDA cores (decode).

Layout (:mod:`compress_kernels.bsr_w4a16.op`): ``values`` (nnz, 32, 4) int32, word ``r`` of row ``i`` of
stored block ``b`` (block row ``R``, block column ``col[b]``) holds the int4 weights of output
``32 R + i`` at the input channels ``32 col[b] + 8 r + j``, nibble ``j`` (two's complement), as the
dense W4A16 ``qweight`` packs them; ``scales`` (nnz, 32) holds that row's scale in the block::

    y[m, 32 R + i] = sum_{b in row R} scales[b, i] * sum_{k < 32} x[m, 32 col[b] + k] * q[b, i, k]   (+ bias)

Memory bound: program (n tile, row) owns one row of x and BLOCK_N outputs of one block row (BLOCK_N in
{8, 16, 32}; the sub-rows ``i`` of a block are contiguous in ``values``, 16 bytes each). Each step
gathers GROUP stored blocks as a (4 GROUP, BLOCK_N) tile of packed words (packed row ``4 g + r``: word
``r`` of gathered block ``g``) and the matching (4 GROUP, 8) x values, and multiplies them on CUDA
cores with :func:`compress_kernels.common.int4.tile_partial` (each nibble turned into an exact fp32
value from its bits in place: three instructions per weight). Each packed row's partial sums of 8
products are scaled by their block's scale (read as a (4 GROUP, BLOCK_N) tile: the 4 rows of a block
read the same 32 bytes) and summed along K in fp32. Every stored block is read once per row of x.

With ``split`` > 1, ``split`` programs share one block row's stored blocks (whole GROUP steps each), so a
layer with few block rows still has enough programs in flight; each stores its fp32 partial and the last
one to finish sums them in split order (:func:`compress_kernels.common.splitk.last_split_reduces`, the
same bits on every run).
"""
from __future__ import annotations

import triton
import triton.language as tl

from compress_kernels.common.int4 import tile_partial
from compress_kernels.common.launch import launch
from compress_kernels.common.splitk import last_split_buffers, last_split_reduces
from compress_kernels.common.tiles import block_row_share
from compress_kernels.reference import BSR_BLOCK, BSR_INT4_WORDS


@triton.jit
def _bsr_w4a16_gemv_kernel(
    x_ptr, crow_ptr, col_ptr, val_ptr, s_ptr, bias_ptr, y_ptr,  # x (M, K), BSR, values (nnz, 32, 4), (nnz, 32), (N,)
    ws_ptr, cnt_ptr,  # SPLIT > 1: fp32 partials (SPLIT, M, N), int32 ticket counters (one per output tile)
    M, N, stride_xm, stride_ym,
    SPLIT: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr, GROUP: tl.constexpr, BLOCK: tl.constexpr,
    WORDS: tl.constexpr,
):
    pid_n = tl.program_id(0)  # which BLOCK_N outputs
    row = tl.program_id(1).to(tl.int64)  # which row of x
    pid_s = tl.program_id(2)  # which share of the block row's stored blocks
    block_row, sub, start, end = block_row_share(crow_ptr, pid_n, pid_s, SPLIT, GROUP, BLOCK_N, BLOCK)

    offs_r = tl.arange(0, GROUP * WORDS)  # packed rows of a step: word offs_r % WORDS of block offs_r // WORDS
    word = offs_r % WORDS
    offs_j = tl.arange(0, 8)
    x_row = x_ptr + row * stride_xm
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for p in range(start, end, GROUP):
        blk = p + offs_r // WORDS  # (4 GROUP,)
        valid = blk < end
        col = tl.load(col_ptr + blk, mask=valid, other=0).to(tl.int32)
        w_ptrs = val_ptr + (blk * (BLOCK * WORDS) + word)[:, None] + sub[None, :] * WORDS
        packed = tl.load(w_ptrs, mask=valid[:, None], other=0)  # (4 GROUP, BLOCK_N) int32
        x_ptrs = x_row + (col * BLOCK + 8 * word)[:, None] + offs_j[None, :]
        xt = tl.load(x_ptrs, mask=valid[:, None], other=0.0).to(tl.float32)  # (4 GROUP, 8)
        scale = tl.load(s_ptr + (blk * BLOCK)[:, None] + sub[None, :], mask=valid[:, None], other=0.0)
        acc += tl.sum(tile_partial(packed, xt, GROUP * BLOCK) * scale.to(tl.float32), axis=0)

    offs_n = block_row * BLOCK + sub
    if SPLIT > 1:  # the last share of this row's outputs to finish sums the partials (common.splitk)
        last_split_reduces(acc[None, :], ws_ptr, cnt_ptr, y_ptr, bias_ptr, row + tl.zeros((1,), dtype=tl.int64),
                           offs_n, M, N, stride_ym, row * tl.num_programs(0) + pid_n, pid_s, SPLIT, HAS_BIAS)
    else:
        if HAS_BIAS:
            acc += tl.load(bias_ptr + offs_n).to(tl.float32)
        tl.store(y_ptr + row * stride_ym + offs_n, acc.to(y_ptr.dtype.element_ty))


def launch_gemv(x2, crow_indices, col_indices, values, scales, bias, y, cfg) -> None:
    """The one-row kernel with ``cfg`` on validated operands: ``x2`` (M, K) with unit column stride, ``y`` (M, N)."""
    m = x2.shape[0]
    n = y.shape[1]
    if cfg.kernel != "gemv" or cfg.block_n not in (8, 16, 32) or cfg.prefetch:
        raise ValueError(f"config: expected a 'gemv' BsrConfig with block_n 8, 16 or 32 and no prefetch, got {cfg}")
    grid = (n // cfg.block_n, m, cfg.split)
    workspace, counters = last_split_buffers(y, cfg.split, m, n, grid[0] * grid[1])
    launch(_bsr_w4a16_gemv_kernel, grid,
        x2, crow_indices, col_indices, values, scales, bias if bias is not None else scales, y, workspace, counters,
        m, n, x2.stride(0), y.stride(0),
        SPLIT=cfg.split, HAS_BIAS=bias is not None, BLOCK_N=cfg.block_n, GROUP=cfg.group, BLOCK=BSR_BLOCK,
        WORDS=BSR_INT4_WORDS,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
