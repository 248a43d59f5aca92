"""W8A16 for one token row per program: the int8 weight streamed once, converted in registers, CUDA-core FMAs.

Same contract as the tensor-core path (``x`` (M, K) fp16/bf16, ``w_q`` (N, K) int8 with K contiguous,
``w_scale`` (N,) or (N, K/128); fp32 accumulation)::

    y[m, n] = s_w[n] * sum_k x[m, k] * w_q[n, k]                          (per channel)
    y[m, n] = sum_g s_w[n, g] * sum_{k in group g} x[m, k] * w_q[n, k]     (groups of 128)
    (+ bias[n])

Why: at M = 1 a matmul is a stream of weights; a tensor-core tile would pad the row to 16 and convert
every weight tile through the instruction's operand layout. Here program (row, n tile, k split) owns
BLOCK_N outputs of one row and reads its (BLOCK_N, BLOCK_K) int8 tile as int32 words, (BLOCK_N,
BLOCK_K/4), 16-byte loads along K. Byte b of word r is channel 4r + b. Each byte becomes an exact fp32
value from its bits in place, with no integer-to-float conversion instruction (those issue at a
quarter of the FMA rate on Hopper, about the rate the bytes arrive at M = 1)::

    u   = word ^ 0x80808080                    # each byte q -> q + 128, in 0..255
    lo  = u | 0x4B000000, hi = (u >> 16) | 0x4B000000     # once per word: 2^23's exponent bits set
    v   = bits_as_fp32(half & (0xFF << 8p | 0x4B000000)) - (2^23 + 128 * 256^p)    # = q * 256^p, exact
    acc[n, r] += (x[4r + b] * 256^-p) * v      # = x * q (x times a power of two: exact), b = 0..3

with ``half`` = lo for bytes 0, 1 and hi for bytes 2, 3, p = b % 2 (the byte stays below bit 16, inside
the mantissa: 2^23 + v is exact). Three instructions per weight (and, subtract, fma), the or and shift
once per word. x comes in as one (BLOCK_K/4, 4) tile per step, split into its 4 columns in registers.
``acc`` holds one fp32 lane per word, (BLOCK_N, BLOCK_K/4), into which the word's four products are
added: a quarter of the registers of a lane per weight (H100, groups of 128 at M = 1: 28672x8192
126.5 -> 104.9 us, 4096x4096 12.3 -> 11.8; per channel within 1%). Per channel the lanes are summed
once at the end and scaled by ``s_w[n]``; with groups each K tile (inside one group: BLOCK_K divides
128) is scaled by its scale row into ``acc``.

The kernel is bound by DRAM latency, so each step first issues the loads of the next tile (weights and
x) and then multiplies the current one. Full tiles load without masks (so the loads stay 16 bytes
wide; the prefetch after the last full tile reloads it); a short last tile is masked. With SPLIT_K > 1
the last split of each (row, tile) to finish sums the fp32 partials in split order and adds the bias
(:mod:`compress_kernels.common.splitk`, "the last split reduces"): one launch, deterministic. A NaN
or Inf in a row of x reaches that output row through the products (Inf * 0 is NaN).
Grid: (M, N / BLOCK_N, SPLIT_K).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from compress_kernels.common.launch import launch
from compress_kernels.common.splitk import last_split_buffers, last_split_reduces
from compress_kernels.common.tiles import split_k_range, weight_columns


@triton.jit
def _byte_value(half, p: tl.constexpr):
    """Byte p (0 or 1) of the biased 16-bit half of each word as its exact int8 value times 256^p, fp32."""
    bits = half & ((0xFF << (8 * p)) | 0x4B000000)  # fp32 2^23 + (q + 128) * 256^p (0x4B000000: 2^23)
    return bits.to(tl.float32, bitcast=True) - (8388608.0 + 128.0 * (1 << (8 * p)))


@triton.jit
def _word_products(words, x0, x1, x2, x3):
    """The (BLOCK_N, BLOCK_K/4) int32 words times x: per word ``sum_b w_q[n, 4r + b] * x[4r + b]`` in fp32,
    from ``xb`` = x at channels 4r + b (``x1``, ``x3`` already divided by 256: bytes 1 and 3 come out as 256
    q, module docstring); four FMAs per word, into one accumulator lane per word."""
    u = (words ^ -0x7F7F7F80).to(tl.uint32, bitcast=True)  # 0x80808080: each byte q -> q + 128 in 0..255
    lo = u | 0x4B000000  # the exponent bits of 2^23 set once per word; the and in _byte_value keeps them
    hi = (u >> 16) | 0x4B000000  # bytes 2, 3 moved to bits 0..15
    part = _byte_value(lo, 0) * x0[None, :]
    part += _byte_value(lo, 1) * x1[None, :]
    part += _byte_value(hi, 0) * x2[None, :]
    return part + _byte_value(hi, 1) * x3[None, :]


@triton.jit
def _load_step(w_ptrs, x_ptrs, kt, k_last, offs_r, offs_k, stride_xk, MASKED: tl.constexpr):
    """The (BLOCK_N, BLOCK_K/4) words at channel ``kt`` and the (BLOCK_K/4, 4) x values there (row r:
    channels 4r .. 4r + 3); with MASKED, zeros from ``k_last`` on (a multiple of 8)."""
    w_ptrs += kt // 4
    x_ptrs += kt * stride_xk
    if MASKED:
        words = tl.load(w_ptrs, mask=(kt + 4 * offs_r)[None, :] < k_last, other=0)
        xt = tl.load(x_ptrs, mask=(kt + offs_k) < k_last, other=0.0)
    else:
        words = tl.load(w_ptrs)
        xt = tl.load(x_ptrs)
    return words, xt


@triton.jit
def _accumulate(acc, words, xt, s_ptrs, kt, stride_sg, GROUPED: tl.constexpr, GROUP_SIZE: tl.constexpr,
                BLOCK_K: tl.constexpr):
    """``acc`` (BLOCK_N, BLOCK_K/4) plus one K tile's products ``x * w_q`` summed per word, times the tile's
    scale row with groups. ``xt`` (BLOCK_K/4, 4) is split into its 4 columns in registers."""
    x_pairs = tl.reshape(xt.to(tl.float32), (BLOCK_K // 4, 2, 2))  # [r, h, e]: channel 4r + 2h + e
    x_even, x_odd = tl.split(x_pairs)  # e = 0, 1: (BK/4, 2) over h
    x0, x2 = tl.split(x_even)
    x1, x3 = tl.split(x_odd)
    part = _word_products(words, x0, x1 * (1.0 / 256), x2, x3 * (1.0 / 256))
    if GROUPED:
        scale = tl.load(s_ptrs + (kt // GROUP_SIZE) * stride_sg).to(tl.float32)
        return acc + part * scale[:, None]
    return acc + part


@triton.jit
def _w8a16_gemv_kernel(
    x_ptr, w_ptr, s_ptr, bias_ptr, out_ptr,  # x (M, K), w (N, K/4) int32 words, scales (N,) or (N, K/G), bias, out
    ws_ptr, cnt_ptr,  # SPLIT_K > 1: fp32 partials (SPLIT_K, M, N), int32 ticket counters (M * N / BLOCK_N,)
    M, N, K,
    stride_xm, stride_xk, stride_wn, stride_sn, stride_sg, stride_om,
    GROUPED: tl.constexpr, GROUP_SIZE: tl.constexpr, SPLIT_K: tl.constexpr, HAS_BIAS: tl.constexpr,
    EVEN_N: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    row = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = weight_columns(offs_n, N, BLOCK_N, EVEN_N).to(tl.int64)  # contiguous or wrapped (stores masked)
    offs_r = tl.arange(0, BLOCK_K // 4)
    offs_k = 4 * offs_r[:, None] + tl.arange(0, 4)[None, :]  # (BK/4, 4): channel 4r + b

    k_first, k_last = split_k_range(pid_k, K, SPLIT_K, BLOCK_K)
    w_ptrs = w_ptr + cols[:, None] * stride_wn + (k_first // 4 + offs_r)[None, :]  # (BN, BK/4) at k_first
    x_ptrs = x_ptr + row.to(tl.int64) * stride_xm + (k_first + offs_k) * stride_xk  # (BK/4, 4)
    s_ptrs = s_ptr + cols * stride_sn

    acc = tl.zeros((BLOCK_N, BLOCK_K // 4), dtype=tl.float32)
    full_tiles = max(k_last - k_first, 0) // BLOCK_K
    if full_tiles > 0:
        words, xt = _load_step(w_ptrs, x_ptrs, 0, k_last, offs_r, offs_k, stride_xk, False)
        for t in range(full_tiles):  # the next tile's loads are in flight during this one's FMAs
            ahead = min(t + 1, full_tiles - 1) * BLOCK_K  # past the last full tile: that tile again
            next_words, next_xt = _load_step(w_ptrs, x_ptrs, ahead, k_last, offs_r, offs_k, stride_xk, False)
            acc = _accumulate(acc, words, xt, s_ptrs, k_first + t * BLOCK_K, stride_sg, GROUPED, GROUP_SIZE, BLOCK_K)
            words, xt = next_words, next_xt
    tail = full_tiles * BLOCK_K
    if k_first + tail < k_last:  # a short last tile: K not a multiple of the tile
        words, xt = _load_step(w_ptrs, x_ptrs, tail, k_last - k_first, offs_r, offs_k, stride_xk, True)
        acc = _accumulate(acc, words, xt, s_ptrs, k_first + tail, stride_sg, GROUPED, GROUP_SIZE, BLOCK_K)

    y = tl.sum(acc, axis=1)  # (BN,)
    if not GROUPED:
        y = y * tl.load(s_ptrs).to(tl.float32)
    if SPLIT_K > 1:  # store the partial; the last split of this (row, tile) to arrive reduces
        last_split_reduces(y[None, :], ws_ptr, cnt_ptr, out_ptr, bias_ptr, row + tl.arange(0, 1), offs_n, M, N,
                           stride_om, row * tl.num_programs(1) + pid_n, pid_k, SPLIT_K, HAS_BIAS)
    else:
        if HAS_BIAS:
            y += tl.load(bias_ptr + cols).to(tl.float32)
        tl.store(out_ptr + row.to(tl.int64) * stride_om + offs_n, y.to(out_ptr.dtype.element_ty), mask=offs_n < N)


def launch_gemv(x2, w_q, w_scale, bias, y, cfg, group_size: int) -> None:
    """Write ``w8a16(x2)`` into ``y`` (M, N) in one launch whatever the K split. Inputs are validated by
    the caller (``w_q`` contiguous, its data 4-byte aligned); ``cfg`` has ``block_n``, ``block_k``
    (dividing ``group_size`` with 2-D scales), ``split_k``, ``num_warps`` (``block_m`` is ignored: one row
    per program)."""
    m, k = x2.shape
    n = w_q.shape[0]
    grouped = w_scale.dim() == 2
    words = w_q.view(torch.int32)  # (N, K/4): byte b of word r is channel 4r + b
    grid = (m, triton.cdiv(n, cfg.block_n), cfg.split_k)
    workspace, counters = last_split_buffers(y, cfg.split_k, m, n, m * grid[1])
    launch(_w8a16_gemv_kernel, grid,
        x2, words, w_scale, bias if bias is not None else w_scale, y, workspace, counters,
        m, n, k,
        x2.stride(0), x2.stride(1), words.stride(0), w_scale.stride(0), w_scale.stride(1) if grouped else 0,
        y.stride(0),
        GROUPED=grouped, GROUP_SIZE=group_size, SPLIT_K=cfg.split_k, HAS_BIAS=bias is not None,
        EVEN_N=n % cfg.block_n == 0, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
