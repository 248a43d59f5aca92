"""Damaged or incomplete compressed-model directories are refused with a CheckpointError that names
the path (and, for manifests, the field) instead of loading wrongly or failing with a stray error.

Two kinds of edit: plain ones (a byte flipped, a field changed), which the digest and the files'
checksums catch; and sealed ones (the same edit with every checksum recomputed, as a tool that rewrites
the manifest would), which the structure checks and the cross-checks against the model catch."""
import json
import logging
import os
import re
import stat

import pytest
import torch
from torch import nn

import compress
from compress import BlockSparseConfig, CheckpointError, W4A16Config, W8A8Config
from compress.checkpoint import MANIFEST, MODEL_CONFIG, TENSORS, load_model_dir
from tests.compress.checkpoint.helpers import (
    library_directory,
    rewrite_tensors,
    tiny_bert_classifier,
    tiny_llama,
    write_sealed,
)
from tests.compress.checkpoint.test_files import fails_instead_of_hanging


def test_compressed_dir_without_manifest_is_refused_not_loaded_as_plain(tmp_path):
    """Without the check, from_pretrained would rebuild the model with random compressed layers."""
    path = compress.save_compressed(compress.convert(tiny_bert_classifier(), W8A8Config()), tmp_path / "w8a8")
    (path / MANIFEST).unlink()
    assert (path / "config.json").is_file() and (path / TENSORS).is_file()  # a plain loader would take it
    with pytest.raises(CheckpointError, match=r"w8a8: looks like a compressed-model directory .*w_q.* "
                                              r"but has no manifest\.json") as error:
        load_model_dir(path)
    assert "\n" not in str(error.value)


def test_dir_with_an_interrupted_save_sibling_and_no_manifest_is_refused(tmp_path):
    plain = tiny_bert_classifier()
    plain.save_pretrained(tmp_path / "model")
    # a sibling a live process (our parent) is still writing: recover leaves it alone, so it stays a trace.
    (tmp_path / f".model.tmp-{os.getppid()}-abc").mkdir()
    with pytest.raises(CheckpointError, match=r"model: looks like .*interrupted-save siblings \['\.model\.tmp-"):
        load_model_dir(tmp_path / "model")
    (tmp_path / f".model.tmp-{os.getppid()}-abc").rmdir()
    assert type(load_model_dir(tmp_path / "model")).__name__ == "BertForSequenceClassification"


# ---- damaged manifests ---------------------------------------------------------------------------
def _converted_mlp():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 96), nn.ReLU(), nn.Linear(96, 64), nn.ReLU(), nn.Linear(64, 64))
    return compress.convert(model, {"0": W8A8Config(), "2": W4A16Config(32), "4": BlockSparseConfig(0.5)})


def _skeleton():
    return nn.Sequential(nn.Linear(64, 96), nn.ReLU(), nn.Linear(96, 64), nn.ReLU(), nn.Linear(64, 64))


def _edit(manifest, case):
    if case == "no files":
        del manifest["files"]
    elif case == "no digest":
        del manifest["digest"]
    elif case == "no tensors":
        del manifest["tensors"]
    elif case == "alias to a missing tensor":
        manifest["aliases"] = {"4.bias_copy": "4.nothing"}
    elif case == "alias over a stored tensor":
        manifest["aliases"] = {"0.bias": "4.bias"}
    elif case == "group size edited":
        manifest["layers"]["2"]["config"]["group_size"] = 64
    elif case == "nnz edited":
        manifest["layers"]["4"]["nnz"] += 1
    elif case == "width edited":
        manifest["layers"]["0"]["in_features"] = 96
    elif case == "unknown config field":
        manifest["layers"]["0"]["config"]["colour"] = "blue"
    elif case == "string in_features":
        manifest["layers"]["2"]["in_features"] = "96"
    return manifest


SEALED_EDITS = [
    ("no files", r"field 'files' is missing"),
    ("no digest", r"field 'digest' is missing"),
    ("no tensors", r"field 'tensors' is missing"),
    ("alias to a missing tensor", r"field 'aliases\.4\.bias_copy': expected the name of a stored tensor.*'4\.nothing'"),
    ("alias over a stored tensor", r"field 'aliases\.0\.bias': expected a name that is not stored"),
    ("group size edited", r"layer '2': tensor '2\.\w+' has shape .* expects .*group_size"),
    ("nnz edited", r"layer '4': tensor '4\.\w+' has shape .* expects .*nnz"),
    ("width edited", r"layer '0': tensor '0\.\w+' has shape .* expects"),
    ("unknown config field", r"field 'layers\.0\.config': .*colour"),
    ("string in_features", r"field 'layers\.2\.in_features': expected a positive integer, got '96'"),
]


