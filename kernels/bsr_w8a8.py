"""Sparse W8A8: per-token int8 activations x 32x32 block-sparse int8 weights, int32 accumulation.

The two compressions of a layer pruned into blocks *and* quantized to W8A8, served together: the
weight is stored as BSR parts like :mod:`kernels.bsr` (``crow_indices`` (N/32 + 1,),
``col_indices`` (nnz,), ``values`` (nnz, 32, 32) with ``values[b, i, j] = W_q[32 r + i, 32 col[b] + j]``)
but with int8 ``values``, plus ``w_scale`` (N,) float32 per output channel, as in :mod:`kernels.w8a8`.

Math (the W8A8 contract of ``kernels.reference`` with ``W_q`` the BSR matrix, absent blocks zero)::

    xq, s_x    = per-token quantization of x (kernels.w8a8.quantize_rows: the same pre-pass)
    acc[m, n]  = sum_{b in block row n // 32} sum_j xq[m, 32 col[b] + j] * values[b, n % 32, j]   int32, exact
    y[m, n]    = acc[m, n] * s_x[m] * w_scale[n] (+ bias[n])                                        fp32 -> x's dtype

The integers are exact and the epilogue does the operations of :mod:`kernels.w8a8` in the same
order, so (unsplit, and where the compiler fuses the same multiply-adds) ``y`` has the bits of
``w8a8_matmul`` on the dense int8 weight (zeros in the absent blocks); the GPU tests allow fp32
rounding. One GEMM kernel: a program per (BLOCK_M rows of x, BLOCK_N outputs of one block row)
gathers GROUP stored blocks per step into a (BLOCK_M, 32 GROUP) int8 tile of ``xq`` and a
(32 GROUP, BLOCK_N) int8 tile of the transposed blocks, one ``tl.dot`` with int32 accumulation.
The quantize pass and this kernel form a PDL pair as in :mod:`kernels.w8a8` (``kernels/_pdl.py``).

``BsrConfig.split`` > 1 shares a block row's stored blocks among that many programs, each adding its
dequantized fp32 partial ``acc * s_x * w_scale``; the last to finish sums them in share order and adds
the bias (:mod:`kernels._splitk`, as the dense kernel's split-K: equal to the unsplit result up to fp32
rounding). Tiles come from :func:`pick_config` (tuned on an H100). From M = 2048 on layers keeping
>= 40% of their blocks the launcher writes the int8 weight out dense and runs the dense W8A8 kernels
(:mod:`kernels.bsr_densify`; the same integers, so the dense kernel's output). Registered as
``torch.ops.compress_kernels.bsr_w8a8_matmul`` with a fake implementation, so callers compile and
capture in CUDA graphs (the launch depends on shapes only).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from compress_kernels._checks import check_same_device, check_shape, check_tensor
from compress_kernels._pdl import launch_options, pdl_enabled, wait_for_inputs
from compress_kernels._splitk import last_split_buffers, last_split_reduces
from compress_kernels.bsr import (FEW_PROGRAMS, SMALL_LAYER, SMALL_SPLIT_MIN_BLOCKS_PER_ROW, SPLIT_MAX_BLOCK_ROWS_M64,
                         SPLIT_MIN_BLOCKS_PER_ROW, BsrConfig, check_parts, runs_of_block)
from compress_kernels.bsr_densify import bsr_to_dense, densifies
from compress_kernels.reference import BSR_BLOCK
from compress_kernels.w8a8 import check_quantized, check_x_scale, quantize_rows, w8a8_matmul_quantized
from compress_kernels.w8a8 import launch as launch_dense_w8a8


SPLIT_MAX_BLOCK_ROWS = 384  # M <= 16: block rows are shared among programs up to this many of them
LONG_ROW_BLOCKS = 64  # rows this long get 8 shares at M <= 16 (when <= 1024 programs) and 4 at M <= 64


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
    block_row = (pid_n * BLOCK_N) // BLOCK
    sub = (pid_n * BLOCK_N) % BLOCK + tl.arange(0, BLOCK_N)  # outputs inside the block row, (BLOCK_N,)
    start = tl.load(crow_ptr + block_row).to(tl.int32)
    end = tl.load(crow_ptr + block_row + 1).to(tl.int32)
    if SPLIT > 1:  # whole GROUP steps per share, as in kernels.bsr
        share = tl.cdiv(tl.cdiv(end - start, SPLIT), GROUP) * GROUP
        start = start + pid_s * share
        end = tl.minimum(end, start + share)

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
    y = acc.to(tl.float32) * s_x[:, None] * s_w[None, :]  # the order of kernels.w8a8's epilogue
    if SPLIT > 1:  # dequantized partials, summed by the last share to finish (kernels._splitk)
        last_split_reduces(y, ws_ptr, cnt_ptr, y_ptr, bias_ptr, first_row + offs_m, offs_n, M, N, stride_ym,
                           pid_m * tl.num_programs(0) + pid_n, pid_s, SPLIT, HAS_BIAS)
    else:
        if HAS_BIAS:
            y += tl.load(bias_ptr + offs_n).to(tl.float32)[None, :]
        y_ptrs = y_ptr + (first_row + offs_m)[:, None].to(tl.int64) * stride_ym + offs_n[None, :]
        tl.store(y_ptrs, y.to(y_ptr.dtype.element_ty), mask=m_mask[:, None])


def pick_config(m: int, n: int, k: int, nnz: int) -> BsrConfig:
    """Tiles from the shapes alone (CUDA-graph safe); ``nnz`` stored blocks give the mean block-row length.

    Tuned on an H100 (``scripts/tune_bsr.py --int8``; docs/kernels-notes.md, "Sparse W8A8"):

    * M <= 16: 16-row tiles. Up to 384 block rows of >= 24 stored blocks are shared by 4 programs
      (8 when that still gives <= 1024 programs and rows are >= 64 blocks long): 4096x4096 at 50%,
      M = 1, 18.9 -> 11.5 us. Otherwise no split and 8 blocks (256 int8 columns) per step.
    * 16 < M <= 64: layers of <= ``SMALL_LAYER`` weights (MiniLM) take 16-row tiles, as the fp16 DDS
      kernel; larger ones 32 or 64 rows, 8 blocks per step, and a 4-way split for <= 128 block rows
      of >= 64 blocks (11008x4096 at 50%, M = 64: 51.3 -> 31.1 us).
    * M > 64: 64-row tiles up to M = 256, else 128, 4 blocks per step; small layers keep 64 rows while
      128 would give fewer than ``FEW_PROGRAMS`` programs (384x1152 at M = 512: 12.2 -> 11.6 us;
      1024x1024 at M = 2048 keeps 128: 18.4 us, 20.9 with 64).
    """
    block_rows = n // BSR_BLOCK
    blocks_per_row = nnz / block_rows
    small_layer = n * k <= SMALL_LAYER
    if m <= 16:
        if block_rows <= SPLIT_MAX_BLOCK_ROWS and blocks_per_row >= SPLIT_MIN_BLOCKS_PER_ROW:
            split = 8 if block_rows * 8 <= 1024 and blocks_per_row >= LONG_ROW_BLOCKS else 4
            return BsrConfig("gemm", 16, 32, 4, 4, 3, split=split)
        return BsrConfig("gemm", 16, 32, 8, 4, 3)
    if m <= 64:
        if small_layer:
            if blocks_per_row >= SMALL_SPLIT_MIN_BLOCKS_PER_ROW:
                return BsrConfig("gemm", 16, 32, 4, 4, 3, split=4)
            return BsrConfig("gemm", 16, 32, 8, 4, 3)
        block_m = 32 if m <= 32 else 64
        if block_rows <= SPLIT_MAX_BLOCK_ROWS_M64 and blocks_per_row >= LONG_ROW_BLOCKS:
            return BsrConfig("gemm", block_m, 32, 4, 4, 3, split=4)
        return BsrConfig("gemm", block_m, 32, 8, 4, 3)
    if m <= 256 or (small_layer and block_rows * triton.cdiv(m, 128) < FEW_PROGRAMS):
        return BsrConfig("gemm", 64, 32, 4, 4, 3)
    return BsrConfig("gemm", 128, 32, 4, 4, 3)


def launch(x2, crow_indices, col_indices, values, w_scale, bias, x_scale, y, config: BsrConfig | None = None) -> None:
    """Quantize validated ``x2`` (M, K) per token, then the sparse int8 GEMM into ``y`` (M, N)."""
    xq, s_x = quantize_rows(x2, x_scale)
    launch_quantized(xq, s_x, crow_indices, col_indices, values, w_scale, bias, y, config)


def launch_quantized(xq, s_x, crow_indices, col_indices, values, w_scale, bias, y, config: BsrConfig | None = None):
    """The sparse int8 GEMM of quantized ``xq`` (M, K) int8 and ``s_x`` (M,) into ``y`` (M, N)."""
    m = xq.shape[0]
    n = y.shape[1]
    config = config or pick_config(m, n, xq.shape[1], col_indices.shape[0])
    if config.kernel != "gemm" or config.block_m < 16:
        raise ValueError(f"config: expected a 'gemm' BsrConfig with block_m >= 16, got {config}")
    use_pdl = pdl_enabled(xq.device, pair=True)
    grid = (n // config.block_n, triton.cdiv(m, config.block_m), config.split)
    workspace, counters = last_split_buffers(y, config.split, m, n, grid[0] * grid[1])
    _bsr_w8a8_kernel[grid](
        xq, s_x, crow_indices, col_indices, values, w_scale, bias if bias is not None else w_scale, y,
        workspace, counters, m, n, xq.stride(0), y.stride(0),
        SPLIT=config.split, HAS_BIAS=bias is not None, BLOCK_M=config.block_m, BLOCK_N=config.block_n, GROUP=config.group,
        BLOCK=BSR_BLOCK, USE_PDL=use_pdl, num_warps=config.num_warps, num_stages=config.num_stages,
        **launch_options(use_pdl),
    )


@torch.library.custom_op("compress_kernels::bsr_w8a8_matmul", mutates_args=())
def _bsr_w8a8_op(
    x: torch.Tensor, crow_indices: torch.Tensor, col_indices: torch.Tensor, values: torch.Tensor,
    w_scale: torch.Tensor, out_features: int, bias: torch.Tensor | None, x_scale: torch.Tensor | None,
) -> torch.Tensor:
    k = x.shape[-1]
    x2 = x.reshape(-1, k)
    if densifies(x2.shape[0], out_features, k, col_indices.shape[0]):  # large M: the dense W8A8 kernels
        w_q = bsr_to_dense(crow_indices, col_indices, values, out_features, k)
        y = launch_dense_w8a8(x2 if x2.stride(-1) == 1 else x2.contiguous(), w_q, w_scale, bias, x_scale)
    else:
        y = torch.empty((x2.shape[0], out_features), dtype=x.dtype, device=x.device)
        if x2.shape[0] > 0:
            launch(x2, crow_indices, col_indices, values, w_scale.contiguous(), bias, x_scale, y)
    return y.reshape(*x.shape[:-1], out_features)


@_bsr_w8a8_op.register_fake
def _bsr_w8a8_fake(x, crow_indices, col_indices, values, w_scale, out_features, bias, x_scale):
    return x.new_empty((*x.shape[:-1], out_features))


def bsr_w8a8_matmul_quantized(xq, s_x, crow_indices, col_indices, values, w_scale, out_features, bias=None,
                              out_dtype=torch.float16):
    """:func:`bsr_w8a8_matmul_parts` from an input already quantized per token (e.g. by
    ``kernels.norm_quant``): ``xq`` (M, K) int8, ``s_x`` (M,) float32 -> (M, N) in ``out_dtype``."""
    check_quantized(xq, s_x, out_dtype)
    x_like = xq.new_empty((0, xq.shape[1]), dtype=out_dtype)  # check_parts checks against an activation's K, dtype
    check_parts(x_like, crow_indices, col_indices, values, out_features, bias, value_dtype=torch.int8)
    check_tensor("w_scale", w_scale, (torch.float32,), ndim=1)
    check_shape("w_scale", w_scale, (out_features,))
    check_same_device(xq, w_scale=w_scale, values=values)
    m, k = xq.shape
    xq, s_x, w_scale = xq.contiguous(), s_x.contiguous(), w_scale.contiguous()
    if densifies(m, out_features, k, col_indices.shape[0]):  # large M: the dense W8A8 GEMM
        w_q = bsr_to_dense(crow_indices, col_indices, values, out_features, k)
        return w8a8_matmul_quantized(xq, s_x, w_q, w_scale, bias, out_dtype)
    y = torch.empty((m, out_features), dtype=out_dtype, device=xq.device)
    if m > 0:
        launch_quantized(xq, s_x, crow_indices, col_indices, values, w_scale, bias, y)
    return y


def bsr_w8a8_matmul_parts(x, crow_indices, col_indices, values, w_scale, out_features, bias=None, x_scale=None):
    """``y = dequant(quant(x) @ W_q.T) (+ bias)`` for ``W_q`` (out_features, K) int8 in BSR parts.

    ``x`` (..., K) fp16/bf16; ``crow_indices`` (N/32 + 1,) and ``col_indices`` (nnz,) int32/int64;
    ``values`` (nnz, 32, 32) int8; ``w_scale`` (N,) float32; ``bias`` (N,) in x's dtype or float32;
    ``x_scale`` None (dynamic per-token scales) or a static float32 scale (one element or (M,)).
    """
    check_parts(x, crow_indices, col_indices, values, out_features, bias, value_dtype=torch.int8)
    check_tensor("w_scale", w_scale, (torch.float32,), ndim=1)
    check_shape("w_scale", w_scale, (out_features,))
    check_same_device(x, w_scale=w_scale)
    check_x_scale(x, x_scale)
    return torch.ops.compress_kernels.bsr_w8a8_matmul(x, crow_indices, col_indices, values, w_scale, out_features,
                                                      bias, x_scale)
