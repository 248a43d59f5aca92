"""LayerNorm, RMSNorm and GELU that also quantize their output per token for the W8A8 layer after them.

A W8A8 layer quantizes its input in a pre-pass launch (``kernels.w8a8.quantize_rows``) before its
GEMM. When that input is the output of a LayerNorm, an RMSNorm or a GELU, the kernel computing it already holds
each row in registers, so it can write the int8 copy too, and the W8A8 GEMM starts from it
(``w8a8_matmul_quantized``): one launch fewer per such layer, which is most of what W8A8 costs over
fp16 on small layers (docs/kernels-notes.md). One program per row of ``x`` (M, K), the whole row in
registers (K <= :data:`MAX_ROW`)::

    LayerNorm:  mu = mean_k x[m, k]    var = mean_k (x[m, k] - mu)^2          (fp32, two passes)
                y[m, k] = (x[m, k] - mu) / sqrt(var + eps) * weight[k] + bias[k]   stored in x's dtype
    RMSNorm:    r = x[m, k] / sqrt(mean_k x[m, k]^2 + eps), rounded to x's dtype     (Llama's order)
                y[m, k] = weight[k] * r                                             stored in x's dtype
    GELU:       y[m, k] = x[m, k] / 2 * (1 + erf(x[m, k] / sqrt(2)))                  stored in x's dtype
    then, on the stored (rounded) y:
                s_x[m] = max_k |y[m, k]| / 127 (0 -> 1), or a static scale
                xq[m, k] = clamp(rint(y[m, k] / s_x[m]), -128, 127)               int8, (M, K) contiguous

The quantization is ``quantize_rows``' (the same helper, IEEE division, round half to even), applied
to the rounded ``y``, so ``xq`` and ``s_x`` are exactly ``kernels.reference.quantize_per_token(y)``.
``y`` itself matches ``torch.nn.functional.layer_norm`` / ``gelu`` / the RMSNorm of Llama-family
models in ``transformers`` to fp32 rounding (the order of the sums differs, and ``1 / sqrt`` is
correctly rounded where ``torch.rsqrt`` may not be), not bit for bit.

The kernels form a PDL pair with the GEMM after them, as the quantize pre-pass does
(``kernels/_pdl.py``): they wait for their input at the start and let the GEMM launch after their
last store. Plain launchers (not ``torch.library`` ops): callers run them eagerly or under CUDA-graph
capture; ``compress.input_quant`` does not use them under ``torch.compile``.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from compress_kernels._checks import check_activation, check_same_device, check_shape, check_tensor
from compress_kernels._pdl import launch_options, let_dependents_launch, pdl_enabled, wait_for_inputs
from compress_kernels.w8a8 import check_x_scale
from compress_kernels.w8a8_fused import quantize_int8

MAX_ROW = 16384  # one row in the registers of one program


@triton.jit
def _store_quantized(y, mask, xq_row, sx_ptr, static_ptr, row, offs, STATIC: tl.constexpr):
    """Per-token int8 of the rounded fp32 row ``y`` (masked lanes ignored) into ``xq_row`` and ``s_x``."""
    if STATIC:
        scale = tl.load(static_ptr)
    else:
        absmax = tl.max(tl.where(mask, tl.abs(y), 0.0), axis=0)
        scale = tl.math.div_rn(absmax, 127.0)
    scale = tl.where(scale == 0.0, 1.0, scale)
    tl.store(sx_ptr + row, scale)
    tl.store(xq_row + offs, quantize_int8(y, scale), mask=mask)


@triton.jit
def _norm_quantize_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr, xq_ptr, sx_ptr, static_ptr,  # x (M, K) rows of stride_xm; y, xq (M, K) contiguous
    K, stride_xm, eps,
    RMS: tl.constexpr, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, STATIC: tl.constexpr,
    BLOCK_K: tl.constexpr, USE_PDL: tl.constexpr,
):
    wait_for_inputs(USE_PDL)
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK_K)
    mask = offs < K
    x = tl.load(x_ptr + row.to(tl.int64) * stride_xm + offs, mask=mask, other=0.0).to(tl.float32)
    if RMS:  # Llama's RMSNorm: the normalized row is rounded to x's dtype before the weight multiplies it
        y = (x * (1.0 / tl.sqrt_rn(tl.sum(x * x, axis=0) / K + eps))).to(y_ptr.dtype.element_ty).to(tl.float32)
    else:
        centered = tl.where(mask, x - tl.sum(x, axis=0) / K, 0.0)
        y = centered * (1.0 / tl.sqrt_rn(tl.sum(centered * centered, axis=0) / K + eps))
    if HAS_WEIGHT:
        y = y * tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    if HAS_BIAS:
        y = y + tl.load(b_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    y_out = y.to(y_ptr.dtype.element_ty)
    tl.store(y_ptr + row.to(tl.int64) * K + offs, y_out, mask=mask)
    _store_quantized(y_out.to(tl.float32), mask, xq_ptr + row.to(tl.int64) * K, sx_ptr, static_ptr, row, offs,
                     STATIC)
    let_dependents_launch(USE_PDL)


@triton.jit
def _gelu_quantize_kernel(
    x_ptr, y_ptr, xq_ptr, sx_ptr, static_ptr, K, stride_xm,
    STATIC: tl.constexpr, BLOCK_K: tl.constexpr, USE_PDL: tl.constexpr,
):
    wait_for_inputs(USE_PDL)
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK_K)
    mask = offs < K
    x = tl.load(x_ptr + row.to(tl.int64) * stride_xm + offs, mask=mask, other=0.0).to(tl.float32)
    y_out = (0.5 * x * (1.0 + tl.math.erf(x * 0.7071067811865476))).to(y_ptr.dtype.element_ty)
    tl.store(y_ptr + row.to(tl.int64) * K + offs, y_out, mask=mask)
    _store_quantized(y_out.to(tl.float32), mask, xq_ptr + row.to(tl.int64) * K, sx_ptr, static_ptr, row, offs,
                     STATIC)
    let_dependents_launch(USE_PDL)


def _rows(x: torch.Tensor, x_scale) -> tuple[torch.Tensor, int, int]:
    """Validated ``x`` as (M, K) rows with unit column stride, and (M, K)."""
    check_activation(x)
    k = x.shape[-1]
    if not 1 <= k <= MAX_ROW:
        raise ValueError(f"x: expected 1 <= K <= {MAX_ROW} features per row (one row per program), got K = {k}")
    check_x_scale(x, x_scale)
    if x_scale is not None and x_scale.numel() != 1:
        raise ValueError(f"x_scale: expected one static scale for every token, got shape {tuple(x_scale.shape)}")
    x2 = x.reshape(-1, k)
    return (x2 if x2.stride(-1) == 1 else x2.contiguous()), x2.shape[0], k


def _outputs(x: torch.Tensor, m: int, k: int):
    return (torch.empty(x.shape, dtype=x.dtype, device=x.device),
            torch.empty((m, k), dtype=torch.int8, device=x.device),
            torch.empty((m,), dtype=torch.float32, device=x.device))


def _launch_options(x: torch.Tensor, k: int) -> dict:
    block_k = triton.next_power_of_2(k)
    use_pdl = pdl_enabled(x.device, pair=True)
    num_warps = 4 if block_k <= 1024 else 8 if block_k <= 4096 else 16
    return {"BLOCK_K": block_k, "USE_PDL": use_pdl, "num_warps": num_warps, **launch_options(use_pdl)}


def layer_norm_quantize(x, weight=None, bias=None, eps: float = 1e-5, x_scale=None):
    """``(y, xq, s_x)``: LayerNorm of ``x`` (..., K) over K, and its per-token int8 quantization.

    ``weight`` / ``bias``: None or (K,) in x's dtype or float32. ``x_scale``: None (dynamic scales)
    or one static float32 scale. ``y`` has x's shape and dtype; ``xq`` is (M, K) int8, ``s_x`` (M,)
    float32, M the number of tokens.
    """
    return _norm_quantize(x, weight, bias, eps, x_scale, rms=False)


def rms_norm_quantize(x, weight, eps: float = 1e-6, x_scale=None):
    """``(y, xq, s_x)``: Llama's RMSNorm of ``x`` (..., K), ``y = weight * rint_dtype(x / rms(x))``
    with ``rms(x) = sqrt(mean_k x^2 + eps)`` in fp32 and the normalized row rounded to x's dtype
    before ``weight`` (x's dtype, (K,)) multiplies it, and its per-token int8 quantization; shapes and
    ``x_scale`` as in :func:`layer_norm_quantize`."""
    if not isinstance(weight, torch.Tensor) or weight.dtype != getattr(x, "dtype", None):
        got = weight.dtype if isinstance(weight, torch.Tensor) else type(weight).__name__
        raise TypeError(f"weight: expected a tensor in x's dtype (the product is formed in it), got {got}")
    return _norm_quantize(x, weight, None, eps, x_scale, rms=True)


def _norm_quantize(x, weight, bias, eps, x_scale, rms: bool):
    x2, m, k = _rows(x, x_scale)
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None:
            check_tensor(name, t, (x.dtype, torch.float32), ndim=1)
            check_shape(name, t, (k,))
            check_same_device(x, **{name: t})
    y, xq, s_x = _outputs(x, m, k)
    if m == 0:
        return y, xq, s_x
    _norm_quantize_kernel[(m,)](
        x2, weight if weight is not None else s_x, bias if bias is not None else s_x, y, xq, s_x,
        x_scale if x_scale is not None else s_x, k, x2.stride(0), float(eps),
        RMS=rms, HAS_WEIGHT=weight is not None, HAS_BIAS=bias is not None, STATIC=x_scale is not None,
        **_launch_options(x, k),
    )
    return y, xq, s_x


def gelu_quantize(x, x_scale=None):
    """``(y, xq, s_x)``: ``gelu(x)`` (exact, erf form) of ``x`` (..., K), and its per-token int8
    quantization; shapes and ``x_scale`` as in :func:`layer_norm_quantize`."""
    x2, m, k = _rows(x, x_scale)
    y, xq, s_x = _outputs(x, m, k)
    if m == 0:
        return y, xq, s_x
    _gelu_quantize_kernel[(m,)](
        x2, y, xq, s_x, x_scale if x_scale is not None else s_x, k, x2.stride(0),
        STATIC=x_scale is not None, **_launch_options(x, k),
    )
    return y, xq, s_x
