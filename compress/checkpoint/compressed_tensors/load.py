"""``load_compressed`` of a compressed-tensors directory: its W8A8 / W4A16 layers as our kernel modules.

A directory is one when ``config.json``'s ``quantization_config.quant_method`` is
``"compressed-tensors"``: written by ``save_compressed(format="compressed-tensors")``, by the
compressed-tensors library (llm-compressor) or by anything else that follows the format
(:mod:`compress.checkpoint.compressed_tensors.format`). Loading runs no code from the directory:

1. ``config.json`` is read as JSON: ``quantization_status`` must be ``"compressed"``; a kv-cache scheme,
   a sparsity or a transform config is refused; so is every config group whose scheme we do not run
   (:func:`~compress.checkpoint.compressed_tensors.format.layer_config` lists what is supported).
2. The tensors come from ``model.safetensors`` or the shards that ``model.safetensors.index.json``
   lists (safetensors only, never a pickle); each shard must hold exactly the tensors the index maps to
   it. Every file is read as a regular file, its header's sizes checked against the file first
   (:mod:`compress.checkpoint.files`). An export of ours (``compress-export.json``) has each file's
   sha256 verified first.
3. The model is the ``transformers`` class ``architectures`` names (a ``PreTrainedModel`` subclass),
   built from the config without weight init; the config's ``quantization_config`` is dropped (the
   model runs our modules now, and a later save writes its own).
4. Each ``nn.Linear`` that a config group targets, and ``ignore`` does not name, becomes a
   ``W8A8Linear`` / ``W4A16Linear`` holding the stored integers and scales. Matching follows
   compressed-tensors: a target is a module name, ``re:<pattern>`` (``re.match`` on the name) or a class
   name of the module or one of its bases; an exact name wins over a pattern, a pattern over a class,
   equal kinds go by the target's text. A targeted ``nn.Embedding`` is refused.
5. Every other tensor loads as stored (dtypes kept); a weight the model ties to another (``lm_head``)
   may be absent. Any tensor missing or left over is a :class:`CheckpointError` naming it.
"""
from __future__ import annotations

import os
import pathlib
import re

import torch
from torch import nn

from compress.checkpoint.compressed_tensors.format import MIXED, QUANT_METHOD, layer_config, module_from
from compress.checkpoint.files import NotRegularFileError, read_json, read_safetensors
from compress.checkpoint.manifest import (
    CT_EXPORT_MARKER,
    MODEL_CONFIG,
    TENSORS,
    CheckpointError,
    file_sha256,
    is_our_compressed_tensors_export,
)
from compress.checkpoint.rebuild import skip_weight_init, transformers_model_class
from compress.plan import replace_submodule

TENSOR_INDEX = "model.safetensors.index.json"


def quantization_config_of(directory: pathlib.Path) -> dict | None:
    """``config.json``'s ``quantization_config`` when it is a compressed-tensors one, else None (also when
    ``config.json`` is missing or not JSON); a ``config.json`` that is not a regular file is refused."""
    try:
        config = read_json(directory / MODEL_CONFIG)
    except NotRegularFileError:
        raise
    except (OSError, ValueError):
        return None
    found = config.get("quantization_config") if isinstance(config, dict) else None
    return found if isinstance(found, dict) and found.get("quant_method") == QUANT_METHOD else None


def _check_patterns(patterns, field: str, where: str) -> list[str]:
    """``patterns`` (targets or ignore): a list of module names, class names or ``re:`` patterns."""
    if not isinstance(patterns, list) or not all(isinstance(p, str) for p in patterns):
        raise CheckpointError(f"{where}: field {field!r}: expected a list of module names, class names or 're:' "
                              f"patterns, got {patterns!r}")
    for pattern in (p for p in patterns if p.startswith("re:")):
        try:
            re.compile(pattern[3:])
        except re.error as error:
            raise CheckpointError(f"{where}: field {field!r}: {pattern!r} is not a valid pattern ({error})") from None
    return patterns


