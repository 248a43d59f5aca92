"""What the decode benchmark decodes: a Llama-2-7B-shaped model with random weights, and its variants.

The model is a ``transformers`` ``LlamaForCausalLM`` with Llama-2-7B shapes (hidden 4096,
intermediate 11008, 32 heads, vocab 32000; tiny shapes for CPU tests), SDPA attention, untied
``lm_head``, built directly on the device in the variant's dtype with seeded weights: every
``nn.Linear`` and ``nn.Embedding`` drawn from ``N(0, 0.02)``, RMSNorm weights 1. The same seed gives
the same weights in every variant. Nothing is downloaded.

Variants (:data:`VARIANTS`, in the default run order), each applied to the decoder layers after
their sibling linears are fused (``q/k/v`` and ``gate/up``); ``lm_head`` and the embeddings stay
in the model's dtype:

* ``fp16``: cuBLAS fp16 linears; ``fp16-eager`` the same model run without compile or graph.
* ``w4a16`` / ``w8a8`` / ``w8a16`` (ours): ``compress.convert`` with ``W4A16Config(group_size=128)`` /
  ``W8A8Config()`` (dynamic per-token activations) / ``W8A16Config()`` (int8 weights, one scale per
  output channel, fp16 activations); ``w8a8-block``: ``W8A8BlockConfig()`` (1 x 128 activation and
  128 x 128 weight scales; Llama's gated MLP has no GELU chain to link).
* ``dds90`` / ``dds50`` (ours): ``compress.prepare`` with ``BlockSparseConfig(p)``, random 32x32
  block masks pruning exactly ``floor(p * blocks)`` blocks of every matrix (speed only, the masks
  are random), then ``compress.convert`` to ``BSRLinear``; ``dds50-w8a8`` the same 50% masks plus
  W8A8, exported to ``BSRW8A8Linear`` (int8 blocks, per-token int8 activations); ``dds50-w4a16`` the
  same 50% masks plus ``W4A16Config(group_size=128)`` (``w4a16``'s groups), exported to ``BSRW4A16Linear``
  (int4 blocks with one float32 scale per row of each stored block, fp16 activations).
* ``int4-aten``: PyTorch's tinygemm int4 kernel (:mod:`scripts.bench.anchors`, group 128) holding
  the same symmetric int4 weights as ``w4a16`` (``compress.core.quant.quantize_groupwise``); tinygemm
  takes bf16 activations only, so this variant's whole model runs in bf16.
* ``int8-aten``: PyTorch's int8 weight-only op (``torch._weight_int8pack_mm``,
  :mod:`scripts.bench.anchors`) holding the same int8 weights and per-channel scales as ``w8a16``
  (``compress.core.quant.quantize_per_channel``; the scales in fp16, as the op takes them). Last in the
  default order: its CUDA kernel (a thread per output) makes it the slowest variant by far.
* ``no-linears``: not a scheme: the decoder linears return zeros, so a step times everything else
  (attention over the cache, norms, rotary embedding, ``lm_head``): the floor under every scheme.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

import compress
from compress.core.quant import quantize_groupwise, quantize_per_channel
from compress.core.sparsity import mask_from_scores
from compress.nn.qat import compressed_layers
from scripts.bench import anchors

LLAMA2_7B = dict(hidden_size=4096, intermediate_size=11008, num_attention_heads=32, num_key_value_heads=32,
                 vocab_size=32000, rms_norm_eps=1e-5)
TINY_LLAMA = dict(hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=4,
                  vocab_size=512, rms_norm_eps=1e-5)
INT4_GROUP = 128
INIT_STD = 0.02


# ---- the model -----------------------------------------------------------------------------------
def llama_config(layers: int, tiny: bool, max_positions: int):
    """A ``LlamaConfig`` with Llama-2-7B shapes (or tiny ones) and SDPA attention."""
    from transformers import LlamaConfig

    shapes = TINY_LLAMA if tiny else LLAMA2_7B
    return LlamaConfig(num_hidden_layers=layers, max_position_embeddings=max_positions,
                       tie_word_embeddings=False, attn_implementation="sdpa", **shapes)


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype):
    """``torch.set_default_dtype(dtype)`` inside the block, the previous default restored after."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


