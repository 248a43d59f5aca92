"""W8A8 matmul in one launch: each GEMM program quantizes its own rows of x (opt-in alternative path).

Same function as the two-launch path of :mod:`kernels.w8a8` (and ``kernels.reference.w8a8_matmul_ref``),
with ``x`` (M, K) fp16/bf16 (any strides), ``w_q`` (N, K) int8, ``w_scale`` (N,) fp32::

    s_x[m]     = max_k |x[m, k]| / 127      (IEEE division; 0 -> 1)   or a static scale (0 -> 1)
    xq[m, k]   = rint(clamp(x[m, k] / s_x[m], -128, 127))              rint = round half to even
    acc[m, n]  = sum_k xq[m, k] * w_q[n, k]                            exact, int32 (tl.dot)
    y[m, n]    = (acc[m, n] * s_x[m]) * w_scale[n] (+ bias[n])         fp32, stored in x's dtype

Program (pid_m, pid_n, pid_k) owns a BLOCK_M x BLOCK_N output tile and one split-K slice of K:

1. scale pass: it reads its BLOCK_M rows of x over the whole K (not only its slice: the scale is a
   property of the row) and reduces them to the per-row absmax. At small M these rows are a few KB
   to a few hundred KB and sit in L2 after the first program has read them.
2. main loop: it loads (BLOCK_M, BLOCK_K) fp16/bf16 tiles of x, quantizes them in registers with
   :func:`quantize_int8_recip` (a float64 multiply by the row's reciprocal, which gives exactly the
   fp32 quotient of the IEEE division the reference and the pre-pass use; see its docstring: a
   ``div_rn`` per element made every K step several times slower on the GPU) and feeds ``tl.dot``
   with the int8 weight tile.
3. epilogue: dequantizes as the two-launch kernel does (same operations in the same order, so the
   output has the same bits), or writes fp32 partials for :mod:`kernels._splitk` when SPLIT_K > 1.

Rows past M are masked off (loaded as 0, never stored), weight columns past N are wrapped.
Every program redoes the scale pass and the quantization for its rows, so x is read
``2 * cdiv(N, BLOCK_N) * SPLIT_K`` times from L2 and quantized ``cdiv(N, BLOCK_N)`` times. On an
H200 that repeated quantization cost more than the launch it saves at every shape measured (M = 1 to
2048; docs/kernels-notes.md, "W8A8 fused activation quantization"), so ``kernels.w8a8.pick_config``
does not choose this path; ``launch(..., config=TileConfig(..., fused=True))`` runs it.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from compress_kernels._splitk import splitk_reduce
from compress_kernels._tiles import grouped_tile, split_k_range

ROUND_MAGIC = tl.constexpr(12582912.0)  # 1.5 * 2**23: adding then subtracting it rounds fp32 half to even
SCALE_STAGES = tl.constexpr(4)  # x tiles in flight in the scale pass (a serial L2 round trip per tile otherwise)


@triton.jit
def round_clamp_int8(q):
    """fp32 quotient -> int8: clamp to [-128, 127], then round half to even.

    The float trick ``(q + 1.5 * 2**23) - 1.5 * 2**23`` is exact for ``|q| < 2**22`` (q is clamped
    first; the bounds are integers, so clamping before rounding gives the integer that rounding then
    clamping gives).
    """
    q = tl.minimum(tl.maximum(q, -128.0), 127.0)
    q = (q + ROUND_MAGIC) - ROUND_MAGIC
    return q.to(tl.int8)


@triton.jit
def quantize_int8(v, scale):
    """fp32 ``v`` / ``scale`` -> int8 with IEEE division (``div_rn``), as the reference divides."""
    return round_clamp_int8(tl.math.div_rn(v, scale))


@triton.jit
def quantize_int8_recip(v, recip):
    """The same integers as ``quantize_int8(v, scale)`` with ``recip = 1 / scale`` in float64.

    ``fp32(float64(v) * recip)`` equals the IEEE fp32 quotient ``v / scale`` whenever ``v`` is an
    fp16 / bf16 value: that product is within 2**-52 (relative) of the exact quotient, while an exact
    quotient of a <= 11-bit significand by a 24-bit one is never an fp32 rounding midpoint and lies at
    least 2**-49 (relative) from every midpoint, so both round to the same fp32 number. (Checked
    exhaustively on the CPU as well: every finite fp16 / bf16 v against ~52k scales, 6.7e9 pairs.)
    ``div_rn`` per element costs a reciprocal, a refinement and a slow-path branch taken for
    ``v == 0``; here it is a multiply and two conversions, with no branch.
    """
    return round_clamp_int8((v.to(tl.float64) * recip).to(tl.float32))


@triton.jit
def row_scales(
    x_ptr, static_ptr, offs_m, M, K, stride_xm, stride_xk,
    STATIC: tl.constexpr, STATIC_PER_ROW: tl.constexpr, EVEN_K: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """Per-row scales (BLOCK_M,) fp32 of rows ``offs_m``: static, or ``max|x[m, :]| / 127``; 0 -> 1.

    ``EVEN_K``: K is a multiple of BLOCK_K, so the loads need only the row mask (16-byte vectors).
    """
    row_ok = offs_m < M
    if STATIC:
        if STATIC_PER_ROW:
            scale = tl.load(static_ptr + offs_m, mask=row_ok, other=1.0)
        else:
            scale = tl.load(static_ptr + tl.zeros((BLOCK_M,), dtype=tl.int32))
    else:
        offs_k = tl.arange(0, BLOCK_K)
        row_ptrs = x_ptr + offs_m[:, None].to(tl.int64) * stride_xm
        absmax = tl.zeros((BLOCK_M, BLOCK_K), dtype=tl.float32)
        for k0 in tl.range(0, K, BLOCK_K, num_stages=SCALE_STAGES):  # several tiles in flight
            if EVEN_K:
                mask = row_ok[:, None]
            else:
                mask = row_ok[:, None] & ((k0 + offs_k) < K)[None, :]
            v = tl.load(row_ptrs + (k0 + offs_k)[None, :] * stride_xk, mask=mask, other=0.0)
            absmax = tl.maximum(absmax, tl.abs(v.to(tl.float32)))
        scale = tl.math.div_rn(tl.max(absmax, axis=1), 127.0)
    return tl.where(scale == 0.0, 1.0, scale)


@triton.jit
def _w8a8_fused_kernel(
    x_ptr, w_ptr, static_ptr, sw_ptr, bias_ptr, out_ptr,  # x (M, K), w (N, K) i8, static scale, (N,), (N,), out
    M, N, K,
    stride_xm, stride_xk, stride_wn, stride_wk, stride_os, stride_om,  # stride_os: between split-K slices
    SPLIT_K, STATIC: tl.constexpr, STATIC_PER_ROW: tl.constexpr, ADD_BIAS: tl.constexpr, EVEN_K: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):
    pid_m, pid_n = grouped_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    pid_k = tl.program_id(1)

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = offs_m < M
    cols = (offs_n % N).to(tl.int64)  # wrapped columns: weight loads need no N mask, stores are masked
    offs_k = tl.arange(0, BLOCK_K)

    s_x = row_scales(x_ptr, static_ptr, offs_m, M, K, stride_xm, stride_xk,
                     STATIC, STATIC_PER_ROW, EVEN_K, BLOCK_M, BLOCK_K)  # (BM,)
    recip = 1.0 / s_x.to(tl.float64)  # IEEE float64 division, once per row

    k_first, k_last = split_k_range(pid_k, K, SPLIT_K, BLOCK_K)
    x_ptrs = x_ptr + offs_m[:, None].to(tl.int64) * stride_xm + (k_first + offs_k)[None, :] * stride_xk  # (BM, BK)
    w_ptrs = w_ptr + cols[None, :] * stride_wn + (k_first + offs_k)[:, None] * stride_wk  # (BK, BN)

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
    for k0 in range(k_first, k_last, BLOCK_K):
        if EVEN_K:
            v = tl.load(x_ptrs, mask=row_ok[:, None], other=0.0)
            b = tl.load(w_ptrs)
        else:
            in_k = (k0 + offs_k) < K
            v = tl.load(x_ptrs, mask=row_ok[:, None] & in_k[None, :], other=0.0)
            b = tl.load(w_ptrs, mask=in_k[:, None], other=0)
        a = quantize_int8_recip(v.to(tl.float32), recip[:, None])
        acc = tl.dot(a, b, acc, out_dtype=tl.int32)
        x_ptrs += BLOCK_K * stride_xk
        w_ptrs += BLOCK_K * stride_wk

    s_w = tl.load(sw_ptr + cols)
    y = acc.to(tl.float32) * s_x[:, None] * s_w[None, :]
    if ADD_BIAS:  # with split-K the bias is added by the reduce pass
        y += tl.load(bias_ptr + cols).to(tl.float32)[None, :]
    out_ptrs = out_ptr + pid_k * stride_os + offs_m[:, None].to(tl.int64) * stride_om + offs_n[None, :]
    mask = row_ok[:, None] & (offs_n[None, :] < N)
    tl.store(out_ptrs, y.to(out_ptr.dtype.element_ty), mask=mask)


def launch_fused(x2, w_q, w_scale, bias, x_scale, cfg, y) -> torch.Tensor:
    """Write ``w8a8(x2)`` into ``y`` (M, N) with one GEMM launch (+ the split-K reduce if ``cfg.split_k > 1``).

    Inputs are validated by the caller; ``cfg`` has ``block_m/n/k``, ``split_k``, ``group_m``,
    ``num_warps`` and ``num_stages``; ``x_scale`` is None or a static fp32 scalar / (M,) tensor.
    """
    m, k = x2.shape
    n = w_q.shape[0]
    split_k = cfg.split_k
    out = y if split_k == 1 else torch.empty((split_k, m, n), dtype=torch.float32, device=x2.device)
    static = x_scale.reshape(-1).contiguous() if x_scale is not None else w_scale  # placeholder when dynamic
    grid = (triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n), split_k)
    _w8a8_fused_kernel[grid](
        x2, w_q, static, w_scale, bias if bias is not None else w_scale, out,
        m, n, k,
        x2.stride(0), x2.stride(1), w_q.stride(0), w_q.stride(1),
        m * n if split_k > 1 else 0, out.stride(-2),
        split_k, STATIC=x_scale is not None, STATIC_PER_ROW=x_scale is not None and x_scale.numel() > 1,
        ADD_BIAS=bias is not None and split_k == 1, EVEN_K=k % (cfg.block_k * split_k) == 0,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    if split_k > 1:
        splitk_reduce(out, bias, y)
    return y
