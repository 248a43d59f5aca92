"""The block quantizers and the int8 GELU as ops: validation, ``torch.library`` custom ops, public calls.

``quantize_act_blocks(x)``: x (..., K) fp16 / bf16 -> ``(xq (M, K) int8, s_x (M, ceil(K/128)) float32)``,
one scale per token and 128 channels (``reference.quantize_act_blocks_ref``; kernel
:mod:`compress_kernels.w8a8_block.quantize`). ``quantize_weight_blocks(w)``: w (N, K) float ->
``(w_q (N, K) int8, s_w (ceil(N/128), ceil(K/128)) float32)`` (``reference.quantize_weight_blocks_ref``).
``gelu_int8_blocks(xq, s_x, act_dtype=torch.float16)``: de-quantize, exact GELU, re-quantize in the
same format (``reference.gelu_int8_blocks_ref``; kernel :mod:`compress_kernels.w8a8_block.gelu`).
Activation scales come out in the kernels' layout (an (M, Kb) view with strides (1, M)). Each is a
custom op (``compress_kernels::quantize_act_blocks``, ``::quantize_weight_blocks``, ``::gelu_int8_blocks``)
with a fake implementation.
"""
from __future__ import annotations

import torch

from compress_kernels.common.checks import check_activation, check_tensor, cpu_tensors_allowed
from compress_kernels.reference import scale_blocks
from compress_kernels.w8a8_block.gelu import launch_gelu_int8_blocks
from compress_kernels.w8a8_block.op import check_block_quantized, check_float_dtype
from compress_kernels.w8a8_block.quantize import (empty_act_scales, launch_quantize_act_blocks,
                                                  launch_quantize_weight_blocks)

WEIGHT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _validate_activation(x) -> None:
    check_activation(x)
    if x.shape[-1] == 0:
        raise ValueError("x: expected K >= 1 features, got K = 0")


def _validate_weight(w) -> None:
    check_tensor("w", w, WEIGHT_DTYPES, ndim=2)
    if w.device.type not in ("cuda", "meta") and not cpu_tensors_allowed():
        raise ValueError(f"w: expected a CUDA tensor (or TRITON_INTERPRET=1 for CPU tests), got device {w.device}")


@torch.library.custom_op("compress_kernels::quantize_act_blocks", mutates_args=())
def _quantize_act_op(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    _validate_activation(x)
    return launch_quantize_act_blocks(x.reshape(-1, x.shape[-1]))


@_quantize_act_op.register_fake
def _quantize_act_fake(x):
    _validate_activation(x)
    m, k = x.numel() // x.shape[-1], x.shape[-1]
    return torch.empty((m, k), dtype=torch.int8, device=x.device), empty_act_scales(m, k, x.device)


@torch.library.custom_op("compress_kernels::quantize_weight_blocks", mutates_args=())
def _quantize_weight_op(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    _validate_weight(w)
    return launch_quantize_weight_blocks(w)


@_quantize_weight_op.register_fake
def _quantize_weight_fake(w):
    _validate_weight(w)
    n, k = w.shape
    return (torch.empty((n, k), dtype=torch.int8, device=w.device),
            torch.empty((scale_blocks(n), scale_blocks(k)), dtype=torch.float32, device=w.device))


def _validate_gelu(xq, s_x, act_dtype) -> None:
    check_block_quantized(xq, s_x)
    check_float_dtype("act_dtype", act_dtype)


@torch.library.custom_op("compress_kernels::gelu_int8_blocks", mutates_args=())
def _gelu_op(xq: torch.Tensor, s_x: torch.Tensor, act_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    _validate_gelu(xq, s_x, act_dtype)
    return launch_gelu_int8_blocks(xq, s_x, act_dtype)


@_gelu_op.register_fake
def _gelu_fake(xq, s_x, act_dtype):
    _validate_gelu(xq, s_x, act_dtype)
    m, k = xq.shape
    return torch.empty((m, k), dtype=torch.int8, device=xq.device), empty_act_scales(m, k, xq.device)


def quantize_act_blocks(x):
    """``(xq (M, K) int8, s_x (M, ceil(K/128)) float32)`` of x (..., K) fp16 / bf16 (module docstring)."""
    _validate_activation(x)
    return torch.ops.compress_kernels.quantize_act_blocks(x)


def quantize_weight_blocks(w):
    """``(w_q (N, K) int8, s_w (ceil(N/128), ceil(K/128)) float32)`` of w (N, K) float (module docstring)."""
    _validate_weight(w)
    return torch.ops.compress_kernels.quantize_weight_blocks(w)


def gelu_int8_blocks(xq, s_x, act_dtype=torch.float16):
    """int8 GELU of ``xq`` (M, K) int8 with ``s_x`` (M, ceil(K/128)): ``(yq, s_y)`` in the same format,
    the values rounded to ``act_dtype`` (fp16 / bf16) on the way (module docstring)."""
    _validate_gelu(xq, s_x, act_dtype)
    return torch.ops.compress_kernels.gelu_int8_blocks(xq, s_x, act_dtype)
