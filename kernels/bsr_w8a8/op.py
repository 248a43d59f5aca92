"""DDS + W8A8: per-token int8 activations x 32x32 block-sparse int8 weights: validation, launchers, custom op.

The two compressions of a layer pruned into blocks *and* quantized to W8A8, served together: the
weight is stored as BSR parts like the fp16 DDS op (:mod:`compress_kernels.bsr.op`) but with int8
``values``, plus ``w_scale`` (N,) float32 per output channel. Math (the W8A8 contract of
``compress_kernels.reference`` with ``W_q`` the BSR matrix, absent blocks zero)::

    xq, s_x    = per-token quantization of x (the dense W8A8 quantize pass)
    acc[m, n]  = sum_k xq[m, k] * W_q[n, k]                      int32, exact
    y[m, n]    = acc[m, n] * s_x[m] * w_scale[n] (+ bias[n])     fp32 -> x's dtype

Which kernel runs is decided by :func:`compress_kernels.bsr_w8a8.dispatch.pick`: the quantize pass
then the sparse int8 tiles (:mod:`compress_kernels.bsr_w8a8.gemm`), or, at large M on dense enough
layers, the int8 weight written out dense for the dense W8A8 kernels (the same integers, so the dense
kernels' output). ``bsr_w8a8_matmul_parts`` validates and calls the custom op
``torch.ops.compress_kernels.bsr_w8a8_matmul`` (with a fake implementation, so callers compile and
capture in CUDA graphs: the launch depends on shapes only). ``bsr_w8a8_matmul_quantized`` starts from
an input already quantized per token and runs only the GEMM. ``bind_bsr_w8a8_matmul_parts`` and
``bind_bsr_w8a8_matmul_quantized`` validate once (indices not checked) and return calls bound to the
parts, which launch without the custom op in eager mode (:mod:`compress_kernels.common.bound`).
"""
from __future__ import annotations

import torch

from compress_kernels.bsr.densify import bsr_to_dense
from compress_kernels.bsr.dispatch import BsrConfig
from compress_kernels.bsr.op import check_parts
from compress_kernels.bsr_w8a8.dispatch import cached_pick
from compress_kernels.bsr_w8a8.gemm import launch_gemm
from compress_kernels.common.bound import BoundMatmul, BoundQuantizedMatmul
from compress_kernels.common.checks import check_quantized, check_same_device, check_shape, check_tensor, check_x_scale
from compress_kernels.common.quantize import quantize_rows
from compress_kernels.w8a8.op import launch as launch_dense_w8a8
from compress_kernels.w8a8.op import launch_quantized as launch_dense_w8a8_quantized


def launch(x2, crow_indices, col_indices, values, w_scale, out_features: int, bias=None, x_scale=None,
           config: BsrConfig | None = None) -> torch.Tensor:
    """Run validated ``x2`` (M, K) through the picked path (or ``config``); returns (M, out_features)."""
    m, k = x2.shape
    config = config or cached_pick(m, out_features, k, col_indices.shape[0], x2.device)
    if config.kernel == "dense":  # large M: the dense W8A8 kernels on the dense int8 weight
        w_q = bsr_to_dense(crow_indices, col_indices, values, out_features, k)
        return launch_dense_w8a8(x2 if x2.stride(-1) == 1 else x2.contiguous(), w_q, w_scale, bias, x_scale)
    y = torch.empty((m, out_features), dtype=x2.dtype, device=x2.device)
    if m > 0:
        xq, s_x = quantize_rows(x2, x_scale)
        launch_gemm(xq, s_x, crow_indices, col_indices, values, w_scale.contiguous(), bias, y, config)
    return y


def launch_nd(x, crow_indices, col_indices, values, w_scale, out_features: int, bias=None,
              x_scale=None) -> torch.Tensor:
    """:func:`launch` on validated ``x`` (..., K): (..., out_features) in x's dtype (the custom op's work)."""
    k = x.shape[-1]
    y = launch(x.reshape(-1, k), crow_indices, col_indices, values, w_scale, out_features, bias, x_scale)
    return y.reshape(*x.shape[:-1], out_features)


@torch.library.custom_op("compress_kernels::bsr_w8a8_matmul", mutates_args=())
def _bsr_w8a8_op(
    x: torch.Tensor, crow_indices: torch.Tensor, col_indices: torch.Tensor, values: torch.Tensor,
    w_scale: torch.Tensor, out_features: int, bias: torch.Tensor | None, x_scale: torch.Tensor | None,
) -> torch.Tensor:
    return launch_nd(x, crow_indices, col_indices, values, w_scale, out_features, bias, x_scale)


@_bsr_w8a8_op.register_fake
def _bsr_w8a8_fake(x, crow_indices, col_indices, values, w_scale, out_features, bias, x_scale):
    return x.new_empty((*x.shape[:-1], out_features))


def _validate_quantized(xq, s_x, crow_indices, col_indices, values, w_scale, out_features, bias, out_dtype,
                        check_indices: bool) -> None:
    check_quantized(xq, s_x, out_dtype)
    x_like = xq.new_empty((0, xq.shape[1]), dtype=out_dtype)  # check_parts checks against an activation's K, dtype
    check_parts(x_like, crow_indices, col_indices, values, out_features, bias, value_dtype=torch.int8,
                check_indices=check_indices)
    check_tensor("w_scale", w_scale, (torch.float32,), ndim=1)
    check_shape("w_scale", w_scale, (out_features,))
    check_same_device(xq, w_scale=w_scale, values=values)


