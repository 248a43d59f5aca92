"""``BSRW8A8Linear``: a layer both pruned into 32x32 blocks and quantized to W8A8. It holds exactly the
int8 weight and scales ``W8A8Linear`` would, minus the absent blocks, and computes the same output; the
kernel is :func:`compress_kernels.bsr_w8a8.op.bsr_w8a8_matmul_parts`. Its indices are checked as
``BSRLinear``'s are (:mod:`compress.nn.inference.bsr`).
"""
from __future__ import annotations

import torch
from torch import nn

from compress._kernels import (bind_bsr_w8a8_matmul_parts, bind_bsr_w8a8_matmul_quantized, bsr_w8a8_matmul_parts,
                               reference)
from compress.configs import BlockSparseConfig, W8A8Config
from compress.core.quant import dequantize_per_channel
from compress.core.sparsity import bsr_to_dense, check_bsr_shape, dense_to_bsr
from compress.nn.inference.base import _InferenceLinear
from compress.nn.inference.bsr import _BlockSparseIndices
from compress.nn.inference.w8a8 import W8A8Linear, _activation_repr, _smoothed, _TakesHandedInput


class BSRW8A8Linear(_BlockSparseIndices, _TakesHandedInput, _InferenceLinear):
    """Block-sparse (32x32 BSR) int8 weight per output channel, int8 activations per token (dynamic) or static."""

    _float32_buffers = ("w_scale", "act_scale", "input_smoothing")
    config_class = W8A8Config

    def __init__(self, in_features: int, out_features: int, bias: bool = True, config: W8A8Config | None = None,
                 nnz: int = 0, block: int = 32, smoothing: bool = False):
        super().__init__(in_features, out_features, bias)
        check_bsr_shape((out_features, in_features), block)
        self.config = self._checked_config(config)
        self.block = block
        self.register_buffer("crow_indices", torch.zeros(out_features // block + 1, dtype=torch.int32))
        self.register_buffer("col_indices", torch.zeros(nnz, dtype=torch.int32))
        self.register_buffer("values", torch.zeros(nnz, block, block, dtype=torch.int8))
        self.register_buffer("w_scale", torch.ones(out_features))
        self.register_buffer("act_scale", torch.ones(()) if self.config.static else None)
        self.register_buffer("input_smoothing", torch.ones(in_features) if smoothing else None)

    @classmethod
    def from_float(cls, linear: nn.Linear, config: W8A8Config | None = None, sparse: BlockSparseConfig | None = None,
                   *, weight: torch.Tensor | None = None, mask: torch.Tensor | None = None,
                   weight_scale: torch.Tensor | None = None, act_scale: torch.Tensor | None = None,
                   input_smoothing: torch.Tensor | None = None) -> "BSRW8A8Linear":
        """Quantize as :meth:`W8A8Linear.from_float` does, then keep the blocks ``mask`` keeps
        (or the non-zero ones)."""
        dense = W8A8Linear.from_float(linear, config, weight=weight, weight_scale=weight_scale, act_scale=act_scale,
                                      input_smoothing=input_smoothing)
        return cls.from_w8a8(dense, (sparse or BlockSparseConfig()).block, mask)

    @classmethod
    def from_w8a8(cls, dense: W8A8Linear, block: int = 32, mask: torch.Tensor | None = None) -> "BSRW8A8Linear":
        """The same int8 weight and scales as ``dense``, its absent blocks dropped."""
        crow, col, values = dense_to_bsr(dense.w_q, block, mask)
        module = cls(dense.in_features, dense.out_features, dense.bias is not None, dense.config, col.numel(), block,
                     smoothing=dense.input_smoothing is not None).to(dense.w_q.device)
        module.crow_indices, module.col_indices, module.values = crow, col, values
        module.w_scale = dense.w_scale.clone()
        for name in ("act_scale", "input_smoothing", "bias"):
            if getattr(dense, name) is not None:
                setattr(module, name, getattr(dense, name).clone())
        module.compute_dtype_marker = dense.weight.new_empty(0)
        return module

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        handed = self._handed_input(x)
        if handed is not None:
            return self._matmul_quantized(x, *handed)
        b = self._buffers
        x = _smoothed(x, b["input_smoothing"])
        parts = (b["crow_indices"], b["col_indices"], b["values"], b["w_scale"], self.out_features)
        if self._use_kernel(x):
            return self._kernel(bsr_w8a8_matmul_parts, bind_bsr_w8a8_matmul_parts, x, *parts, self._bias_for(x),
                                b["act_scale"], check_indices=False)
        return reference.bsr_w8a8_matmul_ref(x, *parts, self.bias, self.act_scale)

    def _matmul_quantized(self, x, xq, s_x) -> torch.Tensor:
        parts = (self.crow_indices, self.col_indices, self.values, self.w_scale, self.out_features)
        if self._use_kernel(x):
            y = self._quantized_kernel(bind_bsr_w8a8_matmul_quantized, x, xq, s_x, *parts, self._bias_for(x),
                                       x.dtype)
        else:
            y = reference.bsr_w8a8_matmul_quantized_ref(xq, s_x, *parts, self.bias, x.dtype)
        return y.reshape(*x.shape[:-1], self.out_features)

    def dequantized_weight(self) -> torch.Tensor:
        """(N, K) float32 ``w_q * w_scale``, absent blocks zero (smoothing factors folded back out)."""
        w_q = bsr_to_dense(self.crow_indices, self.col_indices, self.values, (self.out_features, self.in_features))
        w = dequantize_per_channel(w_q, self.w_scale)
        return w if self.input_smoothing is None else w / self.input_smoothing

    def extra_repr(self) -> str:
        return f"{self._blocks_repr()}, {_activation_repr(self)}"
