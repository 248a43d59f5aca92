"""``load_compressed`` and ``load_model_dir``: a compressed-model directory back into a model.

Loading verifies before it builds: the manifest's structure and digest, each file's sha256
(:mod:`compress.checkpoint.manifest`), the tensors' names, dtypes and shapes against the manifest;
then it rebuilds the model (a ``transformers`` architecture from ``config.json``, only classes that
are ``transformers.PreTrainedModel`` subclasses, or the caller's skeleton), swaps in empty inference
modules from the layer entries and cross-checks them against the tensors (shapes, integer dtypes, the
aliases against the model's own ties) before any tensor is assigned; after assignment each
block-sparse layer's indices are checked. Every failure is a :class:`CheckpointError` naming the file
and the field or layer. No code runs: tensors come from safetensors, never from a pickle.

:func:`load_model_dir` loads any saved model directory: such a compressed one, a compressed-tensors
one (its quantized layers as our modules), or a plain ``transformers`` one (``save_pretrained``). A
directory that looks compressed (quantized-layer tensor names or integer weights in a ``*.safetensors``
file, the ``compress-export.json`` marker, or ``.NAME.tmp-*`` / ``.NAME.old-*`` siblings) but has neither
``manifest.json`` nor a compressed-tensors ``quantization_config`` is refused rather than loaded as plain,
which would re-initialise its compressed layers at random. A directory holding a pipe, socket or device
is refused before any file is opened; every file the loaders read themselves is opened as a regular file
only (:mod:`compress.checkpoint.files`).
"""
from __future__ import annotations

import json
import logging
import os
import pathlib
import re

import torch
from torch import nn

from compress.checkpoint.compressed_tensors.load import load_compressed_tensors, quantization_config_of
from compress.checkpoint.files import check_regular_entries, read_safetensors, read_safetensors_header
from compress.checkpoint.manifest import (
    CT_EXPORT_MARKER,
    MANIFEST,
    MODEL_CONFIG,
    TENSORS,
    CheckpointError,
    read_manifest,
    verify_files,
)
from compress.checkpoint.rebuild import skip_weight_init, transformers_model_class
from compress.checkpoint.safe_write import checkpoint_path, recover
from compress.configs import config_from_dict
from compress.nn.experts import QuantizedExperts
from compress.nn.inference import (BLOCK_SPARSE_MODULES, INFERENCE_MODULES, BSRLinear, BSRW4A16Linear,
                                   BSRW8A8Linear, W4A16Linear, W8A8BlockLinear, W8A8Linear, W8A16Linear)
from compress.plan import replace_submodule

logger = logging.getLogger(__name__)


def _load_tensors(directory: pathlib.Path, manifest: dict) -> dict[str, torch.Tensor]:
    """The stored tensors (aliases filled in), after the digest and the files' checksums are verified,
    with names, dtypes and shapes equal to the manifest's."""
    verify_files(directory, manifest)
    tensor_path = directory / TENSORS
    tensors = read_safetensors(tensor_path)
    expected = manifest["tensors"]
    if set(tensors) != set(expected):
        raise CheckpointError(f"{tensor_path}: tensor names differ from the manifest "
                              f"(missing {sorted(set(expected) - set(tensors))[:5]}, "
                              f"extra {sorted(set(tensors) - set(expected))[:5]})")
    for name, spec in expected.items():
        got = {"dtype": str(tensors[name].dtype).removeprefix("torch."), "shape": list(tensors[name].shape)}
        if got != spec:
            raise CheckpointError(f"{tensor_path}: tensor {name!r}: expected {spec}, got {got}")
    for alias, stored in manifest.get("aliases", {}).items():
        tensors[alias] = tensors[stored]
    return tensors


def _build_transformers_model(directory: pathlib.Path, source: dict) -> nn.Module:
    import transformers

    architecture = source["architecture"]
    cls = transformers_model_class(transformers, architecture)
    if cls is None:
        raise CheckpointError(f"{directory / MANIFEST}: field 'model.architecture': expected a transformers "
                              f"model class (a PreTrainedModel subclass), got {architecture!r} "
                              f"(transformers {transformers.__version__})")
    config = transformers.AutoConfig.from_pretrained(str(directory))
    with skip_weight_init():  # every weight is overwritten by the saved tensors
        return cls(config)


