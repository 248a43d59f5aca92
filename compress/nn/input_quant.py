"""Quantized inputs handed over: a norm or GELU also writes the int8 copy its W8A8 layers need.

A W8A8 layer (``W8A8Linear``, ``BSRW8A8Linear``) with dynamic scales quantizes its input per token
in a launch of its own before its GEMM. In a BERT-style block three of the four W8A8 layers read the
output of a LayerNorm (query/key/value, the first MLP layer) or of a GELU (the second MLP layer); in
a Llama-style block two of four read an RMSNorm's (query/key/value, gate/up). The
kernel computing that output already holds each row, so it can write the int8 copy as well
(:mod:`kernels.norm_quant`), and the layer then runs only its GEMM: one launch fewer per layer, the
launch that made W8A8 slower than fp16 on small models (docs/journal.md).

:func:`link_quantized_inputs` finds the pairs by running one forward pass with hooks. A producer
(an ``nn.LayerNorm`` over the last dimension, the RMSNorm of ``transformers``' Llama, Mistral and
Qwen2, an ``nn.GELU()`` or ``transformers``' exact ``GELUActivation``) is linked to a consumer (a W8A8
layer with dynamic scales and no smoothing factors) when the consumer was called with the very
tensor object the producer returned. Each linked producer is replaced in place by
:class:`QuantizingLayerNorm`, :class:`QuantizingRMSNorm` or :class:`QuantizingGELU` (same
parameters, same output), and each consumer keeps a reference to it (not a submodule: the state
dict does not change, so the model saves as before).

At run time the producer returns its output ``y`` as before and keeps ``(y, its version, xq, s_x)``.
A linked consumer called with that same object, not modified in place since, takes ``xq`` and
``s_x`` instead of quantizing ``y`` again. "Not modified" means an unchanged version counter;
inference-mode tensors have none, so there the same object is taken as unchanged. Called with
anything else, the consumer quantizes as usual, so the output is always the unlinked model's: the
integers are ``quantize_per_token(y)`` in both cases (with the kernels, ``y`` may differ from
PyTorch's norm / GELU in the last bit). The producer drops what it keeps once every linked consumer
has taken it. Under ``torch.compile`` neither side hands anything over. On the CPU (no kernels) the
reference functions do the same work, so a linked model gives the unlinked model's outputs bit for
bit there.
"""
from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from torch import nn

from compress._kernels import NORM_QUANT_MAX_ROW, gelu_quantize, layer_norm_quantize, reference, rms_norm_quantize
from compress.nn.inference import BSRW8A8Linear, W8A8Linear

logger = logging.getLogger(__name__)

CONSUMERS = (W8A8Linear, BSRW8A8Linear)


def _version(t: torch.Tensor) -> int | None:
    """``t``'s in-place version counter; None for inference-mode tensors, which have none."""
    return None if t.is_inference() else t._version


def _uses_kernels(x: torch.Tensor) -> bool:
    """The Triton kernels take ``x``: CUDA, fp16 / bf16, rows that fit one program (else the
    reference functions do the same work with PyTorch ops)."""
    return (x.device.type == "cuda" and x.dtype in (torch.float16, torch.bfloat16)
            and x.shape[-1] <= NORM_QUANT_MAX_ROW)


class _HandsOverQuantized:
    """What every producer shares: keep the int8 copy of the last output until its consumers took it."""

    def _init_handover(self) -> None:
        self._handover = None  # (y, its version, xq, s_x, consumers still to take it)
        self.linked_consumers = 0

    def _compute_and_keep(self, kernel, reference_op, x: torch.Tensor, *args) -> torch.Tensor:
        """``y`` of ``kernel`` (Triton) or of its ``reference_op`` on ``x``; its int8 copy is kept."""
        compute = kernel if _uses_kernels(x) else reference_op
        y, xq, s_x = compute(x, *args)
        self._handover = (y, _version(y), xq, s_x, self.linked_consumers)
        return y

    def quantized(self, x: torch.Tensor):
        """``(xq, s_x)`` of ``x`` when ``x`` is this module's last output, unchanged since; else None."""
        kept = self._handover
        if kept is None or kept[0] is not x or _version(x) != kept[1]:
            return None
        y, version, xq, s_x, left = kept
        self._handover = (y, version, xq, s_x, left - 1) if left > 1 else None
        return xq, s_x

    def _hands_over(self, x: torch.Tensor) -> bool:
        if torch.compiler.is_compiling():
            return False
        self._handover = None
        return self.linked_consumers > 0 and x.dim() >= 1


class QuantizingLayerNorm(_HandsOverQuantized, nn.LayerNorm):
    """``nn.LayerNorm`` over the last dimension that also keeps its output quantized per token."""

    def __init__(self, layer_norm: nn.LayerNorm):
        if len(layer_norm.normalized_shape) != 1:
            raise ValueError(f"layer_norm: expected a norm over the last dimension only, got normalized_shape "
                             f"{tuple(layer_norm.normalized_shape)}")
        super().__init__(layer_norm.normalized_shape, layer_norm.eps, elementwise_affine=False, bias=False)
        self.elementwise_affine = layer_norm.elementwise_affine
        self.weight, self.bias = layer_norm.weight, layer_norm.bias  # the same Parameters (ties kept)
        self._init_handover()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self._hands_over(x):
            return super().forward(x)
        return self._compute_and_keep(layer_norm_quantize, reference.layer_norm_quantize_ref, x, self.weight, self.bias,
                                       self.eps)


