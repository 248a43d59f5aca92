"""Compressed-model directory: save and load without the original weights.

Layout of ``path/``::

    model.safetensors   every tensor of model.state_dict() (packed int4, int8, float32 scales, BSR
                        indices and values, the dense layers), each stored once (aliases of tied
                        weights are listed in the manifest)
    manifest.json       format_version, sha256 of model.safetensors, per-tensor dtype and shape,
                        per-layer inference module + config (+ nnz / smoothing), and how to rebuild
                        the model: a ``transformers`` architecture class, or a class path
    config.json         the model's own ``transformers`` config (transformers models only)

Writes are atomic: everything is written and fsynced in a temporary directory next to ``path``,
which is then renamed onto ``path`` (an existing directory is first moved aside and deleted only
after the rename), so an interrupted save never leaves a directory that loads as if it were whole.
Loading refuses, with a clear error, a directory whose manifest is missing or of another version,
whose safetensors file does not match its checksum, or whose tensors differ in name, dtype or shape
from the manifest. The manifest names classes (``W8A8Linear``, a ``transformers`` architecture), not
the files of ``compress`` that define them.

:func:`load_model_dir` loads any saved model directory: such a compressed one, or a plain
``transformers`` one (``save_pretrained``).
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib
import json
import logging
import os
import pathlib
import shutil
import tempfile

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from compress.configs import config_from_dict
from compress.nn.fusion import is_fused
from compress.nn.modules import INFERENCE_MODULES, BSRLinear, BSRW8A8Linear, W4A16Linear, W8A8Linear
from compress.plan import compressed_layers, replace_submodule

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1
MANIFEST, TENSORS, MODEL_CONFIG = "manifest.json", "model.safetensors", "config.json"


class CheckpointError(ValueError):
    """A compressed-model directory is damaged, incomplete or does not match what it claims."""


def _sha256(path: pathlib.Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _fsync_path(path: pathlib.Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# ---- save -----------------------------------------------------------------------------------------
def _layer_entry(module: nn.Module) -> dict:
    entry = {"module": type(module).__name__, "in_features": module.in_features,
             "out_features": module.out_features, "bias": module.bias is not None}
    if isinstance(module, (W8A8Linear, W4A16Linear, BSRW8A8Linear)):
        entry["config"] = module.config.to_dict()
    if isinstance(module, (W8A8Linear, BSRW8A8Linear)):
        entry["smoothing"] = module.input_smoothing is not None
    if isinstance(module, (BSRLinear, BSRW8A8Linear)):
        entry.update(nnz=module.nnz, block=module.block)
    return entry


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
    if hasattr(model, "config") and hasattr(model.config, "to_json_string") and cls.__module__.startswith("transformers"):
        return {"kind": "transformers", "architecture": cls.__name__}
    return {"kind": "module", "class_path": f"{cls.__module__}.{cls.__qualname__}"}


def _write_json(path: pathlib.Path, data: dict) -> None:
    with open(path, "w") as handle:
        json.dump(data, handle, indent=2, sort_keys=True)
        handle.flush()
        os.fsync(handle.fileno())


def _write_directory(model: nn.Module, directory: pathlib.Path) -> None:
    stored, aliases = _unique_tensors(model.state_dict())
    save_file(stored, str(directory / TENSORS))
    _fsync_path(directory / TENSORS)
    source = _model_source(model)
    if source["kind"] == "transformers":
        model.config.save_pretrained(str(directory))
        _fsync_path(directory / MODEL_CONFIG)
    manifest = {
        "format_version": FORMAT_VERSION,
        "sha256": _sha256(directory / TENSORS),
        "model": source,
        "layers": {name: _layer_entry(m) for name, m in model.named_modules() if type(m).__name__ in INFERENCE_MODULES},
        "tensors": {name: {"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape)} for name, t in stored.items()},
        "aliases": aliases,
    }
    _write_json(directory / MANIFEST, manifest)  # written last: a directory without it is incomplete


def save_compressed(model: nn.Module, path) -> pathlib.Path:
    """Write ``model`` (after :func:`compress.convert`) to the directory ``path``, atomically."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model: expected an nn.Module, got {type(model).__name__}")
    if compressed_layers(model):
        raise ValueError("save_compressed: the model still has training (CompressedLinear) layers; "
                         "call compress.convert(model) first")
    if is_fused(model):
        raise ValueError("save_compressed: the model has fused sibling layers (compress.fuse_siblings), whose "
                         "state differs from the saved layout; save it before fusing, or call "
                         "compress.nn.fusion.unfuse_siblings(model) first")
    target = pathlib.Path(path).absolute()
    target.parent.mkdir(parents=True, exist_ok=True)
    temporary = pathlib.Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        _write_directory(model, temporary)
        _fsync_path(temporary)
        backup = None
        if target.exists():
            backup = target.with_name(f".{target.name}.old-{os.getpid()}")
            os.rename(target, backup)
        os.rename(temporary, target)
        _fsync_path(target.parent)
        if backup is not None:
            shutil.rmtree(backup)
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise
    logger.info("saved compressed model to %s", target)
    return target