def _empty_module(entry: dict) -> nn.Module:
    kind = entry.get("module")
    if kind not in INFERENCE_MODULES:
        raise CheckpointError(f"manifest layer module: expected one of {tuple(INFERENCE_MODULES)}, got {kind!r}")
    args = (entry["in_features"], entry["out_features"], entry["bias"])
    if kind == "W8A8Linear":
        return W8A8Linear(*args, config=config_from_dict(entry["config"]), smoothing=entry["smoothing"])
    if kind == "W4A16Linear":
        return W4A16Linear(*args, config=config_from_dict(entry["config"]))
    if kind == "W8A16Linear":
        return W8A16Linear(*args, config=config_from_dict(entry["config"]))
    if kind == "W8A8BlockLinear":
        return W8A8BlockLinear(*args, config=config_from_dict(entry["config"]))
    if kind == "BSRW8A8Linear":
        return BSRW8A8Linear(*args, config=config_from_dict(entry["config"]), nnz=entry["nnz"], block=entry["block"],
                             smoothing=entry["smoothing"])
    if kind == "BSRW4A16Linear":
        return BSRW4A16Linear(*args, config=config_from_dict(entry["config"]), nnz=entry["nnz"], block=entry["block"])
    return BSRLinear(*args, nnz=entry["nnz"], block=entry["block"])


def _swap_in_layers(model: nn.Module, layers: dict) -> None:
    """Empty inference modules at the manifest's layer names; experts blocks first, since their experts'
    layers live inside them."""
    ordered = sorted(layers.items(), key=lambda item: item[1].get("module") != "QuantizedExperts")
    for name, entry in ordered:
        try:
            current = model.get_submodule(name)
        except AttributeError:
            raise CheckpointError(f"manifest layer {name!r} does not exist in the rebuilt model") from None
        if entry.get("module") == "QuantizedExperts":
            replace_submodule(model, name, _empty_experts(name, entry, current))
        else:
            replace_submodule(model, name, _empty_module(entry))


def _empty_experts(name: str, entry: dict, experts: nn.Module) -> QuantizedExperts:
    """A :class:`QuantizedExperts` skeleton for the rebuilt model's experts block ``experts``, after checking
    it has the manifest entry's sizes."""
    try:
        module = QuantizedExperts.empty_like(experts)
    except (ValueError, AttributeError) as error:
        raise CheckpointError(f"manifest layer {name!r}: the rebuilt model's {type(experts).__name__} cannot hold "
                              f"quantized experts: {error}") from None
    got = {"num_experts": module.num_experts, "in_features": module.hidden_dim,
           "intermediate_size": module.intermediate_dim}
    want = {key: entry[key] for key in got}
    if got != want:
        raise CheckpointError(f"manifest layer {name!r}: expected an experts block of {want}, the rebuilt model has "
                              f"{got}")
    return module


def _check_against_model(directory: pathlib.Path, model: nn.Module, tensors: dict, manifest: dict) -> None:
    """CheckpointError naming the layer and its manifest entry when a stored tensor does not fit the
    rebuilt model: a shape other than the one the layer expects (an edited width, group size, nnz or
    block), an integer tensor of another dtype, a float where integers belong; and an alias the model
    does not tie itself (an edited alias would load one layer's weights into another)."""
    layers, manifest_path = manifest["layers"], directory / MANIFEST
    expected = model.state_dict()
    for key, tensor in tensors.items():
        if key not in expected:
            continue
        want = expected[key]
        layer = key.rpartition(".")[0]
        entry = f" (manifest entry layers.{layer} = {json.dumps(layers[layer])})" if layer in layers else ""
        if tuple(want.shape) != tuple(tensor.shape):
            raise CheckpointError(f"{manifest_path}: layer {layer!r}: tensor {key!r} has shape "
                                  f"{list(tensor.shape)} but the layer the manifest describes expects "
                                  f"{list(want.shape)}{entry}")
        if want.dtype != tensor.dtype and not (want.is_floating_point() and tensor.is_floating_point()):
            raise CheckpointError(f"{manifest_path}: layer {layer!r}: tensor {key!r} is {tensor.dtype} but the "
                                  f"layer expects {want.dtype}{entry}")
    for alias, stored in manifest.get("aliases", {}).items():
        if alias in expected and stored in expected and not _same_storage(expected[alias], expected[stored]):
            raise CheckpointError(f"{manifest_path}: field 'aliases.{alias}': the model does not tie {alias!r} to "
                                  f"{stored!r}; an alias may only name a weight the model shares")


