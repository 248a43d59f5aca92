"""W4A16 matmul: fp16/bf16 activations x packed signed int4 weights with group scales, fp32 accumulation.

Layout (the contract of ``kernels.reference``): ``qweight`` (K/8, N) int32, row-major, so one row of
it holds 8 consecutive input channels for every output channel and a tile of it is read coalesced
along N. Nibble ``j`` (bits 4j..4j+3) of ``qweight[r, n]`` is ``q[8r + j, n]`` in two's complement.
``scales`` (K/G, N) fp32 or x's dtype, G in {32, 64, 128} or G = K (per channel)::

    W[n, k] = q[k, n] * scales[k // G, n]       y = x @ W.T (+ bias)     fp32 accumulation

Unpacking a (BLOCK_K/8, BLOCK_N) int32 tile into (BLOCK_K, BLOCK_N) int4 values: broadcast it to
(BLOCK_K/8, 8, BLOCK_N), move nibble j to the top with ``<< (28 - 4j)`` and sign-extend it back with
an arithmetic ``>> 28``; reshaping to (BLOCK_K, BLOCK_N) puts channel 8r + j at row 8r + j.
``MAGIC_UNPACK`` instead builds the 16-bit float ``1024 + (q + 8)`` (fp16) or ``128 + (q + 8)`` (bf16)
from its bit pattern and subtracts the constant, which avoids integer-to-float conversions.
Either way the integers -8..7 are exact in fp16/bf16. ``EXPANDED_LOAD`` is the classic alternative that
avoids the 3-D reshape: it loads a (BLOCK_K, BLOCK_N) tile whose row k points at packed row k // 8
(the 8 repeats hit L1) and extracts nibble k % 8 per row.

Triton's CPU interpreter (3.9) mishandles bf16 arithmetic and int -> bf16 casts (it computes on the raw
bits), so under ``TRITON_INTERPRET=1`` with bf16 inputs the kernel multiplies fp32 copies of the same
operands (``FP32_OPERANDS``; exact for these values). The GPU always runs the bf16 tensor-core path.

Each K tile lies inside one scale group (BLOCK_K divides G, or G = K), so two dequant orders exist:
``SCALE_AFTER_DOT`` multiplies the tile's fp32 partial product by ``scales[g, n]`` (exact integer
operands, BLOCK_M x BLOCK_N multiplies per tile: the small-M path), otherwise the tile is dequantized
to x's dtype before ``tl.dot`` (BLOCK_K x BLOCK_N multiplies, the accumulator stays in the tensor-core
pipeline: the large-M path).

``PLANES`` (the default for 2 <= M <= 16 with 128-deep K tiles) takes a K tile as 8 nibble planes:
plane j is nibble j of every word of the (BK/8, BN) packed tile, i.e. channels kt + 8r + j, and meets
the x columns kt + 8r + j in a 16-deep ``tl.dot``. A plane is elementwise in the packed tile, so
Triton loads the words from shared memory straight into the tensor-core operand layout and the
unpack (13 PTX instructions per word for all 8 planes, :func:`kernels.w4a16_gemv.nibble_planes_asm`)
happens in registers: the unpacked tile never goes through shared memory, which bound the plain
tiled kernel. The x tile is loaded whole (cp.async) and split into its planes in registers.
``PREFETCH_SCALE`` loads the next K tile's scale row at the top of each iteration (Triton leaves
that row out of its pipeline): on 64-wide plane tiles, and on all of them with 16-bit scales.

Small M is memory bound (the packed weight is a quarter of the fp16 bytes). At M <= 2 on layers with
K <= 4096 and at most 16 Mi weights, and up to M = 16 on small layers (<= 4 Mi weights), the launcher
runs :mod:`kernels.w4a16_wholek` (each program loads its whole K strip at once: one DRAM trip, no
split). Otherwise at M = 1 it runs :mod:`kernels.w4a16_fma` (CUDA-core FMAs over K splits: 2.2-3.0x
cuBLAS on an H100). From M = 17 to 256 on large layers (``wgmma_serves``: more than 4 Mi weights, and
above 32 rows at least 32 Mi, with 128-deep K tiles inside a scale group) it runs :mod:`kernels.w4a16_wgmma`,
the weight as the register operand of wgmma. Otherwise, up to M = 127, this kernel (nibble planes to
M = 16) with narrow N tiles plus split-K (fp32 partials summed in split order: by the last split of
each 16-row tile to finish, in the kernel, else by :func:`kernels._splitk.splitk_reduce`) gives every
SM a stream of weight tiles; from M = 128 on, a Triton dequantize pass and cuBLAS.
``CHUNK`` > 1 makes one loop step cover CHUNK K tiles whose scale rows come in one (CHUNK, BN) load
(same per-tile products and summation order as CHUNK = 1); measured slower on the H100, not a default.
``path="skinny"`` (:mod:`kernels.w4a16_gemv`, two nibbles per op) is a selectable variant that measured
no faster. Tiles come from the heuristic ``pick_config`` on (M bucket, N, K, G); there is no
autotuning, so the first call can be captured in a CUDA graph. Registered as
``torch.ops.compress_kernels.w4a16_matmul``.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from compress_kernels._checks import interpreting, check_activation, check_bias, check_same_device, check_shape, check_tensor
from compress_kernels._splitk import splitk_reduce, tiled_split_launch, write_tile
from compress_kernels._tiles import (SMALL_LAYER, grouped_tile, prefetch_split_k, split8, split_k_for, split_k_range,
                            weight_columns)
from compress_kernels.w4a16_fma import launch_fma
from compress_kernels.w4a16_wholek import launch_wholek, wholek_block_k
from compress_kernels.w4a16_gemv import launch_skinny, nibble_planes, nibble_values
from compress_kernels.w4a16_wgmma import launch_wgmma
from compress_kernels.w4a16_wgmma import supports as wgmma_supports

GROUP_SIZES = (32, 64, 128)
FMA_MAX_M = 1  # up to here, the CUDA-core kernel of kernels.w4a16_fma (one program per token row and tile),
FMA_MIN_WEIGHTS = 4 * 2**20  # for layers this large (at 1024x1024 the tiled kernel measured faster)
WHOLEK_MAX_M = 2  # up to here, layers with K <= WHOLEK_MAX_PICK_K and at most WHOLEK_MAX_WEIGHTS weights take
WHOLEK_MAX_PICK_K = 4096  # kernels.w4a16_wholek (whole K strip per program; H100, M = 1: 1024x1024 5.3 -> 3.0 us,
WHOLEK_MAX_WEIGHTS = 16 * 2**20  # 4096x4096 8.6 -> 7.6 us; 4096x11008 stays with the fma kernel, 15.2 vs 16.9);
# small layers (<= SMALL_LAYER weights) up to M = 16 (1024x1024 M = 8: 6.0 -> 4.0 us; 4096x4096 M = 4 lost:
# 15.7 vs 10.4 us)
PLANES_MAX_M = 16  # up to here (and with 128-deep K tiles), the nibble-plane tiles (H100: 1.3-1.6x the tiled kernel)
WIDE_N = 8192  # from here on the nibble-plane tiles are 128 wide (H100, M = 16: 8192x8192 23.0 vs 25.3 us)
SHORT_K = 512  # with n * k <= SMALL_LAYER (MiniLM's 384-wide inputs): no split-K at M <= 64
DEQUANT_MIN_M = 128  # from here on, dequantize once and let cuBLAS run the fp16 GEMM (see docs/kernels-notes.md)
WGMMA_MAX_M = 256  # from PLANES_MAX_M to here, on layers of > SMALL_LAYER weights: the swapped nibble pairs
WGMMA_MIN_WEIGHTS = 32 * 2**20  # ... and above 32 rows only on layers this large (H100, M = 64: 4096x4096
# ran 17.6 us there against 16.1 for the 64-row tiled kernel; 4096x11008 29.7 against 43.7)


class TileConfig(NamedTuple):
    """Launch parameters of ``_w4a16_matmul_kernel``."""

    block_m: int
    block_n: int
    block_k: int
    split_k: int = 1
    group_m: int = 8
    num_warps: int = 4
    num_stages: int = 3
    scale_after_dot: bool = False
    magic_unpack: bool = False
    expanded_load: bool = False
    path: str = "tiled"  # "fma" (kernels.w4a16_fma, CUDA-core FMAs, M = 1), "wholek" (kernels.w4a16_wholek, the
    # same FMAs on the whole K strip at once, small M on small layers), "wgmma" (kernels.w4a16_wgmma,
    # swapped nibble pairs, the weight as register operand), "skinny" (kernels.w4a16_gemv, M <= 64),
    # "tiled" (tl.dot), "dequant" (dequantize, then cuBLAS)
    asm_unpack: bool = True  # skinny path and nibble planes: inline-PTX unpack (False: plain Triton ops; always
    # so in the interpreter)
    prefetch_scale: bool = False  # skinny and tiled paths: load the next K tile's scales one iteration ahead
    chunk: int = 1  # tiled path: K tiles per loop step (power of two); their scale rows come in one load
    planes: bool = False  # tiled path: the K tile as 8 nibble planes (packed words straight into the dot operand)


@triton.jit
def _unpack_int4(packed, BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr, DTYPE: tl.constexpr, MAGIC: tl.constexpr):
    """(BLOCK_K/8, BLOCK_N) int32 -> (BLOCK_K, BLOCK_N) int4 values in DTYPE (fp16, bf16 or fp32), exactly."""
    j = tl.arange(0, 8)
    if MAGIC:
        biased = packed ^ -0x77777778  # 0x88888888: each nibble q -> q + 8 in 0..15
        nib = (biased[:, None, :] >> (4 * j)[None, :, None]) & 0xF  # (BK/8, 8, BN)
        if DTYPE == tl.float16:
            w = (nib | 0x6400).to(tl.int16).to(tl.float16, bitcast=True) - 1032.0  # 1024 + (q + 8)
        elif DTYPE == tl.bfloat16:
            w = (nib | 0x4300).to(tl.int16).to(tl.bfloat16, bitcast=True) - 136.0  # 128 + (q + 8)
        else:  # fp32 (interpreter emulation of bf16): same bits, subtraction in fp32
            w = (nib | 0x4300).to(tl.int16).to(tl.bfloat16, bitcast=True).to(tl.float32) - 136.0
    else:
        q = (packed[:, None, :] << (28 - 4 * j)[None, :, None]) >> 28  # sign-extended nibble j
        w = q.to(DTYPE)
    return tl.reshape(w, (BLOCK_K, BLOCK_N))


@triton.jit
def _unpack_int4_rows(packed, offs_k, DTYPE: tl.constexpr, MAGIC: tl.constexpr):
    """(BLOCK_K, BLOCK_N) int32, row k holding packed word k // 8 -> its nibble k % 8, in DTYPE, exactly."""
    return nibble_values(packed, ((offs_k % 8) * 4)[:, None], DTYPE, MAGIC)


