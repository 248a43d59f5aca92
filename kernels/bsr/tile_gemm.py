"""DDS at large M on tiled block patterns: output tiles of 32 R outputs over R block rows sharing their columns.

Pattern. ``BlockSparseConfig(tile_rows=R)`` prunes 32x32 blocks in tiles of R consecutive block rows x one
block column, so the R block rows of a tile (rows ``R t .. R t + R - 1``, the last tile of a layer possibly
shorter) store blocks at the same block columns, in the same order
(:func:`compress_kernels.bsr.indices.tile_rows_of` checks it). The free-block kernel
(:mod:`compress_kernels.bsr.gemm`) gives each program one block row, 32 outputs wide, so at large M every
gathered x tile is read once per block row; here one program covers the tile's 32 R outputs and reads
each x tile once for all R block rows, the arithmetic intensity of a dense (BLOCK_M x 32 R) tile.

Program (tile t, m tile) walks the stored blocks of the tile's first block row, one per step::

    acc[m, 32 j + i] += sum_c x[m, 32 col[crow[R t] + p] + c] * values[crow[R t + j] + p, i, c]

``x[m_tile, 32 col : 32 col + 32]`` (BLOCK_M, 32) comes through a tensor descriptor (TMA: the copy engine
fetches the box at the gathered column, zero-filling past M, with no per-element addresses), the R rows'
blocks at the same position, transposed (32, 32 R), through pointers: one ``tl.dot`` per step, fp32
accumulation, the bias added in the epilogue. Each step is small (32 deep), so the pipeline runs many steps
ahead (``num_stages`` 6-8: H200, 4096x4096 at M = 2,048, 50%: 4 stages 0.89x cuBLAS, 6 1.38x, 8 1.40x).
Programs are rastered in groups of ``GROUP_M`` M tiles (:func:`compress_kernels.common.tiles.grouped_tile`),
so the programs running together share both their x tiles and their weight tiles in L2 (8192x28672 at
M = 2,048, 50%: 1.16x -> 1.45x cuBLAS against M tiles in order). Descriptors need Hopper or newer (the
dispatch table takes the free-block kernels elsewhere); Triton's interpreter runs them on the CPU. The index
values must hold the pattern: indices that do not give wrong outputs (the launcher's index check verifies it).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from compress_kernels.bsr.gemm import runs_of_block
from compress_kernels.common.checks import interpreting
from compress_kernels.common.device import tma_describable
from compress_kernels.common.launch import launch
from compress_kernels.common.tiles import grouped_tile
from compress_kernels.reference import BSR_BLOCK

GROUP_M = 8  # M tiles per raster group


@triton.jit
def _bsr_tile_gemm_kernel(
    x_desc, crow_ptr, col_ptr, val_ptr, bias_ptr, y_ptr,  # x (M, K) descriptor, crow, col, values (nnz,32,32), bias, y
    M, N, stride_ym,
    TILE_ROWS: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, GROUP_M: tl.constexpr,
    BLOCK: tl.constexpr, DOT_IN_FP32: tl.constexpr,
):
    pid_m, pid_t = grouped_tile(tl.program_id(0), M, N, BLOCK_M, TILE_ROWS * BLOCK, GROUP_M)
    first_block_row = pid_t * TILE_ROWS
    start = tl.load(crow_ptr + first_block_row)
    count = tl.load(crow_ptr + first_block_row + 1) - start  # every block row of the tile stores this many

    offs_n = first_block_row * BLOCK + tl.arange(0, TILE_ROWS * BLOCK)  # the tile's outputs
    n_mask = offs_n < N  # a short last tile
    row_start = tl.load(crow_ptr + offs_n // BLOCK, mask=n_mask, other=0)  # each output's block row's first block
    w_n = row_start * (BLOCK * BLOCK) + (offs_n % BLOCK) * BLOCK  # (32 R,) its row inside the block
    k_in = tl.arange(0, BLOCK)
    first_row = pid_m * BLOCK_M

    acc = tl.zeros((BLOCK_M, TILE_ROWS * BLOCK), dtype=tl.float32)
    for p in range(0, count):
        col = tl.load(col_ptr + start + p).to(tl.int32)  # int32 or int64 indices
        a = x_desc.load([first_row, col * BLOCK])  # (BLOCK_M, 32), zeros past M
        w_k = runs_of_block(p * (BLOCK * BLOCK) + k_in, BLOCK)
        b = tl.load(val_ptr + w_k[:, None] + w_n[None, :], mask=n_mask[None, :], other=0.0)  # (32, 32 R)
        if DOT_IN_FP32:  # interpreter only: its tl.dot multiplies the raw bits of bf16 operands
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(a, b, acc)

    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
    offs_m = first_row + tl.arange(0, BLOCK_M)
    y_ptrs = y_ptr + offs_m[:, None].to(tl.int64) * stride_ym + offs_n[None, :]
    tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=(offs_m < M)[:, None] & n_mask[None, :])


def launch_tile_gemm(x2, crow_indices, col_indices, values, bias, y, cfg, tile_rows: int) -> None:
    """The tile kernel with ``cfg`` on validated operands whose indices hold the ``tile_rows`` pattern:
    ``x2`` (M, K) with unit column stride (copied first when a descriptor cannot hold it), ``y`` (M, N)."""
    m, n = x2.shape[0], y.shape[1]
    if cfg.block_n != tile_rows * BSR_BLOCK or cfg.group != 1 or cfg.split != 1 or cfg.prefetch:
        raise ValueError(f"config: the tile kernel takes block_n = 32 * tile_rows ({tile_rows * BSR_BLOCK}), one "
                         f"block a step (group 1), no split and no prefetch, got {cfg}")
    if not tma_describable(x2):
        x2 = x2.clone(memory_format=torch.contiguous_format)
    x_desc = TensorDescriptor.from_tensor(x2, [cfg.block_m, BSR_BLOCK])
    grid = (triton.cdiv(n // BSR_BLOCK, tile_rows) * triton.cdiv(m, cfg.block_m),)
    launch(_bsr_tile_gemm_kernel, grid,
        x_desc, crow_indices, col_indices, values, bias if bias is not None else y, y,
        m, n, y.stride(0), TILE_ROWS=tile_rows, HAS_BIAS=bias is not None, BLOCK_M=cfg.block_m, GROUP_M=GROUP_M,
        BLOCK=BSR_BLOCK, DOT_IN_FP32=interpreting() and x2.dtype == torch.bfloat16,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