# ---- load -----------------------------------------------------------------------------------------
def read_manifest(path) -> dict:
    """The manifest of a compressed-model directory, checked for presence and version."""
    directory = pathlib.Path(path)
    manifest_path = directory / MANIFEST
    if not manifest_path.is_file():
        raise CheckpointError(f"{directory}: not a complete compressed-model directory (no {MANIFEST})")
    try:
        manifest = json.loads(manifest_path.read_text())
    except json.JSONDecodeError as error:
        raise CheckpointError(f"{manifest_path}: damaged manifest ({error})") from None
    version = manifest.get("format_version")
    if version != FORMAT_VERSION:
        raise CheckpointError(f"{manifest_path}: expected format_version {FORMAT_VERSION}, got {version!r}")
    return manifest


def _load_tensors(directory: pathlib.Path, manifest: dict) -> dict[str, torch.Tensor]:
    tensor_path = directory / TENSORS
    if not tensor_path.is_file():
        raise CheckpointError(f"{directory}: missing {TENSORS}")
    actual = _sha256(tensor_path)
    if actual != manifest["sha256"]:
        raise CheckpointError(f"{tensor_path}: checksum mismatch (manifest sha256 {manifest['sha256'][:12]}..., "
                              f"file {actual[:12]}...): the file is damaged or was changed")
    tensors = load_file(str(tensor_path))
    expected = manifest["tensors"]
    if set(tensors) != set(expected):
        raise CheckpointError(f"{tensor_path}: tensor names differ from the manifest "
                              f"(missing {sorted(set(expected) - set(tensors))[:5]}, extra {sorted(set(tensors) - set(expected))[:5]})")
    for name, spec in expected.items():
        got = {"dtype": str(tensors[name].dtype).removeprefix("torch."), "shape": list(tensors[name].shape)}
        if got != spec:
            raise CheckpointError(f"{tensor_path}: tensor {name!r}: expected {spec}, got {got}")
    for alias, stored in manifest.get("aliases", {}).items():
        tensors[alias] = tensors[stored]
    return tensors


def _build_transformers_model(directory: pathlib.Path, source: dict) -> nn.Module:
    import transformers

    architecture = source.get("architecture")
    cls = getattr(transformers, architecture, None)
    if cls is None:
        raise CheckpointError(f"{directory}: transformers has no architecture {architecture!r} "
                              f"(transformers {transformers.__version__})")
    config = transformers.AutoConfig.from_pretrained(str(directory))
    with _skip_weight_init():  # every weight is overwritten by the saved tensors
        return cls(config)


def _skip_weight_init():
    """transformers' ``no_init_weights`` context (5.x: ``initialization``, 4.x: ``modeling_utils``)."""
    for module_name in ("transformers.initialization", "transformers.modeling_utils"):
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        if hasattr(module, "no_init_weights"):
            return module.no_init_weights()
    return contextlib.nullcontext()


def _empty_module(entry: dict) -> nn.Module:
    kind = entry.get("module")
    if kind not in INFERENCE_MODULES:
        raise CheckpointError(f"manifest layer module: expected one of {tuple(INFERENCE_MODULES)}, got {kind!r}")
    args = (entry["in_features"], entry["out_features"], entry["bias"])
    if kind == "W8A8Linear":
        return W8A8Linear(*args, config=config_from_dict(entry["config"]), smoothing=entry["smoothing"])
    if kind == "W4A16Linear":
        return W4A16Linear(*args, config=config_from_dict(entry["config"]))
    if kind == "BSRW8A8Linear":
        return BSRW8A8Linear(*args, config=config_from_dict(entry["config"]), nnz=entry["nnz"], block=entry["block"],
                             smoothing=entry["smoothing"])
    return BSRLinear(*args, nnz=entry["nnz"], block=entry["block"])


def _swap_in_layers(model: nn.Module, layers: dict) -> None:
    for name, entry in layers.items():
        try:
            model.get_submodule(name)
        except AttributeError:
            raise CheckpointError(f"manifest layer {name!r} does not exist in the rebuilt model") from None
        replace_submodule(model, name, _empty_module(entry))


def load_compressed(path, model: nn.Module | None = None) -> nn.Module:
    """Rebuild a compressed model on the CPU from ``path`` (written by :func:`save_compressed`).

    ``transformers`` models are rebuilt from the saved config; any other module needs ``model``, a
    skeleton of the original (uncompressed) architecture. The loaded tensors keep their saved dtypes.
    """
    directory = pathlib.Path(path)
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
    missing, unexpected = model.load_state_dict(tensors, strict=False, assign=True)
    if missing or unexpected:
        raise CheckpointError(f"{directory}: state does not match the model (missing {missing[:5]}, "
                              f"unexpected {unexpected[:5]})")
    if hasattr(model, "tie_weights") and manifest.get("aliases"):
        model.tie_weights()
    return model.eval()


def load_model_dir(path: str | pathlib.Path) -> nn.Module:
    """A model from a saved directory: compressed (``compress.save_compressed``) or plain ``transformers``."""
    path = pathlib.Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"model dir: expected a directory, got {path}")
    if (path / MANIFEST).is_file():
        return load_compressed(path)
    return _load_plain_transformers(path)


def _load_plain_transformers(path: pathlib.Path) -> nn.Module:
    import transformers

    config = transformers.AutoConfig.from_pretrained(path)
    architectures = getattr(config, "architectures", None) or []
    if not architectures or not hasattr(transformers, architectures[0]):
        raise ValueError(f"{path}/config.json: expected 'architectures' naming a transformers class, got {architectures}")
    return getattr(transformers, architectures[0]).from_pretrained(path, dtype=torch.float32)
