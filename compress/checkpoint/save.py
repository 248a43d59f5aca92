"""``save_compressed``: a converted model (or, asked for explicitly, a float one) written as a model directory.

Every tensor of ``model.state_dict()`` goes to ``model.safetensors`` once (tied weights are stored
once and listed as aliases), a ``transformers`` model's config to ``config.json`` (without a
``quantization_config``: the weights are float or our layers), and the manifest
(:mod:`compress.checkpoint.manifest`) last, sealed with its digest. The directory is written aside and
swapped into place crash safe (:mod:`compress.checkpoint.safe_write`).
"""
from __future__ import annotations

import copy
import json
import logging
import os
import pathlib

import torch
from safetensors.torch import save_file
from torch import nn

from compress.checkpoint.compressed_tensors import save as compressed_tensors_save
from compress.checkpoint.manifest import (
    FORMAT_MARKER,
    FORMAT_VERSION,
    MANIFEST,
    MANIFEST_MODULES,
    MODEL_CONFIG,
    TENSORS,
    file_sha256,
    layer_entry,
    manifest_digest,
)
from compress.checkpoint.safe_write import check_save_target, fsync_path, replace_directory
from compress.nn.fusion import is_fused
from compress.nn.qat import compressed_layers

logger = logging.getLogger(__name__)
_SAVED_MODULES = tuple(MANIFEST_MODULES.values())  # the compressed layers a save writes (manifest "layers")
SAVE_FORMATS = ("compress", "compressed-tensors")


def _unique_tensors(state: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Tensors with duplicates (tied weights) removed, and {alias: stored name}."""
    stored, aliases, seen = {}, {}, {}
    for name, tensor in state.items():
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape), tensor.dtype)
        if tensor.numel() and key in seen:
            aliases[name] = seen[key]
            continue
        seen[key] = name
        stored[name] = tensor.detach().cpu().contiguous()
    return stored, aliases


def _model_source(model: nn.Module) -> dict:
    cls = type(model)
    if (hasattr(model, "config") and hasattr(model.config, "to_json_string")
            and cls.__module__.startswith("transformers")):
        return {"kind": "transformers", "architecture": cls.__name__}
    return {"kind": "module", "class_path": f"{cls.__module__}.{cls.__qualname__}"}


def _write_json(path: pathlib.Path, data: dict) -> None:
    with open(path, "w") as handle:
        json.dump(data, handle, indent=2, sort_keys=True)
        handle.flush()
        os.fsync(handle.fileno())


def _plain_config(model: nn.Module):
    """A copy of the model's ``transformers`` config as ``save_pretrained`` writes it for a float model:
    ``architectures`` naming the model's class, and no ``quantization_config``. The weights saved here are
    float or our own layers (described by the manifest), never in the format a loaded model's quantization
    (GGUF, ...) names, which would make other tools refuse or misread the directory."""
    config = copy.deepcopy(model.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.architectures = [type(model).__name__]
    return config


def _write_directory(model: nn.Module, directory: pathlib.Path) -> None:
    stored, aliases = _unique_tensors(model.state_dict())
    save_file(stored, str(directory / TENSORS))
    fsync_path(directory / TENSORS)
    files = {TENSORS: file_sha256(directory / TENSORS)}
    source = _model_source(model)
    if source["kind"] == "transformers":
        _plain_config(model).save_pretrained(str(directory))
        fsync_path(directory / MODEL_CONFIG)
        files[MODEL_CONFIG] = file_sha256(directory / MODEL_CONFIG)
    manifest = {
        "format": FORMAT_MARKER,
        "format_version": FORMAT_VERSION,
        "files": files,
        "model": source,
        "layers": {name: layer_entry(m) for name, m in model.named_modules() if type(m).__name__ in MANIFEST_MODULES},
        "tensors": {name: {"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape)}
                    for name, t in stored.items()},
        "aliases": aliases,
    }
    manifest["digest"] = manifest_digest(manifest)
    _write_json(directory / MANIFEST, manifest)  # written last: a directory without it is incomplete


def _check_saveable(model: nn.Module, float_model: bool) -> None:
    """Checks that ``model`` can be saved: an nn.Module after convert, not fused; with compressed layers
    unless ``float_model``, and without any if it is."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model: expected an nn.Module, got {type(model).__name__}")
    if not isinstance(float_model, bool):
        raise TypeError(f"float_model: expected a bool, got {type(float_model).__name__}")
    if compressed_layers(model):
        raise ValueError("save_compressed: the model still has training (CompressedLinear) layers; "
                         "call compress.convert(model) first")
    converted = [name for name, module in model.named_modules() if isinstance(module, _SAVED_MODULES)]
    if not converted and not float_model:
        raise ValueError(f"save_compressed: the model ({type(model).__name__}) has no compressed layers: it was "
                         "never converted (call compress.convert(model) first), or the plan matched no layer; "
                         "to save its float weights on purpose, pass float_model=True")
    if converted and float_model:
        raise ValueError(f"save_compressed: float_model=True but the model has compressed layers "
                         f"{converted[:3]} ({len(converted)} in all); leave float_model out to save them")
    if is_fused(model):
        raise ValueError("save_compressed: the model has fused sibling layers (compress.fuse_siblings), whose "
                         "state differs from the saved layout; save it before fusing, or call "
                         "compress.nn.fusion.unfuse_siblings(model) first")


