"""Signed int4 weights packed eight to an int32: unpacking them exactly inside a kernel.

The packing (the contract of ``compress_kernels.reference.unpack_int4``): ``qweight`` (K/8, N) int32,
nibble ``j`` (bits 4j..4j+3) of ``qweight[r, n]`` is ``q[8r + j, n]`` in two's complement. Every
value -8..7 is exact in fp16, bf16 and fp32, so each helper here gives the exact integers:

* :func:`unpack_int4_tile`: a (BLOCK_K/8, BLOCK_N) packed tile -> (BLOCK_K, BLOCK_N) values. It
  broadcasts the tile to (BLOCK_K/8, 8, BLOCK_N), moves nibble j to the top with ``<< (28 - 4j)``,
  sign-extends it back with an arithmetic ``>> 28`` and reshapes, so channel 8r + j lands at row
  8r + j (the large-M dequantize pass and the W4A16 tile kernel with scales after the dot).
* :func:`nibble_planes`: the 8 nibble planes of a packed tile (plane j = nibble j of every word, the
  tile's own shape), elementwise, so Triton keeps any register layout, e.g. a tensor-core operand's.
  On the GPU through inline PTX (:func:`nibble_planes_asm`), 13 instructions per word for all 8::

      t   = prmt(w, w >> 4, byte b of w -> bits 0..7, byte b of (w >> 4) -> bits 16..23)   # PRMT
      t   = (t & 0x000F000F) ^ (MAGIC | 0x00080008)  # nibbles 2b, 2b+1 -> the low mantissa bits of
                                                     # two 16-bit floats, +8 (two's complement -> 0..15)
      w2  = fma(t, 1, -(MAGIC + 8))                  # HFMA2: exact q in two fp16 / bf16 lanes

  with MAGIC = 1024 (fp16 0x6400) or 128 (bf16 0x4300): those floats are 1024 + u (128 + u)
  exactly, so the subtraction is exact. Triton's CPU interpreter cannot run inline PTX, so there
  (and for fp32 operands) the planes come from plain shifts (:func:`nibble_values`).
* :func:`plane_products`: a packed tile's 8 planes times the matching x columns, 8 tensor-core dots (the
  dense W4A16 planes and the int4-block planes kernel).
* :func:`tile_partial`: ``sum_j x[8r + j] * q[8r + j, n]`` for one packed tile on CUDA cores in fp32,
  three instructions per nibble (the one-row W4A16 kernels). Each nibble is turned into an fp32 value
  from its bits in place, with no shift per nibble::

      u = word ^ 0x88888888                          # each nibble q -> q + 8, in 0..15
      p = j (j < 5), else j - 3 on u >> 12           # nibble j's position, 4p <= 16: inside the mantissa
      w = bits_as_fp32((u | 0x4B000000) & (0xF << 4p | 0x4B000000)) - (2^23 + 8 * 16^p)   # = q * 16^p
      part[r, n] += (x[8r + j] * 16^-p) * w[r, n]                                  # = x * q (powers of two)

  (and, subtract, fma per nibble; the or once per word). A bf16 x below ~1e-33 loses bits when
  scaled by 16^-p (fp32 subnormal range), far under anything that moves a sum of fp32 products.
"""
from __future__ import annotations

import triton
import triton.language as tl

from compress_kernels.common.tiles import split8

# $0..$7 = nibbles 0..7 of $8 as exact 16-bit floats; $9 = MAGIC | 0x00080008 pair, $10 = -(MAGIC + 8) pair,
# $11 = 1.0 pair; FMA_TYPE f16x2 or bf16x2.
_UNPACK_ASM = """{
.reg .b32 sh, t0, t1, t2, t3;
shr.u32 sh, $8, 4;
prmt.b32 t0, $8, sh, 0x7450;
prmt.b32 t1, $8, sh, 0x7551;
prmt.b32 t2, $8, sh, 0x7652;
prmt.b32 t3, $8, sh, 0x7753;
lop3.b32 t0, t0, 0x000F000F, $9, 0x6A;
lop3.b32 t1, t1, 0x000F000F, $9, 0x6A;
lop3.b32 t2, t2, 0x000F000F, $9, 0x6A;
lop3.b32 t3, t3, 0x000F000F, $9, 0x6A;
fma.rn.FMA_TYPE t0, t0, $11, $10;
fma.rn.FMA_TYPE t1, t1, $11, $10;
fma.rn.FMA_TYPE t2, t2, $11, $10;
fma.rn.FMA_TYPE t3, t3, $11, $10;
mov.b32 {$0, $1}, t0;
mov.b32 {$2, $3}, t1;
mov.b32 {$4, $5}, t2;
mov.b32 {$6, $7}, t3;
}"""
UNPACK_ASM_F16 = tl.constexpr(_UNPACK_ASM.replace("FMA_TYPE", "f16x2"))
UNPACK_ASM_BF16 = tl.constexpr(_UNPACK_ASM.replace("FMA_TYPE", "bf16x2"))


