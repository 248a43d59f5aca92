"""DDS for one token row per program: 32x32 block-sparse fp16/bf16 weights on CUDA cores (small M).

Layout as in :mod:`compress_kernels.bsr.gemm` (``values[b, i, j] = W[32 r + i, 32 col[b] + j]`` for
the stored blocks ``crow[r] <= b < crow[r + 1]``). Memory bound: program (n tile, row) owns one row
of x and BLOCK_N outputs of one block row (BLOCK_N in {8, 16, 32}). Splitting a block row's 32
outputs over several programs keeps every SM streaming weights even when N/32 is small, without
atomics (the sub-rows ``i`` of a block are contiguous in ``values``). Each step gathers GROUP stored
blocks: a (BLOCK_N, 32 GROUP) weight tile and the matching 32 GROUP entries of x, multiplied on the
CUDA cores in fp32 and reduced along K::

    y[m, 32 r + i] = sum_{b in row r} sum_j x[m, 32 col[b] + j] * values[b, i, j]   (+ bias)

``PREFETCH_BYTES`` > 0: the first program of each block row asks for the first PREFETCH_BYTES of the
row's stored blocks (contiguous in ``values``) to be brought into L2 before its loop
(:mod:`compress_kernels.common.prefetch`), so the DRAM reads start before the chain of dependent
index -> data loads.
"""
from __future__ import annotations

import triton
import triton.language as tl

from compress_kernels.bsr.gemm import runs_of_block
from compress_kernels.common.launch import launch
from compress_kernels.common.prefetch import prefetch_allowed, prefetch_range
from compress_kernels.reference import BSR_BLOCK


@triton.jit
def prefetch_blocks(val_ptr, start, end, BLOCK: tl.constexpr, PREFETCH_BYTES: tl.constexpr):
    """Ask for the first PREFETCH_BYTES of the stored blocks ``start <= b < end`` (contiguous in values)
    to be brought into L2 (common.prefetch)."""
    block_bytes = BLOCK * BLOCK * (val_ptr.dtype.element_ty.primitive_bitwidth // 8)
    prefetch_range(val_ptr + start * (BLOCK * BLOCK), (end - start) * block_bytes, PREFETCH_BYTES)


@triton.jit
def _bsr_gemv_kernel(
    x_ptr, crow_ptr, col_ptr, val_ptr, bias_ptr, y_ptr,  # x (M, K), crow, col, values (nnz,32,32), bias (N,), y (M, N)
    stride_xm, stride_ym,
    HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr, GROUP: tl.constexpr, BLOCK: tl.constexpr,
    PREFETCH_BYTES: tl.constexpr,
):
    pid_n = tl.program_id(0)  # which BLOCK_N outputs
    row = tl.program_id(1).to(tl.int64)  # which row of x
    block_row = (pid_n * BLOCK_N) // BLOCK
    sub = (pid_n * BLOCK_N) % BLOCK + tl.arange(0, BLOCK_N)  # output rows inside the block, (BLOCK_N,)
    start = tl.load(crow_ptr + block_row).to(tl.int32)
    end = tl.load(crow_ptr + block_row + 1).to(tl.int32)
    if PREFETCH_BYTES > 0:  # the block row's stored blocks, asked for once (first sub-row, first x row)
        if (pid_n * BLOCK_N) % BLOCK == 0 and row == 0:
            prefetch_blocks(val_ptr, start, end, BLOCK, PREFETCH_BYTES)

    offs_k = tl.arange(0, GROUP * BLOCK)  # gathered K positions
    k_block = offs_k // BLOCK  # which of the GROUP blocks, (32 GROUP,)
    k_in = offs_k % BLOCK  # column inside that block
    x_row = x_ptr + row * stride_xm
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for p in range(start, end, GROUP):
        blk = p + k_block
        valid = blk < end
        col = tl.load(col_ptr + blk, mask=valid, other=0).to(tl.int32)
        x_k = runs_of_block(col * BLOCK + k_in, BLOCK)  # x columns of the gathered blocks
        w_k = runs_of_block(blk * (BLOCK * BLOCK) + k_in, BLOCK)  # first row of each gathered block
        xv = tl.load(x_row + x_k, mask=valid, other=0.0)  # (32 GROUP,)
        # (BLOCK_N, 32 GROUP)
        w = tl.load(val_ptr + w_k[None, :] + sub[:, None] * BLOCK, mask=valid[None, :], other=0.0)
        acc += tl.sum(w.to(tl.float32) * xv.to(tl.float32)[None, :], axis=1)

    offs_n = block_row * BLOCK + sub
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_n).to(tl.float32)
    tl.store(y_ptr + row * stride_ym + offs_n, acc.to(y_ptr.dtype.element_ty))


def launch_gemv(x2, crow_indices, col_indices, values, bias, y, cfg) -> None:
    """The one-row kernel with ``cfg`` on validated operands: ``x2`` (M, K) with unit column stride, ``y`` (M, N)."""
    m = x2.shape[0]
    n = y.shape[1]
    if cfg.prefetch and not prefetch_allowed(values):
        raise ValueError(f"config: prefetch={cfg.prefetch} needs values a 16-byte aligned contiguous CUDA "
                         f"tensor on sm_90 or later (never in the interpreter), got device {values.device}")
    grid = (n // cfg.block_n, m)
    launch(_bsr_gemv_kernel, grid,
        x2, crow_indices, col_indices, values, bias if bias is not None else y, y, x2.stride(0), y.stride(0),
        HAS_BIAS=bias is not None, BLOCK_N=cfg.block_n, GROUP=cfg.group, BLOCK=BSR_BLOCK,
        PREFETCH_BYTES=cfg.prefetch, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
