"""DDS + W4A16: fp16/bf16 activations x 32x32 block-sparse int4 weights with group scales: validation,
launcher, custom op.

The two compressions of a layer pruned into blocks *and* quantized to W4A16, served together. Layout:
the BSR index parts of :mod:`compress_kernels.bsr.op` (``crow_indices`` (N/32 + 1,), ``col_indices``
(nnz,)), and per stored block ``b`` of block row ``R``:

* ``values`` (nnz, 32, 4) int32: ``values[b, i, r]`` packs the int4 weights of output ``32 R + i`` at
  the input channels ``32 col[b] + 8 r + j`` in nibble ``j`` (bits 4j..4j+3, two's complement): each row
  of a block is the 32 channels the dense W4A16 ``qweight`` (K/8, N) holds in 4 words, so
  ``values[b] = qweight[4 col[b] : 4 col[b] + 4, 32 R : 32 R + 32].T``;
* ``scales`` (nnz, 32), float32 or x's dtype: ``scales[b, i]`` is the scale of row ``i``'s group in the
  block. W4A16 groups (G in {32, 64, 128}, or one per output channel) cover whole 32-channel blocks, so
  one scale per row and block states any of them (with G = 128, four blocks of a row carry the same
  scale); the kernels need no group size, and a block stored nowhere costs no scale.

Math (the contract of ``compress_kernels.reference.bsr_w4a16_matmul_ref``)::

    W[32 R + i, 32 col[b] + k] = q[b, i, k] * scales[b, i]      (absent blocks zero)
    y = x @ W.T (+ bias)                                          fp32 accumulation, x's dtype

Which kernel runs is decided by :func:`compress_kernels.bsr_w4a16.dispatch.pick`: one row per program
on CUDA cores (:mod:`~compress_kernels.bsr_w4a16.gemv`), four blocks a tensor-core dot as nibble planes
(:mod:`~compress_kernels.bsr_w4a16.planes`), tensor-core tiles with the scale applied after each block's
dot (:mod:`~compress_kernels.bsr_w4a16.gemm`) or, at many rows, the blocks
de-quantized once to x's dtype for the DDS op (:mod:`~compress_kernels.bsr_w4a16.dequant`).
``bsr_w4a16_matmul`` validates and calls the custom op ``torch.ops.compress_kernels.bsr_w4a16_matmul``
(with a fake implementation, so callers compile and capture in CUDA graphs: the launch depends on shapes
only). ``bind_bsr_w4a16_matmul`` validates once (indices not checked) and returns a call bound to the
parts, which launches without the custom op in eager mode (:mod:`compress_kernels.common.bound`).
"""
from __future__ import annotations

import torch

from compress_kernels.bsr.dispatch import BsrConfig
from compress_kernels.bsr.op import check_parts
from compress_kernels.bsr.op import launch as launch_dds
from compress_kernels.bsr_w4a16.dequant import dequantize_blocks
from compress_kernels.bsr_w4a16.dispatch import cached_pick
from compress_kernels.bsr_w4a16.gemm import launch_gemm
from compress_kernels.bsr_w4a16.gemv import launch_gemv
from compress_kernels.bsr_w4a16.planes import launch_planes
from compress_kernels.common.bound import BoundMatmul
from compress_kernels.common.checks import check_same_device, check_shape, check_tensor
from compress_kernels.reference import BSR_BLOCK, BSR_INT4_WORDS

# kernel -> launcher(x2, crow, col, values, scales, bias, y, cfg)
LAUNCHERS = {"gemv": launch_gemv, "planes": launch_planes, "gemm": launch_gemm}
KERNELS = (*LAUNCHERS, "dequant")


def launch(x2, crow_indices, col_indices, values, scales, out_features: int, bias=None, tile_rows: int = 1,
           config: BsrConfig | None = None) -> torch.Tensor:
    """Run validated ``x2`` (M, K) (unit column stride) through the picked kernel (or ``config``);
    returns (M, out_features) in x2's dtype. ``tile_rows``: the indices' tile pattern, which the DDS op
    on de-quantized blocks takes (:mod:`compress_kernels.bsr.tile_gemm`)."""
    m, k = x2.shape
    if m == 0:
        return torch.empty((m, out_features), dtype=x2.dtype, device=x2.device)
    config = config or cached_pick(m, out_features, k, col_indices.shape[0], x2.device)
    if config.kernel not in KERNELS:
        raise ValueError(f"config.kernel: expected one of {KERNELS}, got {config.kernel!r}")
    if config.kernel == "dequant":  # many rows: the DDS op on the blocks in x's dtype
        return launch_dds(x2, crow_indices, col_indices, dequantize_blocks(values, scales, x2.dtype), out_features,
                          bias, tile_rows)
    y = torch.empty((m, out_features), dtype=x2.dtype, device=x2.device)
    LAUNCHERS[config.kernel](x2, crow_indices, col_indices, values, scales, bias, y, config)
    return y


