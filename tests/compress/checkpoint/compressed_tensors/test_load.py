"""load_compressed of compressed-tensors directories: one written by the compressed-tensors library itself
loads into our W8A8Linear / W4A16Linear holding its integers and scales and computes what transformers
computes from it; schemes we do not run and damaged directories are refused with clear errors.

Tolerances on the logits against transformers' model of the same directory (relative Frobenius
error, float32 on the CPU): W4A16 1e-5 (measured 0: the same dequantized weights); static W8A8 2e-3
(the same integers and rounding, summed in another order); dynamic W8A8 3e-2 (compressed-tensors'
fake quantization scales tokens by max|x| / 127.5, our kernels and vLLM's by max|x| / 127; measured
1.2%). See test_save.py for the measurements.
"""
import json
import re

import pytest
import torch
from safetensors.torch import load_file, save_file

import compress
from compress import CheckpointError, W4A16Config, W8A8Config
from compress.checkpoint import TENSORS
from compress.nn.inference import W4A16Linear, W8A8Linear
from tests.compress.checkpoint.helpers import library_directory, logits, relative_error, tiny_llama, token_ids

transformers = pytest.importorskip("transformers")


def _schemes():
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme, preset_name_to_scheme

    static = QuantizationScheme(targets=["Linear"], weights=QuantizationArgs(num_bits=8, strategy="channel"),
                                input_activations=QuantizationArgs(num_bits=8, strategy="tensor", dynamic=False))
    per_channel = QuantizationScheme(targets=["Linear"], weights=QuantizationArgs(num_bits=4, strategy="channel"))
    return {  # name: (scheme, our module and config, tolerance, shard size)
        "W8A8": (preset_name_to_scheme("W8A8", ["Linear"]), W8A8Linear, W8A8Config(), 3e-2, None),
        "W8A8-static": (static, W8A8Linear, W8A8Config(activation="static"), 2e-3, None),
        "W4A16": (preset_name_to_scheme("W4A16", ["Linear"]), W4A16Linear, W4A16Config(group_size=128), 1e-5, None),
        "W4A16-per-channel-sharded": (per_channel, W4A16Linear, W4A16Config(group_size=None), 1e-5, "100KB"),
    }


@pytest.mark.parametrize("name", ["W8A8", "W8A8-static", "W4A16", "W4A16-per-channel-sharded"])
def test_a_directory_the_library_wrote_loads_into_our_modules(tmp_path, name):
    pytest.importorskip("compressed_tensors")
    scheme, module_type, config, tolerance, shard_size = _schemes()[name]
    path = library_directory(tmp_path / "library", scheme, tiny_llama(), token_ids(seed=2), shard_size)
    assert (path / "model.safetensors.index.json").is_file() == (shard_size is not None)
    ours = compress.load_compressed(path)
    layers = {n: m for n, m in ours.named_modules() if isinstance(m, (W8A8Linear, W4A16Linear))}
    assert len(layers) == 14 and {type(m) for m in layers.values()} == {module_type}
    assert {m.config for m in layers.values()} == {config}
    assert type(ours.lm_head) is torch.nn.Linear  # ignored by the scheme: dense
    theirs = transformers.AutoModelForCausalLM.from_pretrained(str(path)).eval()
    ids = token_ids()
    error = relative_error(logits(ours, ids), logits(theirs, ids))
    assert error <= tolerance, f"{name}: relative logit error {error:.2e} > {tolerance}"
    for layer, module in layers.items():  # transformers' weights are decompressed by the forward above
        assert torch.equal(module.dequantized_weight(), theirs.get_submodule(layer).weight), layer
        if module_type is W8A8Linear and config.static:
            assert module.act_scale.item() == theirs.get_submodule(layer).input_scale.item(), layer


def test_integers_and_scales_are_the_stored_ones(tmp_path):
    pytest.importorskip("compressed_tensors")
    from compressed_tensors.compressors.pack_quantized.helpers import unpack_from_int32
    from compressed_tensors.quantization import preset_name_to_scheme

    scheme = preset_name_to_scheme("W4A16", ["Linear"])
    path = library_directory(tmp_path / "library", scheme, tiny_llama(), None)
    stored = load_file(str(path / TENSORS))
    ours = compress.load_compressed(path).get_submodule("model.layers.1.mlp.down_proj")
    q = unpack_from_int32(stored["model.layers.1.mlp.down_proj.weight_packed"], 4, torch.Size([128, 256]))
    assert torch.equal(ours.dequantized_weight(), q.float() * stored["model.layers.1.mlp.down_proj.weight_scale"]
                       .repeat_interleave(128, dim=1))
    assert torch.equal(ours.scales, stored["model.layers.1.mlp.down_proj.weight_scale"].T)


