"""Rebuilding a model from a saved directory, shared by both formats' loaders.

* :func:`transformers_model_class`: the ``transformers`` class a config or manifest names, only when it
  is a ``PreTrainedModel`` subclass (a name such as ``pipeline`` must never make a loader call it).
* :func:`skip_weight_init`: transformers' context that builds a model without initialising weights
  that the saved tensors overwrite anyway.
* :data:`ALIGNMENT`: the byte alignment every loaded tensor gets (CPU kernels pick their code path by
  alignment, so a reloaded model computes bit for bit what the saved one did):
  :func:`compress.checkpoint.files.read_safetensors` copies a tensor stored at an unaligned offset.
"""
from __future__ import annotations

import contextlib
import importlib


ALIGNMENT = 64  # bytes: the CPU allocator's alignment


def transformers_model_class(transformers, name: str):
    """``transformers.<name>`` if it is a ``PreTrainedModel`` subclass, else None."""
    if not isinstance(name, str) or not name.isidentifier():
        return None
    try:
        cls = getattr(transformers, name, None)
    except Exception:  # transformers' lazy module raising on an odd name
        return None
    pretrained = getattr(transformers, "PreTrainedModel", None)
    if isinstance(cls, type) and pretrained is not None and issubclass(cls, pretrained):
        return cls
    return None


def skip_weight_init():
    """transformers' ``no_init_weights`` context (5.x: ``initialization``, 4.x: ``modeling_utils``)."""
    for module_name in ("transformers.initialization", "transformers.modeling_utils"):
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        if hasattr(module, "no_init_weights"):
            return module.no_init_weights()
    return contextlib.nullcontext()

