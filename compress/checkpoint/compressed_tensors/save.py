"""``save_compressed(model, path, format="compressed-tensors")``: a model directory vLLM and transformers load.

Layout of ``path/`` (a Hugging Face model directory; the tensor layout is
:mod:`compress.checkpoint.compressed_tensors.format`)::

    config.json             the model's config, its ``architectures`` and ``dtype``, and
                            ``quantization_config`` (quant_method "compressed-tensors", status
                            "compressed", one config group per scheme: targets "Linear" with the
                            dense linears in ``ignore`` when every compressed layer shares one scheme,
                            else each group lists its layers by name)
    model.safetensors       the quantized layers' tensors and every other tensor under the names
                            ``transformers`` gives them; a weight the architecture ties to another
                            (``lm_head`` to the embedding) is stored once
    generation_config.json  the model's generation settings (models that generate)
    tokenizer files         ``tokenizer.save_pretrained``, else the tokenizer files found beside the
                            model's original weights (``config._name_or_path``, a local directory)
    compress-export.json    the sha256 of each other file: marks the directory as an export of ours,
                            which ``overwrite=True`` may replace and :func:`load_compressed` verifies

Refused with a ValueError naming the layers, before anything is written: a model that is not a
``transformers`` model; MoE experts blocks (``QuantizedExperts``: fused 3-D weights in ``transformers``,
per-expert names that differ by architecture in a checkpoint); block-sparse layers (compressed-tensors
0.20 removed its sparsity compressors, and their bitmask and 2:4 formats never held 32x32 blocks;
writing the zeros densely would keep the numbers but silently drop the speed-up, so they are
refused); W8A8 layers holding SmoothQuant factors no norm absorbed (the format divides no input
channel; folding them into the weight would change its integers); W4A16 layers whose group size does
not divide K (compressed-tensors refuses such groups); a compressed layer that the architecture, as
``transformers`` builds it from the config, does not hold as an ``nn.Linear`` of the same shape
(GPT-2's ``Conv1D``) or ties to another weight; dense tensors whose names or shapes differ from that
architecture's. The directory is written aside and swapped in crash safe, as every save
(:mod:`compress.checkpoint.safe_write`).
"""
from __future__ import annotations

import copy
import json
import os
import pathlib
import shutil

import torch
from safetensors.torch import save_file
from torch import nn

from compress.checkpoint.compressed_tensors.format import FORMAT_VERSION, MIXED, QUANT_METHOD, scheme_of, tensors_of
from compress.checkpoint.manifest import CT_EXPORT_MARKER, MODEL_CONFIG, TENSORS, file_sha256
from compress.checkpoint.safe_write import fsync_path
from compress.nn.experts import QuantizedExperts
from compress.nn.inference import BLOCK_SPARSE_MODULES, W4A16Linear, W8A8Linear, is_inference_module

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "tokenizer.model", "spiece.model", "vocab.json", "vocab.txt", "merges.txt", "chat_template.jinja",
                   "chat_template.json")


def _names(layers) -> str:
    names = list(layers)
    return ", ".join(names[:8]) + (f", ... ({len(names)} in all)" if len(names) > 8 else "")


def _quantized_layers(model: nn.Module) -> dict[str, W8A8Linear | W4A16Linear]:
    """The model's W8A8 / W4A16 layers; ValueError naming the layers the format cannot hold."""
    experts = [name for name, m in model.named_modules() if isinstance(m, QuantizedExperts)]
    if experts:
        raise ValueError(f"save_compressed(format='compressed-tensors'): MoE experts blocks {_names(experts)} "
                         "(QuantizedExperts): transformers holds experts as fused 3-D weights, which a "
                         "compressed-tensors checkpoint stores under per-expert names that differ by architecture; "
                         "not supported: keep the experts dense (leave them out of the plan) or save with "
                         "format='compress'")
    layers = {name: m for name, m in model.named_modules() if is_inference_module(m)}
    sparse = [name for name, m in layers.items() if isinstance(m, BLOCK_SPARSE_MODULES)]
    if sparse:
        raise ValueError(f"save_compressed(format='compressed-tensors'): block-sparse layers {_names(sparse)}: the "
                         "format has no block-sparse layout (compressed-tensors 0.20 reads and writes no sparsity "
                         "compressor; its former bitmask and 2:4 formats cannot hold 32x32 blocks); save them with "
                         "format='compress', or convert the model without BlockSparseConfig")
    other = [f"{name} ({type(m).__name__})" for name, m in layers.items()
             if not isinstance(m, (W8A8Linear, W4A16Linear))]
    if other:
        raise ValueError(f"save_compressed(format='compressed-tensors'): layers {_names(other)}: only W8A8Linear and "
                         "W4A16Linear layers are written in this format; save with format='compress'")
    smoothed = [name for name, m in layers.items() if isinstance(m, W8A8Linear) and m.input_smoothing is not None]
    if smoothed:
        raise ValueError(f"save_compressed(format='compressed-tensors'): W8A8 layers {_names(smoothed)} divide their "
                         "input by SmoothQuant factors that no preceding norm absorbed (input_smoothing); the format "
                         "has no such per-input-channel factor and folding it into the weight would change the int8 "
                         "weights; save with format='compress', or convert with smoothquant_alpha=None")
    padded = [f"{name} (in_features={m.in_features}, group_size={m.group_size})" for name, m in layers.items()
              if not m.config.whole_groups(m.in_features)]
    if padded:
        raise ValueError(f"save_compressed(format='compressed-tensors'): W4A16 layers {_names(padded)}: the group size "
                         "does not divide in_features (the layer pads K with zero channels); compressed-tensors "
                         "requires whole groups; convert these layers with a group size dividing in_features, or per "
                         "channel (W4A16Config(group_size=None))")
    return layers