@triton.jit
def _tile_product(acc, a, packed, scale, offs_k, SCALE_AFTER_DOT: tl.constexpr, MAGIC_UNPACK: tl.constexpr,
                  EXPANDED_LOAD: tl.constexpr, FP32_OPERANDS: tl.constexpr, BLOCK_K: tl.constexpr,
                  BLOCK_N: tl.constexpr):
    """acc + x tile (BM, BK) @ dequantized weight tile (BK, BN) with one scale row (BN,), fp32."""
    if FP32_OPERANDS:  # interpreter + bf16: its bf16 arithmetic is broken, fp32 is exact here
        a = a.to(tl.float32)
    if EXPANDED_LOAD:
        q = _unpack_int4_rows(packed, offs_k, a.dtype, MAGIC_UNPACK)  # (BK, BN) exact ints
    else:
        q = _unpack_int4(packed, BLOCK_K, BLOCK_N, a.dtype, MAGIC_UNPACK)
    if SCALE_AFTER_DOT:
        if FP32_OPERANDS:
            acc += tl.dot(a, q, input_precision="ieee", out_dtype=tl.float32) * scale[None, :]
        else:
            acc += tl.dot(a, q, out_dtype=tl.float32) * scale[None, :]
    else:
        w = (q.to(tl.float32) * scale[None, :]).to(a.dtype)
        if FP32_OPERANDS:
            acc = tl.dot(a, w, acc, input_precision="ieee", out_dtype=tl.float32)
        else:
            acc = tl.dot(a, w, acc, out_dtype=tl.float32)
    return acc