@pytest.mark.parametrize("case, fragment", SEALED_EDITS)
def test_sealed_manifest_edits_are_named(tmp_path, case, fragment):
    path = compress.save_compressed(_converted_mlp(), tmp_path / "c")
    manifest = json.loads((path / MANIFEST).read_text())
    write_sealed(path, _edit(manifest, case))
    with pytest.raises(CheckpointError, match=fragment) as error:
        compress.load_compressed(path, model=_skeleton())
    assert str(path) in str(error.value)


@pytest.mark.parametrize("case", ["group size edited", "nnz edited", "width edited"])
def test_plain_manifest_edits_break_the_digest(tmp_path, case):
    path = compress.save_compressed(_converted_mlp(), tmp_path / "c")
    manifest = json.loads((path / MANIFEST).read_text())
    (path / MANIFEST).write_text(json.dumps(_edit(manifest, case)))
    with pytest.raises(CheckpointError, match=r"manifest\.json: field 'digest' does not match"):
        compress.load_compressed(path, model=_skeleton())


@pytest.mark.parametrize("content, fragment", [
    (b"[1, 2, 3]", "expected a JSON object, got a JSON array"),
    (b"\x89PNG\r\n\x1a\n\xff\xfe\x00binary", "damaged manifest, expected UTF-8 JSON"),
])
def test_manifest_that_is_not_a_json_object_is_refused(tmp_path, content, fragment):
    path = compress.save_compressed(_converted_mlp(), tmp_path / "c")
    (path / MANIFEST).write_bytes(content)
    with pytest.raises(CheckpointError, match=fragment) as error:
        compress.load_compressed(path, model=_skeleton())
    assert str(path / MANIFEST) in str(error.value)


def test_only_transformers_model_classes_are_instantiated(tmp_path, monkeypatch):
    transformers = pytest.importorskip("transformers")
    path = compress.save_compressed(compress.convert(tiny_bert_classifier(), W8A8Config()), tmp_path / "c")
    called = []
    monkeypatch.setattr(transformers, "pipeline", lambda *a, **k: called.append(a))
    manifest = json.loads((path / MANIFEST).read_text())
    for name in ("pipeline", "AutoTokenizer", "__class__", "NoSuchModel"):
        manifest["model"]["architecture"] = name
        write_sealed(path, manifest)
        with pytest.raises(CheckpointError, match=rf"field 'model\.architecture': expected a transformers model "
                                                  rf"class .*got '{name}'"):
            load_model_dir(path)
    assert called == []


# ---- damaged bytes and sealed edits of the files -------------------------------------------------
def _bert_checkpoint(tmp_path):
    return compress.save_compressed(compress.convert(tiny_bert_classifier(), W8A8Config()), tmp_path / "bert")


@pytest.mark.parametrize("name", [TENSORS, MODEL_CONFIG, MANIFEST])
def test_a_flipped_byte_in_any_file_is_refused_naming_it(tmp_path, name):
    path = _bert_checkpoint(tmp_path)
    data = bytearray((path / name).read_bytes())
    position = len(data) // 2
    data[position] = ord("7") if data[position] != ord("7") else ord("8")  # stays valid UTF-8 in the JSON files
    (path / name).write_bytes(bytes(data))
    with pytest.raises(CheckpointError) as error:
        load_model_dir(path)
    assert str(path / name) in str(error.value)


def test_an_edited_model_config_is_refused(tmp_path):
    path = _bert_checkpoint(tmp_path)
    config = json.loads((path / MODEL_CONFIG).read_text())
    config.update(hidden_act="relu", layer_norm_eps=0.1)
    (path / MODEL_CONFIG).write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"config\.json: checksum mismatch"):
        load_model_dir(path)