@triton.jit
def unpack_int4_tile(packed, BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr, DTYPE: tl.constexpr):
    """(BLOCK_K/8, BLOCK_N) int32 -> (BLOCK_K, BLOCK_N) int4 values in DTYPE (fp16, bf16 or fp32), exactly."""
    j = tl.arange(0, 8)
    q = (packed[:, None, :] << (28 - 4 * j)[None, :, None]) >> 28  # sign-extended nibble j
    w = q.to(DTYPE)
    return tl.reshape(w, (BLOCK_K, BLOCK_N))


@triton.jit
def nibble_planes_asm(packed, DTYPE: tl.constexpr):
    """int32 tile -> its 8 nibble planes (same shape each) as exact int4 values in fp16 / bf16, in
    13 inline-PTX instructions per word (``_UNPACK_ASM``); elementwise, so any layout stays as it is."""
    if DTYPE == tl.float16:
        xor_magic = tl.full(packed.shape, 0x64086408, tl.int32)  # 1024 + 8 in each fp16 lane's bits
        neg_magic = tl.full(packed.shape, -0x1BF71BF8, tl.int32)  # 0xE408E408: -1032.0 in each lane
        one = tl.full(packed.shape, 0x3C003C00, tl.int32)
        planes = tl.inline_asm_elementwise(UNPACK_ASM_F16, "=h,=h,=h,=h,=h,=h,=h,=h,r,r,r,r",
                                           [packed, xor_magic, neg_magic, one], dtype=(tl.float16,) * 8,
                                           is_pure=True, pack=1)
    else:
        xor_magic = tl.full(packed.shape, 0x43084308, tl.int32)  # 128 + 8 in each bf16 lane's bits
        neg_magic = tl.full(packed.shape, -0x3CF73CF8, tl.int32)  # 0xC308C308: -136.0 in each lane
        one = tl.full(packed.shape, 0x3F803F80, tl.int32)
        planes = tl.inline_asm_elementwise(UNPACK_ASM_BF16, "=h,=h,=h,=h,=h,=h,=h,=h,r,r,r,r",
                                           [packed, xor_magic, neg_magic, one], dtype=(tl.bfloat16,) * 8,
                                           is_pure=True, pack=1)
    return planes


@triton.jit
def nibble_values(packed, shift, DTYPE: tl.constexpr):
    """The nibble at bit ``shift`` of each int32 of ``packed`` as exact signed values in DTYPE
    (plain shifts: any backend); elementwise, so any layout stays as it is."""
    return ((packed << (28 - shift)) >> 28).to(DTYPE)


@triton.jit
def nibble_planes(packed, DTYPE: tl.constexpr, ASM: tl.constexpr):
    """The 8 nibble planes of an int32 tile (plane j = nibble j of every word, same shape) as exact
    values in DTYPE: through the inline PTX if ASM (fp16 / bf16 on a GPU), else plain Triton ops."""
    if ASM:
        return nibble_planes_asm(packed, DTYPE)
    return (nibble_values(packed, 0, DTYPE), nibble_values(packed, 4, DTYPE),
            nibble_values(packed, 8, DTYPE), nibble_values(packed, 12, DTYPE),
            nibble_values(packed, 16, DTYPE), nibble_values(packed, 20, DTYPE),
            nibble_values(packed, 24, DTYPE), nibble_values(packed, 28, DTYPE))


@triton.jit
def _plane_dot(part, a, w, FP32_OPERANDS: tl.constexpr):
    if FP32_OPERANDS:
        return tl.dot(a, w, part, input_precision="ieee", out_dtype=tl.float32)
    return tl.dot(a, w, part, out_dtype=tl.float32)


