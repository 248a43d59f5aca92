"""Block-scaled W8A8 matmul: validation, launch, ``torch.library`` custom ops and the bound calls.

Math (``compress_kernels.reference.w8a8_block_matmul_ref``), blocks of 128, Kb = ceil(K / 128),
Nb = ceil(N / 128)::

    x (M, K) fp16 / bf16      -> xq int8, s_x (M, Kb)         one scale per token and 128 channels
    w_q (N, K) int8, w_scale (Nb, Kb) float32                  one scale per 128 x 128 weight block
    y[m, n] = sum_kb float(sum_{k in kb} xq[m, k] w_q[n, k]) * (s_x[m, kb] * w_scale[n // 128, kb])   (+ bias)

then the epilogue: a float output in x's dtype (optionally ``gelu`` of it), or ``out_dtype=torch.int8``:
the same values quantized to int8 + (M, Nb) scales, the input format of the next block-scaled layer.

``w8a8_block_matmul(x, w_q, w_scale, bias=None, *, x_scale=None, out_dtype=None, gelu=False,
act_dtype=None)`` takes float ``x`` (..., K) (quantized by the quantize pass first) or, with
``x_scale``, an int8 ``x`` (M, K) already quantized; ``act_dtype`` names the float dtype of such an
input's layer (default fp16: the dtype its output is rounded to). Any M; K and N need
no padding (a last partial block is masked). Four custom ops carry the calls, each with a fake
implementation so callers compile under ``torch.compile`` and capture in CUDA graphs::

    compress_kernels::w8a8_block_matmul(x, w_q, w_scale, bias, gelu)                     float x -> x's dtype
    compress_kernels::w8a8_block_matmul_int8(x, w_q, w_scale, bias, gelu)                float x -> (yq, s_y)
    compress_kernels::w8a8_block_matmul_quantized(xq, s_x, w_q, w_scale, bias, gelu, out_dtype)
    compress_kernels::w8a8_block_matmul_quantized_int8(xq, s_x, w_q, w_scale, bias, gelu, act_dtype)

Int8 outputs are 2-D: ``yq`` (M, N) contiguous and ``s_y`` (M, Nb) in the kernels' scale layout
(strides (1, M)). ``bind_w8a8_block_matmul``, ``bind_w8a8_block_matmul_int8`` and
``bind_w8a8_block_matmul_quantized`` validate once and return calls bound to the weights
(:mod:`compress_kernels.common.bound`). Which kernel runs: :mod:`compress_kernels.w8a8_block.dispatch`.
"""
from __future__ import annotations

import functools

import torch

from compress_kernels.common.bound import BoundMatmul, BoundQuantizedMatmul
from compress_kernels.common.checks import (ACTIVATION_DTYPES, check_activation, check_bias, check_same_device,
                                            check_shape, check_tensor, cpu_tensors_allowed)
from compress_kernels.reference import SCALE_BLOCK, scale_blocks
from compress_kernels.w8a8.tma import tma_ready
from compress_kernels.w8a8_block.dispatch import TileConfig, cached_pick
from compress_kernels.w8a8_block.gemm import launch_tiles
from compress_kernels.w8a8_block.quantize import empty_act_scales, launch_quantize_act_blocks
from compress_kernels.w8a8_block.tma import launch_tma

PATHS = ("tiled", "tma")


# ---- validation -------------------------------------------------------------------------------------
def check_float_dtype(name: str, dtype) -> None:
    """``dtype`` is torch.float16 or torch.bfloat16."""
    if dtype not in ACTIVATION_DTYPES:
        raise TypeError(f"{name}: expected torch.float16 or torch.bfloat16, got {dtype}")


def check_flag(name: str, value) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"{name}: expected a bool, got {type(value).__name__}")


def check_block_weights(w_q, w_scale, k: int) -> None:
    """``w_q`` (N, K) int8 and ``w_scale`` (ceil(N / 128), ceil(K / 128)) float32."""
    check_tensor("w_q", w_q, (torch.int8,), ndim=2)
    n = w_q.shape[0]
    check_shape("w_q", w_q, (n, k))
    check_tensor("w_scale", w_scale, (torch.float32,), ndim=2)
    check_shape("w_scale", w_scale, (scale_blocks(n), scale_blocks(k)))


