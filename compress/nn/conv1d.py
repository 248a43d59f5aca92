"""transformers' ``Conv1D`` (GPT-2 family) taken as an ``nn.Linear``: the same map, the weight transposed.

``transformers.pytorch_utils.Conv1D(nf, nx)`` (GPT-2, OpenAI GPT, ImageGPT, Decision Transformer,
CLVP) holds ``weight`` of shape (nx, nf) = (in_features, out_features) and ``bias`` (nf,) and computes

    y = x @ weight + bias

while ``nn.Linear`` holds ``weight`` (out_features, in_features) and computes ``y = x @ weight.T + bias``.
A linear layer whose weight is the Conv1D's transposed is therefore the same map (up to the order of
the float additions inside the matmul).

:func:`linear_from_conv1d` is how ``compress.prepare`` takes a targeted Conv1D: an ``nn.Linear``
holding a transposed copy of the Conv1D's weight as a new Parameter, (out_features, in_features)
contiguous, and the Conv1D's own ``bias`` Parameter; the Conv1D itself is left as it was. Everything
after it (QAT, masks, GPTQ, export, checkpoints) then sees one kind of layer. An optimizer built
before ``prepare`` still holds the Conv1D's old weight, which is no longer in the model: it would
update that dead copy while the layer's weight gets no step (the shared bias would still train).
Build optimizers after ``prepare``, as the Lightning callbacks do (they prepare in ``setup``, before
``configure_optimizers``). A copy rather than the same Parameter with its data transposed in place:
autograd keeps the shape a Parameter had in any graph still alive, so an in-place transpose breaks
the next backward of a model that ran a forward with gradients before ``prepare``.

:func:`conv1d_from_linear` goes back: a Conv1D holding a transposed copy of a weight, for a prepared
layer that leaves training dense (``CompressedLinear.to_float``), so that a saved float model has the
layout its architecture rebuilds from the config.

A model can only hold a Conv1D once ``transformers`` is imported, so the class is looked up in
``sys.modules`` and this module imports no ``transformers`` of its own.
"""
from __future__ import annotations

import sys

import torch
from torch import nn

_CONV1D_MODULE = "transformers.pytorch_utils"


def conv1d_class() -> type | None:
    """``transformers.pytorch_utils.Conv1D``, or None while transformers is not imported."""
    return getattr(sys.modules.get(_CONV1D_MODULE), "Conv1D", None)


def is_conv1d(module: nn.Module) -> bool:
    """True for transformers' ``Conv1D`` (and subclasses)."""
    cls = conv1d_class()
    return cls is not None and isinstance(module, cls)


def is_linear_or_conv1d(module: nn.Module) -> bool:
    """True for the layers a plan can target: ``nn.Linear`` and transformers' ``Conv1D``."""
    return isinstance(module, nn.Linear) or is_conv1d(module)


def linear_features(module: nn.Module) -> tuple[int, int]:
    """``(in_features, out_features)`` of an ``nn.Linear`` or a ``Conv1D``."""
    if isinstance(module, nn.Linear):
        return module.in_features, module.out_features
    if is_conv1d(module):
        return module.nx, module.nf
    raise TypeError(f"expected an nn.Linear or a transformers Conv1D, got {type(module).__name__}")


@torch.no_grad()
def linear_from_conv1d(conv: nn.Module) -> nn.Linear:
    """An ``nn.Linear`` computing what ``conv`` computes: a transposed copy of its weight (a new
    Parameter), its ``bias`` Parameter itself (see the module docstring)."""
    if not is_conv1d(conv):
        raise TypeError(f"linear_from_conv1d: expected a transformers Conv1D, got {type(conv).__name__}")
    in_features, out_features = conv.nx, conv.nf
    if tuple(conv.weight.shape) != (in_features, out_features):
        raise ValueError(f"linear_from_conv1d: expected a Conv1D weight of shape (nx, nf) = "
                         f"{(in_features, out_features)}, got {tuple(conv.weight.shape)}")
    linear = nn.Linear(in_features, out_features, device="meta")
    linear.weight = _transposed_parameter(conv.weight)
    linear.bias = conv.bias
    return linear


@torch.no_grad()
def conv1d_from_linear(weight: torch.Tensor, bias: nn.Parameter) -> nn.Module:
    """A ``Conv1D`` computing ``x @ weight.T + bias`` from a linear layer's ``weight`` (out, in): its
    weight a transposed copy (a new Parameter), its bias the given Parameter itself."""
    cls = conv1d_class()
    if cls is None:
        raise RuntimeError("conv1d_from_linear: transformers is not imported, so there is no Conv1D class")
    out_features, in_features = weight.shape
    with torch.device("meta"):
        conv = cls(out_features, in_features)
    conv.weight = _transposed_parameter(weight)
    conv.bias = bias
    return conv


def _transposed_parameter(weight: torch.Tensor) -> nn.Parameter:
    """A new Parameter holding ``weight.T`` contiguous, trainable as ``weight`` is."""
    return nn.Parameter(weight.detach().t().contiguous(), requires_grad=weight.requires_grad)
