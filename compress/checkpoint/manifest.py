"""The manifest of a compressed-model directory: what it records, and how every byte is verified.

``manifest.json`` (format_version 2) holds::

    format          "compress-checkpoint": what makes a directory a checkpoint of ours
    format_version  2
    files           {"model.safetensors": sha256, "config.json": sha256 (transformers models only)}
    model           how to rebuild the model: {"kind": "transformers", "architecture": class name}
                    or {"kind": "module", "class_path": ...} (the caller passes a skeleton)
    layers          {layer name: inference module + in/out features, bias, config, nnz, block, smoothing};
                    an experts block (QuantizedExperts) is an entry of its own (num_experts,
                    intermediate_size; in/out features the hidden size) listed with its experts' layers
                    (``<block>.gate_up.<e>``, ``<block>.down.<e>``)
    tensors         {name: {"dtype", "shape"}} of every tensor stored in model.safetensors
    aliases         {alias: stored name} of tied weights, stored once
    digest          sha256 of the manifest's canonical JSON without this field

One digest covers every byte that matters: it is taken over the manifest (keys sorted, no spaces,
ASCII), which holds the sha256 of each other file, so an edited layer width, an injected alias, a
changed ``config.json`` (``hidden_act``, ``layer_norm_eps``) or damaged tensor bytes are each a
:class:`CheckpointError` naming the file. (A checksum detects damage and edits; it is no signature:
whoever rewrites the manifest can recompute it. The loader's cross-checks of metadata against the
tensors, of aliases against the model's own ties and of BSR indices still hold then.)

format_version 1 (saves made before the digest) had only ``sha256`` of model.safetensors; such a
directory still loads, with a warning that its manifest and config.json are unverified.

Structure: :func:`read_manifest` checks presence, version, and every required key with its JSON
type, so the loader never meets a stray ``KeyError`` / ``AttributeError`` / ``TypeError``; each
damage is a :class:`CheckpointError` naming the file and the field.
"""
from __future__ import annotations

import hashlib
import json
import logging
import pathlib
import re

from torch import nn

from compress.checkpoint.files import CheckpointError, NotRegularFileError, read_json, regular_file
from compress.configs import config_from_dict
from compress.nn.experts import QuantizedExperts
from compress.nn.inference import (BLOCK_SPARSE_MODULES, INFERENCE_MODULES, BSRW4A16Linear, BSRW8A8Linear,
                                   W4A16Linear, W8A8BlockLinear, W8A8Linear, W8A16Linear)

logger = logging.getLogger(__name__)

FORMAT_VERSION = 2
READABLE_VERSIONS = (1, 2)
FORMAT_MARKER = "compress-checkpoint"  # manifest["format"]: what makes a directory a checkpoint of ours
MANIFEST, TENSORS, MODEL_CONFIG = "manifest.json", "model.safetensors", "config.json"
MANIFEST_MODULES = {**INFERENCE_MODULES, "QuantizedExperts": QuantizedExperts}  # module types the manifest lists
# What marks a compressed-tensors directory written by save_compressed (compressed_tensors/save.py)
CT_EXPORT_MARKER = "compress-export.json"




def file_sha256(path: pathlib.Path) -> str:
    """sha256 of the regular file ``path`` (:func:`compress.checkpoint.files.regular_file`)."""
    digest = hashlib.sha256()
    with regular_file(path) as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def manifest_digest(manifest: dict) -> str:
    """sha256 of the manifest's canonical JSON (sorted keys, no spaces, ASCII) without ``digest``."""
    content = {key: value for key, value in manifest.items() if key != "digest"}
    text = json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode("ascii")).hexdigest()


def layer_entry(module: nn.Module) -> dict:
    """The manifest entry of one inference module (or experts block): what rebuilds it empty before its
    tensors load."""
    if isinstance(module, QuantizedExperts):
        return {"module": "QuantizedExperts", "in_features": module.hidden_dim, "out_features": module.hidden_dim,
                "bias": False, "num_experts": module.num_experts, "intermediate_size": module.intermediate_dim}
    entry = {"module": type(module).__name__, "in_features": module.in_features,
             "out_features": module.out_features, "bias": module.bias is not None}
    if isinstance(module, (W8A8Linear, W4A16Linear, W8A16Linear, W8A8BlockLinear, BSRW8A8Linear, BSRW4A16Linear)):
        entry["config"] = module.config.to_dict()
    if isinstance(module, (W8A8Linear, BSRW8A8Linear)):
        entry["smoothing"] = module.input_smoothing is not None
    if isinstance(module, BLOCK_SPARSE_MODULES):
        entry.update(nnz=module.nnz, block=module.block)
    return entry