@torch.no_grad()
def build_model(config, dtype: torch.dtype, device: torch.device, seed: int) -> nn.Module:
    """Random-weight causal LM of ``config``'s architecture (``AutoModelForCausalLM.from_config``: Llama here,
    Mixtral in the generate benchmark) made on ``device`` in ``dtype``; same seed, same weights. Linear,
    embedding, router and fused-experts weights are drawn from ``N(0, 0.02)``, RMSNorm weights are 1."""
    from transformers import AutoModelForCausalLM

    with default_dtype(dtype), torch.device(device):
        model = AutoModelForCausalLM.from_config(config)
    generator = torch.Generator(device=device).manual_seed(seed)
    for module in model.modules():
        kind = type(module).__name__
        if isinstance(module, (nn.Linear, nn.Embedding)):
            module.weight.normal_(0.0, INIT_STD, generator=generator)
        elif kind.endswith("RMSNorm"):
            module.weight.fill_(1.0)
        elif kind.endswith(("Experts", "Router")):
            for weight in module.parameters(recurse=False):
                weight.normal_(0.0, INIT_STD, generator=generator)
    return model.eval()


def weight_bytes(model: nn.Module) -> int:
    """Bytes of the decoder layers' parameters and buffers (what a decode step must read)."""
    layers = model.model.layers
    return sum(t.numel() * t.element_size() for t in list(layers.parameters()) + list(layers.buffers()))


# ---- modules swapped in by the anchor variants ------------------------------------------------------
class TinygemmInt4Linear(nn.Module):
    """A bias-free linear layer on tinygemm int4 (``aten._weight_int4pack_mm``, torchao's int4 path).

    ``packed`` and ``scales_and_zeros`` (K/G, N, 2) bf16 come from :func:`anchors.tinygemm_pack` and
    :func:`anchors.tinygemm_scales_and_zeros` of the symmetric group-wise int4 weights
    (``q * scale``, zero points 0). Activations are cast to bf16, the output back to x's dtype.
    """

    def __init__(self, in_features: int, out_features: int, group_size: int, packed: torch.Tensor,
                 scales_and_zeros: torch.Tensor):
        super().__init__()
        self.in_features, self.out_features, self.group_size = in_features, out_features, group_size
        self.register_buffer("packed", packed)
        self.register_buffer("scales_and_zeros", scales_and_zeros)

    @classmethod
    @torch.no_grad()
    def from_float(cls, linear: nn.Linear, group_size: int = INT4_GROUP) -> "TinygemmInt4Linear":
        if linear.bias is not None:
            raise ValueError("TinygemmInt4Linear: expected a linear layer without bias")
        q, scales = quantize_groupwise(linear.weight, group_size)  # (N, K) in [-8, 7], (N, K/G)
        return cls(linear.in_features, linear.out_features, group_size, anchors.tinygemm_pack(q),
                   anchors.tinygemm_scales_and_zeros(scales))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, self.in_features).to(torch.bfloat16).contiguous()
        y = anchors.tinygemm_int4_matmul(x2, self.packed, self.group_size, self.scales_and_zeros)
        return y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, group_size={self.group_size}"


