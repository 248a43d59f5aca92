"""Per-token int8 quantization of activations: the in-kernel helpers and the pre-pass kernel.

The contract (``compress_kernels.reference.quantize_per_token``), for a row ``x[m, :]``::

    s_x[m]     = max_k |x[m, k]| / 127      (IEEE division; 0 -> 1)   or a static scale (0 -> 1)
    xq[m, k]   = rint(clamp(x[m, k] / s_x[m], -128, 127))              rint = round half to even

Rounding uses the float trick ``(q + 1.5 * 2**23) - 1.5 * 2**23``, exact round-half-even for
``|q| < 2**22``; q is clamped first, and since the bounds are integers clamping before rounding gives
the integer that rounding then clamping gives. So every kernel here produces the reference's integers.

Non-finite rows: a row holding a NaN or an Inf gets ``s_x[m] = NaN`` (the reference's rule), so the
GEMM after it writes a NaN output row. Triton's ``max`` skips NaN (the GPU's ``fmax``), so the absmax
alone would hide a NaN; each kernel also sums ``v * 0`` over the row (0 when finite, NaN otherwise)
and adds it to the stored scale. A scale is never 0, so adding 0 leaves every finite one unchanged to
the bit. The int8 values of such a row are unspecified.

* :func:`quantize_int8`: the quotient by IEEE division (``div_rn``), as the reference divides.
* :func:`quantize_int8_recip`: the same integers from a float64 multiply by ``1 / s_x`` (see its
  docstring for why that is exact), cheaper inside a GEMM's K loop (the W8A8 one-row kernel).
* :func:`row_scales`: the per-row scales of a block of rows, read in ``BLOCK_K`` steps.
* :func:`store_int8_row`: the scale and int8 copy of a row a kernel already holds in registers
  (the LayerNorm / RMSNorm / GELU kernels of :mod:`compress_kernels.norm_quant`).
* :func:`non_finite_poison`: 0 for a block of finite values, NaN if any is NaN or Inf.
* :func:`quantize_rows`: the pre-pass launch of the W8A8 GEMMs (dense and block-sparse), one program
  per row: x (M, K) -> ``xq`` (M, K) int8 contiguous and ``s_x`` (M,) fp32. Rows up to
  :data:`ONE_PASS_MAX_K` long are held whole in registers and read once (H100, 4096x4096 at M = 8192:
  47.8 -> 35.7 us); longer rows are read twice in 2048-wide blocks, an absmax pass then a quantize
  pass (at K = 11008, padded to 16384 in one pass, it was slower: 40.2 -> 56.1 us at M = 2048). The
  pass is the producer of a PDL pair with the GEMM after it (:mod:`compress_kernels.common.pdl`).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from compress_kernels.common.launch import launch
from compress_kernels.common.pdl import launch_options, let_dependents_launch, pdl_enabled, wait_for_inputs

ROUND_MAGIC = tl.constexpr(12582912.0)  # 1.5 * 2**23: adding then subtracting it rounds fp32 half to even
SCALE_STAGES = tl.constexpr(4)  # x tiles in flight in the scale pass (a serial L2 round trip per tile otherwise)
ONE_PASS_MAX_K = 4096  # quantize_rows: rows up to this long are held whole and read once
TWO_PASS_BLOCK = 2048  # quantize_rows: x values per step of the two passes over longer rows


@triton.jit
def round_clamp_int8(q):
    """fp32 quotient -> int8: clamp to [-128, 127], then round half to even (see the module docstring)."""
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
def non_finite_poison(v):
    """0.0 if every value of the fp32 block ``v`` is finite, else NaN (``Inf * 0`` and ``NaN * 0`` are NaN)."""
    return tl.sum(v * 0.0)


@triton.jit
def _max_keeping_nan(a, b):
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def row_scales(
    x_ptr, static_ptr, offs_m, M, K, stride_xm, stride_xk,
    STATIC: tl.constexpr, STATIC_PER_ROW: tl.constexpr, EVEN_K: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """Per-row scales (BLOCK_M,) fp32 of rows ``offs_m``: static, or ``max|x[m, :]| / 127``; 0 -> 1;
    NaN for a row holding a NaN or an Inf (dynamic only: a static scale reads no x).

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
            absmax = tl.maximum(absmax, tl.abs(v.to(tl.float32)), propagate_nan=tl.PropagateNan.ALL)
        # NaN-propagating max, then Inf -> NaN: a row holding a NaN or an Inf gets a NaN scale
        scale = tl.math.div_rn(tl.reduce(absmax, 1, _max_keeping_nan), 127.0)
        scale = tl.where(scale < float("inf"), scale, float("nan"))
    return tl.where(scale == 0.0, 1.0, scale)