# ---- edited directories ----------------------------------------------------------------------------
def _export(tmp_path, plan=None):
    model = compress.convert(tiny_llama(), plan or W8A8Config())
    return compress.save_compressed(model, tmp_path / "ct", format="compressed-tensors")


def _edit_config(path, edit):
    """Rewrite config.json through ``edit(quantization_config)``; the marker goes, as in a directory others edited."""
    config = json.loads((path / "config.json").read_text())
    edit(config["quantization_config"])
    (path / "config.json").write_text(json.dumps(config))
    (path / "compress-export.json").unlink(missing_ok=True)


def _weights(**changes):
    return lambda q: q["config_groups"]["group_0"]["weights"].update(changes)


def _activations(value):
    return lambda q: q["config_groups"]["group_0"].update(input_activations=value)


def test_targets_match_as_in_compressed_tensors_a_pattern_before_a_class_name(tmp_path):
    plan = {"*.mlp.*": W4A16Config(group_size=64), "*.self_attn.*": W8A8Config()}
    model = compress.convert(tiny_llama(), plan)
    path = compress.save_compressed(model, tmp_path / "ct", format="compressed-tensors")

    def by_pattern_and_class(quantization):
        for group in quantization["config_groups"].values():
            group["targets"] = [r"re:.*\.mlp\."] if group["format"] == "pack-quantized" else ["Linear"]
    _edit_config(path, by_pattern_and_class)
    loaded = compress.load_compressed(path)
    assert {n: type(m) for n, m in loaded.named_modules() if "proj" in n} == {
        n: type(m) for n, m in model.named_modules() if "proj" in n}
    assert torch.equal(logits(loaded, token_ids()), logits(model, token_ids()))
    _edit_config(path, lambda q: q.update(ignore=["re:(unclosed"]))
    with pytest.raises(CheckpointError, match=r"field 'ignore': 're:\(unclosed' is not a valid pattern"):
        compress.load_compressed(path)


UNSUPPORTED = {  # name: (plan, edit of quantization_config)
    "asymmetric": (W4A16Config(), _weights(symmetric=False)),
    "fp8": (W8A8Config(), _weights(type="float")),
    "int2": (W4A16Config(), _weights(num_bits=2)),
    "group-16": (W4A16Config(), _weights(group_size=16)),
    "block-structure": (W8A8Config(), _weights(strategy="block", block_structure=[128, 128])),
    "w4a8": (W4A16Config(), _activations({"num_bits": 8, "strategy": "token", "dynamic": True})),
    "w8-fp8-activations": (W8A8Config(), _activations({"num_bits": 8, "type": "float", "strategy": "token",
                                                       "dynamic": True})),
    "w8a8-static-per-token": (W8A8Config(), _activations({"num_bits": 8, "strategy": "token", "dynamic": False})),
    "output-activations": (W8A8Config(), lambda q: q["config_groups"]["group_0"].update(
        output_activations={"num_bits": 8, "strategy": "tensor"})),
}


@pytest.mark.parametrize("name", UNSUPPORTED)
def test_unsupported_schemes_are_refused_listing_the_supported_ones(tmp_path, name):
    plan, edit = UNSUPPORTED[name]
    path = _export(tmp_path, plan)
    _edit_config(path, edit)
    with pytest.raises(CheckpointError, match=r"config group 'group_0': weights .* is not supported; supported: "
                                              r"W8A8: int8 symmetric weights per output channel .*W4A16: int4"):
        compress.load_compressed(path)


@pytest.mark.parametrize("edit, pattern", [
    (lambda q: q.update(quantization_status="frozen"), r"'quantization_status': expected 'compressed'.*got 'frozen'"),
    (lambda q: q.update(kv_cache_scheme={"num_bits": 8, "type": "float"}), r"field 'kv_cache_scheme': expected none"),
    (lambda q: q.update(transform_config={"config_groups": {"r1": {}}}), r"field 'transform_config': expected none"),
    (lambda q: q.update(config_groups={}), r"field 'config_groups': expected an object"),
    (lambda q: q["config_groups"]["group_0"]["targets"].append("Embedding"), r"quantize the embedding "
                                                                              r"'model\.embed_tokens'"),
], ids=["frozen", "kv-cache", "transform", "no-groups", "embedding"])
def test_other_quantization_configs_are_refused(tmp_path, edit, pattern):
    path = _export(tmp_path)
    _edit_config(path, edit)
    with pytest.raises(CheckpointError, match=pattern):
        compress.load_compressed(path)


