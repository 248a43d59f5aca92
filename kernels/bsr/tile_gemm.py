"""DDS at large M on tiled block patterns: output tiles of 32 R outputs over R block rows sharing their columns.

Pattern. ``BlockSparseConfig(tile_rows=R)`` prunes 32x32 blocks in tiles of R consecutive block rows x one
block column, so the R block rows of a tile (rows ``R t .. R t + R - 1``, the last tile of a layer possibly
shorter) store blocks at the same block columns, in the same order
(:func:`compress_kernels.bsr.indices.tile_rows_of` checks it). The free-block kernel
(:mod:`compress_kernels.bsr.gemm`) gives each program one block row, 32 outputs wide, so at large M every
gathered x tile is read once per block row; here one program covers the tile's 32 R outputs and reads
each x tile once for all R block rows, the arithmetic intensity of a dense (BLOCK_M x 32 R) tile.

Program (tile t, m tile) walks the stored blocks of the tile's first block row, GROUP at a time::

    acc[m, 32 j + i] += sum_{p in step} sum_c x[m, 32 col[crow[R t] + p] + c] * values[crow[R t + j] + p, i, c]

``x[m_tile, gathered columns]`` (BLOCK_M, 32 GROUP) times the R rows' blocks at the same positions, transposed
(32 GROUP, 32 R): one ``tl.dot`` per step, fp32 accumulation, the bias added in the epilogue. Programs of one
M tile are launched together (tile index fastest), so the x tile stays in L2 while every tile reads it.
The index values must hold the pattern: indices that do not give wrong outputs (the launcher's index check
verifies it).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from compress_kernels.bsr.gemm import runs_of_block
from compress_kernels.common.checks import interpreting
from compress_kernels.common.launch import launch
from compress_kernels.reference import BSR_BLOCK


@triton.jit
def _bsr_tile_gemm_kernel(
    x_ptr, crow_ptr, col_ptr, val_ptr, bias_ptr, y_ptr,  # x (M, K), crow, col, values (nnz,32,32), bias (N,), y (M, N)
    M, N, stride_xm, stride_ym,
    TILE_ROWS: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, GROUP: tl.constexpr,
    BLOCK: tl.constexpr, DOT_IN_FP32: tl.constexpr,
):
    pid_t = tl.program_id(0)  # which tile of TILE_ROWS block rows (fastest)
    pid_m = tl.program_id(1)  # which BLOCK_M rows of x
    first_block_row = pid_t * TILE_ROWS
    start = tl.load(crow_ptr + first_block_row)
    count = tl.load(crow_ptr + first_block_row + 1) - start  # every block row of the tile stores this many

    offs_n = first_block_row * BLOCK + tl.arange(0, TILE_ROWS * BLOCK)  # the tile's outputs
    n_mask = offs_n < N  # a short last tile
    row_start = tl.load(crow_ptr + offs_n // BLOCK, mask=n_mask, other=0)  # each output's block row's first block
    w_n = row_start * (BLOCK * BLOCK) + (offs_n % BLOCK) * BLOCK  # (32 R,) its row inside the block

    first_row = pid_m * BLOCK_M
    x_ptr += first_row.to(tl.int64) * stride_xm
    y_ptr += first_row.to(tl.int64) * stride_ym
    offs_m = tl.arange(0, BLOCK_M)
    m_mask = offs_m < M - first_row
    offs_k = tl.arange(0, GROUP * BLOCK)
    k_block = offs_k // BLOCK
    k_in = offs_k % BLOCK

    acc = tl.zeros((BLOCK_M, TILE_ROWS * BLOCK), dtype=tl.float32)
    for p in range(0, count, GROUP):
        place = p + k_block  # (32 GROUP,) position within each block row's stored blocks
        valid = place < count
        col = tl.load(col_ptr + start + place, mask=valid, other=0).to(tl.int32)
        x_k = runs_of_block(col * BLOCK + k_in, BLOCK)
        w_k = runs_of_block(place * (BLOCK * BLOCK) + k_in, BLOCK)
        a = tl.load(x_ptr + offs_m[:, None] * stride_xm + x_k[None, :], mask=m_mask[:, None] & valid[None, :],
                    other=0.0)  # (BLOCK_M, 32 GROUP)
        b = tl.load(val_ptr + w_k[:, None] + w_n[None, :], mask=valid[:, None] & n_mask[None, :],
                    other=0.0)  # (32 GROUP, 32 R) = the R rows' blocks, transposed
        if DOT_IN_FP32:  # interpreter only: its tl.dot multiplies the raw bits of bf16 operands
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(a, b, acc)

    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
    y_ptrs = y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :]
    tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=m_mask[:, None] & n_mask[None, :])


def launch_tile_gemm(x2, crow_indices, col_indices, values, bias, y, cfg, tile_rows: int) -> None:
    """The tile kernel with ``cfg`` on validated operands whose indices hold the ``tile_rows`` pattern:
    ``x2`` (M, K) with unit column stride, ``y`` (M, N)."""
    m, n = x2.shape[0], y.shape[1]
    if cfg.block_n != tile_rows * BSR_BLOCK or cfg.split != 1 or cfg.prefetch:
        raise ValueError(f"config: the tile kernel takes block_n = 32 * tile_rows ({tile_rows * BSR_BLOCK}), no "
                         f"split and no prefetch, got {cfg}")
    grid = (triton.cdiv(n // BSR_BLOCK, tile_rows), triton.cdiv(m, cfg.block_m))
    launch(_bsr_tile_gemm_kernel, grid,
        x2, crow_indices, col_indices, values, bias if bias is not None else y, y,
        m, n, x2.stride(0), y.stride(0), TILE_ROWS=tile_rows, HAS_BIAS=bias is not None, BLOCK_M=cfg.block_m,
        GROUP=cfg.group, BLOCK=BSR_BLOCK, DOT_IN_FP32=interpreting() and x2.dtype == torch.bfloat16,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
