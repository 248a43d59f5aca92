"""int8 GELU in the 1 x 128 activation format: de-quantize, GELU, re-quantize, one pass.

The contract (``reference.gelu_int8_blocks_ref``), for ``xq`` (M, K) int8 and ``s_x`` (M, Kb)::

    v[m, k]  = rd(xq[m, k] * s_x[m, k // 128])           rd: rounded to the activation dtype (fp16 / bf16)
    g[m, k]  = rd(gelu(v[m, k]))                          exact (erf) GELU in fp32
    (yq, s_y) = quantize_act_blocks_ref(g)                        1 x 128 blocks, symmetric int8

so the int8 GELU gives what a float GELU between two block-scaled layers would hand on. Program (row,
chunk) holds ``BLOCKS`` consecutive blocks of one row as one (BLOCKS, 128) tile (the quantizer's
tiling, :mod:`compress_kernels.w8a8_block.quantize`); ``yq`` comes out contiguous, ``s_y`` in the
kernels' scale layout (strides (1, M)). A NaN scale (a non-finite block) gives a NaN output scale.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from compress_kernels.common.launch import launch
from compress_kernels.reference import SCALE_BLOCK, scale_blocks
from compress_kernels.w8a8_block.blocks import gelu_exact, quantize_rows_sym, round_through, row_block_scales
from compress_kernels.w8a8_block.quantize import MAX_BLOCKS_PER_PROGRAM, empty_act_scales


@triton.jit
def _gelu_int8_blocks_kernel(
    xq_ptr, sx_ptr, yq_ptr, sy_ptr,  # xq (M, K) int8, s_x (M, Kb), yq (M, K) int8 contiguous, s_y (M, Kb)
    K, KB, stride_xm, stride_xk, stride_sxm, stride_sxk, stride_sym, stride_syk,
    ACT_BF16: tl.constexpr, BLOCKS: tl.constexpr, BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    kb = tl.program_id(1) * BLOCKS + tl.arange(0, BLOCKS)
    cols = kb[:, None] * BLOCK + tl.arange(0, BLOCK)[None, :]
    mask = cols < K
    q = tl.load(xq_ptr + row * stride_xm + cols * stride_xk, mask=mask, other=0).to(tl.float32)
    s_x = tl.load(sx_ptr + row * stride_sxm + kb * stride_sxk, mask=kb < KB, other=1.0)
    v = round_through(q * s_x[:, None], ACT_BF16)
    g = round_through(gelu_exact(v), ACT_BF16)  # padded lanes: gelu(0) = 0
    scale = row_block_scales(g)
    tl.store(yq_ptr + row * K + cols, quantize_rows_sym(g, scale), mask=mask)  # g holds act-dtype values
    tl.store(sy_ptr + row * stride_sym + kb * stride_syk, scale, mask=kb < KB)


def launch_gelu_int8_blocks(xq: torch.Tensor, s_x: torch.Tensor, act_dtype: torch.dtype):
    """Validated ``xq`` (M, K) int8 and ``s_x`` (M, Kb) -> ``(yq int8 (M, K), s_y float32 (M, Kb))``."""
    m, k = xq.shape
    yq = torch.empty((m, k), dtype=torch.int8, device=xq.device)
    s_y = empty_act_scales(m, k, xq.device)
    if m == 0:
        return yq, s_y
    kb = scale_blocks(k)
    blocks = min(triton.next_power_of_2(kb), MAX_BLOCKS_PER_PROGRAM)
    launch(_gelu_int8_blocks_kernel, (m, triton.cdiv(kb, blocks)),
        xq, s_x, yq, s_y, k, kb, xq.stride(0), xq.stride(1), s_x.stride(0), s_x.stride(1), s_y.stride(0),
        s_y.stride(1), ACT_BF16=act_dtype == torch.bfloat16, BLOCKS=blocks, BLOCK=SCALE_BLOCK,
        num_warps=4 if blocks <= 8 else 8,
    )
    return yq, s_y
