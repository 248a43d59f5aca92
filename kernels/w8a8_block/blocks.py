"""In-kernel pieces of block-scaled int8: scales of 128-channel blocks, symmetric int8, GELU, float rounding.

The contract (``compress_kernels.reference.quantize_act_blocks_ref`` / ``quantize_weight_blocks``), for a block
``v`` of fp32 values (lanes past K or N loaded as 0, which never changes a block's absmax)::

    s        = max |v| / 127        IEEE division (div_rn); 0 -> 1; NaN if the block holds a NaN or an Inf
    q        = rint(clamp(v / s, -127, 127))      round half to even; 0 where s is NaN

Rounding is the float trick of :mod:`compress_kernels.common.quantize` (``(q + 1.5 * 2**23) - 1.5 * 2**23``,
exact after the clamp). Triton's ``max`` skips NaN, so the absmax here is a NaN-propagating reduce and an
Inf absmax is turned into NaN: a non-finite block never comes out as finite numbers.

* :func:`row_block_scales`: the scales of a (ROWS, 128) tile, one per row (activations: one token's block);
* :func:`tile_scale`: the one scale of a 2-D tile (a 128 x 128 weight block);
* :func:`quantize_sym`: fp32 values and a scale broadcast to their shape -> int8, IEEE division per value
  (weights, whose values may be any fp32);
* :func:`quantize_rows_sym`: the same integers for values that are fp16 / bf16 numbers (activations,
  and outputs rounded to the activation dtype), one float64 reciprocal per row and a multiply per value:
  ``fp32(float64(v) * (1 / s))`` is the IEEE quotient ``v / s`` for such ``v`` (the argument and the
  exhaustive check of :func:`compress_kernels.common.quantize.quantize_int8_recip`); a division per
  value would cost as much as the int8 dot at small M;
* :func:`block_sum_to_float`: an int32 block product (|v| < 2^22: at most 128 * 127^2) as its exact fp32
  value with an integer add and a float subtract, not an int-to-float conversion, which issues at a
  quarter of the FMA rate on Hopper: the GEMMs convert a whole tile every K step;
* :func:`round_through`: fp32 values rounded to fp16 or bf16 and back (the values a float layer stores);
* :func:`gelu_exact`: the erf GELU in fp32.
"""
from __future__ import annotations

import triton
import triton.language as tl

ROUND_MAGIC = tl.constexpr(12582912.0)  # 1.5 * 2**23: adding then subtracting it rounds fp32 half to even
QMAX = tl.constexpr(127.0)


@triton.jit
def _max_keeping_nan(a, b):
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _scale_of(absmax):
    """absmax / 127 (IEEE), 0 -> 1, Inf / NaN -> NaN."""
    scale = tl.math.div_rn(absmax, QMAX)
    scale = tl.where(scale == 0.0, 1.0, scale)
    return tl.where(scale < float("inf"), scale, float("nan"))


@triton.jit
def row_block_scales(v):
    """(ROWS,) scales of the fp32 tile ``v`` (ROWS, 128), one per row."""
    return _scale_of(tl.reduce(tl.abs(v), 1, _max_keeping_nan))


@triton.jit
def tile_scale(v):
    """The scale of the whole fp32 tile ``v`` (R, C), a scalar."""
    per_row = tl.reduce(tl.abs(v), 1, _max_keeping_nan)
    return _scale_of(tl.reduce(per_row, 0, _max_keeping_nan))


@triton.jit
def quantize_sym(v, scale):
    """int8 of fp32 ``v`` with ``scale`` (already broadcast to v's shape): clamp to [-127, 127], round
    half to even; 0 where the scale is NaN."""
    q = tl.math.div_rn(v, scale)
    q = tl.minimum(tl.maximum(q, -QMAX), QMAX)
    q = (q + ROUND_MAGIC) - ROUND_MAGIC
    return tl.where(scale < float("inf"), q, 0.0).to(tl.int8)


@triton.jit
def quantize_rows_sym(v, scale):
    """int8 of fp32 ``v`` (ROWS, C) holding fp16 / bf16 values, with one ``scale`` (ROWS,) per row:
    :func:`quantize_sym`'s integers through a float64 reciprocal per row (module docstring)."""
    recip = 1.0 / scale.to(tl.float64)  # IEEE float64 division, once per row
    q = (v.to(tl.float64) * recip[:, None]).to(tl.float32)
    q = tl.minimum(tl.maximum(q, -QMAX), QMAX)
    q = (q + ROUND_MAGIC) - ROUND_MAGIC
    return tl.where((scale < float("inf"))[:, None], q, 0.0).to(tl.int8)


@triton.jit
def block_sum_to_float(part):
    """The int32 ``part`` (|part| < 2^22) as fp32, exactly: the bits of 1.5 * 2^23 plus ``part`` are the
    float 1.5 * 2^23 + part (its ulp is 1 there), minus 1.5 * 2^23."""
    return (part + 0x4B400000).to(tl.float32, bitcast=True) - ROUND_MAGIC


@triton.jit
def round_through(v, ACT_BF16: tl.constexpr):
    """fp32 ``v`` rounded to bf16 (ACT_BF16) or fp16, back in fp32."""
    if ACT_BF16:
        return v.to(tl.bfloat16).to(tl.float32)
    return v.to(tl.float16).to(tl.float32)


@triton.jit
def gelu_exact(v):
    """``v / 2 * (1 + erf(v / sqrt(2)))`` in fp32."""
    return 0.5 * v * (1.0 + tl.math.erf(v * 0.7071067811865476))
