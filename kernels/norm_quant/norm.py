"""LayerNorm or RMSNorm of one row per program, stored in x's dtype and quantized per token to int8.

For row ``m`` of ``x`` (M, K) held whole in registers (fp32 math)::

    LayerNorm:  mu = mean_k x[m, k]    var = mean_k (x[m, k] - mu)^2          (two passes)
                y[m, k] = (x[m, k] - mu) / sqrt(var + eps) * weight[k] + bias[k]
    RMSNorm:    r = x[m, k] / sqrt(mean_k x[m, k]^2 + eps), rounded to x's dtype     (Llama's order)
                y[m, k] = weight[k] * r

then ``y`` is stored in x's dtype and its rounded values are quantized per token
(:func:`compress_kernels.common.quantize.store_int8_row`). ``1 / sqrt`` is correctly rounded
(``sqrt_rn``). The kernel is the producer of a PDL pair with the W8A8 GEMM after it.
"""
from __future__ import annotations

import triton
import triton.language as tl

from compress_kernels.common.pdl import let_dependents_launch, wait_for_inputs
from compress_kernels.common.quantize import store_int8_row


@triton.jit
def _norm_quantize_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr, xq_ptr, sx_ptr, static_ptr,  # x (M, K) rows of stride_xm; y, xq (M, K) contiguous
    K, stride_xm, eps,
    RMS: tl.constexpr, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, STATIC: tl.constexpr,
    BLOCK_K: tl.constexpr, USE_PDL: tl.constexpr,
):
    wait_for_inputs(USE_PDL)
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK_K)
    mask = offs < K
    x = tl.load(x_ptr + row.to(tl.int64) * stride_xm + offs, mask=mask, other=0.0).to(tl.float32)
    if RMS:  # Llama's RMSNorm: the normalized row is rounded to x's dtype before the weight multiplies it
        y = (x * (1.0 / tl.sqrt_rn(tl.sum(x * x, axis=0) / K + eps))).to(y_ptr.dtype.element_ty).to(tl.float32)
    else:
        centered = tl.where(mask, x - tl.sum(x, axis=0) / K, 0.0)
        y = centered * (1.0 / tl.sqrt_rn(tl.sum(centered * centered, axis=0) / K + eps))
    if HAS_WEIGHT:
        y = y * tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    if HAS_BIAS:
        y = y + tl.load(b_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    y_out = y.to(y_ptr.dtype.element_ty)
    tl.store(y_ptr + row.to(tl.int64) * K + offs, y_out, mask=mask)
    store_int8_row(y_out.to(tl.float32), mask, xq_ptr + row.to(tl.int64) * K, sx_ptr, static_ptr, row, offs,
                   STATIC)
    let_dependents_launch(USE_PDL)
