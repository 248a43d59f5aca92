"""DDS + W8A8 tiles: per-token int8 activations x 32x32 block-sparse int8 weights, int32 accumulation.

The weight is stored as BSR parts like the fp16 DDS kernels (``values[b, i, j] = W_q[32 r + i,
32 col[b] + j]``) but with int8 ``values``, plus ``w_scale`` (N,) float32 per output channel::

    acc[m, n]  = sum_{b in block row n // 32} sum_j xq[m, 32 col[b] + j] * values[b, n % 32, j]   int32, exact
    y[m, n]    = acc[m, n] * s_x[m] * w_scale[n] (+ bias[n])                                        fp32 -> y's dtype

with ``xq``, ``s_x`` from the per-token quantize pass (:func:`compress_kernels.common.quantize.quantize_rows`).
The integers are exact and the epilogue does the operations of the dense W8A8 GEMM in the same order,
so (unsplit, and where the compiler fuses the same multiply-adds) ``y`` has the bits of ``w8a8_matmul``
on the dense int8 weight. A program per (BLOCK_M rows of x, BLOCK_N outputs of one block row) gathers
GROUP stored blocks per step into a (BLOCK_M, 32 GROUP) int8 tile of ``xq`` and a (32 GROUP, BLOCK_N)
int8 tile of the transposed blocks, one ``tl.dot`` with int32 accumulation. ``SPLIT`` > 1 shares a
block row's stored blocks among that many programs, each adding its dequantized fp32 partial; the last
to finish sums them in share order and adds the bias (:mod:`compress_kernels.common.splitk`). The
quantize pass and this kernel form a PDL pair (:mod:`compress_kernels.common.pdl`).
"""
from __future__ import annotations

import triton
import triton.language as tl

from compress_kernels.bsr.gemm import runs_of_block
from compress_kernels.common.launch import launch
from compress_kernels.common.pdl import launch_options, pdl_enabled, wait_for_inputs
from compress_kernels.common.splitk import last_split_buffers, write_tile
from compress_kernels.common.tiles import block_row_share
from compress_kernels.reference import BSR_BLOCK
@triton.jit
def _bsr_w8a8_kernel(
    xq_ptr, sx_ptr, crow_ptr, col_ptr, val_ptr, sw_ptr, bias_ptr, y_ptr,  # xq (M, K) i8, s_x (M,), BSR, (N,), (N,), y
    ws_ptr, cnt_ptr,  # SPLIT > 1: fp32 partials (SPLIT, M, N), int32 ticket counters (one per output tile)
    M, N, stride_xm, stride_ym,
    SPLIT: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    GROUP: tl.constexpr, BLOCK: tl.constexpr, USE_PDL: tl.constexpr,
):
    pid_n = tl.program_id(0)  # which BLOCK_N outputs (fastest: programs of one M tile run together)
    pid_m = tl.program_id(1)  # which BLOCK_M rows of x
    pid_s = tl.program_id(2)  # which share of the block row's stored blocks
    block_row, sub, start, end = block_row_share(crow_ptr, pid_n, pid_s, SPLIT, GROUP, BLOCK_N, BLOCK)

    first_row = pid_m * BLOCK_M
    offs_m = tl.arange(0, BLOCK_M)
    m_mask = offs_m < M - first_row
    xq_ptr += first_row.to(tl.int64) * stride_xm
    offs_k = tl.arange(0, GROUP * BLOCK)
    k_block = offs_k // BLOCK  # which of the GROUP gathered blocks
    k_in = offs_k % BLOCK  # column inside that block

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
    wait_for_inputs(USE_PDL)  # with PDL: xq and s_x come from the quantize pass before
    for p in range(start, end, GROUP):
        blk = p + k_block
        valid = blk < end
        col = tl.load(col_ptr + blk, mask=valid, other=0).to(tl.int32)
        x_k = runs_of_block(col * BLOCK + k_in, BLOCK)
        w_k = runs_of_block(blk * (BLOCK * BLOCK) + k_in, BLOCK)
        a = tl.load(xq_ptr + offs_m[:, None] * stride_xm + x_k[None, :], mask=m_mask[:, None] & valid[None, :], other=0)
        b = tl.load(val_ptr + w_k[:, None] + sub[None, :] * BLOCK, mask=valid[:, None], other=0)  # blocks transposed
        acc = tl.dot(a, b, acc, out_dtype=tl.int32)

    offs_n = block_row * BLOCK + sub
    s_x = tl.load(sx_ptr + first_row + offs_m, mask=m_mask, other=1.0)
    s_w = tl.load(sw_ptr + offs_n)
    y = acc.to(tl.float32) * s_x[:, None] * s_w[None, :]  # the order of the dense W8A8 epilogue
    # the tile itself, or with SPLIT > 1 its fp32 partial, summed by the last share to finish (common.splitk)
    write_tile(y, ws_ptr if SPLIT > 1 else y_ptr, cnt_ptr, y_ptr, bias_ptr, offs_n, first_row + offs_m, offs_n,
               M, N, 0, stride_ym, stride_ym, pid_m * tl.num_programs(0) + pid_n, pid_s, SPLIT, HAS_BIAS)


def launch_gemm(xq, s_x, crow_indices, col_indices, values, w_scale, bias, y, cfg) -> None:
    """The sparse int8 GEMM with ``cfg`` on quantized ``xq`` (M, K) int8 and ``s_x`` (M,) into ``y`` (M, N)."""
    m = xq.shape[0]
    n = y.shape[1]
    if cfg.kernel != "gemm" or cfg.block_m < 16:
        raise ValueError(f"config: expected a 'gemm' BsrConfig with block_m >= 16, got {cfg}")
    use_pdl = pdl_enabled(xq.device)
    grid = (n // cfg.block_n, triton.cdiv(m, cfg.block_m), cfg.split)
    workspace, counters = last_split_buffers(y, cfg.split, m, n, grid[0] * grid[1])
    launch(_bsr_w8a8_kernel, grid,
        xq, s_x, crow_indices, col_indices, values, w_scale, bias if bias is not None else w_scale, y,
        workspace, counters, m, n, xq.stride(0), y.stride(0),
        SPLIT=cfg.split, HAS_BIAS=bias is not None, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, GROUP=cfg.group,
        BLOCK=BSR_BLOCK, USE_PDL=use_pdl, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        **launch_options(use_pdl),
    )