def _same_storage(first: torch.Tensor, second: torch.Tensor) -> bool:
    return (first.untyped_storage().data_ptr() == second.untyped_storage().data_ptr()
            and first.storage_offset() == second.storage_offset())


def _check_block_sparse_indices(directory: pathlib.Path, model: nn.Module) -> None:
    """CheckpointError naming the layer when its BSR indices break the ``torch.sparse_bsr`` invariants
    (the kernels trust them: a bad one reads out of range or kills the process)."""
    for name, module in model.named_modules():
        if isinstance(module, BLOCK_SPARSE_MODULES):
            try:
                module.check_indices()
            except ValueError as error:
                raise CheckpointError(f"{directory / TENSORS}: layer {name!r}: {error}") from None


def _recovered(path) -> pathlib.Path:
    """``path`` after :func:`recover`; a repair that the filesystem refuses (a read-only parent) is
    logged, and the directory is then loaded as it is. A directory holding a pipe, socket or device is
    refused (:func:`~compress.checkpoint.files.check_regular_entries`): a loader opening it could block
    forever."""
    directory = checkpoint_path(path)
    try:
        recover(directory)
    except OSError as error:
        logger.warning("%s: could not repair an interrupted save (%s); loading it as it is", directory, error)
    check_regular_entries(directory)
    return directory


def load_compressed(path, model: nn.Module | None = None) -> nn.Module:
    """Rebuild a compressed model on the CPU from ``path`` (written by :func:`save_compressed`).

    ``transformers`` models are rebuilt from the saved config; any other module needs ``model``, a
    skeleton of the original (uncompressed) architecture. The loaded tensors keep their saved dtypes.
    A compressed-tensors directory (ours, the compressed-tensors library's, ...) loads its W8A8 and
    W4A16 layers into our modules (:mod:`compress.checkpoint.compressed_tensors.load`).
    """
    directory = _recovered(path)
    if not os.path.lexists(directory / MANIFEST) and quantization_config_of(directory) is not None:
        if model is not None:
            raise ValueError(f"load_compressed: {directory} is a compressed-tensors directory, rebuilt from its "
                             "config.json; model= (a skeleton for our own format) is not used there: leave it out")
        return load_compressed_tensors(directory)
    manifest = read_manifest(directory)
    tensors = _load_tensors(directory, manifest)
    source = manifest["model"]
    if model is None:
        if source["kind"] != "transformers":
            raise ValueError(f"load_compressed: {directory} holds a {source['class_path']}, not a transformers "
                             "model; pass model=<an instance of that class> as the skeleton")
        model = _build_transformers_model(directory, source)
    elif not isinstance(model, nn.Module):
        raise TypeError(f"model: expected an nn.Module skeleton, got {type(model).__name__}")
    _swap_in_layers(model, manifest["layers"])
    if hasattr(model, "tie_weights"):  # built without weight init, transformers leaves ties undone
        model.tie_weights()
    _check_against_model(directory, model, tensors, manifest)
    try:
        missing, unexpected = model.load_state_dict(tensors, strict=False, assign=True)
    except RuntimeError as error:
        raise CheckpointError(f"{directory}: state does not match the model: {error}") from None
    if missing or unexpected:
        raise CheckpointError(f"{directory}: state does not match the model (missing {missing[:5]}, "
                              f"unexpected {unexpected[:5]})")
    if hasattr(model, "tie_weights") and manifest.get("aliases"):
        model.tie_weights()
    _check_block_sparse_indices(directory, model)
    return model.eval()