def save_compressed(model: nn.Module, path, overwrite: bool = False, *, format: str = "compress",
                    tokenizer=None, float_model: bool = False) -> pathlib.Path:
    """Write ``model`` (after :func:`compress.convert`) to the directory ``path``, crash safe.

    A model with no compressed layer is refused (ValueError): forgetting ``compress.convert`` would
    otherwise write a float model where a compressed one was meant. ``float_model=True`` saves such a
    model on purpose (e.g. fine-tuned weights to compress later; ``format="compress"`` only), and then
    refuses one with compressed layers. A ``transformers`` model's ``config.json`` is written without
    ``quantization_config`` (a GGUF-loaded model's, say): a float directory is then a plain float
    checkpoint that ``transformers`` and llm-compressor load as such.

    ``format``: ``"compress"`` (this module's layout, every layer kind, loaded by
    :func:`compress.load_compressed`) or ``"compressed-tensors"`` (a model directory that vLLM and
    ``transformers`` with the ``compressed-tensors`` package load, W8A8 and W4A16 layers only:
    :mod:`compress.checkpoint.compressed_tensors.save`, which also writes ``tokenizer`` there).
    ``path`` must be new, an empty directory, or (with ``overwrite=True``) a save of ours in either
    format; anything else is refused before anything is written (:func:`check_save_target`)."""
    if format not in SAVE_FORMATS:
        raise ValueError(f"format: expected one of {SAVE_FORMATS}, got {format!r}")
    if tokenizer is not None and format != "compressed-tensors":
        raise ValueError("tokenizer: only format='compressed-tensors' writes a tokenizer (a model directory for "
                         "vLLM / transformers); the 'compress' format holds the model only")
    if tokenizer is not None and not hasattr(tokenizer, "save_pretrained"):
        raise TypeError("tokenizer: expected a transformers tokenizer (with save_pretrained), "
                        f"got {type(tokenizer).__name__}")
    _check_saveable(model, float_model)
    if float_model and format != "compress":
        raise ValueError(f"float_model=True: only format='compress' saves a float model, got format={format!r} "
                         "(a compressed-tensors directory holds quantized layers; for a plain transformers "
                         "directory use model.save_pretrained)")
    target = check_save_target(path, overwrite)
    if format == "compressed-tensors":
        contents = compressed_tensors_save.export_contents(model)  # refuses what the format cannot hold
        write = lambda directory: compressed_tensors_save.write_directory(model, contents, directory, tokenizer)  # noqa: E731
    else:
        write = lambda directory: _write_directory(model, directory)  # noqa: E731
    replace_directory(target, write, overwrite)
    logger.info("saved compressed model to %s (format %s)", target, format)
    return target
