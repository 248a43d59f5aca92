"""``BSRLinear``: a block-sparse weight (32x32 BSR parts) in the model dtype, dense activations; the
kernel is :func:`compress_kernels.bsr.op.bsr_matmul_parts` (absent blocks skipped; weights pruned in tiles
of block rows, ``BlockSparseConfig(tile_rows=R)``, run on the tile kernel at large M).

BSR index *values* are checked where they come in (``check_indices()``: :func:`compress.load_compressed`
runs it on every block-sparse layer; ``from_float`` builds valid ones), so the forwards of the
block-sparse modules pass ``check_indices=False`` and launch without a host synchronisation.
"""
from __future__ import annotations

import torch
from torch import nn

from compress._kernels import bind_bsr_matmul_parts, bsr_matmul_parts, check_bsr_indices, reference, tile_rows_of
from compress.configs import BlockSparseConfig
from compress.core.sparsity import bsr_to_dense, check_bsr_shape, dense_to_bsr
from compress.nn.inference.base import _InferenceLinear


class _BlockSparseIndices:
    """What the block-sparse modules share: the BSR index check (their forwards pass ``check_indices=False``
    to the launchers, so indices are checked once, where they come in) and the tile pattern found with it
    (``tile_rows``: the tiles of block rows that store the same block columns, 8, 4, 2 or 1; 1 until the
    indices come in), the count of stored blocks and the description of the layer's blocks."""

    tile_rows = 1

    @property
    def nnz(self) -> int:
        return self.col_indices.numel()

    def _blocks_repr(self) -> str:
        total = (self.out_features // self.block) * (self.in_features // self.block)
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"block={self.block}, nnz_blocks={self.nnz}/{total}")

    def check_indices(self) -> None:
        """ValueError unless ``crow_indices`` / ``col_indices`` hold the ``torch.sparse_bsr`` invariants
        (crow from 0 to nnz, non-decreasing; block columns in range and increasing within a row)."""
        if tuple(self.crow_indices.shape) != (self.out_features // self.block + 1,):
            raise ValueError(f"crow_indices: expected shape ({self.out_features // self.block + 1},), "
                             f"got {tuple(self.crow_indices.shape)}")
        if self.values.shape[0] != self.col_indices.shape[0]:
            raise ValueError(f"values: expected {self.col_indices.shape[0]} blocks (one per col_indices entry), "
                             f"got {self.values.shape[0]}")
        check_bsr_indices(self.crow_indices, self.col_indices, self.in_features // self.block)
        self.tile_rows = tile_rows_of(self.crow_indices, self.col_indices)


class BSRLinear(_BlockSparseIndices, _InferenceLinear):
    """Block-sparse weight (32x32 BSR) in the model dtype; dense activations."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, nnz: int = 0, block: int = 32):
        super().__init__(in_features, out_features, bias)
        check_bsr_shape((out_features, in_features), block)
        self.block = block
        self.register_buffer("crow_indices", torch.zeros(out_features // block + 1, dtype=torch.int32))
        self.register_buffer("col_indices", torch.zeros(nnz, dtype=torch.int32))
        self.register_buffer("values", torch.zeros(nnz, block, block))

    @classmethod
    def from_float(cls, linear: nn.Linear, config: BlockSparseConfig | None = None, *,
                   weight: torch.Tensor | None = None, mask: torch.Tensor | None = None) -> "BSRLinear":
        """Store the blocks of ``linear`` (or ``weight``) that ``mask`` keeps (or that are non-zero)."""
        block = (config or BlockSparseConfig()).block
        source = (linear.weight if weight is None else weight).detach()
        crow, col, values = dense_to_bsr(source, block, mask)
        module = cls(linear.in_features, linear.out_features, linear.bias is not None, col.numel(), block)
        module.crow_indices, module.col_indices, module.values = crow, col, values.clone()
        module.tile_rows = tile_rows_of(crow, col)
        cls._copy_float_state(module, linear)
        return module.to(source.device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._use_kernel(x):
            b = self._buffers
            values = self._in_dtype("values", b["values"], x.dtype)
            return self._kernel(bsr_matmul_parts, bind_bsr_matmul_parts, x, b["crow_indices"], b["col_indices"], values,
                                self.out_features, self._bias_for(x), self.tile_rows, check_indices=False)
        return reference.bsr_matmul_ref(x, self.crow_indices, self.col_indices, self.values,
                                                  self.out_features, self.bias)

    def dequantized_weight(self) -> torch.Tensor:
        """(N, K) dense weight, absent blocks zero."""
        return bsr_to_dense(self.crow_indices, self.col_indices, self.values, (self.out_features, self.in_features))

    def extra_repr(self) -> str:
        return self._blocks_repr()
