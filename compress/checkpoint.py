"""Compressed-model directory: save and load without the original weights.

Layout of ``path/``::

    model.safetensors   every tensor of model.state_dict() (packed int4, int8, float32 scales, BSR
                        indices and values, the dense layers), each stored once (aliases of tied
                        weights are listed in the manifest)
    manifest.json       format_version, sha256 of model.safetensors, per-tensor dtype and shape,
                        per-layer inference module + config (+ nnz / smoothing), and how to rebuild
                        the model: a ``transformers`` architecture class, or a class path
    config.json         the model's own ``transformers`` config (transformers models only)

Saving never loses a user's files. Before anything is written, :func:`save_compressed` refuses
an empty or whitespace path, a path that is an existing file (or a symlink to one, or a dangling
symlink), and an existing directory that is neither empty nor a checkpoint of ours (a directory
whose ``manifest.json`` parses as JSON carrying ``"format": "compress-checkpoint"``, or, for saves
made before that marker, ``format_version`` with ``sha256`` and ``tensors``); that refusal holds even
with ``overwrite=True``. An existing checkpoint of ours is replaced only with ``overwrite=True``
(else ``FileExistsError`` naming the path and the flag). An empty directory is saved into. A
symlink to a directory saves at the directory it points to, so the link keeps working.

The swap is crash safe. The new checkpoint is written and fsynced in a hidden sibling
``.NAME.tmp-<pid>-<hex>`` (``manifest.json`` last: a directory without it is incomplete). A new path
is then one ``rename``. An existing one is swapped with Linux ``renameat2(RENAME_EXCHANGE)``
(atomic: the path holds the old or the new checkpoint at every instant; the old one, now in the
temporary, is deleted after the parent directory is fsynced). Where that call is unavailable the
fallback is two renames: the old directory to ``.NAME.old-<pid>-<hex>``, the new one onto the path,
then the backup is deleted; an exception between them puts the old directory back at once. A crash
at any point (a kill leaves no chance to clean up) is repaired by :func:`recover` on the next
:func:`save_compressed` or :func:`load_compressed` of that path: the path missing and a
``.NAME.old-*`` backup present -> the backup (the newest whole one) is put back; the path present ->
backups are dropped; ``.NAME.tmp-*`` entries are removed. Entries of another process that is still
alive (the pid in the name) are left alone; saving one path from two processes at once is not
supported. After a successful save or recovery no hidden ``.NAME.*`` entry remains.

Modes are the usual ones: directories ``0o777 & ~umask``, files ``0o666 & ~umask`` (the temporary
directory is made with ``os.mkdir``, not ``tempfile.mkdtemp``, whose 0700 would stay on the result;
safetensors writes its file 0600, so the files are given the directory's mode less the execute bits).

Loading refuses, with a clear error, a directory whose manifest is missing or of another version,
whose safetensors file does not match its checksum, or whose tensors differ in name, dtype or shape
from the manifest. The manifest names classes (``W8A8Linear``, a ``transformers`` architecture), not
the files of ``compress`` that define them.

:func:`load_model_dir` loads any saved model directory: such a compressed one, or a plain
``transformers`` one (``save_pretrained``). A directory that looks compressed (our packed tensor names
in ``model.safetensors``, or ``.NAME.tmp-*`` / ``.NAME.old-*`` siblings) but has no ``manifest.json``
is refused rather than loaded as plain, which would re-initialise its compressed layers at random.

A damaged manifest (not UTF-8 JSON, not an object, a required key missing or of the wrong type, an
alias to a tensor that is not stored, an unknown layer module or config field, a ``model.architecture``
that is not a ``transformers.PreTrainedModel`` subclass) and a stored tensor whose shape does not fit
the layer its entry describes are all a :class:`CheckpointError` naming the file and the field or layer.
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib
import json
import logging
import ctypes
import ctypes.util
import errno
import os
import pathlib
import re
import secrets
import shutil
import stat
import sys

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from compress.configs import config_from_dict
from compress.nn.fusion import is_fused
from compress.nn.modules import INFERENCE_MODULES, BSRLinear, BSRW8A8Linear, W4A16Linear, W8A8Linear
from compress.plan import compressed_layers, replace_submodule

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1
FORMAT_MARKER = "compress-checkpoint"  # manifest["format"]: what makes a directory a checkpoint of ours
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
        "format": FORMAT_MARKER,
        "format_version": FORMAT_VERSION,
        "sha256": _sha256(directory / TENSORS),
        "model": source,
        "layers": {name: _layer_entry(m) for name, m in model.named_modules() if type(m).__name__ in INFERENCE_MODULES},
        "tensors": {name: {"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape)} for name, t in stored.items()},
        "aliases": aliases,
    }
    _write_json(directory / MANIFEST, manifest)  # written last: a directory without it is incomplete


def _check_saveable(model: nn.Module) -> None:
    """Checks that ``model`` can be saved: an nn.Module after convert, not fused."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model: expected an nn.Module, got {type(model).__name__}")
    if compressed_layers(model):
        raise ValueError("save_compressed: the model still has training (CompressedLinear) layers; "
                         "call compress.convert(model) first")
    if is_fused(model):
        raise ValueError("save_compressed: the model has fused sibling layers (compress.fuse_siblings), whose "
                         "state differs from the saved layout; save it before fusing, or call "
                         "compress.nn.fusion.unfuse_siblings(model) first")


