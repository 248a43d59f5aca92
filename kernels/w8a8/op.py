"""W8A8 matmul: int8 activations x int8 weights, int32 accumulation, dequantized in the epilogue.

Math (the contract of ``compress_kernels.reference.w8a8_matmul_ref``), with ``x`` (M, K) fp16/bf16,
``w_q`` (N, K) int8 (the ``nn.Linear`` layout, K contiguous), ``w_scale`` (N,) fp32::

    s_x[m]     = max_k |x[m, k]| / 127         (dynamic, per token; 0 -> 1)   or a static scale
    xq[m, k]   = clamp(rint(x[m, k] / s_x[m]), -128, 127)       rint = round half to even
    acc[m, n]  = sum_k xq[m, k] * w_q[n, k]                      exact, int32
    y[m, n]    = acc[m, n] * s_x[m] * w_scale[n] (+ bias[n])     in fp32, stored in x's dtype

Every path computes the reference's integers (:mod:`compress_kernels.common.quantize`); which one
runs is decided by :func:`compress_kernels.w8a8.dispatch.pick` from the shapes alone (remembered per
shape: ``cached_pick``). ``w8a8_matmul`` validates and calls the custom op
``torch.ops.compress_kernels.w8a8_matmul`` (with a fake implementation, so callers compile under
``torch.compile`` and capture in CUDA graphs). ``w8a8_matmul_quantized`` starts from an input already
quantized per token (by the LayerNorm / RMSNorm / GELU kernels of :mod:`compress_kernels.norm_quant`)
and runs only the GEMM. ``bind_w8a8_matmul`` and ``bind_w8a8_matmul_quantized`` validate once and
return calls bound to the weights, which launch without the custom op in eager mode
(:mod:`compress_kernels.common.bound`).
"""
from __future__ import annotations

import functools

import torch

from compress_kernels.common.bound import BoundMatmul, BoundQuantizedMatmul
from compress_kernels.common.checks import (check_activation, check_bias, check_quantized, check_same_device,
                                            check_shape, check_tensor, check_x_scale)
from compress_kernels.common.quantize import quantize_rows
from compress_kernels.w8a8.dispatch import TileConfig, cached_pick
from compress_kernels.w8a8.gemm import launch_tiles
from compress_kernels.w8a8.gemv import launch_gemv
from compress_kernels.w8a8.tma import launch_tma, tma_ready

PATHS = ("gemv", "tiled", "tma")


def _validate(x, w_q, w_scale, bias, x_scale) -> None:
    check_activation(x)
    check_tensor("w_q", w_q, (torch.int8,), ndim=2)
    k = x.shape[-1]
    if k == 0:
        raise ValueError("x: expected K >= 1 input features, got K = 0")
    n = w_q.shape[0]
    check_shape("w_q", w_q, (n, k))
    check_tensor("w_scale", w_scale, (torch.float32,), ndim=1)
    check_shape("w_scale", w_scale, (n,))
    check_bias(bias, n, x)
    check_same_device(x, w_q=w_q, w_scale=w_scale)
    check_x_scale(x, x_scale)


def launch(x2, w_q, w_scale, bias=None, x_scale=None, config: TileConfig | None = None,
           tma_ok: bool | None = None) -> torch.Tensor:
    """Run validated 2-D ``x2`` (M, K) through the picked path (or ``config``); returns (M, N) in x2's dtype.
    ``tma_ok``: ``tma_ready(w_q)`` when the caller knows it already (a bound call), else None."""
    m, k = x2.shape
    n = w_q.shape[0]
    y = torch.empty((m, n), dtype=x2.dtype, device=x2.device)
    if m == 0:
        return y
    cfg = config or cached_pick(m, n, k, x2.device, tma_ok=tma_ready(w_q) if tma_ok is None else tma_ok)
    w_scale = w_scale.contiguous()
    bias = bias.contiguous() if bias is not None else None
    if cfg.path == "gemv":  # one launch: the row is quantized in the kernel
        launch_gemv(x2, w_q, w_scale, bias, x_scale, cfg, y)
        return y
    xq, s_x = quantize_rows(x2, x_scale)
    return launch_gemm(xq, s_x, w_q, w_scale, bias, cfg, y)


def launch_gemm(xq, s_x, w_q, w_scale, bias, cfg: TileConfig, y) -> torch.Tensor:
    """The GEMM of ``cfg`` (path ``tiled`` or ``tma``) on quantized ``xq`` (M, K) int8 and ``s_x`` (M,)
    into ``y`` (M, N)."""
    if cfg.path == "tma":
        if cfg.split_k != 1 or not tma_ready(w_q, xq):
            raise ValueError(f"config: the tma path needs split_k 1 and TMA-describable operands, got {cfg}")
        launch_tma(xq, s_x, w_q, w_scale, bias, cfg, y)
    elif cfg.path == "tiled":
        launch_tiles(xq, s_x, w_q, w_scale, bias, cfg, y)
    else:
        raise ValueError(f"config.path: expected one of {PATHS} (gemv only for unquantized x), got {cfg.path!r}")
    return y


def launch_nd(x, w_q, w_scale, bias=None, x_scale=None, tma_ok: bool | None = None) -> torch.Tensor:
    """:func:`launch` on validated ``x`` (..., K): (..., N) in x's dtype (the custom op's work after validation)."""
    k = x.shape[-1]
    y2 = launch(x.reshape(-1, k), w_q, w_scale, bias, x_scale, tma_ok=tma_ok)
    return y2.reshape(*x.shape[:-1], w_q.shape[0])


