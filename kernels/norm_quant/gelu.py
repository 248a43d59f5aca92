"""Exact (erf) GELU of one row per program, stored in x's dtype and quantized per token to int8.

For row ``m`` of ``x`` (M, K) held whole in registers (fp32 math)::

    y[m, k] = x[m, k] / 2 * (1 + erf(x[m, k] / sqrt(2)))

then ``y`` is stored in x's dtype and its rounded values are quantized per token
(:func:`compress_kernels.common.quantize.store_int8_row`). The kernel is the producer of a PDL pair
with the W8A8 GEMM after it.
"""
from __future__ import annotations

import triton
import triton.language as tl

from compress_kernels.common.pdl import let_dependents_launch, wait_for_inputs
from compress_kernels.common.quantize import store_int8_row


@triton.jit
def _gelu_quantize_kernel(
    x_ptr, y_ptr, xq_ptr, sx_ptr, static_ptr, K, stride_xm,
    STATIC: tl.constexpr, BLOCK_K: tl.constexpr, USE_PDL: tl.constexpr,
):
    wait_for_inputs(USE_PDL)
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK_K)
    mask = offs < K
    x = tl.load(x_ptr + row.to(tl.int64) * stride_xm + offs, mask=mask, other=0.0).to(tl.float32)
    y_out = (0.5 * x * (1.0 + tl.math.erf(x * 0.7071067811865476))).to(y_ptr.dtype.element_ty)
    tl.store(y_ptr + row.to(tl.int64) * K + offs, y_out, mask=mask)
    store_int8_row(y_out.to(tl.float32), mask, xq_ptr + row.to(tl.int64) * K, sx_ptr, static_ptr, row, offs,
                   STATIC)
    let_dependents_launch(USE_PDL)
