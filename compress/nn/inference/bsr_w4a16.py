"""``BSRW4A16Linear``: a layer both pruned into 32x32 blocks and quantized to W4A16. It holds exactly the
int4 integers and group scales ``W4A16Linear`` would, minus the absent blocks, and computes the same
output; the kernel is :func:`compress_kernels.bsr_w4a16.op.bsr_w4a16_matmul`.

Buffers (N = out_features, K = in_features, both multiples of 32)::

    crow_indices  (N/32 + 1,) int32    the BSR index parts, as BSRLinear's
    col_indices   (nnz,) int32
    values        (nnz, 32, 4) int32   stored block b, row i: its 32 int4 weights packed along K, nibble j
                                       of word r = channel 8r + j (the dense ``qweight``'s packing)
    scales        (nnz, 32) float32    the scale of row i's group in block b

    W[32 R + i, 32 col[b] + k] = q[b, i, k] * scales[b, i]       (absent blocks zero)

Scales are kept per stored block and row rather than in W4A16's (K/G, N) layout: a group (32, 64 or 128
channels, or the whole row) covers whole blocks, so each block needs one scale per row, the kernel
needs no group size, and a pruned block costs no scale (with G = 32 at 90% sparsity the dense layout
would hold ten times the scales used). With G = 128 the four blocks of a group repeat their rows'
scales: 128 bytes per stored block of 512 bytes of int4, where the dense layout would read about half
that at 50% sparsity.

Numbers: the scales are the float32 ones QAT fake-quantizes with (absmax of the masked weight's group,
or LSQ's learned ones, or GPTQ's), the integers ``clamp(round(w / s), -8, 7)`` of the masked weight, so
``q * s`` is bit for bit the fake-quantized weight of the training module and the output equals the QAT
model's up to fp32 summation order. K is never padded: a layer whose K is not a multiple of the group
size has a last group of fewer channels (its scale from those, as W4A16Linear's zero padding gives).
Indices are checked, and their tile pattern found (``tile_rows``: many rows then run the tile kernel on the
de-quantized blocks), as ``BSRLinear``'s are (:mod:`compress.nn.inference.bsr`).
"""
from __future__ import annotations

import torch
from torch import nn

from compress._kernels import bind_bsr_w4a16_matmul, bsr_w4a16_matmul, reference, tile_rows_of
from compress.configs import BlockSparseConfig, W4A16Config
from compress.core.quant import pack_int4_blocks, unpack_int4, unpack_int4_blocks
from compress.core.sparsity import bsr_to_dense, check_bsr_shape, dense_to_bsr
from compress.nn.inference.base import _InferenceLinear
from compress.nn.inference.bsr import _BlockSparseIndices
from compress.nn.inference.w4a16 import W4A16Linear


class BSRW4A16Linear(_BlockSparseIndices, _InferenceLinear):
    """Block-sparse (32x32 BSR) int4 weight with group scales; fp16/bf16 activations."""

    _float32_buffers = ("scales",)
    config_class = W4A16Config

    def __init__(self, in_features: int, out_features: int, bias: bool = True, config: W4A16Config | None = None,
                 nnz: int = 0, block: int = 32):
        super().__init__(in_features, out_features, bias)
        check_bsr_shape((out_features, in_features), block)
        self.config = self._checked_config(config)
        self.block = block
        self.group_size = self.config.group_size_for(in_features)
        if self.group_size % block:
            raise ValueError(f"BSRW4A16Linear: expected a group size that covers whole {block}-channel blocks (a "
                             f"multiple of {block}), got group_size={self.group_size} for in_features={in_features}")
        self.register_buffer("crow_indices", torch.zeros(out_features // block + 1, dtype=torch.int32))
        self.register_buffer("col_indices", torch.zeros(nnz, dtype=torch.int32))
        self.register_buffer("values", torch.zeros(nnz, block, block // 8, dtype=torch.int32))
        self.register_buffer("scales", torch.ones(nnz, block))

    @classmethod
    def from_float(cls, linear: nn.Linear, config: W4A16Config | None = None, sparse: BlockSparseConfig | None = None,
                   *, weight: torch.Tensor | None = None, mask: torch.Tensor | None = None,
                   weight_scale: torch.Tensor | None = None) -> "BSRW4A16Linear":
        """Quantize as :meth:`W4A16Linear.from_float` does (``weight_scale`` (N, Kp/G), e.g. learned by LSQ
        or GPTQ's), then keep the blocks ``mask`` keeps (or the non-zero ones)."""
        dense = W4A16Linear.from_float(linear, config, weight=weight, weight_scale=weight_scale)
        return cls.from_w4a16(dense, (sparse or BlockSparseConfig()).block, mask)

    @classmethod
    def from_w4a16(cls, dense: W4A16Linear, block: int = 32, mask: torch.Tensor | None = None) -> "BSRW4A16Linear":
        """The same int4 weight and scales as ``dense``, its absent blocks dropped (those ``mask`` (N/32,
        K/32) prunes, or without a mask the all-zero ones)."""
        n, k = dense.out_features, dense.in_features
        check_bsr_shape((n, k), block)
        q = unpack_int4(dense.qweight).T[:, :k]  # (N, K) int8, the padding channels dropped
        if mask is None:
            mask = q.reshape(n // block, block, k // block, block).ne(0).any(dim=3).any(dim=1)
        crow, col, q_blocks = dense_to_bsr(q, block, mask)
        row_scales = dense.scales.T.repeat_interleave(dense.group_size, dim=1)[:, :k]  # (N, K): each weight's scale
        _, _, scale_blocks = dense_to_bsr(row_scales, block, mask)  # (nnz, b, b), constant along each block row
        module = cls(k, n, dense.bias is not None, dense.config, col.numel(), block).to(dense.qweight.device)
        module.crow_indices, module.col_indices = crow, col
        module.tile_rows = tile_rows_of(crow, col)
        module.values = pack_int4_blocks(q_blocks)
        module.scales = scale_blocks[:, :, 0].contiguous()
        if dense.bias is not None:
            module.bias = dense.bias.clone()
        module.compute_dtype_marker = dense.weight.new_empty(0)
        return module

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b = self._buffers
        parts = (b["crow_indices"], b["col_indices"], b["values"], b["scales"], self.out_features)
        if self._use_kernel(x):
            return self._kernel(bsr_w4a16_matmul, bind_bsr_w4a16_matmul, x, *parts, self._bias_for(x),
                                self.tile_rows, check_indices=False)
        return reference.bsr_w4a16_matmul_ref(x, *parts, self.bias)

    def dequantized_weight(self) -> torch.Tensor:
        """(N, K) float32 ``q * scale``, absent blocks zero."""
        blocks = unpack_int4_blocks(self.values).float() * self.scales[:, :, None]
        return bsr_to_dense(self.crow_indices, self.col_indices, blocks, (self.out_features, self.in_features))

    def extra_repr(self) -> str:
        return f"{self._blocks_repr()}, group_size={self.group_size}"
