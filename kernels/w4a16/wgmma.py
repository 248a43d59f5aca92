"""W4A16 with the weight as the register operand of the tensor cores: swapped nibble pairs.

Same operands and contract as the other W4A16 paths (``qweight`` (K/8, N) int32, nibble ``j`` of word
``qweight[r, n]`` is ``q[8r + j, n]`` in two's complement; ``scales`` (K/G, N); fp32 accumulation),
for G = 128 or per channel with K a multiple of 128. It computes the transposed product::

    y^T[n, m] = sum_t sum_{p < 4} sum_{r < 16, e < 2} (q[kt + 8r + 2p + e, n] * scales[t, n]) * x[m, kt + 8r + 2p + e]

over 128-deep K tiles ``kt`` (one scale row each). For each nibble pair p the (BLOCK_N, 32) tile
whose column 2r + e is nibble 2p + e of word ``kt/8 + r`` is the *left* operand of a 32-deep
``tl.dot``, and the matching 32 x columns, transposed, the right one. The left tile is elementwise
in the packed (BLOCK_N, 16) words up to a join of two nibble planes, and the two values a thread
holds side by side in the dot's register layout are the two nibbles of one word, so Triton loads the
words from shared memory straight into that layout and unpacks them there
(:func:`compress_kernels.common.int4.nibble_planes`): on Hopper the dot is a wgmma whose A operand is in
registers, so the unpacked weight never goes through shared memory, and the weight fills the
instruction's 64-row side whatever M is. x, the small operand, is wgmma's B, read from shared memory.
(Single nibble planes as 16-deep dots measured slower: each thread then needs words of two rows
apart in K, a 2-way shared-memory bank conflict on every load.)

The x columns of pair p (kt + 8r + 2p + e) come in runs of 2, 8 apart. A 32-deep B operand needs
them side by side, so a pass first writes x with each 128-column tile in pair order
(:func:`permute_pairs`)::

    xp[m, kt + 32 p + 2 r + e] = x[m, kt + 8 r + 2 p + e]

after which pair p's columns are the contiguous xp[:, kt + 32 p : kt + 32 p + 32]. The pass and the
kernel are a PDL pair (:mod:`compress_kernels.common.pdl`): the kernel may launch while the pass finishes and waits
before its first read of xp.

16-bit scales are read as int32 words, two channels each (``SCALE_HALVES``): a 2-byte load per
thread cannot go through ``cp.async``, and Triton then loads the row synchronously in the loop.
The unpacked weights are multiplied by their scale in x's dtype and every dot sums into one
accumulator (the dequantize-then-multiply order of the large-M paths). Token rows past M are wrapped
copies of real rows whose results are not stored. K splits: the fp32 partials go through
:mod:`compress_kernels.common.splitk` (summed by the last split of a tile in the kernel, or by a
second launch). Under ``TRITON_INTERPRET=1`` with bf16 the operands are fp32 copies
(``FP32_OPERANDS``, exact for these values) and the nibbles come from plain shifts.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from compress_kernels.common.checks import interpreting
from compress_kernels.common.int4 import nibble_planes
from compress_kernels.common.launch import launch
from compress_kernels.common.pdl import launch_options, let_dependents_launch, pdl_enabled, wait_for_inputs
from compress_kernels.common.splitk import splitk_reduce, tiled_split_launch, write_tile
from compress_kernels.common.tiles import split_k_range, weight_columns
from compress_kernels.w4a16.dispatch import PAIR_TILE, wgmma_supports


@triton.jit
def _permute_pairs_kernel(x_ptr, xp_ptr, M, stride_xm, stride_xk, stride_pm, BLOCK_M: tl.constexpr,
                           USE_PDL: tl.constexpr):
    """xp[m, kt + 32 p + 2 r + e] = x[m, kt + 8 r + 2 p + e] for one (BLOCK_M, 128) tile (a row's loads
    stay within 256 bytes)."""
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    kt = tl.program_id(1) * 128
    c = tl.arange(0, 128)
    source = kt + ((c % 32) // 2) * 8 + (c // 32) * 2 + c % 2  # column 32 p + 2 r + e <- 8 r + 2 p + e
    m_ok = (offs_m < M)[:, None]
    rows = offs_m.to(tl.int64)[:, None]
    wait_for_inputs(USE_PDL)  # x comes from the kernel before
    tile = tl.load(x_ptr + rows * stride_xm + source[None, :] * stride_xk, mask=m_ok)
    tl.store(xp_ptr + rows * stride_pm + (kt + c)[None, :], tile, mask=m_ok)
    let_dependents_launch(USE_PDL)  # the GEMM may start; it waits before reading xp


def permute_pairs(x2: torch.Tensor, use_pdl: bool = False) -> torch.Tensor:
    """x (M, K), K a multiple of 128, with each 128-column tile in pair order (see the module docstring)."""
    m, k = x2.shape
    xp = torch.empty((m, k), dtype=x2.dtype, device=x2.device)
    block_m = 16
    launch(_permute_pairs_kernel, (triton.cdiv(m, block_m), k // PAIR_TILE),
        x2, xp, m, x2.stride(0), x2.stride(1), xp.stride(0), BLOCK_M=block_m, USE_PDL=use_pdl, num_warps=4,
        **launch_options(use_pdl))
    return xp


@triton.jit
def _pair_dot(acc, lo, hi, x_ptrs, p: tl.constexpr, FP32_OPERANDS: tl.constexpr):
    """acc + nibble pair p of the weight tile, (BN, 32) with column 2r + e = nibble 2p + e of word r,
    times the transposed x columns 32 p .. 32 p + 31 of the tile (in pair order)."""
    w = tl.reshape(tl.join(lo, hi), (lo.shape[0], 32))
    xp = tl.load(x_ptrs + 32 * p)  # (BM, 32)
    if FP32_OPERANDS:
        return tl.dot(w, tl.trans(xp.to(tl.float32)), acc, input_precision="ieee", out_dtype=tl.float32)
    return tl.dot(w, tl.trans(xp), acc, out_dtype=tl.float32)


@triton.jit
def _scale_row(s_ptrs, HALVES: tl.constexpr, S_DTYPE: tl.constexpr, cols):
    """One scale row at ``s_ptrs`` (pointers per output channel; with HALVES to the int32 word holding
    the 16-bit scale of channel ``cols``: 4-byte loads pipeline through cp.async, 2-byte ones do not)."""
    if HALVES:
        bits = (tl.load(s_ptrs) >> ((cols % 2) * 16)) & 0xFFFF
        row = bits.to(tl.int16).to(S_DTYPE, bitcast=True)
    else:
        row = tl.load(s_ptrs)
    return row


@triton.jit
def _w4a16_wgmma_kernel(
    xp_ptr, qw_ptr, s_ptr, bias_ptr, out_ptr,  # xp (M, K) in pair order, qweight (K/8, N), scales, bias, out
    y_ptr, cnt_ptr,  # REDUCE_SPLIT > 1: the output (M, N) and one ticket counter per output tile
    M, N, K, group_size,
    stride_xm, stride_qk, stride_qn, stride_sg, stride_sn, stride_os, stride_om, stride_ym,
    SPLIT_K, ADD_BIAS: tl.constexpr, REDUCE_SPLIT: tl.constexpr, EVEN_N: tl.constexpr,
    SCALE_HALVES: tl.constexpr, S_DTYPE: tl.constexpr, USE_PDL: tl.constexpr,
    ASM_UNPACK: tl.constexpr, FP32_OPERANDS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    tiles_m = tl.cdiv(M, BLOCK_M)
    pid_m = tl.program_id(0) % tiles_m  # the token tiles of one weight tile run side by side (L2 reuse)
    pid_n = tl.program_id(0) // tiles_m
    pid_k = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = weight_columns(offs_n, N, BLOCK_N, EVEN_N)  # contiguous (16-byte loads) or wrapped
    rows = (offs_m % M).to(tl.int64)  # wrapped: loads need no mask, stores are masked
    offs_r = tl.arange(0, 16)

    k_first, k_last = split_k_range(pid_k, K, SPLIT_K, 128)
    q_ptrs = qw_ptr + (k_first // 8 + offs_r)[None, :] * stride_qk + cols[:, None] * stride_qn  # (BN, 16) words
    x_ptrs = xp_ptr + rows[:, None] * stride_xm + (k_first + tl.arange(0, 32))[None, :]  # (BM, 32): pair 0's columns
    s_ptrs = s_ptr + (cols // 2 if SCALE_HALVES else cols) * stride_sn

    w_dtype: tl.constexpr = tl.float32 if FP32_OPERANDS else xp_ptr.dtype.element_ty
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    wait_for_inputs(USE_PDL)  # xp comes from the permutation pass before
    for kt in range(k_first, k_last, 128):
        packed = tl.load(q_ptrs)
        w0, w1, w2, w3, w4, w5, w6, w7 = nibble_planes(packed, w_dtype, ASM_UNPACK)
        # dequantized in x's dtype, summed straight into acc
        scale = _scale_row(s_ptrs + (kt // group_size) * stride_sg, SCALE_HALVES, S_DTYPE, cols)
        scale = scale.to(w_dtype)[:, None]  # (BN, 1)
        acc = _pair_dot(acc, w0 * scale, w1 * scale, x_ptrs, 0, FP32_OPERANDS)
        acc = _pair_dot(acc, w2 * scale, w3 * scale, x_ptrs, 1, FP32_OPERANDS)
        acc = _pair_dot(acc, w4 * scale, w5 * scale, x_ptrs, 2, FP32_OPERANDS)
        acc = _pair_dot(acc, w6 * scale, w7 * scale, x_ptrs, 3, FP32_OPERANDS)
        q_ptrs += 16 * stride_qk
        x_ptrs += 128

    let_dependents_launch(USE_PDL)
    write_tile(tl.trans(acc), out_ptr, cnt_ptr, y_ptr, bias_ptr, cols, offs_m, offs_n, M, N, stride_os, stride_om,
               stride_ym, tl.program_id(0), pid_k, REDUCE_SPLIT, ADD_BIAS)


def _scale_operand(scales: torch.Tensor):
    """(tensor the kernel reads, whether it holds 16-bit scales in int32 pairs, their Triton dtype)."""
    n = scales.shape[1]
    if scales.element_size() == 4:
        return scales, False, tl.float32
    if scales.stride(1) == 1 and scales.stride(0) % 2 == 0 and n % 2 == 0 and scales.storage_offset() % 2 == 0:
        return scales.view(torch.int32), True, tl.float16 if scales.dtype == torch.float16 else tl.bfloat16
    return scales.float(), False, tl.float32  # a layout the int32 view cannot read: one conversion pass


def launch_wgmma(x2, qweight, scales, group_size, bias, y, cfg) -> None:
    """Permute x into pair order, then run the kernel into ``y`` (M, N). ``cfg`` is a
    :class:`compress_kernels.w4a16.dispatch.TileConfig` (block_m tokens, block_n channels, split_k,
    warps, stages)."""
    m, k = x2.shape
    n = qweight.shape[1]
    if not wgmma_supports(k, group_size) or cfg.block_k != PAIR_TILE or cfg.scale_after_dot:
        raise ValueError(f"config: the wgmma path needs block_k = {PAIR_TILE}, K and group_size multiples of "
                         f"{PAIR_TILE} and the scales applied before the dot (scale_after_dot False), got "
                         f"block_k={cfg.block_k}, K={k}, group_size={group_size}, "
                         f"scale_after_dot={cfg.scale_after_dot}")
    interpret = interpreting()
    use_pdl = pdl_enabled(x2.device)
    xp = permute_pairs(x2, use_pdl)
    s_view, halves, s_dtype = _scale_operand(scales)
    grid, in_kernel, out, counters = tiled_split_launch(y, m, n, cfg.block_m, cfg.block_n, cfg.split_k)
    launch(_w4a16_wgmma_kernel, grid,
        xp, qweight, s_view, bias if bias is not None else s_view, out, y, counters,
        m, n, k, group_size,
        xp.stride(0), qweight.stride(0), qweight.stride(1), s_view.stride(0), s_view.stride(1),
        m * n if cfg.split_k > 1 else 0, out.stride(-2), y.stride(0),
        cfg.split_k, ADD_BIAS=bias is not None and (cfg.split_k == 1 or in_kernel),
        REDUCE_SPLIT=cfg.split_k if in_kernel else 1, EVEN_N=n % cfg.block_n == 0,
        SCALE_HALVES=halves, S_DTYPE=s_dtype, USE_PDL=use_pdl,
        ASM_UNPACK=not interpret, FP32_OPERANDS=interpret and x2.dtype == torch.bfloat16,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        **launch_options(use_pdl),
    )
    if cfg.split_k > 1 and not in_kernel:
        splitk_reduce(out, bias, y)