@pytest.mark.parametrize("content", [b"truncated", b"\x80\x04\x95pickle"])
def test_a_sealed_unreadable_tensor_file_is_refused(tmp_path, content):
    path = _bert_checkpoint(tmp_path)
    (path / TENSORS).write_bytes(content)
    write_sealed(path, json.loads((path / MANIFEST).read_text()))
    with pytest.raises(CheckpointError, match=r"model\.safetensors: not a readable safetensors file"):
        load_model_dir(path)


def test_a_sealed_integer_tensor_of_another_dtype_is_refused(tmp_path):
    path = compress.save_compressed(_converted_mlp(), tmp_path / "c")
    rewrite_tensors(path, lambda t: t.update({"0.w_q": t["0.w_q"].to(torch.int16)}))
    with pytest.raises(CheckpointError, match=r"layer '0': tensor '0\.w_q' is torch\.int16 but the layer expects "
                                              r"torch\.int8"):
        compress.load_compressed(path, model=_skeleton())


def test_a_sealed_alias_the_model_does_not_tie_is_refused(tmp_path):
    """Layer 4's weights aliased into layer 2 (same shape): both dense, untied in the model."""
    def three_layers():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64))

    path = compress.save_compressed(compress.convert(three_layers(), {"0": W8A8Config()}), tmp_path / "c")
    rewrite_tensors(path, lambda t: t.pop("2.weight"))
    manifest = json.loads((path / MANIFEST).read_text())
    manifest["aliases"] = {"2.weight": "4.weight"}
    write_sealed(path, manifest)
    with pytest.raises(CheckpointError, match=r"field 'aliases\.2\.weight': the model does not tie '2\.weight' "
                                              r"to '4\.weight'"):
        compress.load_compressed(path, model=three_layers())


def _edit_indices(case):
    def edit(tensors):
        crow, col = tensors["4.crow_indices"].clone(), tensors["4.col_indices"].clone()
        if case == "column out of range":
            col[0] = 2
        elif case == "negative column":
            col[-1] = -1
        elif case == "crow past nnz":
            crow[-1] = col.numel() + 5
        elif case == "crow decreasing":
            crow[1] = crow[2] + 1
        elif case == "columns out of order":
            row = int((crow[1:] - crow[:-1]).argmax())  # a block row holding two blocks
            first = int(crow[row])
            col[first], col[first + 1] = col[first + 1].clone(), col[first].clone()
        tensors["4.crow_indices"], tensors["4.col_indices"] = crow, col
    return edit


@pytest.mark.parametrize("case, fragment", [
    ("column out of range", r"col_indices: expected block columns in \[0, 2\)"),
    ("negative column", r"col_indices: expected block columns in \[0, 2\) .*= -1"),
    ("crow past nnz", r"crow_indices: expected crow_indices\[-1\] == nnz"),
    ("crow decreasing", r"crow_indices: expected non-decreasing values"),
    ("columns out of order", r"col_indices: expected strictly increasing block columns"),
])
def test_sealed_bad_block_sparse_indices_are_refused_naming_the_layer(tmp_path, case, fragment):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 96), nn.ReLU(), nn.Linear(96, 64), nn.ReLU(), nn.Linear(64, 64))
    with torch.no_grad():
        model[4].weight[:32, 32:] = 0  # block (0, 1) absent; block row 1 keeps both of its blocks
    converted = compress.convert(model, {"0": W8A8Config(), "2": W4A16Config(32), "4": BlockSparseConfig(0.25)})
    path = compress.save_compressed(converted, tmp_path / "c")
    rewrite_tensors(path, _edit_indices(case))
    with pytest.raises(CheckpointError, match=rf"model\.safetensors: layer '4': {fragment}"):
        compress.load_compressed(path, model=_skeleton())


def test_a_format_version_1_directory_loads_with_a_warning(tmp_path, caplog):
    path = compress.save_compressed(_converted_mlp(), tmp_path / "c")
    manifest = json.loads((path / MANIFEST).read_text())
    manifest.update(format_version=1, sha256=manifest.pop("files")[TENSORS])
    del manifest["digest"]
    (path / MANIFEST).write_text(json.dumps(manifest))
    with caplog.at_level(logging.WARNING, logger="compress.checkpoint.manifest"):
        loaded = compress.load_compressed(path, model=_skeleton())
    assert torch.equal(loaded[0].w_q, _converted_mlp()[0].w_q)
    assert "format_version 1" in caplog.text and "not the manifest" in caplog.text