def checkpoint_path(path) -> pathlib.Path:
    """The absolute, normalized directory ``path`` names (a symlink to a directory: the directory).

    Refuses a path that is not a str / PathLike, an empty or whitespace one, and the root."""
    if isinstance(path, bytes) or not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path: expected a str or os.PathLike directory path, got {type(path).__name__}")
    text = os.fspath(path)
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"path: expected a non-empty directory path, got {text!r}")
    target = pathlib.Path(os.path.abspath(text))
    if target.is_symlink() and target.is_dir():
        target = pathlib.Path(os.path.realpath(target))
    if not target.name:
        raise ValueError(f"path: expected a directory below the filesystem root, got {text!r}")
    return target


def is_our_checkpoint(path) -> bool:
    """Whether ``path`` is a directory holding a manifest of ours (any format_version)."""
    manifest_path = pathlib.Path(path) / MANIFEST
    try:
        manifest = json.loads(manifest_path.read_text())
    except (OSError, ValueError):
        return False
    if not isinstance(manifest, dict):
        return False
    if manifest.get("format") == FORMAT_MARKER:
        return True
    return isinstance(manifest.get("format_version"), int) and "sha256" in manifest and "tensors" in manifest


def check_save_target(path, overwrite: bool = False, flag: str = "overwrite=True") -> pathlib.Path:
    """The directory :func:`save_compressed` would write for ``path``, or the error it would raise.

    Call it before long work to fail early (``compress export`` does, before converting the weights). It runs
    :func:`recover` first, so a path left by a crashed save is judged as it will be saved onto."""
    if not isinstance(overwrite, bool):
        raise TypeError(f"overwrite: expected a bool, got {type(overwrite).__name__}")
    target = checkpoint_path(path)
    if target.is_symlink() and not target.exists():
        raise FileExistsError(f"{target}: is a dangling symlink; expected a new or empty directory, "
                              "or a compressed checkpoint")
    if target.exists() and not target.is_dir():
        raise FileExistsError(f"{target}: is an existing file, not a directory; refusing to replace it "
                              "(save_compressed writes a directory: choose a new path)")
    recover(target)
    if not target.is_dir():
        return target
    if is_our_checkpoint(target):
        if not overwrite:
            raise FileExistsError(f"{target}: already holds a compressed checkpoint; pass {flag} to replace it")
        return target
    entries = sorted(os.listdir(target))
    if entries:
        shown = ", ".join(entries[:3]) + (", ..." if len(entries) > 3 else "")
        raise FileExistsError(f"{target}: is a non-empty directory that is not a compressed checkpoint "
                              f"(it holds {shown}); refusing to replace it, even with {flag}: "
                              "choose a new or empty directory")
    return target


def _new_hidden_dir(target: pathlib.Path, kind: str) -> pathlib.Path:
    """Make ``.NAME.<kind>-<pid>-<hex>`` next to ``target`` with mode 0o777 & ~umask."""
    while True:
        candidate = target.with_name(f".{target.name}.{kind}-{os.getpid()}-{secrets.token_hex(4)}")
        try:
            os.mkdir(candidate, 0o777)
            return candidate
        except FileExistsError:
            continue


def _normal_file_modes(directory: pathlib.Path) -> None:
    """Files in ``directory`` get 0o666 & ~umask: the directory's own mode (made 0o777 & ~umask by
    ``os.mkdir``) without execute bits. safetensors writes 0600 whatever the umask."""
    mode = stat.S_IMODE(directory.stat().st_mode) & 0o666
    for entry in directory.iterdir():
        if entry.is_file() and not entry.is_symlink():
            os.chmod(entry, mode)