def _layer_configs(
    directory: pathlib.Path, quantization: dict
) -> tuple[dict[str, tuple[list[str], object]], list[str]]:
    """({group name: (targets, our config)}, ignore); CheckpointError for what we do not run."""
    where = f"{directory / MODEL_CONFIG}: quantization_config"
    status = quantization.get("quantization_status")
    if status != "compressed":
        raise CheckpointError(f"{where}: field 'quantization_status': expected 'compressed' (integer weights), got "
                              f"{status!r} (float weights with fake quantization: save the model compressed first)")
    for key in ("kv_cache_scheme", "sparsity_config", "transform_config"):
        if quantization.get(key):
            raise CheckpointError(f"{where}: field {key!r}: expected none, got {quantization[key]!r}; only the "
                                  "quantized linear layers of config_groups are supported")
    groups = quantization.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        raise CheckpointError(f"{where}: field 'config_groups': expected an object {{name: scheme}}, got {groups!r}")
    global_format = quantization.get("format")
    configs = {}
    for name, scheme in groups.items():
        if not isinstance(scheme, dict):
            raise CheckpointError(f"{where}: config group {name!r}: expected a scheme object, got {scheme!r}")
        targets = _check_patterns(scheme.get("targets"), f"config_groups.{name}.targets", where)
        if global_format == MIXED and not scheme.get("format"):
            raise CheckpointError(f"{where}: config group {name!r}: format 'mixed-precision' needs each group's format")
        configs[name] = (targets, layer_config(scheme, global_format, f"{where}: config group {name!r}"))
    return configs, _check_patterns(quantization.get("ignore") or [], "ignore", where)


def _match_rank(name: str, module: nn.Module, target: str) -> tuple[int, str] | None:
    """How ``target`` matches the module: (0 exact name | 1 pattern | 2 class name, target), or None."""
    if target.startswith("re:"):
        return (1, target) if re.match(target[3:], name) else None
    if target == name:
        return 0, target
    if any(cls.__name__ == target for cls in type(module).__mro__):
        return 2, target
    return None


def _targeted_layers(model: nn.Module, configs: dict, ignore: list[str], where: str) -> dict[str, object]:
    """{module name: our config} for every module a config group targets and ``ignore`` does not name."""
    chosen = {}
    for name, module in model.named_modules():
        if not name or not isinstance(module, (nn.Linear, nn.Embedding)):
            continue
        if any(_match_rank(name, module, pattern) for pattern in ignore):
            continue
        ranked = [(rank, config) for targets, config in configs.values() for target in targets
                  if (rank := _match_rank(name, module, target)) is not None]
        if not ranked:
            continue
        if isinstance(module, nn.Embedding):
            raise CheckpointError(f"{where}: the config groups quantize the embedding {name!r}; only nn.Linear "
                                  "layers are supported")
        chosen[name] = min(ranked, key=lambda pair: pair[0])[1]
    return chosen


def _verify_export(directory: pathlib.Path) -> None:
    """The sha256 of each file an export of ours lists (``compress-export.json``)."""
    files = read_json(directory / CT_EXPORT_MARKER)["files"]
    for name, expected in files.items():
        path = directory / name
        try:
            if pathlib.Path(name).name != name:
                raise FileNotFoundError(name)
            actual = file_sha256(path)
        except FileNotFoundError:
            raise CheckpointError(f"{directory}: missing {name} (listed in {CT_EXPORT_MARKER})") from None
        if actual != expected:
            raise CheckpointError(f"{path}: checksum mismatch (listed in {CT_EXPORT_MARKER}): the file is damaged "
                                  "or was changed")


def _weight_map(directory: pathlib.Path) -> dict[str, str]:
    """{tensor name: shard file} from ``model.safetensors.index.json``, each file a .safetensors file in
    ``directory``."""
    index_path = directory / TENSOR_INDEX
    index = read_json(index_path)
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise CheckpointError(f"{index_path}: expected JSON with a non-empty 'weight_map' {{tensor: file}}, got "
                              f"{type(weight_map).__name__ if weight_map is not None else 'none'}")
    for name in weight_map.values():
        if not isinstance(name, str) or pathlib.Path(name).name != name or not name.endswith(".safetensors"):
            raise CheckpointError(f"{index_path}: field 'weight_map': expected .safetensors file names in the "
                                  f"directory, got {name!r}")
    return weight_map


def _load_shards(directory: pathlib.Path, weight_map: dict[str, str]) -> dict[str, torch.Tensor]:
    """Every tensor of the shards the index lists; CheckpointError naming the shard when it holds a tensor
    the index does not map to it, or lacks one the index does (a stale or edited index would otherwise
    load whichever copy comes last)."""
    tensors = {}
    for shard in sorted(set(weight_map.values())):
        stored = _read(directory / shard)
        listed = {name for name, file in weight_map.items() if file == shard}
        unlisted, absent = sorted(set(stored) - listed), sorted(listed - set(stored))
        if unlisted or absent:
            raise CheckpointError(f"{directory / shard}: its tensors differ from what {TENSOR_INDEX} maps to it: "
                                  f"not listed there {unlisted[:5]}, listed but absent {absent[:5]}")
        tensors.update(stored)
    return tensors


