"""``W4A16Linear``: int4 weights with one scale per group of G input channels (or per channel), fp16 /
bf16 activations; the kernel is :func:`compress_kernels.w4a16.op.w4a16_matmul` (int4 unpack,
dequantize, fp32 accumulation). K is padded with zero channels to a multiple of G and of 8.
"""
from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from torch import nn

from compress._kernels import bind_w4a16_matmul, reference, w4a16_matmul
from compress.configs import W4A16Config
from compress.core.quant import dequantize_groupwise, pack_int4, quantize_groupwise, unpack_int4
from compress.nn.inference.base import _InferenceLinear, _pad_inputs

logger = logging.getLogger(__name__)


class W4A16Linear(_InferenceLinear):
    """int4 weights with group-wise scales, fp16/bf16 activations."""

    _float32_buffers = ("scales",)
    config_class = W4A16Config

    def __init__(self, in_features: int, out_features: int, bias: bool = True, config: W4A16Config | None = None):
        super().__init__(in_features, out_features, bias)
        self.config = self._checked_config(config)
        self.padded_in_features, self.group_size = self.config.padding(in_features)
        self.register_buffer("qweight", torch.zeros(self.padded_in_features // 8, out_features, dtype=torch.int32))
        self.register_buffer("scales", torch.ones(self.padded_in_features // self.group_size, out_features))

    @classmethod
    def from_float(cls, linear: nn.Linear, config: W4A16Config | None = None, *, weight: torch.Tensor | None = None,
                   weight_scale: torch.Tensor | None = None) -> "W4A16Linear":
        """Quantize ``linear`` (or ``weight``) to int4; ``weight_scale`` (N, Kp/G) e.g. learned by LSQ."""
        config = config or W4A16Config()
        module = cls(linear.in_features, linear.out_features, linear.bias is not None, config)
        source = (linear.weight if weight is None else weight).detach().float()
        pad = module.padded_in_features - module.in_features
        if pad:
            logger.info("W4A16Linear: K=%d padded to %d (group size %d) with zero channels",
                        module.in_features, module.padded_in_features, module.group_size)
            source = F.pad(source, (0, pad))
        q, scale = quantize_groupwise(source, module.group_size, weight_scale)  # (N, Kp), (N, Kp/G)
        module.qweight.copy_(pack_int4(q.T.contiguous()))
        module.scales.copy_(scale.T)
        cls._copy_float_state(module, linear)
        return module.to(source.device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._use_kernel(x):
            b = self._buffers
            return self._kernel(w4a16_matmul, bind_w4a16_matmul, x, b["qweight"], b["scales"], self.group_size,
                                self._bias_for(x), padded_features=self.padded_in_features)
        x = _pad_inputs(x, self.in_features, self.padded_in_features)
        return reference.w4a16_matmul_ref(x, self.qweight, self.scales, self.group_size, self.bias)

    def dequantized_weight(self) -> torch.Tensor:
        """(N, K) float32 dequantized weight (padding removed)."""
        q = unpack_int4(self.qweight).T  # (N, Kp)
        return dequantize_groupwise(q, self.scales.T, self.group_size)[:, : self.in_features]

    def extra_repr(self) -> str:
        pad = f", padded_in_features={self.padded_in_features}" if self.padded_in_features != self.in_features else ""
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"group_size={self.group_size}{pad}")
