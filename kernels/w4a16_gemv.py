"""W4A16 small-M kernel (M <= 64): packed int4 weights unpacked with two nibbles per 32-bit op.

Same operands and contract as :mod:`kernels.w4a16` (``qweight`` (K/8, N) int32, nibble ``j`` of word
``qweight[r, n]`` is ``q[8r + j, n]`` in two's complement; ``scales`` (K/G, N); fp32 accumulation)::

    y[m, n] = sum_g scales[g, n] * sum_{k in group g} x[m, k] * q[k, n]      (+ bias[n])

Why a separate kernel: at small M the weight stream is the whole cost, and the earlier kernels looked
bound by instruction issue (a hypothesis the H100 later refuted, see docs/kernels-notes.md, call 4:
this kernel is correct but slower than the tiled one and is not the default): their SASS spent 6-14 instructions per nibble (a shift, a
mask, an int -> float convert or a magic subtract per nibble, a re-pack of halves, scalar shared-memory
stores of the unpacked tile). 234 M nibbles (8192 x 28672) at ~12 instructions each is ~110 us on
132 SMs x 128 lanes, while the bytes need ~40 us. This kernel unpacks one packed word (8 nibbles) in
13 instructions (``_UNPACK_ASM``), 4 of them per pair of nibbles:

    t   = prmt(w, w >> 4, byte b of w -> bits 0..7, byte b of (w >> 4) -> bits 16..23)   # PRMT
    t   = (t & 0x000F000F) ^ (MAGIC | 0x00080008)     # nibbles 2b, 2b+1 -> the low mantissa bits of
                                                      # two 16-bit floats, +8 (two's complement -> 0..15)
    w2  = fma(t, 1, -(MAGIC + 8))                     # HFMA2: exact q in two fp16 / bf16 lanes

with MAGIC = 1024 (fp16 0x6400) or 128 (bf16 0x4300): those floats are 1024 + u (128 + u) exactly, so
the subtraction is exact. The pair lands in k order (2b, 2b+1) in one register, so the (BLOCK_K,
BLOCK_N) operand is assembled by ``tl.join`` / ``tl.permute`` / ``tl.reshape`` without re-packing,
stored to shared memory once and fed to ``tl.dot`` (mma) with M padded to 16. Scales multiply the
fp32 partial product of each K tile (a tile never crosses a scale group), so there is no per-element
scale work (``PREFETCH_SCALE`` loads the next tile's scales one iteration early). x rows past M are masked.

Triton's CPU interpreter cannot run inline PTX, so under ``TRITON_INTERPRET=1`` (``ASM_UNPACK=False``)
the same tile is built with plain integer ops (shift, mask, sign fix, convert): the same values, so the
tests check the indexing, the join order, split-K, masks and scales; the PTX is checked on the GPU.
With bf16 in the interpreter the operands are fp32 (``FP32_OPERANDS``), as in :mod:`kernels.w4a16`.
"""
from __future__ import annotations

import triton
import triton.language as tl

from compress_kernels._tiles import weight_columns

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
def _join8(n0, n1, n2, n3, n4, n5, n6, n7, ROWS: tl.constexpr, BLOCK_N: tl.constexpr):
    """Eight (ROWS, BLOCK_N) nibble planes -> (8 * ROWS, BLOCK_N) with plane j at rows 8r + j."""
    c = tl.join(tl.join(tl.join(n0, n1), tl.join(n2, n3)), tl.join(tl.join(n4, n5), tl.join(n6, n7)))
    c = tl.permute(c, (0, 4, 3, 2, 1))  # (ROWS, BLOCK_N, s0, s1, s2) -> (ROWS, s2, s1, s0, BLOCK_N), j = 4 s2 + 2 s1 + s0
    return tl.reshape(c, (8 * ROWS, BLOCK_N))


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
def nibble_values(packed, shift, DTYPE: tl.constexpr, MAGIC: tl.constexpr):
    """The nibble at bit ``shift`` of each int32 of ``packed`` (``shift`` a constant or a tensor that
    broadcasts) as exact signed values in DTYPE: elementwise, so any layout stays as it is."""
    if MAGIC:
        nib = ((packed >> shift) & 0xF) ^ 0x8  # q + 8 in 0..15
        if DTYPE == tl.float16:
            w = (nib | 0x6400).to(tl.int16).to(tl.float16, bitcast=True) - 1032.0
        elif DTYPE == tl.bfloat16:
            w = (nib | 0x4300).to(tl.int16).to(tl.bfloat16, bitcast=True) - 136.0
        else:
            w = (nib | 0x4300).to(tl.int16).to(tl.bfloat16, bitcast=True).to(tl.float32) - 136.0
    else:
        w = ((packed << (28 - shift)) >> 28).to(DTYPE)
    return w


