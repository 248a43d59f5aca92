"""``W8A16Linear``: int8 weights with one scale per output channel (or per group of 128 input
channels), fp16 / bf16 activations; the kernel is :func:`compress_kernels.w8a16.op.w8a16_matmul`
(int8 x fp16/bf16, fp32 accumulation). K is padded with zero channels to a multiple of 8 (of 128 with
groups).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from compress._kernels import bind_w8a16_matmul, reference, w8a16_matmul
from compress.configs import W8A16Config
from compress.core.quant import quantize_groupwise, quantize_per_channel
from compress.nn.inference.base import _InferenceLinear, _pad_inputs


class W8A16Linear(_InferenceLinear):
    """int8 weights with one scale per output channel (or per group of 128 input channels), fp16/bf16
    activations."""

    _float32_buffers = ("w_scale",)
    config_class = W8A16Config

    def __init__(self, in_features: int, out_features: int, bias: bool = True, config: W8A16Config | None = None):
        super().__init__(in_features, out_features, bias)
        self.config = self._checked_config(config)
        self.padded_in_features, group_size = self.config.padding(in_features)
        self.register_buffer("w_q", torch.zeros(out_features, self.padded_in_features, dtype=torch.int8))
        groups = () if self.config.group_size is None else (self.padded_in_features // group_size,)
        self.register_buffer("w_scale", torch.ones(out_features, *groups))  # (N,) or (N, Kp/128)

    @classmethod
    def from_float(cls, linear: nn.Linear, config: W8A16Config | None = None, *, weight: torch.Tensor | None = None,
                   weight_scale: torch.Tensor | None = None) -> "W8A16Linear":
        """Quantize ``linear`` (or ``weight``) to int8; ``weight_scale`` (N,) or (N, Kp/128), e.g. learned by
        LSQ or chosen by GPTQ."""
        config = config or W8A16Config()
        module = cls(linear.in_features, linear.out_features, linear.bias is not None, config)
        source = F.pad((linear.weight if weight is None else weight).detach().float(),
                       (0, module.padded_in_features - module.in_features))
        if config.group_size is None:
            w_q, scale = quantize_per_channel(source, weight_scale)
        else:
            w_q, scale = quantize_groupwise(source, config.group_size, weight_scale, qmax=config.qmax)
        module.w_q.copy_(w_q)
        module.w_scale.copy_(scale)
        cls._copy_float_state(module, linear)
        return module.to(source.device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._use_kernel(x):
            b = self._buffers
            return self._kernel(w8a16_matmul, bind_w8a16_matmul, x, b["w_q"], b["w_scale"], self._bias_for(x),
                                padded_features=self.padded_in_features)
        x = _pad_inputs(x, self.in_features, self.padded_in_features)
        return reference.w8a16_matmul_ref(x, self.w_q, self.w_scale, self.bias)

    def dequantized_weight(self) -> torch.Tensor:
        """(N, K) float32 ``w_q * w_scale`` (padding removed)."""
        return reference.dequantize_int8(self.w_q, self.w_scale)[:, : self.in_features]

    def extra_repr(self) -> str:
        scales = "per channel" if self.config.group_size is None else f"group_size={self.config.group_size}"
        pad = f", padded_in_features={self.padded_in_features}" if self.padded_in_features != self.in_features else ""
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"int8 weights {scales}{pad}")
