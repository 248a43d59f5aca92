"""The one place where ``compress`` reaches the project's kernels (import name ``compress_kernels``).

``reference`` is the pure-PyTorch contract of every kernel (:mod:`compress_kernels.reference`); it
needs no Triton and is what the inference modules run on the CPU. The Triton launchers they call on
CUDA inputs are imported here from the module that defines each (``compress_kernels.<op>.op``), so
go-to-definition leads from a module's forward to its kernel: an op's public launcher (its
``torch.library`` custom op, what ``torch.compile`` traces) and ``bind_<op>`` (every argument validated
once, a call bound to the weights returned: :mod:`compress_kernels.common.bound`). Without Triton
these names are the package's stand-ins, which raise ImportError when called (only a CUDA input
reaches them), and ``NORM_QUANT_MAX_ROW`` is 0 (no row goes to the norm kernels).
:func:`check_bsr_indices` is the full check of BSR index values (run when a block-sparse layer is
loaded, not per forward).
"""
from __future__ import annotations

import compress_kernels
from compress_kernels import reference

if compress_kernels.TRITON_AVAILABLE:
    from compress_kernels.bsr.op import bind_bsr_matmul_parts, bsr_matmul_parts
    from compress_kernels.bsr_w4a16.op import bind_bsr_w4a16_matmul, bsr_w4a16_matmul
    from compress_kernels.bsr_w8a8.op import (bind_bsr_w8a8_matmul_parts, bind_bsr_w8a8_matmul_quantized,
                                              bsr_w8a8_matmul_parts)
    from compress_kernels.moe.op import bind_moe_w4a16, bind_moe_w8a8, bind_moe_w8a16, moe_w4a16, moe_w8a8, moe_w8a16
    from compress_kernels.norm_quant.dispatch import MAX_ROW as NORM_QUANT_MAX_ROW
    from compress_kernels.norm_quant.op import gelu_quantize, layer_norm_quantize, rms_norm_quantize
    from compress_kernels.w4a16.op import bind_w4a16_matmul, w4a16_matmul
    from compress_kernels.w8a8.op import bind_w8a8_matmul, bind_w8a8_matmul_quantized, w8a8_matmul
    from compress_kernels.w8a8_block.op import (bind_w8a8_block_matmul, bind_w8a8_block_matmul_int8,
                                                bind_w8a8_block_matmul_quantized, w8a8_block_matmul)
    from compress_kernels.w8a16.op import bind_w8a16_matmul, w8a16_matmul
else:  # the same names from the package, whose stand-ins raise ImportError naming Triton
    from compress_kernels import (NORM_QUANT_MAX_ROW, bind_bsr_matmul_parts, bind_bsr_w4a16_matmul,
                                  bind_bsr_w8a8_matmul_parts, bind_bsr_w8a8_matmul_quantized, bind_moe_w4a16,
                                  bind_moe_w8a8, bind_moe_w8a16, bind_w4a16_matmul,
                                  bind_w8a8_block_matmul, bind_w8a8_block_matmul_int8,
                                  bind_w8a8_block_matmul_quantized, bind_w8a8_matmul, bind_w8a8_matmul_quantized,
                                  bind_w8a16_matmul, bsr_matmul_parts, bsr_w4a16_matmul, bsr_w8a8_matmul_parts,
                                  gelu_quantize, layer_norm_quantize, moe_w4a16, moe_w8a8, moe_w8a16,
                                  rms_norm_quantize, w4a16_matmul, w8a8_block_matmul, w8a8_matmul, w8a16_matmul)

__all__ = [
    "NORM_QUANT_MAX_ROW",
    "bind_bsr_matmul_parts",
    "bind_bsr_w4a16_matmul",
    "bind_bsr_w8a8_matmul_parts",
    "bind_bsr_w8a8_matmul_quantized",
    "bind_moe_w4a16",
    "bind_moe_w8a8",
    "bind_moe_w8a16",
    "bind_w4a16_matmul",
    "bind_w8a8_block_matmul",
    "bind_w8a8_block_matmul_int8",
    "bind_w8a8_block_matmul_quantized",
    "bind_w8a8_matmul",
    "bind_w8a8_matmul_quantized",
    "bind_w8a16_matmul",
    "bsr_matmul_parts",
    "bsr_w4a16_matmul",
    "bsr_w8a8_matmul_parts",
    "check_bsr_indices",
    "gelu_quantize",
    "layer_norm_quantize",
    "moe_w4a16",
    "moe_w8a8",
    "moe_w8a16",
    "reference",
    "rms_norm_quantize",
    "tile_rows_of",
    "w4a16_matmul",
    "w8a8_block_matmul",
    "w8a8_matmul",
    "w8a16_matmul",
]


def check_bsr_indices(crow_indices, col_indices, block_cols: int) -> None:
    """:func:`compress_kernels.bsr.indices.check_bsr_indices`: ValueError unless the indices hold the
    ``torch.sparse_bsr`` invariants for ``block_cols`` block columns."""
    from compress_kernels.bsr.indices import check_bsr_indices as check

    check(crow_indices, col_indices, block_cols)


def tile_rows_of(crow_indices, col_indices) -> int:
    """:func:`compress_kernels.bsr.indices.tile_rows_of`: the tiles of block rows (8, 4, 2, else 1) that hold
    the same block columns (valid indices expected)."""
    from compress_kernels.bsr.indices import tile_rows_of as tiles

    return tiles(crow_indices, col_indices)