@triton.jit
def _x_planes(x_ptrs, kt, k_last, offs_k, EVEN_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    """The contiguous (BM, BK) x tile split in registers into its 8 planes (BM, BK/8): plane j holds
    columns kt + 8r + j (k = 8r + 4a + 2b + c, split off c, then b, then a)."""
    if EVEN_K:
        a = tl.load(x_ptrs)
    else:
        a = tl.load(x_ptrs, mask=(kt + offs_k)[None, :] < k_last, other=0.0)
    return split8(tl.reshape(a, (BLOCK_M, BLOCK_K // 8, 2, 2, 2)))


@triton.jit
def _plane_dot(part, a, w, FP32_OPERANDS: tl.constexpr):
    if FP32_OPERANDS:
        return tl.dot(a.to(tl.float32), w, part, input_precision="ieee", out_dtype=tl.float32)
    return tl.dot(a, w, part, out_dtype=tl.float32)


@triton.jit
def _plane_tile_product(acc, x_ptrs, packed, scale, offs_k, kt, k_last, EVEN_K: tl.constexpr,
                        MAGIC_UNPACK: tl.constexpr, ASM_UNPACK: tl.constexpr, FP32_OPERANDS: tl.constexpr,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """acc + one K tile as 8 nibble planes: plane j is the (BK/8, BN) tile of nibble j of every packed word
    (channels kt + 8r + j) times the x columns kt + 8r + j. Each plane is elementwise in the packed tile, so
    Triton loads the words straight into the dot-operand layout and unpacks them in registers; scale after.
    The x tile is loaded whole and split into its planes in registers (loading each plane's columns
    with a stride of 8 measured 1.7-2x slower on an H100). ASM_UNPACK builds all 8 planes of a word in
    13 PTX instructions (kernels.w4a16_gemv)."""
    part = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    x_dtype: tl.constexpr = tl.float32 if FP32_OPERANDS else x_ptrs.dtype.element_ty
    w0, w1, w2, w3, w4, w5, w6, w7 = nibble_planes(packed, x_dtype, ASM_UNPACK, MAGIC_UNPACK)
    a0, a1, a2, a3, a4, a5, a6, a7 = _x_planes(x_ptrs, kt, k_last, offs_k, EVEN_K, BLOCK_M, BLOCK_K)
    part = _plane_dot(part, a0, w0, FP32_OPERANDS)
    part = _plane_dot(part, a1, w1, FP32_OPERANDS)
    part = _plane_dot(part, a2, w2, FP32_OPERANDS)
    part = _plane_dot(part, a3, w3, FP32_OPERANDS)
    part = _plane_dot(part, a4, w4, FP32_OPERANDS)
    part = _plane_dot(part, a5, w5, FP32_OPERANDS)
    part = _plane_dot(part, a6, w6, FP32_OPERANDS)
    part = _plane_dot(part, a7, w7, FP32_OPERANDS)
    return acc + part * scale[None, :]


@triton.jit
def _w4a16_matmul_kernel(
    x_ptr, qw_ptr, s_ptr, bias_ptr, out_ptr,  # x (M, K), qweight (K/8, N), scales (K/G, N), bias (N,), out
    y_ptr, cnt_ptr,  # REDUCE_SPLIT > 1: the output (M, N) and one ticket counter per output tile
    M, N, K, group_size,
    stride_xm, stride_xk, stride_qk, stride_qn, stride_sg, stride_sn, stride_os, stride_om, stride_ym,
    SPLIT_K, ADD_BIAS: tl.constexpr, REDUCE_SPLIT: tl.constexpr, EVEN_K: tl.constexpr, EVEN_N: tl.constexpr,
    SCALE_AFTER_DOT: tl.constexpr, MAGIC_UNPACK: tl.constexpr, EXPANDED_LOAD: tl.constexpr,
    FP32_OPERANDS: tl.constexpr, CHUNK: tl.constexpr, PLANES: tl.constexpr, ASM_UNPACK: tl.constexpr,
    PREFETCH_SCALE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):
    pid_m, pid_n = grouped_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    pid_k = tl.program_id(1)

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = (offs_m % M).to(tl.int64)  # wrapped: loads need no M/N mask, stores are masked
    cols = weight_columns(offs_n, N, BLOCK_N, EVEN_N)  # contiguous (16-byte loads) or wrapped
    offs_k = tl.arange(0, BLOCK_K)
    offs_kp = tl.arange(0, BLOCK_K // 8)

    k_first, k_last = split_k_range(pid_k, K, SPLIT_K, BLOCK_K)
    x_ptrs = x_ptr + rows[:, None] * stride_xm + (k_first + offs_k)[None, :] * stride_xk  # (BM, BK)
    if EXPANDED_LOAD:  # (BK, BN): row k reads packed row k // 8 (8 rows share a word, served by L1)
        q_ptrs = qw_ptr + ((k_first + offs_k) // 8)[:, None] * stride_qk + cols[None, :] * stride_qn
    else:  # (BK/8, BN): each packed word read once
        q_ptrs = qw_ptr + (k_first // 8 + offs_kp)[:, None] * stride_qk + cols[None, :] * stride_qn
    s_ptrs = s_ptr + cols * stride_sn  # (BN,)

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    offs_c = tl.arange(0, CHUNK)
    if PREFETCH_SCALE:  # CHUNK = 1: one tile ahead (clamped, so an empty split reads in bounds)
        scale_next = tl.load(s_ptrs + (min(k_first, K - 1) // group_size) * stride_sg).to(tl.float32)
    else:
        scale_next = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for k0 in range(k_first, k_last, CHUNK * BLOCK_K):  # one step = CHUNK K tiles
        # the step's CHUNK scale rows in one load, issued before any tile waits on it (clamped: a tile
        # past k_last reads a valid row and contributes zero)
        if CHUNK > 1:
            chunk_k = tl.minimum(k0 + offs_c * BLOCK_K, K - 1)
            scales = tl.load(s_ptrs[None, :] + (chunk_k // group_size)[:, None] * stride_sg).to(tl.float32)
        for t in tl.static_range(CHUNK):
            kt = k0 + t * BLOCK_K
            if not PLANES:  # (the planes split their x tile in _plane_tile_product)
                if EVEN_K:
                    a = tl.load(x_ptrs)
                else:  # masked against k_last (not K): with CHUNK > 1 a step may run past this split's range
                    a = tl.load(x_ptrs, mask=(kt + offs_k)[None, :] < k_last, other=0.0)
            if EVEN_K:
                packed = tl.load(q_ptrs)
            else:
                if EXPANDED_LOAD:
                    packed = tl.load(q_ptrs, mask=(kt + offs_k)[:, None] < k_last, other=0)
                else:
                    packed = tl.load(q_ptrs, mask=(kt // 8 + offs_kp)[:, None] < k_last // 8, other=0)
            if PREFETCH_SCALE:  # the next tile's scale row is in flight while this tile computes
                scale = scale_next
                next_row = min(kt + BLOCK_K, k_last - 1) // group_size
                scale_next = tl.load(s_ptrs + next_row * stride_sg).to(tl.float32)
            elif CHUNK == 1:  # the original order: tile loads, then its scale row
                scale = tl.load(s_ptrs + (k0 // group_size) * stride_sg).to(tl.float32)  # (BN,)
            else:  # row t of the (CHUNK, BN) tile: a sum of one value and zeros, exact
                scale = tl.sum(tl.where((offs_c == t)[:, None], scales, 0.0), axis=0)
            if PLANES:
                acc = _plane_tile_product(acc, x_ptrs, packed, scale, offs_k, kt, k_last, EVEN_K, MAGIC_UNPACK,
                                          ASM_UNPACK, FP32_OPERANDS, BLOCK_M, BLOCK_N, BLOCK_K)
            else:
                acc = _tile_product(acc, a, packed, scale, offs_k, SCALE_AFTER_DOT, MAGIC_UNPACK, EXPANDED_LOAD,
                                    FP32_OPERANDS, BLOCK_K, BLOCK_N)
            x_ptrs += BLOCK_K * stride_xk
            q_ptrs += (BLOCK_K // 8) * stride_qk

    write_tile(acc, out_ptr, cnt_ptr, y_ptr, bias_ptr, cols, offs_m, offs_n, M, N, stride_os, stride_om, stride_ym,
               tl.program_id(0), pid_k, REDUCE_SPLIT, ADD_BIAS)


@triton.jit
def _dequantize_kernel(
    qw_ptr, s_ptr, w_ptr,  # qweight (K/8, N), scales (K/G, N), W^T out (K, N) contiguous in x's dtype
    N, K, group_size, stride_qk, stride_qn, stride_sg, stride_sn,
    MAGIC_UNPACK: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """Large-M path, first step: W^T[k, n] = q[k, n] * scales[k // G, n] in x's dtype (BLOCK_K divides G)."""
    k0 = tl.program_id(0) * BLOCK_K
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_kp = k0 // 8 + tl.arange(0, BLOCK_K // 8)
    n_ok = offs_n < N
    packed = tl.load(qw_ptr + offs_kp[:, None] * stride_qk + offs_n[None, :] * stride_qn,
                     mask=(offs_kp[:, None] < K // 8) & n_ok[None, :], other=0)
    scale = tl.load(s_ptr + (k0 // group_size) * stride_sg + offs_n * stride_sn, mask=n_ok, other=0.0)
    q = _unpack_int4(packed, BLOCK_K, BLOCK_N, tl.float32, MAGIC_UNPACK)
    w = q * scale.to(tl.float32)[None, :]
    offs_k = k0 + tl.arange(0, BLOCK_K)
    out = w_ptr + offs_k[:, None].to(tl.int64) * N + offs_n[None, :]
    tl.store(out, w.to(w_ptr.dtype.element_ty), mask=(offs_k[:, None] < K) & n_ok[None, :])


def dequantize(qweight, scales, group_size: int, dtype: torch.dtype) -> torch.Tensor:
    """Triton dequantization: (K/8, N) packed + (K/G, N) scales -> W^T (K, N) in ``dtype``."""
    k, n = qweight.shape[0] * 8, qweight.shape[1]
    w_t = torch.empty((k, n), dtype=dtype, device=qweight.device)
    block_k = min(64, group_size) if group_size != k else 64
    block_n = 128
    grid = (triton.cdiv(k, block_k), triton.cdiv(n, block_n))
    _dequantize_kernel[grid](
        qweight, scales, w_t, n, k, group_size,
        qweight.stride(0), qweight.stride(1), scales.stride(0), scales.stride(1),
        MAGIC_UNPACK=False, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=4,
    )
    return w_t


def wgmma_serves(m: int, n: int, k: int, group_size: int) -> bool:
    """Whether ``pick_config`` gives this call the swapped nibble pairs (:mod:`kernels.w4a16_wgmma`)."""
    if not (PLANES_MAX_M < m <= WGMMA_MAX_M and n * k > SMALL_LAYER and wgmma_supports(k, group_size)):
        return False
    return m <= 32 or n * k >= WGMMA_MIN_WEIGHTS


def pick_config(m: int, n: int, k: int, group_size: int) -> TileConfig:
    """Tile shape by M bucket; BLOCK_K never crosses a scale group."""
    if wgmma_serves(m, n, k, group_size):
        return _wgmma_config(m, n, k)
    if wholek_serves(m, n, k):
        return wholek_config(m, k)
    if m >= DEQUANT_MIN_M:
        return TileConfig(0, 0, 0, path="dequant")
    if m <= FMA_MAX_M and n * k >= FMA_MIN_WEIGHTS:  # H100: 2.2-3.0x fp16 at M = 1 (docs/kernels-notes.md)
        cfg = TileConfig(1, 64, 128 if group_size == k else min(128, group_size), num_warps=4, num_stages=3, path="fma")
        return cfg._replace(split_k=prefetch_split_k(m, n, k, cfg))
    if m <= 64 and k <= SHORT_K and n * k <= SMALL_LAYER:
        # Small layers sit in L2 and take a few K steps: split-K's reduce launch costs more than it buys
        # (H200, M = 64: 384x384 5.6 -> 4.4 us, 384x1536 6.5 -> 4.9 us; docs/kernels-notes.md)
        return TileConfig(16, 64, 128 if group_size == k else min(128, group_size), num_warps=4, num_stages=3,
                          scale_after_dot=True)
    block_k = 128 if group_size == k else min(128, group_size)
    if m <= PLANES_MAX_M and block_k == 128:  # 64 columns per warp; H100 sweeps, session 9 (docs/kernels-notes.md)
        # 64-wide tiles load the next scale row early (H100, 11008x4096: 21.3 -> 18.5 us)
        block_n = 128 if n >= WIDE_N else 64
        cfg = TileConfig(16, block_n, 128, num_warps=2, num_stages=3, scale_after_dot=True, planes=True,
                         prefetch_scale=block_n == 64)
        return cfg._replace(split_k=_balanced_split_k(m, n, k, cfg))
    if m <= 16:  # the skinny path (kernels.w4a16_gemv) measured slower on the H100: see docs/kernels-notes.md
        cfg = TileConfig(16, 64, 128, num_warps=4, num_stages=4, scale_after_dot=True)
    elif m <= 64:
        cfg = TileConfig(64, 64, 128, num_warps=4, num_stages=4, scale_after_dot=True)
    else:
        cfg = TileConfig(128, 128, 64, num_warps=8, num_stages=4)
    if group_size != k:
        cfg = cfg._replace(block_k=min(cfg.block_k, group_size))
    if m <= 16:  # H100 call 5: >= 2 programs per SM in near-full waves, 7-14% faster on 8192x28672, 11008x4096
        return cfg._replace(split_k=_balanced_split_k(m, n, k, cfg))
    return cfg._replace(split_k=split_k_for(m, n, k, cfg))


def wholek_serves(m: int, n: int, k: int) -> bool:
    """Whether ``pick_config`` gives this call the whole-K-strip kernel (:mod:`kernels.w4a16_wholek`)."""
    if k > WHOLEK_MAX_PICK_K:
        return False
    return (m <= WHOLEK_MAX_M and n * k <= WHOLEK_MAX_WEIGHTS) or (m <= PLANES_MAX_M and n * k <= SMALL_LAYER)


def wholek_config(m: int, k: int) -> TileConfig:
    """The whole-K-strip kernel's tile (H100 sweeps, docs/kernels-notes.md). M <= 2: 16 columns and
    8 warps up to 2048-deep strips, 8 columns and 4 warps beyond (wider tiles or fewer warps at
    K = 4096 spill registers: 2-20x slower). More rows (small layers only): 32 columns and 4 warps up
    to 1024-deep strips, 16 beyond."""
    block_k = wholek_block_k(k)
    if m <= WHOLEK_MAX_M:
        block_n, warps = (16, 8) if block_k <= 2048 else (8, 4)
    else:
        block_n, warps = (32, 4) if block_k <= 1024 else (16, 4)
    return TileConfig(1, block_n, block_k, num_warps=warps, num_stages=1, path="wholek")


def _wgmma_config(m: int, n: int, k: int) -> TileConfig:
    """Swapped nibble pairs: 32, 64 or 128 token rows per tile (the wgmma's N side), 64 or 128 channels
    (its M side), one warp group, 3 stages, the balanced split (H100 sweep, session 10: docs/kernels-notes.md).
    At 33-64 rows, layers with few outputs and long rows (N <= 4096, K > 8192) take 256 channels and two
    warp groups, which share each x tile (11008x4096 at M = 64: 36.2 -> 31.0 us)."""
    block_m, block_n = (32, 64) if m <= 32 else ((64, 128) if m <= 64 else (128, 128))
    warps = 4
    if 32 < m <= 64 and n <= 4096 and k > 8192:
        block_n, warps = 256, 8
    cfg = TileConfig(block_m, block_n, 128, num_warps=warps, num_stages=3, path="wgmma")
    return cfg._replace(split_k=_balanced_split_k(m, n, k, cfg))


def skinny_config(m: int, n: int, k: int, group_size: int) -> TileConfig:
    """M <= 64: the two-nibbles-per-op kernel of :mod:`kernels.w4a16_gemv` (see docs/kernels-notes.md).

    Not the default: on the H100 it measured slower than the tiled kernel (call 4); kept for the sweep."""
    block_m = 16 if m <= 16 else (32 if m <= 32 else 64)
    block_k = 128 if group_size == k else min(128, group_size)
    cfg = TileConfig(block_m, 64, block_k, num_warps=4, num_stages=4, path="skinny")
    return cfg._replace(split_k=_balanced_split_k(m, n, k, cfg))


def _balanced_split_k(m: int, n: int, k: int, cfg: TileConfig, sms: int = 132) -> int:
    """Smallest power-of-two K split giving >= 2 programs per SM with whole waves >= 85% full.

    A wave here is one program per SM; a last, partly filled wave leaves SMs idle while the rest stream.
    Each split keeps at least two loop steps (``chunk`` K tiles each), so the pipeline has something to overlap."""
    tiles = triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n)
    k_tiles = triton.cdiv(k, cfg.block_k * cfg.chunk)  # loop steps (chunk K tiles each)
    best, best_fill, split = 1, 0.0, 1
    while split <= 16 and (split == 1 or k_tiles // split >= 2):
        programs = tiles * split
        fill = programs / (triton.cdiv(programs, sms) * sms)
        if programs >= 2 * sms and fill >= 0.85:
            return split
        if fill > best_fill:  # under one wave, fill grows with the split: the most programs win
            best, best_fill = split, fill
        split *= 2
    return best


def _validate(x, qweight, scales, group_size, bias) -> None:
    check_activation(x)
    check_tensor("qweight", qweight, (torch.int32,), ndim=2)
    k = x.shape[-1]
    if k == 0 or k % 8:
        raise ValueError(f"x: expected K (last dim) a positive multiple of 8 (8 int4 per int32), got K = {k}")
    n = qweight.shape[1]
    check_shape("qweight", qweight, (k // 8, n))
    if isinstance(group_size, bool) or not isinstance(group_size, int):
        raise TypeError(f"group_size: expected an int, got {type(group_size).__name__}")
    if group_size not in GROUP_SIZES and group_size != k:
        raise ValueError(f"group_size: expected one of {GROUP_SIZES} or K = {k}, got {group_size}")
    if k % group_size:
        raise ValueError(f"x: expected K a multiple of group_size = {group_size}, got K = {k}")
    check_tensor("scales", scales, (torch.float32, x.dtype), ndim=2)
    check_shape("scales", scales, (k // group_size, n))
    check_bias(bias, n, x)
    check_same_device(x, qweight=qweight, scales=scales)


def launch(x2, qweight, scales, group_size: int, bias=None, config: TileConfig | None = None) -> torch.Tensor:
    """Run the kernel on validated 2-D ``x2`` (M, K); returns (M, N) in x2's dtype."""
    m, k = x2.shape
    n = qweight.shape[1]
    y = torch.empty((m, n), dtype=x2.dtype, device=x2.device)
    if m == 0:
        return y
    cfg = config or pick_config(m, n, k, group_size)
    if config is None and cfg.planes and scales.element_size() == 2:
        # 16-bit scale rows are loaded synchronously in the loop: always one K tile ahead (H100, M = 16,
        # 8192x28672: 74.8 -> 69.2 us, the fp32-scale time; docs/kernels-notes.md, session 10)
        cfg = cfg._replace(prefetch_scale=True)
    if cfg.path == "dequant":
        w_t = dequantize(qweight, scales, group_size, x2.dtype)  # (K, N)
        if bias is None:
            return torch.matmul(x2, w_t, out=y)
        return torch.addmm(bias.to(x2.dtype), x2, w_t, out=y)
    bias = bias.contiguous() if bias is not None else None
    if cfg.path == "fma":  # one launch: the kernel reduces its own K splits
        launch_fma(x2, qweight, scales, group_size, bias, y, cfg)
        return y
    if cfg.path == "wholek":  # one launch, one load of the whole K strip per program
        launch_wholek(x2, qweight, scales, group_size, bias, y, cfg)
        return y
    if cfg.path == "tiled":  # writes y itself (its K splits summed in the kernel or by a second launch)
        _launch_tiled(x2, qweight, scales, group_size, bias, y, cfg)
        return y
    if cfg.path == "wgmma":  # the same, after a pass that puts x in pair order
        launch_wgmma(x2, qweight, scales, group_size, bias, y, cfg, interpreting())
        return y
    out = y if cfg.split_k == 1 else torch.empty((cfg.split_k, m, n), dtype=torch.float32, device=x2.device)
    if cfg.path != "skinny":
        raise ValueError(f"config.path: expected fma, wholek, tiled, wgmma, skinny or dequant, got {cfg.path!r}")
    fp32_operands = interpreting() and x2.dtype == torch.bfloat16
    launch_skinny(x2, qweight, scales, group_size, bias, out, cfg, cfg.asm_unpack and not interpreting(), fp32_operands)
    if cfg.split_k > 1:
        splitk_reduce(out, bias, y)
    return y


def _launch_tiled(x2, qweight, scales, group_size, bias, y, cfg: TileConfig) -> None:
    """The tensor-core kernel into ``y`` (M, N); K splits summed in the kernel for 16-row tiles, else
    by a second launch (:func:`kernels._splitk.reduces_in_kernel`)."""
    m, k = x2.shape
    n = qweight.shape[1]
    if cfg.prefetch_scale and cfg.chunk != 1:
        raise ValueError(f"config: prefetch_scale needs chunk 1 (a chunk loads its scale rows together), "
                         f"got {cfg.chunk}")
    if cfg.planes and (cfg.block_k < 128 or cfg.expanded_load or cfg.chunk != 1):
        raise ValueError(f"config: nibble planes need block_k >= 128 (one 16-deep dot per plane), no expanded "
                         f"load and chunk 1, got block_k={cfg.block_k}, expanded_load={cfg.expanded_load}, "
                         f"chunk={cfg.chunk}")
    grid, in_kernel, out, counters = tiled_split_launch(y, m, n, cfg.block_m, cfg.block_n, cfg.split_k)
    _w4a16_matmul_kernel[grid](
        x2, qweight, scales, bias if bias is not None else scales, out, y, counters,
        m, n, k, group_size,
        x2.stride(0), x2.stride(1), qweight.stride(0), qweight.stride(1), scales.stride(0), scales.stride(1),
        m * n if cfg.split_k > 1 else 0, out.stride(-2), y.stride(0),
        cfg.split_k, ADD_BIAS=bias is not None and (cfg.split_k == 1 or in_kernel),
        REDUCE_SPLIT=cfg.split_k if in_kernel else 1,
        EVEN_K=k % (cfg.block_k * cfg.chunk * cfg.split_k) == 0, EVEN_N=n % cfg.block_n == 0,
        SCALE_AFTER_DOT=cfg.scale_after_dot, MAGIC_UNPACK=cfg.magic_unpack, EXPANDED_LOAD=cfg.expanded_load,
        FP32_OPERANDS=interpreting() and x2.dtype == torch.bfloat16, CHUNK=cfg.chunk, PLANES=bool(cfg.planes),
        ASM_UNPACK=cfg.asm_unpack and cfg.planes and not interpreting(), PREFETCH_SCALE=cfg.prefetch_scale,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    if cfg.split_k > 1 and not in_kernel:
        splitk_reduce(out, bias, y)


@torch.library.custom_op("compress_kernels::w4a16_matmul", mutates_args=())
def _w4a16_op(
    x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, group_size: int, bias: torch.Tensor | None
) -> torch.Tensor:
    _validate(x, qweight, scales, group_size, bias)
    k = x.shape[-1]
    y2 = launch(x.reshape(-1, k), qweight, scales, group_size, bias)
    return y2.reshape(*x.shape[:-1], qweight.shape[1])


@_w4a16_op.register_fake
def _w4a16_fake(x, qweight, scales, group_size, bias):
    _validate(x, qweight, scales, group_size, bias)
    return x.new_empty((*x.shape[:-1], qweight.shape[1]))


def w4a16_matmul(x, qweight, scales, group_size, bias=None) -> torch.Tensor:
    """``y = x @ dequant(qweight, scales).T (+ bias)``: x (..., K) fp16/bf16 -> (..., N) in x's dtype."""
    _validate(x, qweight, scales, group_size, bias)
    return torch.ops.compress_kernels.w4a16_matmul(x, qweight, scales, group_size, bias)
