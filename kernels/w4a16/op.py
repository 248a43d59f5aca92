"""W4A16 matmul: fp16/bf16 activations x packed signed int4 weights with group scales, fp32 accumulation.

Layout (the contract of ``compress_kernels.reference``): ``qweight`` (K/8, N) int32, row-major, so
one row of it holds 8 consecutive input channels for every output channel and a tile of it is read
coalesced along N. Nibble ``j`` (bits 4j..4j+3) of ``qweight[r, n]`` is ``q[8r + j, n]`` in two's
complement. ``scales`` (K/G, N) fp32 or x's dtype, G in {32, 64, 128} or G = K (per channel)::

    W[n, k] = q[k, n] * scales[k // G, n]       y = x @ W.T (+ bias)     fp32 accumulation

Which kernel runs is decided by :func:`compress_kernels.w4a16.dispatch.pick` from the shapes and the
scale dtype alone (remembered per shape: ``cached_pick``). ``w4a16_matmul`` validates and calls the
custom op ``torch.ops.compress_kernels.w4a16_matmul`` (with a fake implementation, so callers compile
under ``torch.compile`` and capture in CUDA graphs). ``bind_w4a16_matmul`` validates once and returns a
call bound to the weights, which in eager mode launches without the custom op
(:mod:`compress_kernels.common.bound`).
"""
from __future__ import annotations

import torch

from compress_kernels.common.bound import BoundMatmul
from compress_kernels.common.checks import check_activation, check_bias, check_same_device, check_shape, check_tensor
from compress_kernels.w4a16.dequant import launch_dequant
from compress_kernels.w4a16.dispatch import TileConfig, cached_pick
from compress_kernels.w4a16.fma import launch_fma
from compress_kernels.w4a16.tiled import launch_tiled
from compress_kernels.w4a16.wgmma import launch_wgmma
from compress_kernels.w4a16.wholek import launch_wholek

GROUP_SIZES = (32, 64, 128)
LAUNCHERS = {  # path -> launcher(x2, qweight, scales, group_size, bias, y, cfg), each writing y (M, N)
    "wholek": launch_wholek,
    "fma": launch_fma,
    "tiled": launch_tiled,
    "wgmma": launch_wgmma,
}


def _validate(x, qweight, scales, group_size, bias) -> None:
    check_activation(x)
    check_tensor("qweight", qweight, (torch.int32,), ndim=2)
    k = x.shape[-1]
    if k == 0 or k % 8:
        raise ValueError(f"x: expected K (last dim) a positive multiple of 8 (8 int4 per int32), got K = {k}")
    n = qweight.shape[1]
    check_shape("qweight", qweight, (k // 8, n))
    if isinstance(group_size, bool) or not isinstance(group_size, int):
        raise TypeError(f"group_size: expected an int, got {type(group_size).__name__}")
    if group_size not in GROUP_SIZES and group_size != k:
        raise ValueError(f"group_size: expected one of {GROUP_SIZES} or K = {k}, got {group_size}")
    if k % group_size:
        raise ValueError(f"x: expected K a multiple of group_size = {group_size}, got K = {k}")
    check_tensor("scales", scales, (torch.float32, x.dtype), ndim=2)
    check_shape("scales", scales, (k // group_size, n))
    check_bias(bias, n, x)
    check_same_device(x, qweight=qweight, scales=scales)


def launch(x2, qweight, scales, group_size: int, bias=None, config: TileConfig | None = None) -> torch.Tensor:
    """Run validated 2-D ``x2`` (M, K) through the picked path (or ``config``); returns (M, N) in x2's dtype."""
    m, k = x2.shape
    n = qweight.shape[1]
    y = torch.empty((m, n), dtype=x2.dtype, device=x2.device)
    if m == 0:
        return y
    cfg = config or cached_pick(m, n, k, group_size, scales.element_size(), x2.device)
    if cfg.path == "dequant":
        launch_dequant(x2, qweight, scales, group_size, bias, y)
        return y
    if cfg.path not in LAUNCHERS:
        raise ValueError(f"config.path: expected one of {['dequant', *LAUNCHERS]}, got {cfg.path!r}")
    bias = bias.contiguous() if bias is not None else None
    LAUNCHERS[cfg.path](x2, qweight, scales, group_size, bias, y, cfg)
    return y


def launch_nd(x, qweight, scales, group_size: int, bias=None) -> torch.Tensor:
    """:func:`launch` on validated ``x`` (..., K): (..., N) in x's dtype (the custom op's work after validation)."""
    k = x.shape[-1]
    y2 = launch(x.reshape(-1, k), qweight, scales, group_size, bias)
    return y2.reshape(*x.shape[:-1], qweight.shape[1])


@torch.library.custom_op("compress_kernels::w4a16_matmul", mutates_args=())
def _w4a16_op(
    x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, group_size: int, bias: torch.Tensor | None
) -> torch.Tensor:
    _validate(x, qweight, scales, group_size, bias)
    return launch_nd(x, qweight, scales, group_size, bias)


@_w4a16_op.register_fake
def _w4a16_fake(x, qweight, scales, group_size, bias):
    _validate(x, qweight, scales, group_size, bias)
    return x.new_empty((*x.shape[:-1], qweight.shape[1]))


def w4a16_matmul(x, qweight, scales, group_size, bias=None) -> torch.Tensor:
    """``y = x @ dequant(qweight, scales).T (+ bias)``: x (..., K) fp16/bf16 -> (..., N) in x's dtype."""
    _validate(x, qweight, scales, group_size, bias)
    return torch.ops.compress_kernels.w4a16_matmul(x, qweight, scales, group_size, bias)


def bind_w4a16_matmul(x, qweight, scales, group_size, bias=None) -> BoundMatmul:
    """:func:`w4a16_matmul` with every argument validated now, against ``x``, and the weight side bound
    for later inputs of x's dtype, device and K (:class:`compress_kernels.common.bound.BoundMatmul`)."""
    _validate(x, qweight, scales, group_size, bias)
    return BoundMatmul("w4a16_matmul", launch_nd, (qweight, scales, group_size, bias), x)
