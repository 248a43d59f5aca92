"""W8A16 matmul: fp16/bf16 activations x int8 weights with per-channel or per-group scales, fp32 accumulation.

Math (the contract of ``compress_kernels.reference.w8a16_matmul_ref``), with ``x`` (M, K) fp16/bf16,
``w_q`` (N, K) int8 (the ``nn.Linear`` layout, contiguous) and ``w_scale`` float32 or x's dtype::

    w_scale (N,):        W[n, k] = w_q[n, k] * w_scale[n]           one scale per output channel
    w_scale (N, K/128):  W[n, k] = w_q[n, k] * w_scale[n, k // 128]  one per group of 128 input channels
    y = x @ W.T (+ bias)     fp32 accumulation, stored in x's dtype

K must be a multiple of 8 (of 128 with group scales); any M (M = 0 gives an empty output) and any N.
Which kernel runs is decided by :func:`compress_kernels.w8a16.dispatch.pick` from the shapes alone
(remembered per shape: ``cached_pick``): the one-row CUDA-core kernel (:mod:`~compress_kernels.w8a16.gemv`),
the tensor-core tiles (:mod:`~compress_kernels.w8a16.tiled`), or at large M the weight dequantized once for
cuBLAS (:mod:`~compress_kernels.w8a16.dequant`). ``w8a16_matmul`` validates and calls
the custom op ``torch.ops.compress_kernels.w8a16_matmul`` (with a fake implementation, so callers
compile under ``torch.compile`` and capture in CUDA graphs). ``bind_w8a16_matmul`` validates once and
returns a call bound to the weights, which in eager mode launches without the custom op
(:mod:`compress_kernels.common.bound`).
"""
from __future__ import annotations

import torch

from compress_kernels.common.bound import BoundMatmul
from compress_kernels.common.checks import check_activation, check_bias, check_same_device, check_shape, check_tensor
from compress_kernels.w8a16.dequant import launch_dequant
from compress_kernels.w8a16.dispatch import GROUP_SIZE, TileConfig, cached_pick
from compress_kernels.w8a16.gemv import launch_gemv
from compress_kernels.w8a16.tiled import launch_tiled

# path -> launcher(x2, w_q, w_scale, bias, y, cfg, G)
LAUNCHERS = {"gemv": launch_gemv, "tiled": launch_tiled, "dequant": launch_dequant}
K_MULTIPLE = 8  # K a multiple of this: whole 16-byte x vectors and 8-byte weight rows (read as int32 words)


def _validate(x, w_q, w_scale, bias) -> None:
    check_activation(x)
    check_tensor("w_q", w_q, (torch.int8,), ndim=2)
    k = x.shape[-1]
    if k == 0 or k % K_MULTIPLE:
        raise ValueError(f"x: expected K (last dim) a positive multiple of {K_MULTIPLE}, got K = {k}")
    n = w_q.shape[0]
    check_shape("w_q", w_q, (n, k))
    if not w_q.is_contiguous():
        raise ValueError(f"w_q: expected a contiguous (N, K) tensor (K contiguous), got strides {tuple(w_q.stride())}")
    check_tensor("w_scale", w_scale, (torch.float32, x.dtype))
    per_group = (n, k // GROUP_SIZE) if k % GROUP_SIZE == 0 else None
    if tuple(w_scale.shape) not in ((n,), per_group):
        allowed = f"({n},) (one scale per output channel)"
        allowed += (f" or {per_group} (one per group of {GROUP_SIZE} input channels)" if per_group else
                    f"; group scales need K a multiple of {GROUP_SIZE}, K = {k}")
        raise ValueError(f"w_scale: expected shape {allowed}, got {tuple(w_scale.shape)}")
    check_bias(bias, n, x)
    check_same_device(x, w_q=w_q, w_scale=w_scale)


def launch(x2, w_q, w_scale, bias=None, config: TileConfig | None = None) -> torch.Tensor:
    """Run validated 2-D ``x2`` (M, K) through the picked path (or ``config``); returns (M, N) in x2's dtype."""
    m, k = x2.shape
    n = w_q.shape[0]
    y = torch.empty((m, n), dtype=x2.dtype, device=x2.device)
    if m == 0:
        return y
    grouped = w_scale.dim() == 2
    cfg = config or cached_pick(m, n, k, grouped, x2.device)
    if cfg.path not in LAUNCHERS:
        raise ValueError(f"config.path: expected one of {list(LAUNCHERS)}, got {cfg.path!r}")
    if w_q.storage_offset() % 4:  # checked here, not in _validate: torch.compile cannot trace storage_offset
        raise ValueError(f"w_q: expected its data to start at a multiple of 4 bytes (rows are read as int32 "
                         f"words), got storage offset {w_q.storage_offset()}")
    if grouped and (cfg.path != "dequant" or cfg.block_k) and (cfg.block_k <= 0 or GROUP_SIZE % cfg.block_k):
        raise ValueError(f"config.block_k: with group scales a K tile stays inside one group of {GROUP_SIZE} "
                         f"(a power of two dividing it), got block_k={cfg.block_k}")
    bias = bias.contiguous() if bias is not None else None
    LAUNCHERS[cfg.path](x2, w_q, w_scale, bias, y, cfg, GROUP_SIZE)
    return y


def launch_nd(x, w_q, w_scale, bias=None) -> torch.Tensor:
    """:func:`launch` on validated ``x`` (..., K): (..., N) in x's dtype (the custom op's work after validation)."""
    k = x.shape[-1]
    y2 = launch(x.reshape(-1, k), w_q, w_scale, bias)
    return y2.reshape(*x.shape[:-1], w_q.shape[0])


@torch.library.custom_op("compress_kernels::w8a16_matmul", mutates_args=())
def _w8a16_op(x: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    _validate(x, w_q, w_scale, bias)
    return launch_nd(x, w_q, w_scale, bias)


@_w8a16_op.register_fake
def _w8a16_fake(x, w_q, w_scale, bias):
    _validate(x, w_q, w_scale, bias)
    return x.new_empty((*x.shape[:-1], w_q.shape[0]))


def w8a16_matmul(x, w_q, w_scale, bias=None) -> torch.Tensor:
    """``y = x @ (w_q * w_scale).T (+ bias)``: x (..., K) fp16/bf16 -> (..., N) in x's dtype.

    ``w_scale``: (N,) per output channel, or (N, K/128) per group of 128 input channels."""
    _validate(x, w_q, w_scale, bias)
    return torch.ops.compress_kernels.w8a16_matmul(x, w_q, w_scale, bias)


def bind_w8a16_matmul(x, w_q, w_scale, bias=None) -> BoundMatmul:
    """:func:`w8a16_matmul` with every argument validated now, against ``x``, and the weight side bound
    for later inputs of x's dtype, device and K (:class:`compress_kernels.common.bound.BoundMatmul`)."""
    _validate(x, w_q, w_scale, bias)
    return BoundMatmul("w8a16_matmul", launch_nd, (w_q, w_scale, bias), x)
