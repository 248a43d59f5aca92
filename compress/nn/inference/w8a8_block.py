"""``W8A8BlockLinear``: int8 weights with one scale per 128 x 128 block, int8 activations with one
dynamic scale per token and 128 channels; the kernel is
:func:`compress_kernels.w8a8_block.op.w8a8_block_matmul` (one rescale per 128-deep K block).

It needs no padding (the kernels mask a last partial block). Linked into an MLP chain by
:func:`compress.nn.block_chain.link_block_chains`, an up-projection writes ``gelu`` of its output as int8
+ 1 x 128 scales (``chain_head``) and the down-projection reads them (``chain_tail``) without a float
round trip.
"""
from __future__ import annotations

import torch
from torch import nn

from compress._kernels import (bind_w8a8_block_matmul, bind_w8a8_block_matmul_int8, bind_w8a8_block_matmul_quantized,
                               reference, w8a8_block_matmul)
from compress.configs import W8A8BlockConfig
from compress.core.block_quant import dequantize_weight_blocks, quantize_weight_blocks
from compress.nn.inference.base import _InferenceLinear


class W8A8BlockLinear(_InferenceLinear):
    """Block-scaled int8 weights (one scale per 128 x 128 block), int8 activations (one dynamic scale per
    token and 128 channels)."""

    _float32_buffers = ("w_scale",)
    config_class = W8A8BlockConfig

    def __init__(self, in_features: int, out_features: int, bias: bool = True, config: W8A8BlockConfig | None = None):
        super().__init__(in_features, out_features, bias)
        self.config = self._checked_config(config)
        block = self.config.block
        self.register_buffer("w_q", torch.zeros(out_features, in_features, dtype=torch.int8))
        self.register_buffer("w_scale", torch.ones(-(-out_features // block), -(-in_features // block)))

    @classmethod
    def from_float(cls, linear: nn.Linear, config: W8A8BlockConfig | None = None, *,
                   weight: torch.Tensor | None = None, weight_scale: torch.Tensor | None = None) -> "W8A8BlockLinear":
        """Quantize ``linear`` (or ``weight``, e.g. masked) in 128 x 128 blocks; ``weight_scale`` e.g.
        learned by LSQ."""
        module = cls(linear.in_features, linear.out_features, linear.bias is not None, config)
        source = (linear.weight if weight is None else weight).detach().float()
        w_q, scale = quantize_weight_blocks(source, weight_scale)
        module.w_q.copy_(w_q)
        module.w_scale.copy_(scale)
        cls._copy_float_state(module, linear)
        return module.to(source.device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not torch.compiler.is_compiling():  # an MLP chain hands int8 over (compress.nn.block_chain)
            tail = self.__dict__.get("chain_tail")
            handed = tail.quantized(x) if tail is not None else None
            if handed is not None:
                return self.matmul_quantized(x, *handed)
            head = self.__dict__.get("chain_head")
            if head is not None:
                return head.start(self, x)
        if self._use_kernel(x):
            b = self._buffers
            return self._kernel(w8a8_block_matmul, bind_w8a8_block_matmul, x, b["w_q"], b["w_scale"], self._bias_for(x))
        return reference.w8a8_block_matmul_ref(x, self.w_q, self.w_scale, self.bias)

    def gelu_int8_output(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(yq (M, N) int8, s_y (M, ceil(N/128)))``: the exact GELU of this layer's output (rounded to x's
        dtype), quantized in 1 x 128 blocks (the next block-scaled layer's input), never written in float."""
        if self._use_kernel(x):
            b = self._buffers
            bind, key = bind_w8a8_block_matmul_int8, (x.dtype, x.get_device())
            args = (b["w_q"], b["w_scale"], self._bias_for(x))
            call = self._kept(bind, key, args) or self._keep(bind, key, args, bind(x, *args, gelu=True))
            return call(x)
        return reference.w8a8_block_matmul_ref(x, self.w_q, self.w_scale, self.bias, gelu=True,
                                                         out_dtype=torch.int8)

    def matmul_quantized(self, x: torch.Tensor, xq: torch.Tensor, s_x: torch.Tensor) -> torch.Tensor:
        """This layer on ``xq`` (M, K) int8 and ``s_x`` (M, ceil(K/128)) handed over for ``x``:
        (..., N) in x's dtype."""
        if self._use_kernel(x):
            b = self._buffers
            y = self._quantized_kernel(bind_w8a8_block_matmul_quantized, x, xq, s_x, b["w_q"], b["w_scale"],
                                       self._bias_for(x), x.dtype)
        else:
            y = reference.w8a8_block_matmul_quantized_ref(xq, s_x, self.w_q, self.w_scale, self.bias,
                                                                   out_dtype=x.dtype)
        return y.reshape(*x.shape[:-1], self.out_features)

    def dequantized_weight(self) -> torch.Tensor:
        """(N, K) float32 ``w_q * w_scale`` of each block."""
        return dequantize_weight_blocks(self.w_q, self.w_scale)

    def extra_repr(self) -> str:
        chain = "".join(f", {role}" for role in ("chain_head", "chain_tail") if self.__dict__.get(role) is not None)
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"int8 {self.config.block}x{self.config.block} weight blocks, 1x{self.config.block} activation "
                f"blocks{chain}")