class WeightInt8Linear(nn.Module):
    """A bias-free linear layer on ``torch._weight_int8pack_mm`` (PyTorch's int8 weight-only op).

    ``w_q`` (N, K) int8 and ``scales`` (N,) in the model dtype come from
    :func:`compress.core.quant.quantize_per_channel`: the integers and scales of our ``W8A16Linear``.
    """

    def __init__(self, in_features: int, out_features: int, w_q: torch.Tensor, scales: torch.Tensor):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.register_buffer("w_q", w_q)
        self.register_buffer("scales", scales)

    @classmethod
    @torch.no_grad()
    def from_float(cls, linear: nn.Linear) -> "WeightInt8Linear":
        if linear.bias is not None:
            raise ValueError("WeightInt8Linear: expected a linear layer without bias")
        w_q, scales = quantize_per_channel(linear.weight)
        return cls(linear.in_features, linear.out_features, w_q.contiguous(), scales.to(linear.weight.dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = anchors.weight_int8pack_mm(x.reshape(-1, self.in_features), self.w_q, self.scales.to(x.dtype))
        return y.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 weights per channel"


class SkippedLinear(nn.Module):
    """Stands in for a linear layer and returns zeros: times everything in a step except the linears."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features

    @classmethod
    def from_float(cls, linear: nn.Linear) -> "SkippedLinear":
        return cls(linear.in_features, linear.out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.new_zeros(*x.shape[:-1], self.out_features)


def swap_decoder_linears(model: nn.Module, make: Callable[[nn.Linear], nn.Module]) -> int:
    """Replace every ``nn.Linear`` inside the decoder layers by ``make(linear)`` (``lm_head`` untouched)."""
    count = 0
    for layer in model.model.layers:
        for name, child in list(layer.named_modules()):
            if isinstance(child, nn.Linear):
                parent_name, _, attr = name.rpartition(".")
                setattr(layer.get_submodule(parent_name) if parent_name else layer, attr, make(child))
                count += 1
    return count


# ---- the variants ----------------------------------------------------------------------------------
def apply_random_block_sparsity(model: nn.Module, sparsity: float, seed: int, quant=None) -> None:
    """Prune exactly ``floor(sparsity * blocks)`` random 32x32 blocks of every decoder matrix, export BSR
    (``quant``: a W8A8 or W4A16 config also quantizing them, exported as int8 / int4 blocks)."""
    configs = [compress.BlockSparseConfig(sparsity=sparsity)] + ([quant] if quant is not None else [])
    compress.prepare(model, configs)
    generator = torch.Generator().manual_seed(seed)
    for layer in compressed_layers(model).values():
        scores = torch.rand(tuple(layer.mask.shape), generator=generator)
        layer.set_mask(mask_from_scores(scores, sparsity).to(layer.mask.device))
    compress.convert(model)


def apply_w4a16(model: nn.Module, seed: int) -> None:
    compress.convert(model, compress.W4A16Config(group_size=INT4_GROUP))


def apply_w8a8(model: nn.Module, seed: int) -> None:
    compress.convert(model, compress.W8A8Config())


def apply_w8a16(model: nn.Module, seed: int) -> None:
    compress.convert(model, compress.W8A16Config())


def apply_w8a8_block(model: nn.Module, seed: int) -> None:
    compress.convert(model, compress.W8A8BlockConfig())


@dataclass(frozen=True)
class Variant:
    dtype: torch.dtype
    compiled: bool  # torch.compile + one CUDA graph per step (the common harness) or plain eager
    apply: Callable[[nn.Module, int], None] | None  # (model, seed) -> None, in place


VARIANTS = {
    "fp16": Variant(torch.float16, True, None),
    "w4a16": Variant(torch.float16, True, apply_w4a16),
    "int4-aten": Variant(torch.bfloat16, True, lambda m, s: swap_decoder_linears(m, TinygemmInt4Linear.from_float)),
    "w8a8": Variant(torch.float16, True, apply_w8a8),
    "w8a16": Variant(torch.float16, True, apply_w8a16),
    "w8a8-block": Variant(torch.float16, True, apply_w8a8_block),
    "dds90": Variant(torch.float16, True, lambda m, s: apply_random_block_sparsity(m, 0.9, s)),
    "dds50": Variant(torch.float16, True, lambda m, s: apply_random_block_sparsity(m, 0.5, s)),
    "dds50-w8a8": Variant(torch.float16, True,
                          lambda m, s: apply_random_block_sparsity(m, 0.5, s, compress.W8A8Config())),
    "dds50-w4a16": Variant(torch.float16, True,
                           lambda m, s: apply_random_block_sparsity(m, 0.5, s, compress.W4A16Config(INT4_GROUP))),
    "fp16-eager": Variant(torch.float16, False, None),
    "no-linears": Variant(torch.float16, True, lambda m, s: swap_decoder_linears(m, SkippedLinear.from_float)),
    "int8-aten": Variant(torch.float16, True, lambda m, s: swap_decoder_linears(m, WeightInt8Linear.from_float)),
}
ALL_VARIANTS = tuple(VARIANTS)  # the default run order