def launch_nd(x, crow_indices, col_indices, values, scales, out_features: int, bias=None,
              tile_rows: int = 1) -> torch.Tensor:
    """:func:`launch` on validated ``x`` (..., K): (..., out_features) in x's dtype (the custom op's work)."""
    k = x.shape[-1]
    x2 = x.reshape(-1, k)
    if x2.shape[0] > 0 and x2.stride(-1) != 1:
        x2 = x2.contiguous()
    y = launch(x2, crow_indices, col_indices, values, scales, out_features, bias, tile_rows)
    return y.reshape(*x.shape[:-1], out_features)


@torch.library.custom_op("compress_kernels::bsr_w4a16_matmul", mutates_args=())
def _bsr_w4a16_op(
    x: torch.Tensor, crow_indices: torch.Tensor, col_indices: torch.Tensor, values: torch.Tensor,
    scales: torch.Tensor, out_features: int, bias: torch.Tensor | None, tile_rows: int = 1,
) -> torch.Tensor:
    return launch_nd(x, crow_indices, col_indices, values, scales, out_features, bias, tile_rows)


@_bsr_w4a16_op.register_fake
def _bsr_w4a16_fake(x, crow_indices, col_indices, values, scales, out_features, bias, tile_rows=1):
    return x.new_empty((*x.shape[:-1], out_features))


def _validate(x, crow_indices, col_indices, values, scales, out_features, bias, check_indices: bool,
              tile_rows: int) -> None:
    if isinstance(values, torch.Tensor) and values.dtype == torch.int8 and values.dim() == 3:
        raise TypeError(f"values: expected int4 blocks packed 8 to an int32, shape "
                        f"(nnz, {BSR_BLOCK}, {BSR_INT4_WORDS}) int32, got int8 {tuple(values.shape)} (nibble j of "
                        "word r of a block row: channel 8r + j)")
    check_parts(x, crow_indices, col_indices, values, out_features, bias, value_dtype=torch.int32,
                check_indices=check_indices, block_shape=(BSR_BLOCK, BSR_INT4_WORDS),
                block_layout=f"{BSR_BLOCK}x{BSR_BLOCK} int4 blocks, 8 per int32 along K", tile_rows=tile_rows)
    check_tensor("scales", scales, (torch.float32, x.dtype), ndim=2)
    nnz = col_indices.shape[0]
    if tuple(scales.shape) != (nnz, BSR_BLOCK):
        if scales.shape[0] != nnz and scales.shape[1] == out_features:
            raise ValueError(f"scales: expected shape ({nnz}, {BSR_BLOCK}) (one scale per row of each stored block), "
                             f"got {tuple(scales.shape)}, the dense W4A16 (K/G, N) layout: give each stored block the "
                             "scales of its rows' group")
        check_shape("scales", scales, (nnz, BSR_BLOCK))
    if not scales.is_contiguous():
        raise ValueError(f"scales: expected a contiguous tensor, got strides {scales.stride()}")
    check_same_device(x, scales=scales)


def bsr_w4a16_matmul(x, crow_indices, col_indices, values, scales, out_features, bias=None, tile_rows=1, *,
                     check_indices=True):
    """``y = x @ W.T (+ bias)`` for ``W`` (out_features, K): 32x32 blocks of int4 weights with group scales,
    given by their BSR parts (module docstring).

    ``x`` (..., K) fp16/bf16, K a multiple of 32; ``crow_indices`` (N/32 + 1,) and ``col_indices`` (nnz,)
    int32/int64; ``values`` (nnz, 32, 4) int32; ``scales`` (nnz, 32) float32 or x's dtype; ``bias`` (N,) in
    x's dtype or float32. Returns (..., N) in x's dtype. ``tile_rows`` (1, 2, 4 or 8): the block rows store the
    same block columns in tiles of that many, which many rows run on the tile kernel after de-quantizing.
    ``check_indices=False`` skips the index-value check (for indices already checked once, the tile pattern
    included).
    """
    _validate(x, crow_indices, col_indices, values, scales, out_features, bias, check_indices, tile_rows)
    return torch.ops.compress_kernels.bsr_w4a16_matmul(x, crow_indices, col_indices, values, scales, out_features,
                                                       bias, tile_rows)


def bind_bsr_w4a16_matmul(x, crow_indices, col_indices, values, scales, out_features, bias=None,
                          tile_rows=1) -> BoundMatmul:
    """:func:`bsr_w4a16_matmul` with every argument validated now, against ``x`` (the index *values* not:
    check them once where they come in), and the parts bound for later inputs of x's dtype, device and K
    (:class:`compress_kernels.common.bound.BoundMatmul`)."""
    _validate(x, crow_indices, col_indices, values, scales, out_features, bias, False, tile_rows)
    weights = (crow_indices, col_indices, values, scales, out_features, bias, tile_rows)
    return BoundMatmul("bsr_w4a16_matmul", launch_nd, weights, x)