# ---- files that are not regular files; compressed-tensors directories that lost their config ----------
def _llama_w8a8(tmp_path, name="ct"):
    """A compressed-tensors export of ours (W8A8 layers, a dense lm_head)."""
    model = compress.convert(tiny_llama(), {f"model.layers.{i}.mlp.down_proj": W8A8Config() for i in range(2)})
    return compress.save_compressed(model, tmp_path / name, format="compressed-tensors")


def _replace_with_pipe(path):
    path.unlink()
    os.mkfifo(path)


@pytest.mark.parametrize("name", [MANIFEST, MODEL_CONFIG, TENSORS])
def test_a_pipe_in_our_directory_is_refused_by_load_and_save_without_blocking(tmp_path, name):
    path = compress.save_compressed(_converted_mlp(), tmp_path / "c")
    _replace_with_pipe(path / name) if (path / name).exists() else os.mkfifo(path / name)
    refusal = rf"c/{re.escape(name)}: expected a regular file, got a named pipe"
    with fails_instead_of_hanging():
        with pytest.raises(CheckpointError, match=refusal):
            compress.load_compressed(path, model=_skeleton())
        with pytest.raises(CheckpointError, match=refusal):
            load_model_dir(path)
        if name == MANIFEST:  # the save reads it to tell whether the directory is ours: refused, kept
            with pytest.raises(CheckpointError, match=refusal):
                compress.save_compressed(_converted_mlp(), path, overwrite=True)
            assert stat.S_ISFIFO(os.stat(path / name).st_mode)
        else:  # a checkpoint of ours, replaced whole with overwrite=True (the pipe is never opened)
            compress.save_compressed(_converted_mlp(), path, overwrite=True)
            assert torch.equal(compress.load_compressed(path, model=_skeleton())[0].w_q, _converted_mlp()[0].w_q)


@pytest.mark.parametrize("name", [MODEL_CONFIG, TENSORS, "compress-export.json", "generation_config.json"])
def test_a_pipe_in_a_compressed_tensors_or_plain_directory_is_refused_without_blocking(tmp_path, name):
    for path in (_llama_w8a8(tmp_path), _plain_bert(tmp_path)):
        if (path / name).exists():
            _replace_with_pipe(path / name)
        else:
            os.mkfifo(path / name)
        with fails_instead_of_hanging(), pytest.raises(CheckpointError, match=rf"{re.escape(name)}: expected a "
                                                                              "regular file, got a named pipe"):
            load_model_dir(path)


def _plain_bert(tmp_path):
    tiny_bert_classifier().save_pretrained(tmp_path / "plain")
    return tmp_path / "plain"


def _without_quantization_config(path):
    config = json.loads((path / MODEL_CONFIG).read_text())
    del config["quantization_config"]
    (path / MODEL_CONFIG).write_text(json.dumps(config))


@pytest.mark.parametrize("marker", [True, False], ids=["export-marker-kept", "export-marker-gone"])
def test_a_compressed_tensors_dir_without_its_quantization_config_is_refused(tmp_path, marker):
    """Loaded as plain, its int8 down_proj weights would be re-initialised at random."""
    path = _llama_w8a8(tmp_path)
    _without_quantization_config(path)
    if not marker:
        (path / "compress-export.json").unlink()
    fragment = r"compress-export\.json, the marker" if marker else (
        r"model\.safetensors holds quantized-layer tensors such as \['model\.layers\.0\.mlp\.down_proj\.weight', "
        r"'model\.layers\.0\.mlp\.down_proj\.weight_scale'")
    with pytest.raises(CheckpointError, match=rf"ct: looks like a compressed-model directory \(.*{fragment}.*\) but "
                                              r"has no manifest\.json and no compressed-tensors quantization_config"):
        load_model_dir(path)


def test_a_sharded_library_dir_without_its_quantization_config_is_refused(tmp_path):
    pytest.importorskip("compressed_tensors")
    from compressed_tensors.quantization import preset_name_to_scheme

    path = library_directory(tmp_path / "library", preset_name_to_scheme("W4A16", ["Linear"]), tiny_llama(),
                             max_shard_size="100KB")
    _without_quantization_config(path)
    assert not (path / TENSORS).exists()
    with pytest.raises(CheckpointError, match=r"model-\d+-of-\d+\.safetensors holds quantized-layer tensors such "
                                              r"as \[.*weight_packed"):
        load_model_dir(path)