class QuantizingRMSNorm(_HandsOverQuantized, nn.Module):
    """The RMSNorm of Llama-family ``transformers`` models (:data:`RMS_NORM_CLASSES`), also keeping its
    output quantized per token (when its weight is in the input's dtype, as after a model cast)."""

    def __init__(self, rms_norm: nn.Module):
        super().__init__()
        self.weight = rms_norm.weight  # the same Parameter
        self.variance_epsilon = rms_norm.variance_epsilon
        self._init_handover()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self._hands_over(x) or self.weight.dtype != x.dtype:
            return reference.rms_norm_ref(x, self.weight, self.variance_epsilon)
        return self._compute_and_keep(rms_norm_quantize, reference.rms_norm_quantize_ref, x, self.weight,
                                       self.variance_epsilon)

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, eps={self.variance_epsilon}"


class QuantizingGELU(_HandsOverQuantized, nn.Module):
    """The exact (erf) GELU that also keeps its output quantized per token."""

    def __init__(self):
        super().__init__()
        self._init_handover()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self._hands_over(x):
            return F.gelu(x)
        return self._compute_and_keep(gelu_quantize, reference.gelu_quantize_ref, x)


RMS_NORM_CLASSES = ("LlamaRMSNorm", "MistralRMSNorm", "Qwen2RMSNorm")  # weight * rounded(x / rms(x))


def _is_llama_rms_norm(module: nn.Module) -> bool:
    weight = getattr(module, "weight", None)
    return (type(module).__name__ in RMS_NORM_CLASSES and hasattr(module, "variance_epsilon")
            and isinstance(weight, torch.Tensor) and weight.dim() == 1)


def _is_exact_gelu(module: nn.Module) -> bool:
    if isinstance(module, nn.GELU):
        return module.approximate == "none"
    # transformers' GELUActivation (BERT's "gelu"): forward is self.act(x), exact when act is F.gelu
    return type(module).__name__ == "GELUActivation" and getattr(module, "act", None) is F.gelu


def producer_for(module: nn.Module) -> nn.Module | None:
    """The handing-over replacement of ``module`` (itself if it already is one); None if it has none."""
    if isinstance(module, _HandsOverQuantized):
        return module
    if isinstance(module, nn.LayerNorm) and len(module.normalized_shape) == 1:
        return QuantizingLayerNorm(module)
    if _is_llama_rms_norm(module):
        return QuantizingRMSNorm(module)
    if _is_exact_gelu(module):
        return QuantizingGELU()
    return None


def takes_handed_input(module: nn.Module) -> bool:
    """A W8A8 layer that quantizes its input dynamically and as it comes (no smoothing factors)."""
    return isinstance(module, CONSUMERS) and not module.config.static and module.input_smoothing is None


@torch.no_grad()
def find_links(model: nn.Module, example_inputs: dict) -> list[tuple[str, str]]:
    """``(producer name, consumer name)`` pairs seen in one forward of ``model(**example_inputs)``."""
    names = {id(m): name for name, m in model.named_modules()}
    outputs: dict[int, tuple[str, torch.Tensor]] = {}
    links: list[tuple[str, str]] = []

    def record_output(module, _args, output):
        if isinstance(output, torch.Tensor):
            outputs[id(output)] = (names[id(module)], output)

    def check_input(module, args):
        seen = outputs.get(id(args[0])) if args and isinstance(args[0], torch.Tensor) else None
        if seen is not None and seen[1] is args[0] and (seen[0], names[id(module)]) not in links:
            links.append((seen[0], names[id(module)]))

    hooks = []
    for module in model.modules():
        if producer_for(module) is not None:
            hooks.append(module.register_forward_hook(record_output))
        elif takes_handed_input(module):
            hooks.append(module.register_forward_pre_hook(check_input))
    try:
        model(**example_inputs)
    finally:
        for hook in hooks:
            hook.remove()
    return links


def _replace_everywhere(model: nn.Module, old: nn.Module, new: nn.Module) -> None:
    """Set ``new`` wherever ``old`` is registered as a child (a module may be registered twice)."""
    for parent in list(model.modules()):
        for child_name, child in list(parent.named_children()):
            if child is old:
                setattr(parent, child_name, new)


def link_quantized_inputs(model: nn.Module, example_inputs: dict) -> int:
    """Link producers to the W8A8 layers that read their outputs (module docstring); returns the
    number of linked layers. Runs one forward of ``model(**example_inputs)`` under ``no_grad``."""
    links = find_links(model, example_inputs)
    modules = dict(model.named_modules())
    producers: dict[str, nn.Module] = {}
    for producer_name, consumer_name in links:
        if producer_name not in producers:
            old = modules[producer_name]
            producers[producer_name] = new = producer_for(old)
            if new is not old:
                _replace_everywhere(model, old, new)
            new.linked_consumers = 0
        consumer = modules[consumer_name]
        consumer.__dict__["input_source"] = producers[producer_name]  # a plain attribute, not a submodule
        producers[producer_name].linked_consumers += 1
    logger.info("linked %d W8A8 layer(s) to the norm / GELU before them", len(links))
    return len(links)


def linked_layers(model: nn.Module) -> int:
    """How many W8A8 layers of ``model`` take their input quantized from a linked producer."""
    return sum(module.__dict__.get("input_source") is not None for module in model.modules())