# Leaf names of tensors that only quantized layers hold: our inference modules' buffers
# (compress/nn/inference/) and the compressed-tensors format's (compressed_tensors/format.py, and what
# the compressed-tensors library writes for other schemes).
COMPRESSED_TENSOR_NAMES = frozenset({"qweight", "w_q", "w_scale", "crow_indices", "col_indices", "input_smoothing"})
QUANTIZED_TENSOR_NAMES = COMPRESSED_TENSOR_NAMES | {
    "weight_scale", "weight_packed", "weight_shape", "weight_zero_point", "weight_g_idx", "weight_global_scale",
    "input_scale", "input_zero_point", "input_global_scale"}


def _quantized_tensors(tensor_path: pathlib.Path) -> list[str]:
    """Names of the tensors in ``tensor_path`` that only a quantized layer holds: a name of
    :data:`QUANTIZED_TENSOR_NAMES`, or a ``weight`` that is not floating point. Reads the header only; an
    unreadable file says nothing about who wrote it (empty list)."""
    try:
        header = read_safetensors_header(tensor_path)
    except (OSError, CheckpointError):
        return []
    return sorted(name for name, (dtype, _) in header.items()
                  if name.rpartition(".")[2] in QUANTIZED_TENSOR_NAMES
                  or (name.rpartition(".")[2] == "weight" and not dtype.is_floating_point))


def _compressed_traces(path: pathlib.Path) -> list[str]:
    """Signs that ``path`` holds a compressed model (empty when there are none).

    Three kinds: tensors in any ``*.safetensors`` file that only quantized layers hold (ours or the
    compressed-tensors format's), the ``compress-export.json`` marker of a compressed-tensors export, and
    hidden ``.NAME.tmp-*`` / ``.NAME.old-*`` siblings that only an interrupted save leaves behind.
    """
    traces = []
    for tensor_path in sorted(path.glob("*.safetensors")):
        quantized = _quantized_tensors(tensor_path)
        if quantized:
            traces.append(f"{tensor_path.name} holds quantized-layer tensors such as {quantized[:3]}")
    if os.path.lexists(path / CT_EXPORT_MARKER):
        traces.append(f"{CT_EXPORT_MARKER}, the marker of a compressed-tensors export, is present")
    pattern = re.compile(rf"^\.{re.escape(path.name)}\.(tmp|old)-")
    try:
        hidden = sorted(name for name in os.listdir(path.parent) if pattern.match(name))
    except OSError:
        hidden = []
    if hidden:
        traces.append(f"interrupted-save siblings {hidden[:3]} in {path.parent}")
    return traces


def load_model_dir(path: str | pathlib.Path) -> nn.Module:
    """A model from a saved directory: compressed (``compress.save_compressed``, either format; or any
    compressed-tensors directory) or plain ``transformers``.

    A directory that looks compressed (see :func:`_compressed_traces`) but has neither ``manifest.json``
    nor a compressed-tensors ``quantization_config`` in ``config.json`` is refused with
    :class:`CheckpointError`: loading it as a plain ``transformers`` model would re-initialise every
    compressed layer at random (their tensors match no dense weight name) and an evaluation would report
    the accuracy of noise instead of failing.
    """
    path = _recovered(path)
    if not path.is_dir():
        raise FileNotFoundError(f"model dir: expected a directory, got {path}")
    if os.path.lexists(path / MANIFEST) or quantization_config_of(path) is not None:
        return load_compressed(path)
    traces = _compressed_traces(path)
    if traces:
        raise CheckpointError(f"{path}: looks like a compressed-model directory ({'; '.join(traces)}) but has no "
                              f"{MANIFEST} and no compressed-tensors quantization_config in {MODEL_CONFIG}; refusing "
                              "to load it as a plain model, which would re-initialise its compressed layers at random "
                              "(restore the missing file, or re-export the model with save_compressed)")
    return _load_plain_transformers(path)


def _load_plain_transformers(path: pathlib.Path) -> nn.Module:
    import transformers

    config = transformers.AutoConfig.from_pretrained(path)
    architectures = getattr(config, "architectures", None) or []
    cls = transformers_model_class(transformers, architectures[0]) if architectures else None
    if cls is None:
        raise CheckpointError(f"{path}/config.json: field 'architectures': expected a list naming a transformers "
                              f"model class (a PreTrainedModel subclass), got {architectures}")
    return cls.from_pretrained(path, dtype=torch.float32)