@triton.jit
def store_int8_row(y, mask, xq_row, sx_ptr, static_ptr, row, offs, STATIC: tl.constexpr):
    """Per-token int8 of the rounded fp32 row ``y`` (masked lanes ignored) into ``xq_row`` and ``s_x``."""
    if STATIC:
        scale = tl.load(static_ptr)
    else:
        absmax = tl.max(tl.where(mask, tl.abs(y), 0.0), axis=0)
        scale = tl.math.div_rn(absmax, 127.0)
    scale = tl.where(scale == 0.0, 1.0, scale)
    tl.store(sx_ptr + row, scale + non_finite_poison(tl.where(mask, y, 0.0)))
    tl.store(xq_row + offs, quantize_int8(y, scale), mask=mask)


@triton.jit
def _quantize_rows_kernel(
    x_ptr, xq_ptr, sx_ptr, static_ptr,  # x (M, K), xq (M, K) int8 contiguous, s_x (M,) fp32, static scale
    K, stride_xm, stride_xk,
    STATIC: tl.constexpr, STATIC_PER_ROW: tl.constexpr, BLOCK_K: tl.constexpr, ONE_PASS: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    wait_for_inputs(USE_PDL)  # x comes from the kernel before
    row = tl.program_id(0)
    x_row = x_ptr + row.to(tl.int64) * stride_xm
    offs = tl.arange(0, BLOCK_K)
    if STATIC:
        if STATIC_PER_ROW:
            scale = tl.load(static_ptr + row)
        else:
            scale = tl.load(static_ptr)
    if ONE_PASS:  # the whole row (K <= BLOCK_K) in registers: x is read once
        row_mask = offs < K
        row_vals = tl.load(x_row + offs * stride_xk, mask=row_mask, other=0.0).to(tl.float32)
        if not STATIC:
            scale = tl.math.div_rn(tl.max(tl.abs(row_vals), axis=0), 127.0)
        scale = tl.where(scale == 0.0, 1.0, scale)
        tl.store(sx_ptr + row, scale + non_finite_poison(row_vals))
        tl.store(xq_ptr + row.to(tl.int64) * K + offs, quantize_int8(row_vals, scale), mask=row_mask)
    else:  # an absmax pass, then a quantize pass, BLOCK_K at a time
        if not STATIC:
            absmax = tl.zeros((BLOCK_K,), dtype=tl.float32)
            for k0 in range(0, K, BLOCK_K):
                v = tl.load(x_row + (k0 + offs) * stride_xk, mask=k0 + offs < K, other=0.0)
                absmax = tl.maximum(absmax, tl.abs(v.to(tl.float32)))
            scale = tl.math.div_rn(tl.max(absmax, axis=0), 127.0)
        scale = tl.where(scale == 0.0, 1.0, scale)
        xq_row = xq_ptr + row.to(tl.int64) * K
        poison = tl.zeros((BLOCK_K,), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            mask = k0 + offs < K
            v = tl.load(x_row + (k0 + offs) * stride_xk, mask=mask, other=0.0).to(tl.float32)
            poison += v * 0.0
            tl.store(xq_row + k0 + offs, quantize_int8(v, scale), mask=mask)
        tl.store(sx_ptr + row, scale + tl.sum(poison))
    # the GEMM may launch now (it waits for this kernel before reading xq); at the kernel's start this
    # made batch 8 of a MiniLM-size model slower (compress_kernels.common.pdl)
    let_dependents_launch(USE_PDL)


def row_warps(block_k: int) -> int:
    """Warps of a program that holds a row of ``block_k`` values: 4 up to 1024, 8 up to 4096, else 16."""
    return 4 if block_k <= 1024 else (8 if block_k <= 4096 else 16)


def quantize_rows(x2: torch.Tensor, x_scale: torch.Tensor | None = None):
    """Triton per-token quantization of ``x2`` (M, K): ``(xq int8 (M, K), s_x fp32 (M,))``; ``x_scale``
    None (dynamic scales) or a static fp32 scale (one element or (M,))."""
    m, k = x2.shape
    xq = torch.empty((m, k), dtype=torch.int8, device=x2.device)
    s_x = torch.empty((m,), dtype=torch.float32, device=x2.device)
    if m == 0:
        return xq, s_x
    static = x_scale.reshape(-1).contiguous() if x_scale is not None else s_x
    one_pass = k <= ONE_PASS_MAX_K
    block_k = triton.next_power_of_2(k) if one_pass else min(triton.next_power_of_2(k), TWO_PASS_BLOCK)
    use_pdl = pdl_enabled(x2.device)
    launch(_quantize_rows_kernel, (m,),
        x2, xq, s_x, static, k, x2.stride(0), x2.stride(1),
        STATIC=x_scale is not None, STATIC_PER_ROW=x_scale is not None and x_scale.numel() > 1,
        BLOCK_K=block_k, ONE_PASS=one_pass, USE_PDL=use_pdl, num_warps=row_warps(block_k),
        **launch_options(use_pdl),
    )
    return xq, s_x