@triton.jit
def nibble_planes(packed, DTYPE: tl.constexpr, ASM: tl.constexpr, MAGIC: tl.constexpr = False):
    """The 8 nibble planes of an int32 tile (plane j = nibble j of every word, same shape) as exact
    values in DTYPE: through the inline PTX if ASM (fp16 / bf16 on a GPU), else plain Triton ops."""
    if ASM:
        return nibble_planes_asm(packed, DTYPE)
    return (nibble_values(packed, 0, DTYPE, MAGIC), nibble_values(packed, 4, DTYPE, MAGIC),
            nibble_values(packed, 8, DTYPE, MAGIC), nibble_values(packed, 12, DTYPE, MAGIC),
            nibble_values(packed, 16, DTYPE, MAGIC), nibble_values(packed, 20, DTYPE, MAGIC),
            nibble_values(packed, 24, DTYPE, MAGIC), nibble_values(packed, 28, DTYPE, MAGIC))


@triton.jit
def _unpack_asm(packed, DTYPE: tl.constexpr, ROWS: tl.constexpr, BLOCK_N: tl.constexpr):
    """(ROWS, BLOCK_N) int32 -> (8 ROWS, BLOCK_N) exact int4 values in fp16 / bf16, through inline PTX."""
    n0, n1, n2, n3, n4, n5, n6, n7 = nibble_planes_asm(packed, DTYPE)
    return _join8(n0, n1, n2, n3, n4, n5, n6, n7, ROWS, BLOCK_N)


@triton.jit
def _nibble(packed, j: tl.constexpr, DTYPE: tl.constexpr):
    """Nibble plane j of ``packed`` as signed values in DTYPE (plain integer ops: any backend)."""
    return ((((packed >> (4 * j)) & 0xF) ^ 0x8) - 8).to(DTYPE)


@triton.jit
def _unpack_plain(packed, DTYPE: tl.constexpr, ROWS: tl.constexpr, BLOCK_N: tl.constexpr):
    """Same result as ``_unpack_asm`` without inline PTX (the interpreter's path)."""
    return _join8(_nibble(packed, 0, DTYPE), _nibble(packed, 1, DTYPE), _nibble(packed, 2, DTYPE),
                  _nibble(packed, 3, DTYPE), _nibble(packed, 4, DTYPE), _nibble(packed, 5, DTYPE),
                  _nibble(packed, 6, DTYPE), _nibble(packed, 7, DTYPE), ROWS, BLOCK_N)


