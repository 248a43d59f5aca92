"""W8A16 tensor-core tiles: the int8 weight tile converted to x's dtype in the loop, fp32 accumulation, split-K.

Operands (the contract of ``compress_kernels.reference.w8a16_matmul_ref``): ``x`` (M, K) fp16/bf16,
``w_q`` (N, K) int8 (K contiguous), ``w_scale`` (N,) or (N, K/128). The kernel computes the transposed
product, output channels by tokens::

    per channel:  y^T[n, m] = s_w[n] * sum_k w_q[n, k] * x[m, k]                       (scale in the epilogue)
    groups:       y^T[n, m] = sum_t s_w[n, t] * sum_{k in tile t} w_q[n, k] * x[m, k]   (SCALE_AFTER_DOT)
              or  y^T[n, m] = sum_k fp16(w_q[n, k] * s_w[n, k // 128]) * x[m, k]      (dequantized before the dot)

Program (tile, split) owns a (BLOCK_N channels, BLOCK_M tokens) tile of ``y^T`` (grouped tile order:
GROUP_M token tiles share each weight tile while it sits in L2) and one split-K slice of K in BLOCK_K
tiles, each inside one scale group. Per K tile it loads the (BLOCK_N, BLOCK_K) int8 weight tile and the
(BLOCK_M, BLOCK_K) x tile, converts the weight to x's dtype (exact: every int8 is an fp16 / bf16 value)
and multiplies ``tl.dot(w, x^T)``. Why the transposed product: the converted weight is then the dot's
left operand, which Hopper's wgmma takes from registers, so it is converted where it is loaded and
never written back to shared memory (as the right operand it would be), and the weight fills the
instruction's 64-row side whatever M is; x, the small operand at small M, is the right operand, read
from shared memory. Per-channel scales multiply the accumulator once at the end, so the tensor cores
see exact integer weights; grouped scales either multiply each K tile's fp32 product
(``SCALE_AFTER_DOT``, exact operands, BLOCK_N x BLOCK_M multiplies per tile: the small-M order) or
dequantize the weight tile before the dot (BLOCK_N x BLOCK_K multiplies per tile, one accumulator
through every K tile: the order for more rows).

Rows and columns past M and N are wrapped for the loads and masked at the store. K splits write fp32
partials summed in split order, by the last split of each 16-token tile in the kernel, else by a second
launch (:mod:`compress_kernels.common.splitk`). Under ``TRITON_INTERPRET=1`` with bf16 (whose
arithmetic and int -> bf16 casts the interpreter gets wrong) the operands are fp32 copies of the same
values (``FP32_OPERANDS``).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from compress_kernels.common.checks import interpreting
from compress_kernels.common.launch import launch
from compress_kernels.common.splitk import splitk_reduce, tiled_split_launch, write_tile
from compress_kernels.common.tiles import grouped_tile, split_k_range, weight_columns


# $0, $1 = the 4 int8 of $2 as exact fp16 pairs: each byte q + 128 (xor 0x80) becomes the low byte of
# fp16 0x64XX = 1024 + (q + 128), then 1152 = 0x6480 is subtracted; 4 instructions per 4 weights
_INT8_TO_F16_ASM = tl.constexpr("""{
.reg .b32 u, bias;
xor.b32 u, $2, 0x80808080;
mov.b32 bias, 0x64806480;
prmt.b32 $0, u, 0x64646464, 0x5140;
prmt.b32 $1, u, 0x64646464, 0x5342;
sub.f16x2 $0, $0, bias;
sub.f16x2 $1, $1, bias;
}""")
# $0, $1 = the 4 int8 of $2 as exact bf16 pairs: each byte q + 128 becomes the low byte of fp32 0x4B0000XX
# = 2^23 + (q + 128), minus 2^23 + 128 gives q in fp32, whose low 16 bits are zero, so its high half is q
# in bf16; two high halves per output register
_INT8_TO_BF16_ASM = tl.constexpr("""{
.reg .b32 u, f0, f1, f2, f3;
xor.b32 u, $2, 0x80808080;
prmt.b32 f0, u, 0x4B000000, 0x7540;
prmt.b32 f1, u, 0x4B000000, 0x7541;
prmt.b32 f2, u, 0x4B000000, 0x7542;
prmt.b32 f3, u, 0x4B000000, 0x7543;
sub.f32 f0, f0, 0f4B000080;
sub.f32 f1, f1, 0f4B000080;
sub.f32 f2, f2, 0f4B000080;
sub.f32 f3, f3, 0f4B000080;
prmt.b32 $0, f0, f1, 0x7632;
prmt.b32 $1, f2, f3, 0x7632;
}""")


@triton.jit
def _int8_to(w, DTYPE: tl.constexpr, ASM: tl.constexpr):
    """The int8 tile ``w`` as exact DTYPE values; with ASM (fp16 / bf16 on a GPU) by the inline PTX above,
    elementwise, so the tile keeps its register layout (a dot operand's)."""
    if not ASM:
        values = w.to(DTYPE)
    elif DTYPE == tl.float16:
        values = tl.inline_asm_elementwise(_INT8_TO_F16_ASM, "=r,=r,r", [w], dtype=tl.float16, is_pure=True, pack=4)
    else:
        values = tl.inline_asm_elementwise(_INT8_TO_BF16_ASM, "=r,=r,r", [w], dtype=tl.bfloat16, is_pure=True, pack=4)
    return values


@triton.jit
def _dot(w, a, acc, FP32_OPERANDS: tl.constexpr):
    """acc + w (BN, BK) @ a^T (BK, BM) in fp32."""
    if FP32_OPERANDS:
        return tl.dot(w, tl.trans(a.to(tl.float32)), acc, input_precision="ieee", out_dtype=tl.float32)
    return tl.dot(w, tl.trans(a), acc, out_dtype=tl.float32)


@triton.jit
def tile_product(acc, w, a, s_ptrs, k0, stride_sg, GROUPED: tl.constexpr, GROUP_SIZE: tl.constexpr,
                 SCALE_AFTER_DOT: tl.constexpr, FP32_OPERANDS: tl.constexpr, ASM_CONVERT: tl.constexpr):
    """acc (BN, BM) + the int8 weight tile ``w`` (BN, BK) times the x tile ``a`` (BM, BK) transposed;
    with groups, the tile's scale row (BN,) applied (see the module docstring)."""
    operand_dtype: tl.constexpr = tl.float32 if FP32_OPERANDS else a.dtype
    if not GROUPED:
        return _dot(_int8_to(w, operand_dtype, ASM_CONVERT), a, acc, FP32_OPERANDS)
    scale = tl.load(s_ptrs + (k0 // GROUP_SIZE) * stride_sg).to(tl.float32)
    if SCALE_AFTER_DOT:
        part = _dot(_int8_to(w, operand_dtype, ASM_CONVERT), a, tl.zeros(acc.shape, tl.float32), FP32_OPERANDS)
        return acc + part * scale[:, None]
    return _dot((w.to(tl.float32) * scale[:, None]).to(operand_dtype), a, acc, FP32_OPERANDS)


@triton.jit
def _w8a16_tiled_kernel(
    x_ptr, w_ptr, s_ptr, bias_ptr, out_ptr,  # x (M, K), w (N, K) int8, scales (N,) or (N, K/G), bias (N,), out
    y_ptr, cnt_ptr,  # REDUCE_SPLIT > 1: the output (M, N) and one ticket counter per output tile
    M, N, K,
    stride_xm, stride_xk, stride_wn, stride_wk, stride_sn, stride_sg, stride_os, stride_om, stride_ym,
    SPLIT_K, GROUPED: tl.constexpr, GROUP_SIZE: tl.constexpr, SCALE_AFTER_DOT: tl.constexpr,
    ADD_BIAS: tl.constexpr, REDUCE_SPLIT: tl.constexpr, EVEN_K: tl.constexpr, EVEN_N: tl.constexpr,
    FP32_OPERANDS: tl.constexpr, ASM_CONVERT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):
    pid_m, pid_n = grouped_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    pid_k = tl.program_id(1)

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = (offs_m % M).to(tl.int64)  # wrapped: loads need no M/N mask, stores are masked
    cols = weight_columns(offs_n, N, BLOCK_N, EVEN_N)  # contiguous (16-byte loads) or wrapped
    offs_k = tl.arange(0, BLOCK_K)

    k_first, k_last = split_k_range(pid_k, K, SPLIT_K, BLOCK_K)
    x_ptrs = x_ptr + rows[:, None] * stride_xm + (k_first + offs_k)[None, :] * stride_xk  # (BM, BK)
    w_ptrs = w_ptr + cols.to(tl.int64)[:, None] * stride_wn + (k_first + offs_k)[None, :] * stride_wk  # (BN, BK)
    s_ptrs = s_ptr + cols * stride_sn  # (BN,)

    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for k0 in range(k_first, k_last, BLOCK_K):
        if EVEN_K:
            a = tl.load(x_ptrs)
            w = tl.load(w_ptrs)
        else:
            a = tl.load(x_ptrs, mask=(k0 + offs_k)[None, :] < k_last, other=0.0)
            w = tl.load(w_ptrs, mask=(k0 + offs_k)[None, :] < k_last, other=0)
        acc = tile_product(acc, w, a, s_ptrs, k0, stride_sg, GROUPED, GROUP_SIZE, SCALE_AFTER_DOT, FP32_OPERANDS,
                           ASM_CONVERT)
        x_ptrs += BLOCK_K * stride_xk
        w_ptrs += BLOCK_K * stride_wk

    if not GROUPED:
        acc = acc * tl.load(s_ptrs).to(tl.float32)[:, None]
    write_tile(tl.trans(acc), out_ptr, cnt_ptr, y_ptr, bias_ptr, cols, offs_m, offs_n, M, N, stride_os, stride_om,
               stride_ym, tl.program_id(0), pid_k, REDUCE_SPLIT, ADD_BIAS)


def launch_tiled(x2, w_q, w_scale, bias, y, cfg, group_size: int) -> None:
    """The tensor-core kernel into ``y`` (M, N); K splits summed in the kernel for 16-token tiles, else by
    a second launch (:func:`compress_kernels.common.splitk.reduces_in_kernel`). Inputs are validated by the
    caller; with 2-D scales ``cfg.block_k`` divides ``group_size``."""
    m, k = x2.shape
    n = w_q.shape[0]
    grouped = w_scale.dim() == 2
    grid, in_kernel, out, counters = tiled_split_launch(y, m, n, cfg.block_m, cfg.block_n, cfg.split_k)
    launch(_w8a16_tiled_kernel, grid,
        x2, w_q, w_scale, bias if bias is not None else w_scale, out, y, counters,
        m, n, k,
        x2.stride(0), x2.stride(1), w_q.stride(0), w_q.stride(1), w_scale.stride(0),
        w_scale.stride(1) if grouped else 0, m * n if cfg.split_k > 1 else 0, out.stride(-2), y.stride(0),
        cfg.split_k, GROUPED=grouped, GROUP_SIZE=group_size, SCALE_AFTER_DOT=cfg.scale_after_dot,
        ADD_BIAS=bias is not None and (cfg.split_k == 1 or in_kernel), REDUCE_SPLIT=cfg.split_k if in_kernel else 1,
        EVEN_K=k % (cfg.block_k * cfg.split_k) == 0, EVEN_N=n % cfg.block_n == 0,
        FP32_OPERANDS=interpreting() and x2.dtype == torch.bfloat16, ASM_CONVERT=not interpreting(),
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    if cfg.split_k > 1 and not in_kernel:
        splitk_reduce(out, bias, y)