def check_block_quantized(xq, s_x) -> None:
    """``xq`` (M, K) int8 (CUDA, or CPU when interpreting), K >= 1, and ``s_x`` (M, ceil(K / 128)) float32
    on its device: the 1 x 128 activation format."""
    check_tensor("xq", xq, (torch.int8,), ndim=2)
    if xq.device.type not in ("cuda", "meta") and not cpu_tensors_allowed():
        raise ValueError(f"xq: expected a CUDA tensor (or TRITON_INTERPRET=1 for CPU tests), got device {xq.device}")
    if xq.shape[1] == 0:
        raise ValueError("xq: expected K >= 1 input features, got K = 0")
    check_tensor("s_x", s_x, (torch.float32,), ndim=2)
    check_shape("s_x", s_x, (xq.shape[0], scale_blocks(xq.shape[1])))
    check_same_device(xq, s_x=s_x)


def _validate(x, w_q, w_scale, bias, gelu) -> None:
    check_activation(x)
    k = x.shape[-1]
    if k == 0:
        raise ValueError("x: expected K >= 1 input features, got K = 0")
    check_block_weights(w_q, w_scale, k)
    check_bias(bias, w_q.shape[0], x)
    check_same_device(x, w_q=w_q, w_scale=w_scale)
    check_flag("gelu", gelu)


def _validate_quantized(xq, s_x, w_q, w_scale, bias, gelu, float_dtype, dtype_name: str) -> None:
    check_block_quantized(xq, s_x)
    check_block_weights(w_q, w_scale, xq.shape[1])
    check_float_dtype(dtype_name, float_dtype)
    if bias is not None:
        check_tensor("bias", bias, (float_dtype, torch.float32), ndim=1)
        check_shape("bias", bias, (w_q.shape[0],))
    check_same_device(xq, w_q=w_q, w_scale=w_scale, bias=bias)
    check_flag("gelu", gelu)


def check_config(cfg: TileConfig, int8_out: bool) -> None:
    """ValueError unless ``cfg`` can run this call (module docstring of the dispatch table)."""
    if cfg.path not in PATHS:
        raise ValueError(f"config.path: expected one of {PATHS}, got {cfg.path!r}")
    if cfg.block_k != SCALE_BLOCK:
        raise ValueError(f"config.block_k: expected {SCALE_BLOCK} (one scale block per K step), got {cfg.block_k}")
    if int8_out and cfg.block_n != SCALE_BLOCK:
        raise ValueError(f"config.block_n: an int8 output needs {SCALE_BLOCK}-wide tiles (a tile owns its "
                         f"scales), got {cfg.block_n}")
    if (SCALE_BLOCK % cfg.block_n if cfg.block_n < SCALE_BLOCK else cfg.block_n % SCALE_BLOCK):
        raise ValueError(f"config.block_n: expected a divisor or a multiple of {SCALE_BLOCK}, got {cfg.block_n}")
    if cfg.path == "tma" and (cfg.split_k != 1 or cfg.block_n != SCALE_BLOCK):
        raise ValueError(f"config: the tma path needs split_k 1 and block_n {SCALE_BLOCK}, got {cfg}")


# ---- launch -----------------------------------------------------------------------------------------
def launch(x2, s_x, w_q, w_scale, bias=None, gelu=False, out_dtype=torch.float16, act_dtype=None,
           config: TileConfig | None = None):
    """The product of validated ``x2`` (M, K) (float with ``s_x`` None, else int8 with ``s_x`` (M, Kb)):
    (M, N) in ``out_dtype`` (fp16 / bf16), or with ``out_dtype=torch.int8`` ``(yq, s_y)`` rounded through
    ``act_dtype``. ``config``: the picked one when None."""
    quantized = s_x is not None
    m, k = x2.shape
    n = w_q.shape[0]
    int8_out = out_dtype == torch.int8
    out = torch.empty((m, n), dtype=out_dtype, device=x2.device)
    s_out = empty_act_scales(m, n, x2.device) if int8_out else None
    if m == 0:
        return (out, s_out) if int8_out else out
    ready = tma_ready(w_q, x2 if quantized else None)
    cfg = config or cached_pick(m, n, k, x2.device, int8_out=int8_out, tma_ok=ready)
    check_config(cfg, int8_out)
    w_scale = w_scale.contiguous()
    bias = bias.contiguous() if bias is not None else None
    if not quantized:
        x2, s_x = launch_quantize_act_blocks(x2)
    act_bf16 = (act_dtype if int8_out else out_dtype) == torch.bfloat16
    if cfg.path == "tma":
        if not tma_ready(w_q, x2):
            raise ValueError("config.path: tma needs operands TMA can describe (16-byte aligned rows), got others")
        launch_tma(x2, s_x, w_q, w_scale, bias, out, s_out, cfg, gelu, act_bf16)
    else:
        launch_tiles(x2, s_x, w_q, w_scale, bias, out, s_out, cfg, gelu, act_bf16)
    return (out, s_out) if int8_out else out