@triton.jit
def _load_scale(s_ptrs, k, stride_sg, GROUP_K: tl.constexpr):
    """fp32 scales (BLOCK_N,) of the group holding input channel k (GROUP_K = 0: per channel, row 0)."""
    if GROUP_K == 0:
        return tl.load(s_ptrs).to(tl.float32)
    return tl.load(s_ptrs + (k // GROUP_K) * stride_sg).to(tl.float32)  # GROUP_K a power of two: a shift


@triton.jit
def w4a16_skinny_kernel(
    x_ptr, qw_ptr, s_ptr, bias_ptr, out_ptr,  # x (M, K), qweight (K/8, N), scales (K/G, N), bias (N,), out
    M, N, K,
    stride_xm, stride_xk, stride_qk, stride_qn, stride_sg, stride_sn, stride_os, stride_om,
    SPLIT_K, GROUP_K: tl.constexpr, ADD_BIAS: tl.constexpr, EVEN_K: tl.constexpr, EVEN_N: tl.constexpr,
    ASM_UNPACK: tl.constexpr, FP32_OPERANDS: tl.constexpr, PREFETCH_SCALE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """Program (n tile, K split, m tile) -> fp32 partial (or final) outputs of a BLOCK_M x BLOCK_N tile."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m = tl.program_id(2)
    ROWS: tl.constexpr = BLOCK_K // 8
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = weight_columns(offs_n, N, BLOCK_N, EVEN_N)  # contiguous (16-byte loads) or wrapped (stores masked)
    m_ok = offs_m < M
    offs_k = tl.arange(0, BLOCK_K)
    offs_r = tl.arange(0, ROWS)

    k_tiles = tl.cdiv(K, BLOCK_K)
    tiles_per_split = tl.cdiv(k_tiles, SPLIT_K)
    k_first = tl.multiple_of(pid_k * tiles_per_split * BLOCK_K, BLOCK_K)
    k_last = min(K, k_first + tiles_per_split * BLOCK_K)
    x_ptrs = x_ptr + offs_m[:, None].to(tl.int64) * stride_xm + (k_first + offs_k)[None, :] * stride_xk  # (BM, BK)
    q_ptrs = qw_ptr + (k_first // 8 + offs_r)[:, None] * stride_qk + cols[None, :] * stride_qn  # (BK/8, BN)
    s_ptrs = s_ptr + cols * stride_sn  # (BN,)

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if PREFETCH_SCALE:  # one tile ahead; clamped, so an empty split reads in bounds
        scale_next = _load_scale(s_ptrs, min(k_first, K - 1), stride_sg, GROUP_K)
    else:
        scale_next = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for k0 in range(k_first, k_last, BLOCK_K):
        if EVEN_K:
            a = tl.load(x_ptrs, mask=m_ok[:, None], other=0.0)
            packed = tl.load(q_ptrs)
        else:
            a = tl.load(x_ptrs, mask=m_ok[:, None] & ((k0 + offs_k)[None, :] < K), other=0.0)
            packed = tl.load(q_ptrs, mask=(k0 // 8 + offs_r)[:, None] < K // 8, other=0)
        if PREFETCH_SCALE:  # the next tile's scales are in flight while this tile computes
            scale = scale_next
            scale_next = _load_scale(s_ptrs, min(k0 + BLOCK_K, k_last - 1), stride_sg, GROUP_K)
        else:
            scale = _load_scale(s_ptrs, k0, stride_sg, GROUP_K)
        if FP32_OPERANDS:
            a = a.to(tl.float32)
        if ASM_UNPACK:
            w = _unpack_asm(packed, a.dtype, ROWS, BLOCK_N)  # (BK, BN) exact q
        else:
            w = _unpack_plain(packed, a.dtype, ROWS, BLOCK_N)
        if FP32_OPERANDS:
            acc += tl.dot(a, w, input_precision="ieee", out_dtype=tl.float32) * scale[None, :]
        else:
            acc += tl.dot(a, w, out_dtype=tl.float32) * scale[None, :]
        x_ptrs += BLOCK_K * stride_xk
        q_ptrs += ROWS * stride_qk

    if ADD_BIAS:  # with split-K the reduce pass adds the bias
        acc += tl.load(bias_ptr + cols).to(tl.float32)[None, :]
    out_ptrs = out_ptr + pid_k * stride_os + offs_m[:, None].to(tl.int64) * stride_om + offs_n[None, :]
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=m_ok[:, None] & (offs_n[None, :] < N))


def launch_skinny(x2, qweight, scales, group_size, bias, out, cfg, asm_unpack: bool, fp32_operands: bool) -> None:
    """Launch on validated (M, K) ``x2``; ``out`` is (M, N) or the (SPLIT_K, M, N) fp32 workspace.

    ``cfg`` is a :class:`kernels.w4a16.TileConfig` whose BLOCK_K divides the group size (or G = K)."""
    m, k = x2.shape
    n = qweight.shape[1]
    grid = (triton.cdiv(n, cfg.block_n), cfg.split_k, triton.cdiv(m, cfg.block_m))
    w4a16_skinny_kernel[grid](
        x2, qweight, scales, bias if bias is not None else scales, out,
        m, n, k,
        x2.stride(0), x2.stride(1), qweight.stride(0), qweight.stride(1), scales.stride(0), scales.stride(1),
        m * n if cfg.split_k > 1 else 0, out.stride(-2),
        cfg.split_k, GROUP_K=0 if group_size == k else group_size, ADD_BIAS=bias is not None and cfg.split_k == 1, EVEN_K=k % (cfg.block_k * cfg.split_k) == 0,
        EVEN_N=n % cfg.block_n == 0, ASM_UNPACK=asm_unpack, FP32_OPERANDS=fp32_operands,
        PREFETCH_SCALE=cfg.prefetch_scale,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