def is_our_checkpoint(path) -> bool:
    """Whether ``path`` is a directory holding a manifest of ours (any format_version), or a
    compressed-tensors export of ours (:data:`CT_EXPORT_MARKER`). A manifest or marker that is a pipe,
    socket or device is a :class:`~compress.checkpoint.files.NotRegularFileError`, never read."""
    if is_our_compressed_tensors_export(path):
        return True
    try:
        manifest = read_json(pathlib.Path(path) / MANIFEST)
    except NotRegularFileError:
        raise
    except (OSError, ValueError):  # missing or not JSON
        return False
    if not isinstance(manifest, dict):
        return False
    if manifest.get("format") == FORMAT_MARKER:
        return True
    return isinstance(manifest.get("format_version"), int) and "sha256" in manifest and "tensors" in manifest


def is_our_compressed_tensors_export(path) -> bool:
    """Whether ``path`` holds the marker that ``save_compressed(format="compressed-tensors")`` writes last."""
    try:
        marker = read_json(pathlib.Path(path) / CT_EXPORT_MARKER)
    except NotRegularFileError:
        raise
    except (OSError, ValueError):  # missing or not JSON
        return False
    return isinstance(marker, dict) and marker.get("written_by") == "compress" and isinstance(marker.get("files"), dict)


def read_manifest(path) -> dict:
    """The manifest of a compressed-model directory, checked for presence, version and structure
    (:func:`_check_manifest`); :func:`verify_files` then checks the digest and the files."""
    directory = pathlib.Path(path)
    manifest_path = directory / MANIFEST
    try:
        manifest = read_json(manifest_path, "manifest")
    except FileNotFoundError:
        raise CheckpointError(f"{directory}: not a complete compressed-model directory (no {MANIFEST})") from None
    if not isinstance(manifest, dict):
        raise CheckpointError(f"{manifest_path}: expected a JSON object, got a JSON {_json_kind(manifest)}")
    version = manifest.get("format_version")
    if isinstance(version, bool) or version not in READABLE_VERSIONS:
        raise CheckpointError(f"{manifest_path}: field 'format_version': expected one of {READABLE_VERSIONS}, "
                              f"got {version!r}")
    _check_manifest(manifest_path, manifest)
    return manifest


def verify_files(directory: pathlib.Path, manifest: dict) -> None:
    """The manifest's digest and every file's sha256; CheckpointError naming the file otherwise."""
    manifest_path = directory / MANIFEST
    if manifest["format_version"] == 1:
        logger.warning("%s: format_version 1 (saved before manifest digests): only %s is verified, not the "
                       "manifest or %s; save the model again to upgrade", manifest_path, TENSORS, MODEL_CONFIG)
        files = {TENSORS: manifest["sha256"]}
    else:
        if manifest_digest(manifest) != manifest["digest"]:
            raise CheckpointError(f"{manifest_path}: field 'digest' does not match the manifest's content: the "
                                  "manifest was edited or damaged after it was saved")
        files = manifest["files"]
    for name, expected in files.items():
        path = directory / name
        try:
            actual = file_sha256(path)
        except FileNotFoundError:
            raise CheckpointError(f"{directory}: missing {name} (listed in {MANIFEST})") from None
        if actual != expected:
            raise CheckpointError(f"{path}: checksum mismatch (manifest sha256 {expected[:12]}..., file "
                                  f"{actual[:12]}...): the file is damaged or was changed")


def _json_kind(value) -> str:
    names = {dict: "object", list: "array", str: "string", bool: "boolean", int: "number", float: "number"}
    return "null" if value is None else names.get(type(value), type(value).__name__)


_LAYER_FIELDS = {  # inference module -> {field: type} its manifest entry needs (see layer_entry)
    "W8A8Linear": {"config": dict, "smoothing": bool},
    "W4A16Linear": {"config": dict},
    "W8A16Linear": {"config": dict},
    "W8A8BlockLinear": {"config": dict},
    "BSRLinear": {"nnz": int, "block": int},
    "BSRW8A8Linear": {"config": dict, "smoothing": bool, "nnz": int, "block": int},
    "BSRW4A16Linear": {"config": dict, "nnz": int, "block": int},
    "QuantizedExperts": {"num_experts": int, "intermediate_size": int},
}