@torch.library.custom_op("compress_kernels::w8a8_matmul", mutates_args=())
def _w8a8_op(
    x: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor, bias: torch.Tensor | None, x_scale: torch.Tensor | None
) -> torch.Tensor:
    _validate(x, w_q, w_scale, bias, x_scale)
    return launch_nd(x, w_q, w_scale, bias, x_scale)


@_w8a8_op.register_fake
def _w8a8_fake(x, w_q, w_scale, bias, x_scale):
    _validate(x, w_q, w_scale, bias, x_scale)
    return x.new_empty((*x.shape[:-1], w_q.shape[0]))


def _validate_quantized(xq, s_x, w_q, w_scale, bias, out_dtype) -> None:
    check_quantized(xq, s_x, out_dtype)
    k = xq.shape[1]
    check_tensor("w_q", w_q, (torch.int8,), ndim=2)
    n = w_q.shape[0]
    check_shape("w_q", w_q, (n, k))
    check_tensor("w_scale", w_scale, (torch.float32,), ndim=1)
    check_shape("w_scale", w_scale, (n,))
    if bias is not None:
        check_tensor("bias", bias, (out_dtype, torch.float32), ndim=1)
        check_shape("bias", bias, (n,))
    check_same_device(xq, w_q=w_q, w_scale=w_scale, bias=bias)


def launch_quantized(xq, s_x, w_q, w_scale, bias=None, out_dtype=torch.float16) -> torch.Tensor:
    """The GEMM on validated per-token int8 ``xq`` (M, K) and ``s_x`` (M,): (M, N) in ``out_dtype``."""
    m, k = xq.shape
    n = w_q.shape[0]
    y = torch.empty((m, n), dtype=out_dtype, device=xq.device)
    if m == 0:
        return y
    xq = xq.contiguous()
    bias = bias.contiguous() if bias is not None else None
    cfg = cached_pick(m, n, k, xq.device, quantized=True, tma_ok=tma_ready(w_q, xq))
    return launch_gemm(xq, s_x.contiguous(), w_q, w_scale.contiguous(), bias, cfg, y)


def w8a8_matmul_quantized(xq, s_x, w_q, w_scale, bias=None, out_dtype=torch.float16) -> torch.Tensor:
    """:func:`w8a8_matmul` from an input already quantized per token (e.g. by ``compress_kernels.norm_quant``):
    ``xq`` (M, K) int8 and ``s_x`` (M,) float32 -> (M, N) in ``out_dtype`` (fp16 / bf16)."""
    _validate_quantized(xq, s_x, w_q, w_scale, bias, out_dtype)
    return launch_quantized(xq, s_x, w_q, w_scale, bias, out_dtype)


def w8a8_matmul(x, w_q, w_scale, bias=None, x_scale=None) -> torch.Tensor:
    """``y = dequant(quant(x) @ w_q.T) (+ bias)``: x (..., K) fp16/bf16 -> (..., N) in x's dtype.

    ``x_scale``: None for dynamic per-token scales, else a static fp32 scale (a Python float, a
    one-element tensor or one per token, shape (M,)).
    """
    if isinstance(x_scale, (int, float)) and isinstance(x, torch.Tensor):
        x_scale = torch.tensor(float(x_scale), dtype=torch.float32, device=x.device)
    _validate(x, w_q, w_scale, bias, x_scale)
    return torch.ops.compress_kernels.w8a8_matmul(x, w_q, w_scale, bias, x_scale)


def bind_w8a8_matmul(x, w_q, w_scale, bias=None, x_scale=None) -> BoundMatmul:
    """:func:`w8a8_matmul` with every argument validated now, against ``x``, and the weight side bound for
    later inputs of x's dtype, device and K (:class:`compress_kernels.common.bound.BoundMatmul`).
    ``x_scale``: None (dynamic) or one static scale for every token (a per-token one fits one M only)."""
    if isinstance(x_scale, (int, float)) and isinstance(x, torch.Tensor):
        x_scale = torch.tensor(float(x_scale), dtype=torch.float32, device=x.device)
    _validate(x, w_q, w_scale, bias, x_scale)
    if x_scale is not None and x_scale.numel() != 1:
        raise ValueError(f"x_scale: expected None or one static scale for every token (a bound call serves any "
                         f"number of tokens), got shape {tuple(x_scale.shape)}")
    launch_bound = functools.partial(launch_nd, tma_ok=tma_ready(w_q))  # a fact of w_q: read once
    return BoundMatmul("w8a8_matmul", launch_bound, (w_q, w_scale, bias, x_scale), x)


def bind_w8a8_matmul_quantized(xq, s_x, w_q, w_scale, bias=None, out_dtype=torch.float16) -> BoundQuantizedMatmul:
    """:func:`w8a8_matmul_quantized` with every argument validated now, against ``xq`` and ``s_x``, and the
    weight side bound for later inputs on xq's device with its K
    (:class:`compress_kernels.common.bound.BoundQuantizedMatmul`)."""
    _validate_quantized(xq, s_x, w_q, w_scale, bias, out_dtype)
    return BoundQuantizedMatmul("w8a8_matmul_quantized", launch_quantized, (w_q, w_scale, bias, out_dtype), xq)
