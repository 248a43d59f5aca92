"""W4A16 tensor-core tiles: x (M, K) fp16/bf16 times the packed int4 weight, fp32 accumulation, split-K.

Operands (the contract of ``compress_kernels.reference``): ``qweight`` (K/8, N) int32, nibble ``j``
of ``qweight[r, n]`` is ``q[8r + j, n]``; ``scales`` (K/G, N) fp32 or x's dtype::

    W[n, k] = q[k, n] * scales[k // G, n]       y = x @ W.T (+ bias)     fp32 accumulation

Program (tile, split) owns a (BLOCK_M, BLOCK_N) output tile (grouped tile order) and a split-K slice
of K in BLOCK_K tiles, each inside one scale group. Per K tile, one of three products:

* ``PLANES`` (2-16 rows with 128-deep tiles): the tile as 8 nibble planes. Plane j is nibble j of
  every word of the (BK/8, BN) packed tile, i.e. channels kt + 8r + j, and meets the x columns
  kt + 8r + j in a 16-deep ``tl.dot``. A plane is elementwise in the packed tile, so Triton loads
  the words from shared memory straight into the tensor-core operand layout and unpacks them in
  registers (:func:`compress_kernels.common.int4.nibble_planes`, 13 PTX instructions per word): the
  unpacked tile never goes through shared memory, which bound the plain tiles. The x tile is loaded
  whole and split into its planes in registers (a strided load per plane was 1.7-2x slower), after the
  packed tile's load, in the same K step (loaded one step ahead, as the grouped MoE kernel does, it ran
  6-12% slower here: H200, M = 2-16).
* ``SCALE_AFTER_DOT``: the unpacked tile (:func:`compress_kernels.common.int4.unpack_int4_tile`)
  times x, exact integer operands, the fp32 product scaled by the tile's scale row (BM x BN
  multiplies per tile: the small-M order).
* otherwise the tile is dequantized to x's dtype before ``tl.dot`` (BK x BN multiplies per tile, the
  accumulator stays in the tensor-core pipeline: the order for more rows).

``PREFETCH_SCALE`` loads the next K tile's scale row at the top of each iteration (Triton leaves that
row out of its pipeline). Rows and columns past M and N are wrapped for the loads and masked at the
store. K splits write fp32 partials summed in split order, by the last split of each 16-row tile to
finish in the kernel, else by a second launch (:mod:`compress_kernels.common.splitk`).

Triton's CPU interpreter (3.9) mishandles bf16 arithmetic and int -> bf16 casts (it computes on the raw
bits), so under ``TRITON_INTERPRET=1`` with bf16 inputs the kernel multiplies fp32 copies of the same
operands (``FP32_OPERANDS``; exact for these values) and unpacks the planes with plain shifts.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from compress_kernels.common.checks import interpreting
from compress_kernels.common.int4 import plane_products, unpack_int4_tile
from compress_kernels.common.launch import launch
from compress_kernels.common.splitk import splitk_reduce, tiled_split_launch, write_tile
from compress_kernels.common.tiles import grouped_tile, split_k_range, weight_columns

PLANE_MIN_K = 128  # nibble planes: one 16-deep dot per plane needs 128-deep K tiles


@triton.jit
def tile_product(acc, a, packed, scale, SCALE_AFTER_DOT: tl.constexpr, FP32_OPERANDS: tl.constexpr,
                 BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr):
    """acc + x tile (BM, BK) @ dequantized weight tile (BK, BN) with one scale row (BN,), fp32."""
    if FP32_OPERANDS:  # interpreter + bf16: its bf16 arithmetic is broken, fp32 is exact here
        a = a.to(tl.float32)
    q = unpack_int4_tile(packed, BLOCK_K, BLOCK_N, a.dtype)
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
def load_x_tile(x_ptrs, kt, k_last, offs_k, EVEN_K: tl.constexpr):
    """The (BM, BK) x tile at channel ``kt`` (``x_ptrs`` point there), zeros from ``k_last`` on (``EVEN_K``: no
    mask)."""
    if EVEN_K:
        return tl.load(x_ptrs)
    return tl.load(x_ptrs, mask=(kt + offs_k)[None, :] < k_last, other=0.0)


@triton.jit
def plane_tile_product(acc, a, packed, scale, ASM_UNPACK: tl.constexpr, FP32_OPERANDS: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """acc + one K tile as 8 nibble planes: plane j (BK/8, BN) times the x columns kt + 8r + j of the
    (BM, BK) tile ``a`` (split in registers, k = 8r + 4a + 2b + c: c, then b, then a), the sum of the 8
    products scaled once (see the module docstring)."""
    part = plane_products(a, packed, ASM_UNPACK, FP32_OPERANDS, BLOCK_M, BLOCK_N, BLOCK_K)
    return acc + part * scale[None, :]


@triton.jit
def _w4a16_matmul_kernel(
    x_ptr, qw_ptr, s_ptr, bias_ptr, out_ptr,  # x (M, K), qweight (K/8, N), scales (K/G, N), bias (N,), out
    y_ptr, cnt_ptr,  # REDUCE_SPLIT > 1: the output (M, N) and one ticket counter per output tile
    M, N, K, group_size,
    stride_xm, stride_xk, stride_qk, stride_qn, stride_sg, stride_sn, stride_os, stride_om, stride_ym,
    SPLIT_K, ADD_BIAS: tl.constexpr, REDUCE_SPLIT: tl.constexpr, EVEN_K: tl.constexpr, EVEN_N: tl.constexpr,
    SCALE_AFTER_DOT: tl.constexpr, FP32_OPERANDS: tl.constexpr, PLANES: tl.constexpr, ASM_UNPACK: tl.constexpr,
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
    q_ptrs = qw_ptr + (k_first // 8 + offs_kp)[:, None] * stride_qk + cols[None, :] * stride_qn  # (BK/8, BN)
    s_ptrs = s_ptr + cols * stride_sn  # (BN,)

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if PREFETCH_SCALE:  # one tile ahead (clamped, so an empty split reads in bounds)
        scale_next = tl.load(s_ptrs + (min(k_first, K - 1) // group_size) * stride_sg).to(tl.float32)
    else:
        scale_next = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for k0 in range(k_first, k_last, BLOCK_K):
        if not PLANES:  # (the planes load their x tile after the weight's)
            a = load_x_tile(x_ptrs, k0, k_last, offs_k, EVEN_K)
        if EVEN_K:
            packed = tl.load(q_ptrs)
        else:
            packed = tl.load(q_ptrs, mask=(k0 // 8 + offs_kp)[:, None] < k_last // 8, other=0)
        if PREFETCH_SCALE:  # the next tile's scale row is in flight while this tile computes
            scale = scale_next
            next_row = min(k0 + BLOCK_K, k_last - 1) // group_size
            scale_next = tl.load(s_ptrs + next_row * stride_sg).to(tl.float32)
        else:  # the tile's loads, then its scale row
            scale = tl.load(s_ptrs + (k0 // group_size) * stride_sg).to(tl.float32)  # (BN,)
        if PLANES:
            a = load_x_tile(x_ptrs, k0, k_last, offs_k, EVEN_K)
            acc = plane_tile_product(acc, a, packed, scale, ASM_UNPACK, FP32_OPERANDS, BLOCK_M, BLOCK_N, BLOCK_K)
        else:
            acc = tile_product(acc, a, packed, scale, SCALE_AFTER_DOT, FP32_OPERANDS, BLOCK_K, BLOCK_N)
        x_ptrs += BLOCK_K * stride_xk
        q_ptrs += (BLOCK_K // 8) * stride_qk

    write_tile(acc, out_ptr, cnt_ptr, y_ptr, bias_ptr, cols, offs_m, offs_n, M, N, stride_os, stride_om, stride_ym,
               tl.program_id(0), pid_k, REDUCE_SPLIT, ADD_BIAS)


def launch_tiled(x2, qweight, scales, group_size, bias, y, cfg) -> None:
    """The tensor-core kernel into ``y`` (M, N); K splits summed in the kernel for 16-row tiles, else
    by a second launch (:func:`compress_kernels.common.splitk.reduces_in_kernel`)."""
    m, k = x2.shape
    n = qweight.shape[1]
    if cfg.planes and cfg.block_k < PLANE_MIN_K:
        raise ValueError(f"config: nibble planes need block_k >= {PLANE_MIN_K} (one 16-deep dot per plane), "
                         f"got block_k={cfg.block_k}")
    interpret = interpreting()
    grid, in_kernel, out, counters = tiled_split_launch(y, m, n, cfg.block_m, cfg.block_n, cfg.split_k)
    launch(_w4a16_matmul_kernel, grid,
        x2, qweight, scales, bias if bias is not None else scales, out, y, counters,
        m, n, k, group_size,
        x2.stride(0), x2.stride(1), qweight.stride(0), qweight.stride(1), scales.stride(0), scales.stride(1),
        m * n if cfg.split_k > 1 else 0, out.stride(-2), y.stride(0),
        cfg.split_k, ADD_BIAS=bias is not None and (cfg.split_k == 1 or in_kernel),
        REDUCE_SPLIT=cfg.split_k if in_kernel else 1,
        EVEN_K=k % (cfg.block_k * cfg.split_k) == 0, EVEN_N=n % cfg.block_n == 0,
        SCALE_AFTER_DOT=cfg.scale_after_dot, FP32_OPERANDS=interpret and x2.dtype == torch.bfloat16,
        PLANES=bool(cfg.planes), ASM_UNPACK=cfg.planes and not interpret, PREFETCH_SCALE=cfg.prefetch_scale,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    if cfg.split_k > 1 and not in_kernel:
        splitk_reduce(out, bias, y)
