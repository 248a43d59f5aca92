"""``W8A8Linear``: int8 weights per output channel, int8 activations per token (dynamic) or one
calibrated scale (static), optionally divided by SmoothQuant factors first; the kernel is
:func:`compress_kernels.w8a8.op.w8a8_matmul` (int8 x int8, int32 accumulation, ``acc * s_x[m] *
s_w[n] (+ b)``). A linked norm or GELU may hand the layer its input already quantized
(:mod:`compress.nn.input_quant`), which then runs only the GEMM.
"""
from __future__ import annotations

import torch
from torch import nn

from compress._kernels import bind_w8a8_matmul, bind_w8a8_matmul_quantized, reference, w8a8_matmul
from compress.configs import W8A8Config
from compress.core.quant import dequantize_per_channel, quantize_per_channel
from compress.nn.inference.base import _InferenceLinear


def _smoothed(x: torch.Tensor, input_smoothing: torch.Tensor | None) -> torch.Tensor:
    """``x / input_smoothing`` per input channel (SmoothQuant factors), in x's dtype; x without factors."""
    return x if input_smoothing is None else (x.float() / input_smoothing).to(x.dtype)


def _activation_repr(module) -> str:
    """How a W8A8 module quantizes its input: dynamic or static scale, smoothed or not."""
    mode = f"static act_scale={module.act_scale.item():.4g}" if module.config.static else "dynamic per-token"
    return mode + (", smoothed" if module.input_smoothing is not None else "")


class _TakesHandedInput:
    """W8A8 kinds: use the int8 copy of ``x`` that a linked norm / GELU already wrote
    (:mod:`compress.nn.input_quant` sets ``input_source``; dynamic scales without smoothing only)."""

    def _handed_input(self, x: torch.Tensor):
        """``(xq (M, K) int8, s_x (M,) float32)`` for exactly this ``x``, or None: quantize it here."""
        if torch.compiler.is_compiling():
            return None
        source = self.__dict__.get("input_source")
        if source is None or self.config.static or self._buffers["input_smoothing"] is not None:
            return None
        return source.quantized(x)


class W8A8Linear(_TakesHandedInput, _InferenceLinear):
    """int8 weights per output channel, int8 activations per token (dynamic) or static."""

    _float32_buffers = ("w_scale", "act_scale", "input_smoothing")
    config_class = W8A8Config

    def __init__(self, in_features: int, out_features: int, bias: bool = True, config: W8A8Config | None = None,
                 smoothing: bool = False):
        super().__init__(in_features, out_features, bias)
        self.config = self._checked_config(config)
        self.register_buffer("w_q", torch.zeros(out_features, in_features, dtype=torch.int8))
        self.register_buffer("w_scale", torch.ones(out_features))
        self.register_buffer("act_scale", torch.ones(()) if self.config.static else None)
        self.register_buffer("input_smoothing", torch.ones(in_features) if smoothing else None)

    @classmethod
    def from_float(cls, linear: nn.Linear, config: W8A8Config | None = None, *, weight: torch.Tensor | None = None,
                   weight_scale: torch.Tensor | None = None, act_scale: torch.Tensor | None = None,
                   input_smoothing: torch.Tensor | None = None) -> "W8A8Linear":
        """Quantize ``linear`` (or the given effective ``weight``, e.g. masked) per output channel."""
        config = config or W8A8Config()
        if config.static and act_scale is None:
            raise ValueError("W8A8Linear.from_float: a static config needs a calibrated act_scale; calibrate first")
        module = cls(linear.in_features, linear.out_features, linear.bias is not None, config,
                     smoothing=input_smoothing is not None)
        source = linear.weight if weight is None else weight
        w_q, w_scale = quantize_per_channel(source.detach(), weight_scale)
        module.w_q.copy_(w_q)
        module.w_scale.copy_(w_scale)
        if config.static:
            module.act_scale.copy_(act_scale.detach().float().reshape(()))
        if input_smoothing is not None:
            module.input_smoothing.copy_(input_smoothing.detach().float())
        cls._copy_float_state(module, linear)
        return module.to(source.device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        handed = self._handed_input(x)
        if handed is not None:
            return self._matmul_quantized(x, *handed)
        b = self._buffers  # read directly in the forwards: nn.Module.__getattr__ costs about 1 us a buffer
        x = _smoothed(x, b["input_smoothing"])
        if self._use_kernel(x):
            return self._kernel(w8a8_matmul, bind_w8a8_matmul, x, b["w_q"], b["w_scale"], self._bias_for(x),
                                b["act_scale"])
        return reference.w8a8_matmul_ref(x, self.w_q, self.w_scale, self.bias, self.act_scale)

    def _matmul_quantized(self, x, xq, s_x) -> torch.Tensor:
        if self._use_kernel(x):
            b = self._buffers
            y = self._quantized_kernel(bind_w8a8_matmul_quantized, x, xq, s_x, b["w_q"], b["w_scale"],
                                       self._bias_for(x), x.dtype)
        else:
            y = reference.w8a8_matmul_quantized_ref(xq, s_x, self.w_q, self.w_scale, self.bias, x.dtype)
        return y.reshape(*x.shape[:-1], self.out_features)

    def dequantized_weight(self) -> torch.Tensor:
        """(N, K) float32 ``w_q * w_scale`` (smoothing factors folded back out)."""
        w = dequantize_per_channel(self.w_q, self.w_scale)
        return w if self.input_smoothing is None else w / self.input_smoothing

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"{_activation_repr(self)}")