def _read(path: pathlib.Path) -> dict[str, torch.Tensor]:
    try:
        return read_safetensors(path)
    except FileNotFoundError:
        raise CheckpointError(f"{path.parent}: missing {path.name}") from None


def _load_tensors(directory: pathlib.Path) -> dict[str, torch.Tensor]:
    """The tensors of ``model.safetensors``, else of the shards ``model.safetensors.index.json`` lists
    (safetensors only: pickled weights are never loaded)."""
    if os.path.lexists(directory / TENSORS):
        return _read(directory / TENSORS)
    if not os.path.lexists(directory / TENSOR_INDEX):
        raise CheckpointError(f"{directory}: expected {TENSORS} or {TENSOR_INDEX} (safetensors weights; pickled "
                              "weights are never loaded), got neither")
    return _load_shards(directory, _weight_map(directory))


def _build_model(directory: pathlib.Path) -> nn.Module:
    import transformers

    config = transformers.AutoConfig.from_pretrained(str(directory))
    architectures = getattr(config, "architectures", None) or []
    cls = transformers_model_class(transformers, architectures[0]) if architectures else None
    if cls is None:
        raise CheckpointError(f"{directory / MODEL_CONFIG}: field 'architectures': expected a list naming a "
                              f"transformers model class (a PreTrainedModel subclass), got {architectures}")
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    with skip_weight_init():  # every weight is overwritten by the stored tensors
        model = cls(config)
    if model.can_generate() and (directory / "generation_config.json").is_file():
        model.generation_config = transformers.GenerationConfig.from_pretrained(str(directory))
    return model


def _load_dense(directory: pathlib.Path, model: nn.Module, tensors: dict[str, torch.Tensor], quantized: dict) -> None:
    """The tensors outside the ``quantized`` layers, as stored; only weights the model ties may be absent."""
    expected = {n: t for n, t in model.state_dict().items() if n.rpartition(".")[0] not in quantized}
    wrong = [f"{n} {list(t.shape)} (expected {list(expected[n].shape)})" for n, t in tensors.items()
             if n in expected and t.shape != expected[n].shape]
    unexpected = sorted(set(tensors) - set(expected))
    if wrong or unexpected:
        raise CheckpointError(f"{directory}: tensors that do not fit {type(model).__name__}: unexpected "
                              f"{unexpected[:5]}, other shapes {wrong[:5]}")
    model.load_state_dict(tensors, strict=False, assign=True)
    model.tie_weights()
    loaded = {(t.untyped_storage().data_ptr(), t.storage_offset()) for t in tensors.values()}
    state = model.state_dict()
    missing = [n for n in sorted(set(expected) - set(tensors))
               if (state[n].untyped_storage().data_ptr(), state[n].storage_offset()) not in loaded]
    if missing:
        raise CheckpointError(f"{directory}: missing tensors {missing[:5]} ({len(missing)} in all) that "
                              f"{type(model).__name__} needs")


def load_compressed_tensors(directory: pathlib.Path) -> nn.Module:
    """The model in the compressed-tensors ``directory`` (module docstring), on the CPU, in eval mode."""
    configs, ignore = _layer_configs(directory, quantization_config_of(directory))
    if is_our_compressed_tensors_export(directory):
        _verify_export(directory)
    tensors = _load_tensors(directory)
    model = _build_model(directory)
    quantized = {}
    for name, config in _targeted_layers(model, configs, ignore, f"{directory / MODEL_CONFIG}").items():
        linear = model.get_submodule(name)
        prefix = f"{name}."
        keys = {key[len(prefix):]: key for key in tensors if key.startswith(prefix) and "." not in key[len(prefix):]}
        own = {suffix: tensors.pop(key) for suffix, key in keys.items()}
        if ("bias" in own) != (linear.bias is not None):
            raise CheckpointError(f"{directory}: layer {name!r}: {type(model).__name__} builds it "
                                  f"{'with' if linear.bias is not None else 'without'} a bias but the directory "
                                  f"stores {'one' if 'bias' in own else 'none'}")
        module = module_from(config, own, linear.in_features, linear.out_features, f"{directory}: layer {name!r}")
        quantized[name] = module
        replace_submodule(model, name, module)
    _load_dense(directory, model, tensors, quantized)
    float_dtype = next((t.dtype for t in tensors.values() if t.is_floating_point()), torch.float32)
    for module in quantized.values():  # model code reads layer.weight.dtype: the model's, not the scales'
        module.compute_dtype_marker = torch.empty(0, dtype=float_dtype)
    return model.eval()