def launch_nd(x, w_q, w_scale, bias=None, gelu=False) -> torch.Tensor:
    """Validated float ``x`` (..., K) -> (..., N) in x's dtype (the custom op's work after validation)."""
    k = x.shape[-1]
    y2 = launch(x.reshape(-1, k), None, w_q, w_scale, bias, gelu, x.dtype)
    return y2.reshape(*x.shape[:-1], w_q.shape[0])


def launch_nd_int8(x, w_q, w_scale, bias=None, gelu=False):
    """Validated float ``x`` (..., K) -> ``(yq (M, N) int8, s_y (M, Nb))``, rounded through x's dtype."""
    return launch(x.reshape(-1, x.shape[-1]), None, w_q, w_scale, bias, gelu, torch.int8, x.dtype)


def launch_quantized(xq, s_x, w_q, w_scale, bias=None, gelu=False, out_dtype=torch.float16):
    """Validated ``xq`` (M, K) int8 and ``s_x`` (M, Kb) -> (M, N) in ``out_dtype``."""
    return launch(xq, s_x, w_q, w_scale, bias, gelu, out_dtype)


def _int8_outputs_like(m: int, n: int, device):
    return torch.empty((m, n), dtype=torch.int8, device=device), empty_act_scales(m, n, device)


# ---- custom ops -------------------------------------------------------------------------------------
@torch.library.custom_op("compress_kernels::w8a8_block_matmul", mutates_args=())
def _matmul_op(x: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor, bias: torch.Tensor | None,
               gelu: bool) -> torch.Tensor:
    _validate(x, w_q, w_scale, bias, gelu)
    return launch_nd(x, w_q, w_scale, bias, gelu)


@_matmul_op.register_fake
def _matmul_fake(x, w_q, w_scale, bias, gelu):
    _validate(x, w_q, w_scale, bias, gelu)
    return x.new_empty((*x.shape[:-1], w_q.shape[0]))


@torch.library.custom_op("compress_kernels::w8a8_block_matmul_int8", mutates_args=())
def _matmul_int8_op(x: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor, bias: torch.Tensor | None,
                    gelu: bool) -> tuple[torch.Tensor, torch.Tensor]:
    _validate(x, w_q, w_scale, bias, gelu)
    return launch_nd_int8(x, w_q, w_scale, bias, gelu)