def _architecture(model: nn.Module) -> nn.Module:
    """The model's class built from its config on the meta device: the names and modules that
    ``transformers`` (and vLLM) will expect in the directory."""
    cls = type(model)
    config = getattr(model, "config", None)
    if not cls.__module__.startswith("transformers") or not hasattr(config, "to_diff_dict"):
        raise ValueError(f"save_compressed(format='compressed-tensors'): expected a transformers model (a model "
                         f"directory is rebuilt from config.json), got {cls.__module__}.{cls.__qualname__}; save it "
                         "with format='compress'")
    with torch.device("meta"):
        return cls(copy.deepcopy(config))


def _tied_groups(module: nn.Module) -> list[list[str]]:
    """Names of parameters that are one tensor (tied weights), one list per tensor shared by several."""
    groups: dict[int, list[str]] = {}
    for name, parameter in module.named_parameters(remove_duplicate=False):
        groups.setdefault(id(parameter), []).append(name)
    return [names for names in groups.values() if len(names) > 1]


def _check_linear_layers(model: nn.Module, layers: dict, architecture: nn.Module) -> None:
    """ValueError unless the architecture holds each quantized layer as an ``nn.Linear`` of its shape."""
    for name, module in layers.items():
        built = architecture.get_submodule(name) if _has_submodule(architecture, name) else None
        ours = (module.in_features, module.out_features, module.bias is not None)
        if isinstance(built, nn.Linear) and (built.in_features, built.out_features, built.bias is not None) == ours:
            continue
        found = "nothing" if built is None else f"a {type(built).__name__}" + (
            f" ({built.in_features} -> {built.out_features}, bias={built.bias is not None})"
            if isinstance(built, nn.Linear) else "")
        raise ValueError(f"save_compressed(format='compressed-tensors'): layer {name!r} ({ours[0]} -> {ours[1]}, "
                         f"bias={ours[2]}) is {found} in {type(model).__name__} as transformers builds it from the "
                         "config; the format quantizes nn.Linear layers under their own names only")


def _dense_tensors(model: nn.Module, layers: dict, architecture: nn.Module) -> dict[str, torch.Tensor]:
    """Every tensor of ``model`` outside the quantized layers, under the architecture's names, each
    tied group stored once (under its first name); ValueError when the model and the architecture disagree."""
    expected = architecture.state_dict()
    quantized = {f"{name}.{suffix}" for name in layers for suffix in ("weight", "bias")}
    ours = {name: t for name, t in model.state_dict().items() if name.rpartition(".")[0] not in layers}
    tied_copies = set()
    for group in _tied_groups(architecture):
        if quantized & set(group):
            raise ValueError(f"save_compressed(format='compressed-tensors'): {type(model).__name__} ties {group}; a "
                             "quantized layer's weight cannot be tied; keep that layer dense")
        present = [ours[name] for name in group if name in ours]
        if len({(t.untyped_storage().data_ptr(), t.storage_offset()) for t in present}) > 1:
            raise ValueError(f"save_compressed(format='compressed-tensors'): the config ties {group} "
                             "(transformers loads one tensor for all of them) but the model holds different "
                             "tensors there")
        tied_copies.update(group[1:])
    ours = {name: t for name, t in ours.items() if name not in tied_copies}
    missing = sorted(set(expected) - set(ours) - quantized - tied_copies)
    extra = sorted(set(ours) - set(expected))
    wrong = [f"{n} {list(ours[n].shape)} (expected {list(expected[n].shape)})"
             for n in sorted(set(ours) & set(expected)) if ours[n].shape != expected[n].shape]
    if missing or extra or wrong:
        raise ValueError(f"save_compressed(format='compressed-tensors'): the model's tensors differ from those of "
                         f"{type(model).__name__} as transformers builds it from the config: missing {missing[:5]}, "
                         f"unexpected {extra[:5]}, other shapes {wrong[:5]}")
    stored, seen = {}, set()
    for name, tensor in ours.items():  # weights the model shares but the architecture does not tie: stored apart
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset())
        tensor = tensor.detach().cpu()
        stored[name] = tensor.clone() if key in seen and tensor.numel() else tensor.contiguous()
        seen.add(key)
    return stored