def _hidden_name(target: pathlib.Path, kind: str) -> pathlib.Path:
    return target.with_name(f".{target.name}.{kind}-{os.getpid()}-{secrets.token_hex(4)}")


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100
_libc = None


def _exchange_directories(first: pathlib.Path, second: pathlib.Path) -> bool:
    """Atomically swap two paths with Linux ``renameat2(RENAME_EXCHANGE)``; False where unsupported
    (not Linux, no such libc symbol, or a filesystem that refuses it), leaving both untouched."""
    global _libc
    if not sys.platform.startswith("linux"):
        return False
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    renameat2 = getattr(_libc, "renameat2", None)
    if renameat2 is None:
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    result = renameat2(_AT_FDCWD, os.fsencode(first), _AT_FDCWD, os.fsencode(second), _RENAME_EXCHANGE)
    if result == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False
    raise OSError(code, f"renameat2(RENAME_EXCHANGE) {first} <-> {second}: {os.strerror(code)}")


def _remove(path: pathlib.Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:
        return False
    return True


def _leftovers(target: pathlib.Path) -> dict[str, list[pathlib.Path]]:
    """Hidden ``.NAME.tmp-*`` / ``.NAME.old-*`` siblings of ``target`` that no other live process owns."""
    found = {"tmp": [], "old": []}
    pattern = re.compile(rf"^\.{re.escape(target.name)}\.(tmp|old)-(.+)$")
    try:
        names = os.listdir(target.parent)
    except OSError:  # a parent we cannot read holds nothing we could repair
        return found
    for name in names:
        match = pattern.match(name)
        if match is None:
            continue
        pid = re.match(r"^(\d+)(?:-|$)", match.group(2))
        if pid is not None and int(pid.group(1)) != os.getpid() and _pid_alive(int(pid.group(1))):
            continue  # another process is saving this path right now
        found[match.group(1)].append(target.parent / name)
    return found


def recover(path) -> pathlib.Path:
    """Repair what a save of ``path`` interrupted at any point left behind (see the module docstring);
    returns the directory. Does nothing (and writes nothing) when there is nothing to repair."""
    target = checkpoint_path(path)
    leftovers = _leftovers(target)
    if not leftovers["tmp"] and not leftovers["old"]:
        return target
    backups = leftovers["old"]
    if not os.path.lexists(target) and backups:
        whole = [b for b in backups if is_our_checkpoint(b)]
        chosen = max(whole or backups, key=lambda b: b.stat().st_mtime_ns)
        os.rename(chosen, target)
        logger.warning("recovered %s from the backup %s of an interrupted save", target, chosen.name)
        backups = [b for b in backups if b != chosen]
    for leftover in [*leftovers["tmp"], *backups]:
        _remove(leftover)
    _fsync_path(target.parent)
    return target


def save_compressed(model: nn.Module, path, overwrite: bool = False) -> pathlib.Path:
    """Write ``model`` (after :func:`compress.convert`) to the directory ``path``, crash safe.

    ``path`` must be new, an empty directory, or (with ``overwrite=True``) a checkpoint of ours;
    anything else is refused before anything is written (see the module docstring)."""
    _check_saveable(model)
    target = check_save_target(path, overwrite)
    target.parent.mkdir(parents=True, exist_ok=True)
    temporary = _new_hidden_dir(target, "tmp")  # the new checkpoint; after an exchange, the old one
    backup = None  # the fallback's ``.NAME.old-*``: the old checkpoint while the path is empty
    try:
        _write_directory(model, temporary)
        _normal_file_modes(temporary)
        _fsync_path(temporary)
        if not target.exists():
            os.rename(temporary, target)
            temporary = None
        elif not _exchange_directories(temporary, target):
            backup = _hidden_name(target, "old")
            os.rename(target, backup)
            os.rename(temporary, target)
            temporary = None
        _fsync_path(target.parent)
        if temporary is not None:
            shutil.rmtree(temporary)
            temporary = None
        if backup is not None:
            shutil.rmtree(backup)
            backup = None
        _fsync_path(target.parent)
    except BaseException:
        if backup is not None and not os.path.lexists(target):
            with contextlib.suppress(OSError):
                os.rename(backup, target)  # put the old checkpoint back at once
                backup = None
        # the temporary is never the only copy of the old checkpoint; a backup is removed only when the
        # path holds the new one (else :func:`recover` puts it back later)
        leftovers = [temporary, backup if os.path.lexists(target) else None]
        for leftover in leftovers:
            if leftover is not None and os.path.lexists(leftover):
                with contextlib.suppress(OSError):
                    _remove(leftover)
        raise
    logger.info("saved compressed model to %s", target)
    return target


# ---- load -----------------------------------------------------------------------------------------
def read_manifest(path) -> dict:
    """The manifest of a compressed-model directory, checked for presence, version and structure.

    Every damage is a :class:`CheckpointError` naming the file and the field (see
    :func:`_check_manifest`), so later steps can index the manifest without stray ``KeyError`` /
    ``AttributeError`` / ``TypeError`` escaping from deep inside the loader.
    """
    directory = pathlib.Path(path)
    manifest_path = directory / MANIFEST
    if not manifest_path.is_file():
        raise CheckpointError(f"{directory}: not a complete compressed-model directory (no {MANIFEST})")
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise CheckpointError(f"{manifest_path}: damaged manifest, expected UTF-8 JSON ({error})") from None
    if not isinstance(manifest, dict):
        raise CheckpointError(f"{manifest_path}: expected a JSON object, got a JSON {_json_kind(manifest)}")
    version = manifest.get("format_version")
    if version != FORMAT_VERSION:
        raise CheckpointError(f"{manifest_path}: expected format_version {FORMAT_VERSION}, got {version!r}")
    _check_manifest(manifest_path, manifest)
    return manifest


def _json_kind(value) -> str:
    names = {dict: "object", list: "array", str: "string", bool: "boolean", int: "number", float: "number"}
    return "null" if value is None else names.get(type(value), type(value).__name__)


_LAYER_FIELDS = {  # inference module -> {field: type} its manifest entry needs (see _layer_entry)
    "W8A8Linear": {"config": dict, "smoothing": bool},
    "W4A16Linear": {"config": dict},
    "BSRLinear": {"nnz": int, "block": int},
    "BSRW8A8Linear": {"config": dict, "smoothing": bool, "nnz": int, "block": int},
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

    sha = need(manifest, "sha256", "sha256", str, "a 64-digit hex string")
    if not re.fullmatch(r"[0-9a-f]{64}", sha):
        fail("sha256", "a 64-digit hex string", sha)
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
    source = need(manifest, "model", "model", dict, "an object {kind, architecture or class_path}")
    kind = need(source, "kind", "model.kind", str, "'transformers' or 'module'")
    if kind == "transformers":
        need(source, "architecture", "model.architecture", str, "a transformers model class name")
    elif kind == "module":
        need(source, "class_path", "model.class_path", str, "a class path string")
    else:
        fail("model.kind", "'transformers' or 'module'", kind)
    layers = need(manifest, "layers", "layers", dict, "an object {layer name: entry}")
    for name, entry in layers.items():
        where = f"layers.{name}"
        if not isinstance(entry, dict):
            fail(where, "an object", entry)
        module = need(entry, "module", f"{where}.module", str, f"one of {tuple(INFERENCE_MODULES)}")
        if module not in _LAYER_FIELDS:
            fail(f"{where}.module", f"one of {tuple(INFERENCE_MODULES)}", module)
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

    architecture = source["architecture"]
    cls = _transformers_model_class(transformers, architecture)
    if cls is None:
        raise CheckpointError(f"{directory / MANIFEST}: field 'model.architecture': expected a transformers "
                              f"model class (a PreTrainedModel subclass), got {architecture!r} "
                              f"(transformers {transformers.__version__})")
    config = transformers.AutoConfig.from_pretrained(str(directory))
    with _skip_weight_init():  # every weight is overwritten by the saved tensors
        return cls(config)


def _transformers_model_class(transformers, name: str):
    """``transformers.<name>`` if it is a ``PreTrainedModel`` subclass, else None.

    Only model classes are instantiated: a manifest or config naming any other attribute
    (``pipeline``, ``AutoTokenizer``, a module) must not make the loader call it."""
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


def _check_shapes(directory: pathlib.Path, model: nn.Module, tensors: dict, layers: dict) -> None:
    """CheckpointError naming the layer and its manifest entry when a stored tensor's shape is not the
    one the rebuilt layer expects (an edited group size, nnz or block changes the expected shapes)."""
    expected = model.state_dict()
    for key, tensor in tensors.items():
        if key in expected and tuple(expected[key].shape) != tuple(tensor.shape):
            layer = key.rpartition(".")[0]
            entry = f" (manifest entry layers.{layer} = {json.dumps(layers[layer])})" if layer in layers else ""
            raise CheckpointError(f"{directory / MANIFEST}: layer {layer!r}: tensor {key!r} has shape "
                                  f"{list(tensor.shape)} but the layer the manifest describes expects "
                                  f"{list(expected[key].shape)}{entry}")


def _recovered(path) -> pathlib.Path:
    """``path`` after :func:`recover`; a repair that the filesystem refuses (a read-only parent) is
    logged, and the directory is then loaded as it is."""
    directory = checkpoint_path(path)
    try:
        recover(directory)
    except OSError as error:
        logger.warning("%s: could not repair an interrupted save (%s); loading it as it is", directory, error)
    return directory


def load_compressed(path, model: nn.Module | None = None) -> nn.Module:
    """Rebuild a compressed model on the CPU from ``path`` (written by :func:`save_compressed`).

    ``transformers`` models are rebuilt from the saved config; any other module needs ``model``, a
    skeleton of the original (uncompressed) architecture. The loaded tensors keep their saved dtypes.
    """
    directory = _recovered(path)
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
    _check_shapes(directory, model, tensors, manifest["layers"])
    try:
        missing, unexpected = model.load_state_dict(tensors, strict=False, assign=True)
    except RuntimeError as error:
        raise CheckpointError(f"{directory}: state does not match the model: {error}") from None
    if missing or unexpected:
        raise CheckpointError(f"{directory}: state does not match the model (missing {missing[:5]}, "
                              f"unexpected {unexpected[:5]})")
    if hasattr(model, "tie_weights") and manifest.get("aliases"):
        model.tie_weights()
    return model.eval()


# Leaf names of the buffers only our inference modules hold (compress/nn/modules.py): a
# model.safetensors carrying them was written by save_compressed, whatever else is in the directory.
COMPRESSED_TENSOR_NAMES = frozenset({"qweight", "w_q", "w_scale", "crow_indices", "col_indices", "input_smoothing"})


def _compressed_traces(path: pathlib.Path) -> list[str]:
    """Signs that ``path`` was written by :func:`save_compressed` (empty when there are none).

    Two kinds: tensor names in ``model.safetensors`` that only our inference modules produce, and
    hidden ``.NAME.tmp-*`` / ``.NAME.old-*`` siblings that only an interrupted save leaves behind.
    """
    traces = []
    tensor_path = path / TENSORS
    if tensor_path.is_file():
        from safetensors import safe_open

        try:
            with safe_open(str(tensor_path), framework="pt") as handle:
                names = list(handle.keys())
        except Exception:  # an unreadable file says nothing about who wrote it
            names = []
        ours = sorted(n for n in names if n.rpartition(".")[2] in COMPRESSED_TENSOR_NAMES)
        if ours:
            traces.append(f"{TENSORS} holds compressed-layer tensors such as {ours[:3]}")
    pattern = re.compile(rf"^\.{re.escape(path.name)}\.(tmp|old)-")
    try:
        hidden = sorted(name for name in os.listdir(path.parent) if pattern.match(name))
    except OSError:
        hidden = []
    if hidden:
        traces.append(f"interrupted-save siblings {hidden[:3]} in {path.parent}")
    return traces


def load_model_dir(path: str | pathlib.Path) -> nn.Module:
    """A model from a saved directory: compressed (``compress.save_compressed``) or plain ``transformers``.

    A directory that looks compressed (see :func:`_compressed_traces`) but has no ``manifest.json``
    is refused with :class:`CheckpointError`: loading it as a plain ``transformers`` model would
    re-initialise every compressed layer at random (their tensors match no dense weight name) and
    an evaluation would report the accuracy of noise instead of failing.
    """
    path = _recovered(path)
    if not path.is_dir():
        raise FileNotFoundError(f"model dir: expected a directory, got {path}")
    if (path / MANIFEST).is_file():
        return load_compressed(path)
    traces = _compressed_traces(path)
    if traces:
        raise CheckpointError(f"{path}: looks like a compressed-model directory ({'; '.join(traces)}) but has no "
                              f"{MANIFEST}; refusing to load it as a plain model, which would re-initialise "
                              "its compressed layers at random (re-export it with save_compressed)")
    return _load_plain_transformers(path)


def _load_plain_transformers(path: pathlib.Path) -> nn.Module:
    import transformers

    config = transformers.AutoConfig.from_pretrained(path)
    architectures = getattr(config, "architectures", None) or []
    cls = _transformers_model_class(transformers, architectures[0]) if architectures else None
    if cls is None:
        raise CheckpointError(f"{path}/config.json: field 'architectures': expected a list naming a transformers "
                              f"model class (a PreTrainedModel subclass), got {architectures}")
    return cls.from_pretrained(path, dtype=torch.float32)