@_matmul_int8_op.register_fake
def _matmul_int8_fake(x, w_q, w_scale, bias, gelu):
    _validate(x, w_q, w_scale, bias, gelu)
    return _int8_outputs_like(x.numel() // x.shape[-1], w_q.shape[0], x.device)


@torch.library.custom_op("compress_kernels::w8a8_block_matmul_quantized", mutates_args=())
def _quantized_op(xq: torch.Tensor, s_x: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor,
                  bias: torch.Tensor | None, gelu: bool, out_dtype: torch.dtype) -> torch.Tensor:
    _validate_quantized(xq, s_x, w_q, w_scale, bias, gelu, out_dtype, "out_dtype")
    return launch_quantized(xq, s_x, w_q, w_scale, bias, gelu, out_dtype)


@_quantized_op.register_fake
def _quantized_fake(xq, s_x, w_q, w_scale, bias, gelu, out_dtype):
    _validate_quantized(xq, s_x, w_q, w_scale, bias, gelu, out_dtype, "out_dtype")
    return xq.new_empty((xq.shape[0], w_q.shape[0]), dtype=out_dtype)


@torch.library.custom_op("compress_kernels::w8a8_block_matmul_quantized_int8", mutates_args=())
def _quantized_int8_op(xq: torch.Tensor, s_x: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor,
                       bias: torch.Tensor | None, gelu: bool,
                       act_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    _validate_quantized(xq, s_x, w_q, w_scale, bias, gelu, act_dtype, "act_dtype")
    return launch(xq, s_x, w_q, w_scale, bias, gelu, torch.int8, act_dtype)


@_quantized_int8_op.register_fake
def _quantized_int8_fake(xq, s_x, w_q, w_scale, bias, gelu, act_dtype):
    _validate_quantized(xq, s_x, w_q, w_scale, bias, gelu, act_dtype, "act_dtype")
    return _int8_outputs_like(xq.shape[0], w_q.shape[0], xq.device)


# ---- public calls -----------------------------------------------------------------------------------
def w8a8_block_matmul(x, w_q, w_scale, bias=None, *, x_scale=None, out_dtype=None, gelu=False, act_dtype=None):
    """Block-scaled W8A8 (module docstring).

    ``x``: float (..., K) fp16 / bf16 with ``x_scale`` None, or int8 (M, K) with ``x_scale`` (M, ceil(K/128))
    float32. ``out_dtype``: None (x's dtype; ``act_dtype`` for an int8 x), that float dtype, or
    ``torch.int8`` for ``(yq (M, N), s_y (M, ceil(N/128)))``. ``act_dtype``: the layer's float dtype for an
    int8 x (default fp16); a float x's is its own. ``gelu``: exact GELU in the epilogue.
    """
    if x_scale is None:
        if act_dtype is not None and act_dtype != getattr(x, "dtype", None):
            raise TypeError(f"act_dtype: expected None or x's dtype {getattr(x, 'dtype', None)} for a float x, "
                            f"got {act_dtype}")
        _validate(x, w_q, w_scale, bias, gelu)
        if out_dtype == torch.int8:
            return torch.ops.compress_kernels.w8a8_block_matmul_int8(x, w_q, w_scale, bias, gelu)
        if out_dtype not in (None, x.dtype):
            raise TypeError(f"out_dtype: expected None, x's dtype {x.dtype} or torch.int8, got {out_dtype}")
        return torch.ops.compress_kernels.w8a8_block_matmul(x, w_q, w_scale, bias, gelu)
    act_dtype = torch.float16 if act_dtype is None else act_dtype
    if out_dtype == torch.int8:
        _validate_quantized(x, x_scale, w_q, w_scale, bias, gelu, act_dtype, "act_dtype")
        return torch.ops.compress_kernels.w8a8_block_matmul_quantized_int8(x, x_scale, w_q, w_scale, bias, gelu,
                                                                           act_dtype)
    out_dtype = act_dtype if out_dtype is None else out_dtype
    if out_dtype != act_dtype:
        raise TypeError(f"out_dtype: expected None, act_dtype {act_dtype} or torch.int8, got {out_dtype}")
    _validate_quantized(x, x_scale, w_q, w_scale, bias, gelu, out_dtype, "out_dtype")
    return torch.ops.compress_kernels.w8a8_block_matmul_quantized(x, x_scale, w_q, w_scale, bias, gelu, out_dtype)


def bind_w8a8_block_matmul(x, w_q, w_scale, bias=None, gelu=False) -> BoundMatmul:
    """The float-in, float-out call validated now, against ``x``, and bound to the weight side for later
    inputs of x's dtype, device and K (:class:`compress_kernels.common.bound.BoundMatmul`)."""
    _validate(x, w_q, w_scale, bias, gelu)
    return BoundMatmul("w8a8_block_matmul", launch_nd, (w_q, w_scale, bias, gelu), x)


def bind_w8a8_block_matmul_int8(x, w_q, w_scale, bias=None, gelu=False) -> BoundMatmul:
    """:func:`bind_w8a8_block_matmul` for the int8 output: calls return ``(yq (M, N), s_y (M, Nb))``."""
    _validate(x, w_q, w_scale, bias, gelu)
    return BoundMatmul("w8a8_block_matmul_int8", launch_nd_int8, (w_q, w_scale, bias, gelu), x)


def bind_w8a8_block_matmul_quantized(xq, s_x, w_q, w_scale, bias=None, out_dtype=torch.float16,
                                     gelu=False) -> BoundQuantizedMatmul:
    """The int8-in, float-out call validated now, against ``xq`` and ``s_x``, and bound to the weight side for
    later inputs on xq's device with its K (:class:`compress_kernels.common.bound.BoundQuantizedMatmul`)."""
    _validate_quantized(xq, s_x, w_q, w_scale, bias, gelu, out_dtype, "out_dtype")
    launch_bound = functools.partial(launch_quantized, gelu=gelu, out_dtype=out_dtype)
    return BoundQuantizedMatmul("w8a8_block_matmul_quantized", launch_bound, (w_q, w_scale, bias), xq,
                                scale_columns=scale_blocks(xq.shape[1]))