def _has_submodule(module: nn.Module, name: str) -> bool:
    try:
        module.get_submodule(name)
    except AttributeError:
        return False
    return True


def quantization_config(layers: dict, ignore: list[str]) -> dict:
    """config.json's ``quantization_config`` for ``layers`` (name -> our module)."""
    groups: list[tuple[dict, list[str]]] = []
    for name, module in layers.items():
        scheme = scheme_of(module)
        for known, members in groups:
            if known == scheme:
                members.append(name)
                break
        else:
            groups.append((scheme, [name]))
    one_scheme = len(groups) == 1
    formats = {scheme["format"] for scheme, _ in groups}
    return {
        "quant_method": QUANT_METHOD,
        "version": FORMAT_VERSION,
        "format": formats.pop() if len(formats) == 1 else MIXED,
        "quantization_status": "compressed",
        "config_groups": {f"group_{index}": {**scheme, "targets": ["Linear"] if one_scheme else members}
                          for index, (scheme, members) in enumerate(groups)},
        "ignore": ignore,
        "kv_cache_scheme": None,
        "global_compression_ratio": None,
        "sparsity_config": {},
        "transform_config": {},
    }


def _write_tokenizer(model: nn.Module, tokenizer, directory: pathlib.Path) -> None:
    if tokenizer is not None:
        tokenizer.save_pretrained(str(directory))
        return
    source = pathlib.Path(str(getattr(model.config, "_name_or_path", "") or ""))
    if source.is_dir():
        for name in TOKENIZER_FILES:
            if (source / name).is_file():
                shutil.copyfile(source / name, directory / name)


def export_contents(model: nn.Module) -> tuple[dict[str, torch.Tensor], dict]:
    """(the tensors of model.safetensors, config.json's content) for ``model``; ValueError for what the
    format cannot hold (module docstring). Writes nothing."""
    layers = _quantized_layers(model)
    architecture = _architecture(model)
    _check_linear_layers(model, layers, architecture)
    tensors = _dense_tensors(model, layers, architecture)
    model_dtype = next((t.dtype for t in tensors.values() if t.is_floating_point()), torch.float32)
    ignore = [name for name, m in architecture.named_modules() if isinstance(m, nn.Linear) and name not in layers]
    for name, module in layers.items():
        tensors.update({f"{name}.{suffix}": t.cpu().contiguous() for suffix, t in tensors_of(module).items()})
    config = copy.deepcopy(model.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.architectures = [type(model).__name__]
    data = config.to_diff_dict()
    data["dtype"] = str(model_dtype).removeprefix("torch.")  # what transformers loads the dense weights as
    data["quantization_config"] = quantization_config(layers, ignore)
    return tensors, data


def write_directory(model: nn.Module, contents: tuple[dict, dict], directory: pathlib.Path, tokenizer=None) -> None:
    """Write the directory of the module docstring into the (empty) ``directory`` from
    :func:`export_contents`."""
    tensors, config = contents
    save_file(tensors, str(directory / TENSORS), metadata={"format": "pt"})
    (directory / MODEL_CONFIG).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    if getattr(model, "generation_config", None) is not None and model.can_generate():
        model.generation_config.save_pretrained(str(directory))
    _write_tokenizer(model, tokenizer, directory)
    files = {}
    for path in sorted(p for p in directory.iterdir() if p.is_file()):
        fsync_path(path)
        files[path.name] = file_sha256(path)
    marker = {"format": QUANT_METHOD, "written_by": "compress", "files": files}
    with open(directory / CT_EXPORT_MARKER, "w") as handle:  # written last: a directory without it is incomplete
        json.dump(marker, handle, indent=2, sort_keys=True)
        handle.flush()
        os.fsync(handle.fileno())