def test_tensors_that_do_not_fit_are_refused_naming_them(tmp_path):
    path = _export(tmp_path, W4A16Config())
    (path / "compress-export.json").unlink()
    tensors = load_file(str(path / TENSORS))
    layer = "model.layers.0.mlp.down_proj"  # 256 -> 128: two groups of 128 per row
    tensors[f"{layer}.weight_zero_point"] = torch.zeros(128, 2, dtype=torch.int8)
    save_file(tensors, str(path / TENSORS))
    with pytest.raises(CheckpointError, match=rf"layer '{layer}': .*unexpected \['weight_zero_point'\]"):
        compress.load_compressed(path)
    del tensors[f"{layer}.weight_zero_point"]
    tensors[f"{layer}.weight_scale"] = -tensors[f"{layer}.weight_scale"]
    save_file(tensors, str(path / TENSORS))
    with pytest.raises(CheckpointError, match=rf"layer '{layer}': tensor 'weight_scale': expected positive finite"):
        compress.load_compressed(path)
    tensors[f"{layer}.weight_scale"] = tensors[f"{layer}.weight_scale"][:, :1].abs()
    save_file(tensors, str(path / TENSORS))
    with pytest.raises(CheckpointError, match=rf"layer '{layer}': tensor 'weight_scale': expected shape \[128, 2\]"):
        compress.load_compressed(path)


def test_pickled_weights_are_never_loaded_and_a_skeleton_is_refused(tmp_path):
    path = _export(tmp_path)
    with pytest.raises(ValueError, match="compressed-tensors directory, rebuilt from its config.json; model="):
        compress.load_compressed(path, model=tiny_llama())
    (path / "compress-export.json").unlink()
    torch.save(load_file(str(path / TENSORS)), path / "pytorch_model.bin")
    (path / TENSORS).unlink()
    with pytest.raises(CheckpointError, match=r"expected model\.safetensors or model\.safetensors\.index\.json "
                                              r"\(safetensors weights; pickled weights are never loaded\)"):
        compress.load_compressed(path)


def _sharded_library_dir(tmp_path):
    """A W4A16 per-channel directory the library wrote in shards, and its index's weight map."""
    pytest.importorskip("compressed_tensors")
    scheme = _schemes()["W4A16-per-channel-sharded"][0]
    path = library_directory(tmp_path / "library", scheme, tiny_llama(), max_shard_size="100KB")
    return path, json.loads((path / "model.safetensors.index.json").read_text())["weight_map"]


def test_a_shard_holding_a_tensor_the_index_maps_elsewhere_is_refused(tmp_path):
    """Loaded silently, whichever copy came last would win: the index says which one is meant."""
    path, weight_map = _sharded_library_dir(tmp_path)
    name = "model.layers.1.mlp.down_proj.weight_scale"
    home = weight_map[name]
    other = sorted(set(weight_map.values()) - {home})[0]
    stray = load_file(str(path / other))
    stray[name] = load_file(str(path / home))[name] * 2  # a stale copy of another scale
    save_file(stray, str(path / other), metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=rf"{re.escape(other)}: its tensors differ from what "
                                              rf"model\.safetensors\.index\.json maps to it: not listed there "
                                              rf"\['{re.escape(name)}'\], listed but absent \[\]"):
        compress.load_compressed(path)


def test_an_index_mapping_a_tensor_to_a_shard_without_it_is_refused(tmp_path):
    path, weight_map = _sharded_library_dir(tmp_path)
    name = "model.layers.1.mlp.down_proj.weight_scale"
    other = sorted(set(weight_map.values()) - {weight_map[name]})[0]
    weight_map[name] = other
    (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    with pytest.raises(CheckpointError, match=rf"{re.escape(other)}: .*listed but absent \['{re.escape(name)}'\]"):
        compress.load_compressed(path)


def test_an_index_naming_a_missing_shard_or_no_weights_is_refused(tmp_path):
    path, weight_map = _sharded_library_dir(tmp_path)
    index = path / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": {**weight_map, "extra": "model-absent.safetensors"}}))
    with pytest.raises(CheckpointError, match=r"library: missing model-absent\.safetensors"):
        compress.load_compressed(path)
    index.write_text(json.dumps({"weight_map": {}}))
    with pytest.raises(CheckpointError, match=r"index\.json: expected JSON with a non-empty 'weight_map'"):
        compress.load_compressed(path)