@triton.jit
def plane_products(a, packed, ASM: tl.constexpr, FP32_OPERANDS: tl.constexpr, ROWS: tl.constexpr,
                   BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """sum_j a[:, 8r + j] @ plane j of ``packed``: the (ROWS, BLOCK_K) x tile ``a`` (split in registers, k =
    8r + 4a + 2b + c: c, then b, then a) times the (BLOCK_K/8, BLOCK_N) packed tile's 8 nibble planes
    (:func:`nibble_planes`), 8 tensor-core dots 16 or more deep, fp32, unscaled. ``FP32_OPERANDS`` (the
    interpreter with bf16, whose bf16 arithmetic is broken) multiplies fp32 copies, exact for these values."""
    if FP32_OPERANDS:
        a = a.to(tl.float32)
    w0, w1, w2, w3, w4, w5, w6, w7 = nibble_planes(packed, a.dtype, ASM)
    a0, a1, a2, a3, a4, a5, a6, a7 = split8(tl.reshape(a, (ROWS, BLOCK_K // 8, 2, 2, 2)))
    part = tl.zeros((ROWS, BLOCK_N), dtype=tl.float32)
    part = _plane_dot(part, a0, w0, FP32_OPERANDS)
    part = _plane_dot(part, a1, w1, FP32_OPERANDS)
    part = _plane_dot(part, a2, w2, FP32_OPERANDS)
    part = _plane_dot(part, a3, w3, FP32_OPERANDS)
    part = _plane_dot(part, a4, w4, FP32_OPERANDS)
    part = _plane_dot(part, a5, w5, FP32_OPERANDS)
    part = _plane_dot(part, a6, w6, FP32_OPERANDS)
    part = _plane_dot(part, a7, w7, FP32_OPERANDS)
    return part


@triton.jit
def _nibble_columns(xt, ROWS: tl.constexpr):
    """The 8 columns of ``xt`` (ROWS, 8) as (ROWS,) tensors, j = 0..7."""
    return split8(tl.reshape(xt, (ROWS, 2, 2, 2)))


@triton.jit
def _nibble_product(u_lo, u_hi, xj, j: tl.constexpr):
    """``x[8r + j] * q[8r + j, n]`` for nibble plane ``j``, from the biased words (see the module docstring)."""
    if j < 5:  # nibble j sits at bits 4j..4j+3 <= 19: inside the fp32 mantissa where it is
        src = u_lo
        p: tl.constexpr = j
    else:
        src = u_hi
        p: tl.constexpr = j - 3
    bits = src & ((0xF << (4 * p)) | 0x4B000000)  # fp32 2^23 + (q + 8) * 16^p, exact
    w = bits.to(tl.float32, bitcast=True) - (8388608.0 + 8.0 * (1 << (4 * p)))  # q * 16^p, exact
    return (xj * (1.0 / (1 << (4 * p))))[:, None] * w  # x * 16^-p: a power of two, exact


@triton.jit
def tile_partial(packed, xt, BLOCK_K: tl.constexpr):
    """sum_j x[kt + 8r + j] * q[kt + 8r + j, n] for one packed tile (BLOCK_K/8, BLOCK_N) and its x values
    ``xt`` (BLOCK_K/8, 8) fp32: (BLOCK_K/8, BLOCK_N) fp32, unscaled."""
    u = (packed ^ -0x77777778).to(tl.uint32, bitcast=True)  # 0x88888888: each nibble q -> q + 8 in 0..15
    u_lo = u | 0x4B000000  # exponent bits of 2^23 set once per word; the and below keeps them
    u_hi = (u >> 12) | 0x4B000000  # nibbles 5..7 moved to bit positions 8..19
    x0, x1, x2, x3, x4, x5, x6, x7 = _nibble_columns(xt, BLOCK_K // 8)
    part = _nibble_product(u_lo, u_hi, x0, 0)
    part += _nibble_product(u_lo, u_hi, x1, 1)
    part += _nibble_product(u_lo, u_hi, x2, 2)
    part += _nibble_product(u_lo, u_hi, x3, 3)
    part += _nibble_product(u_lo, u_hi, x4, 4)
    part += _nibble_product(u_lo, u_hi, x5, 5)
    part += _nibble_product(u_lo, u_hi, x6, 6)
    part += _nibble_product(u_lo, u_hi, x7, 7)
    return part