def launch_quantized(xq, s_x, crow_indices, col_indices, values, w_scale, out_features: int, bias=None,
                     out_dtype=torch.float16) -> torch.Tensor:
    """The GEMM on validated per-token int8 ``xq`` (M, K) and ``s_x`` (M,): (M, out_features) in ``out_dtype``."""
    m, k = xq.shape
    xq, s_x, w_scale = xq.contiguous(), s_x.contiguous(), w_scale.contiguous()
    config = cached_pick(m, out_features, k, col_indices.shape[0], xq.device)
    if config.kernel == "dense":  # large M: the dense W8A8 GEMM
        w_q = bsr_to_dense(crow_indices, col_indices, values, out_features, k)
        return launch_dense_w8a8_quantized(xq, s_x, w_q, w_scale, bias, out_dtype)
    y = torch.empty((m, out_features), dtype=out_dtype, device=xq.device)
    if m > 0:
        launch_gemm(xq, s_x, crow_indices, col_indices, values, w_scale, bias, y, config)
    return y


def bsr_w8a8_matmul_quantized(xq, s_x, crow_indices, col_indices, values, w_scale, out_features, bias=None,
                              out_dtype=torch.float16, *, check_indices=True):
    """:func:`bsr_w8a8_matmul_parts` from an input already quantized per token (e.g. by
    ``compress_kernels.norm_quant``): ``xq`` (M, K) int8, ``s_x`` (M,) float32 -> (M, N) in ``out_dtype``."""
    _validate_quantized(xq, s_x, crow_indices, col_indices, values, w_scale, out_features, bias, out_dtype,
                        check_indices)
    return launch_quantized(xq, s_x, crow_indices, col_indices, values, w_scale, out_features, bias, out_dtype)


def _validate_parts(x, crow_indices, col_indices, values, w_scale, out_features, bias, x_scale,
                    check_indices: bool) -> None:
    check_parts(x, crow_indices, col_indices, values, out_features, bias, value_dtype=torch.int8,
                check_indices=check_indices)
    check_tensor("w_scale", w_scale, (torch.float32,), ndim=1)
    check_shape("w_scale", w_scale, (out_features,))
    check_same_device(x, w_scale=w_scale)
    check_x_scale(x, x_scale)


def bsr_w8a8_matmul_parts(x, crow_indices, col_indices, values, w_scale, out_features, bias=None, x_scale=None, *,
                          check_indices=True):
    """``y = dequant(quant(x) @ W_q.T) (+ bias)`` for ``W_q`` (out_features, K) int8 in BSR parts.

    ``x`` (..., K) fp16/bf16; ``crow_indices`` (N/32 + 1,) and ``col_indices`` (nnz,) int32/int64;
    ``values`` (nnz, 32, 32) int8; ``w_scale`` (N,) float32; ``bias`` (N,) in x's dtype or float32;
    ``x_scale`` None (dynamic per-token scales) or a static float32 scale (one element or (M,)).
    ``check_indices=False`` skips the index-value check (for indices already checked once).
    """
    _validate_parts(x, crow_indices, col_indices, values, w_scale, out_features, bias, x_scale, check_indices)
    return torch.ops.compress_kernels.bsr_w8a8_matmul(x, crow_indices, col_indices, values, w_scale, out_features,
                                                      bias, x_scale)


def bind_bsr_w8a8_matmul_parts(x, crow_indices, col_indices, values, w_scale, out_features, bias=None,
                               x_scale=None) -> BoundMatmul:
    """:func:`bsr_w8a8_matmul_parts` with every argument validated now, against ``x`` (the index *values*
    not: check them once where they come in), and the parts bound for later inputs of x's dtype, device
    and K (:class:`compress_kernels.common.bound.BoundMatmul`). ``x_scale``: None or one static scale."""
    _validate_parts(x, crow_indices, col_indices, values, w_scale, out_features, bias, x_scale, check_indices=False)
    if x_scale is not None and x_scale.numel() != 1:
        raise ValueError(f"x_scale: expected None or one static scale for every token (a bound call serves any "
                         f"number of tokens), got shape {tuple(x_scale.shape)}")
    weights = (crow_indices, col_indices, values, w_scale, out_features, bias, x_scale)
    return BoundMatmul("bsr_w8a8_matmul", launch_nd, weights, x)


def bind_bsr_w8a8_matmul_quantized(xq, s_x, crow_indices, col_indices, values, w_scale, out_features, bias=None,
                                   out_dtype=torch.float16) -> BoundQuantizedMatmul:
    """:func:`bsr_w8a8_matmul_quantized` with every argument validated now, against ``xq`` and ``s_x`` (the
    index values not), and the parts bound for later inputs on xq's device with its K
    (:class:`compress_kernels.common.bound.BoundQuantizedMatmul`)."""
    _validate_quantized(xq, s_x, crow_indices, col_indices, values, w_scale, out_features, bias, out_dtype,
                        check_indices=False)
    weights = (crow_indices, col_indices, values, w_scale, out_features, bias, out_dtype)
    return BoundQuantizedMatmul("bsr_w8a8_matmul_quantized", launch_quantized, weights, xq)
