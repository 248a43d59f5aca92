"""LayerNorm, RMSNorm and GELU that also quantize their output per token for the W8A8 layer after them.

A W8A8 layer quantizes its input in a pre-pass launch
(:func:`compress_kernels.common.quantize.quantize_rows`) before its GEMM. When that input is the
output of a LayerNorm, an RMSNorm or a GELU, the kernel computing it already holds each row in
registers, so it can write the int8 copy too, and the W8A8 GEMM starts from it
(``w8a8_matmul_quantized``): one launch fewer per such layer, which is most of what W8A8 costs over
fp16 on small layers. One program per row of ``x`` (M, K), the whole row in registers
(K <= :data:`MAX_ROW`; :mod:`compress_kernels.norm_quant.norm`, :mod:`compress_kernels.norm_quant.gelu`).
Each returns ``(y, xq, s_x)``: ``y`` in x's shape and dtype, ``xq`` (M, K) int8, ``s_x`` (M,) fp32,
exactly ``compress_kernels.reference.quantize_per_token(y)``. ``y`` itself matches
``torch.nn.functional.layer_norm`` / ``gelu`` / the RMSNorm of Llama-family models in
``transformers`` to fp32 rounding (the order of the sums differs, and ``1 / sqrt`` is correctly
rounded where ``torch.rsqrt`` may not be), not bit for bit.

Plain launchers (not ``torch.library`` ops): callers run them eagerly or under CUDA-graph capture;
``compress.nn.input_quant`` does not use them under ``torch.compile``.
"""
from __future__ import annotations

import torch

from compress_kernels.common.checks import check_activation, check_same_device, check_shape, check_tensor, check_x_scale
from compress_kernels.common.launch import launch
from compress_kernels.common.pdl import launch_options, pdl_enabled
from compress_kernels.norm_quant.dispatch import MAX_ROW, pick
from compress_kernels.norm_quant.gelu import _gelu_quantize_kernel
from compress_kernels.norm_quant.norm import _norm_quantize_kernel


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
    cfg = pick(k)
    use_pdl = pdl_enabled(x.device)
    return {"BLOCK_K": cfg.block_k, "USE_PDL": use_pdl, "num_warps": cfg.num_warps, **launch_options(use_pdl)}


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
    launch(_norm_quantize_kernel, (m,),
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
    launch(_gelu_quantize_kernel, (m,),
        x2, y, xq, s_x, x_scale if x_scale is not None else s_x, k, x2.stride(0),
        STATIC=x_scale is not None, **_launch_options(x, k),
    )
    return y, xq, s_x
