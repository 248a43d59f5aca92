"""DDS tensor-core tiles: dense activations x 32x32 block-sparse fp16/bf16 weights, gathered blocks.

Layout (as ``torch.sparse_bsr`` with 32x32 blocks, see :mod:`compress_kernels.bsr.op`): ``crow``
(N/32 + 1,) over block rows, ``col`` (nnz,) block columns, ``values`` (nnz, 32, 32) with
``values[b, i, j] = W[32 r + i, 32 col[b] + j]`` for the stored blocks ``crow[r] <= b < crow[r + 1]``.

Program (n tile, m tile, share) owns BLOCK_M rows of x and BLOCK_N outputs of one block row. Each step
gathers GROUP stored blocks into one K tile of width 32 GROUP::

    acc[m, i] += sum_{b in step} sum_j x[m, 32 col[b] + j] * values[b, i, j]      one tl.dot, fp32

as ``x[m_tile, gathered columns]`` (BLOCK_M, 32 GROUP) times the transposed blocks (32 GROUP,
BLOCK_N). Programs with the same M tile are launched together (the block-row index varies fastest),
so that x tile stays in L2 while every block row reads it. ``SPLIT`` > 1 shares a block row's stored
blocks among that many programs (whole GROUP steps each), so a layer with few block rows still fills
the GPU; the last program of each output tile to finish sums the fp32 partials in share order and
adds the bias (:mod:`compress_kernels.common.splitk`). An empty block row gives zeros (or the bias).

Interpreter note: Triton's CPU interpreter multiplies the raw bits of bf16 ``tl.dot`` operands
(bf16 is stored as uint16 there), so under ``TRITON_INTERPRET=1`` bf16 tiles are upcast to fp32
before the dot (``DOT_IN_FP32``); on the GPU the dot runs in bf16.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from compress_kernels.common.checks import interpreting
from compress_kernels.common.launch import launch
from compress_kernels.common.splitk import last_split_buffers, write_tile
from compress_kernels.common.tiles import block_row_share
from compress_kernels.reference import BSR_BLOCK


@triton.jit
def runs_of_block(offsets, BLOCK: tl.constexpr):
    """Tell the compiler that ``offsets`` are runs of BLOCK consecutive values, each starting at a
    multiple of BLOCK (true for ``32 * index + (arange % 32)``). Triton cannot see this through the
    gathered block indices, and without it the gathers become 2-byte loads instead of 16-byte ones."""
    return tl.max_contiguous(tl.multiple_of(offsets, BLOCK), BLOCK)


@triton.jit
def _bsr_gemm_kernel(
    x_ptr, crow_ptr, col_ptr, val_ptr, bias_ptr, y_ptr,  # x (M, K), crow, col, values (nnz,32,32), bias (N,), y (M, N)
    ws_ptr, cnt_ptr,  # SPLIT > 1: fp32 partials (SPLIT, M, N), int32 ticket counters (one per output tile)
    M, N, stride_xm, stride_ym,
    SPLIT: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP: tl.constexpr,
    BLOCK: tl.constexpr, DOT_IN_FP32: tl.constexpr,
):
    pid_n = tl.program_id(0)  # which BLOCK_N outputs (fastest: programs of one M tile run together)
    pid_m = tl.program_id(1)  # which BLOCK_M rows of x
    pid_s = tl.program_id(2)  # which share of the block row's stored blocks
    block_row, sub, start, end = block_row_share(crow_ptr, pid_n, pid_s, SPLIT, GROUP, BLOCK_N, BLOCK)

    first_row = pid_m * BLOCK_M
    x_ptr += first_row.to(tl.int64) * stride_xm
    offs_m = tl.arange(0, BLOCK_M)
    m_mask = offs_m < M - first_row  # (BLOCK_M,)
    offs_k = tl.arange(0, GROUP * BLOCK)
    k_block = offs_k // BLOCK
    k_in = offs_k % BLOCK

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for p in range(start, end, GROUP):
        blk = p + k_block  # (32 GROUP,)
        valid = blk < end
        col = tl.load(col_ptr + blk, mask=valid, other=0).to(tl.int32)
        x_k = runs_of_block(col * BLOCK + k_in, BLOCK)
        w_k = runs_of_block(blk * (BLOCK * BLOCK) + k_in, BLOCK)
        a_ptrs = x_ptr + offs_m[:, None] * stride_xm + x_k[None, :]
        a = tl.load(a_ptrs, mask=m_mask[:, None] & valid[None, :], other=0.0)  # (BLOCK_M, 32 GROUP)
        b_ptrs = val_ptr + w_k[:, None] + sub[None, :] * BLOCK
        b = tl.load(b_ptrs, mask=valid[:, None], other=0.0)  # (32 GROUP, BLOCK_N) = blocks transposed
        if DOT_IN_FP32:  # interpreter only: its tl.dot multiplies the raw bits of bf16 operands
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(a, b, acc)

    offs_n = block_row * BLOCK + sub
    # the tile itself, or with SPLIT > 1 its fp32 partial, summed by the last share to finish (common.splitk)
    write_tile(acc, ws_ptr if SPLIT > 1 else y_ptr, cnt_ptr, y_ptr, bias_ptr, offs_n, first_row + offs_m, offs_n,
               M, N, 0, stride_ym, stride_ym, pid_m * tl.num_programs(0) + pid_n, pid_s, SPLIT, HAS_BIAS)


def launch_gemm(x2, crow_indices, col_indices, values, bias, y, cfg) -> None:
    """The tile kernel with ``cfg`` on validated operands: ``x2`` (M, K) with unit column stride, ``y`` (M, N)."""
    m = x2.shape[0]
    n = y.shape[1]
    if cfg.prefetch:
        raise ValueError(f"config: the tile kernel prefetches nothing (prefetch 0; the one-row kernel does), got {cfg}")
    grid = (n // cfg.block_n, triton.cdiv(m, cfg.block_m), cfg.split)
    workspace, counters = last_split_buffers(y, cfg.split, m, n, grid[0] * grid[1])
    launch(_bsr_gemm_kernel, grid,
        x2, crow_indices, col_indices, values, bias if bias is not None else y, y, workspace, counters,
        m, n, x2.stride(0), y.stride(0), SPLIT=cfg.split, HAS_BIAS=bias is not None, BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n, GROUP=cfg.group, BLOCK=BSR_BLOCK,
        DOT_IN_FP32=interpreting() and x2.dtype == torch.bfloat16,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