def _check_manifest(manifest_path: pathlib.Path, manifest: dict) -> None:
    """Structure of a parsed manifest: required keys with the right JSON types, aliases that point to
    stored tensors, layer entries naming a known inference module with valid configs, and a model
    source of a known kind. CheckpointError naming ``manifest_path`` and the field otherwise."""

    def fail(field: str, expected: str, got) -> None:
        shown = f"a JSON {_json_kind(got)}" if isinstance(got, (dict, list)) else repr(got)
        raise CheckpointError(f"{manifest_path}: field {field!r}: expected {expected}, got {shown}")

    def need(container: dict, key: str, field: str, types, expected: str):
        if key not in container:
            raise CheckpointError(f"{manifest_path}: field {field!r} is missing (expected {expected})")
        value = container[key]
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in _tuple(types)):
            fail(field, expected, value)
        return value

    def hex_digest(container: dict, key: str, field: str) -> None:
        value = need(container, key, field, str, "a 64-digit hex string")
        if not re.fullmatch(r"[0-9a-f]{64}", value):
            fail(field, "a 64-digit hex string", value)

    if manifest["format_version"] == 1:
        hex_digest(manifest, "sha256", "sha256")
    else:
        hex_digest(manifest, "digest", "digest")
        files = need(manifest, "files", "files", dict, "an object {file name: sha256}")
        if TENSORS not in files:
            raise CheckpointError(f"{manifest_path}: field 'files.{TENSORS}' is missing (expected its sha256)")
        for name in files:
            if name not in (TENSORS, MODEL_CONFIG):
                fail(f"files.{name}", f"only {TENSORS!r} and {MODEL_CONFIG!r}", name)
            hex_digest(files, name, f"files.{name}")
    tensors = need(manifest, "tensors", "tensors", dict, "an object {name: {dtype, shape}}")
    for name, spec in tensors.items():
        if not isinstance(spec, dict):
            fail(f"tensors.{name}", "an object {dtype, shape}", spec)
        need(spec, "dtype", f"tensors.{name}.dtype", str, "a dtype name")
        shape = need(spec, "shape", f"tensors.{name}.shape", list, "a list of sizes")
        if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape):
            fail(f"tensors.{name}.shape", "a list of non-negative integers", shape)
    aliases = manifest.get("aliases", {})
    if not isinstance(aliases, dict):
        fail("aliases", "an object {alias: stored tensor name}", aliases)
    for alias, stored in aliases.items():
        if not isinstance(stored, str) or stored not in tensors:
            fail(f"aliases.{alias}", "the name of a stored tensor (a key of 'tensors')", stored)
        if alias in tensors:
            fail(f"aliases.{alias}", "a name that is not stored (an alias would replace the stored tensor)", alias)
    source = need(manifest, "model", "model", dict, "an object {kind, architecture or class_path}")
    kind = need(source, "kind", "model.kind", str, "'transformers' or 'module'")
    if kind == "transformers":
        need(source, "architecture", "model.architecture", str, "a transformers model class name")
        if manifest["format_version"] > 1 and MODEL_CONFIG not in manifest["files"]:
            raise CheckpointError(f"{manifest_path}: field 'files.{MODEL_CONFIG}' is missing "
                                  "(a transformers model is rebuilt from its config.json)")
    elif kind == "module":
        need(source, "class_path", "model.class_path", str, "a class path string")
    else:
        fail("model.kind", "'transformers' or 'module'", kind)
    layers = need(manifest, "layers", "layers", dict, "an object {layer name: entry}")
    for name, entry in layers.items():
        where = f"layers.{name}"
        if not isinstance(entry, dict):
            fail(where, "an object", entry)
        module = need(entry, "module", f"{where}.module", str, f"one of {tuple(MANIFEST_MODULES)}")
        if module not in _LAYER_FIELDS:
            fail(f"{where}.module", f"one of {tuple(MANIFEST_MODULES)}", module)
        for key in ("in_features", "out_features"):
            if need(entry, key, f"{where}.{key}", int, "a positive integer") <= 0:
                fail(f"{where}.{key}", "a positive integer", entry[key])
        need(entry, "bias", f"{where}.bias", bool, "true or false")
        for key, kind_type in _LAYER_FIELDS[module].items():
            expected = {dict: "a config object", bool: "true or false", int: "a positive integer"}[kind_type]
            value = need(entry, key, f"{where}.{key}", kind_type, expected)
            if kind_type is int and value <= 0:
                fail(f"{where}.{key}", expected, value)
        if "config" in _LAYER_FIELDS[module]:
            try:
                config_from_dict(entry["config"])
            except (TypeError, ValueError) as error:
                raise CheckpointError(f"{manifest_path}: field '{where}.config': {error}") from None


def _tuple(types) -> tuple:
    return types if isinstance(types, tuple) else (types,)

