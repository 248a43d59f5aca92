"""Damaged or incomplete compressed-model directories are refused with a CheckpointError that names
the path (and, for manifests, the field) instead of loading wrongly or failing with a stray error."""
import json
import os

import pytest
import torch
from torch import nn

import compress
from compress import BlockSparseConfig, CheckpointError, W4A16Config, W8A8Config
from compress.checkpoint import MANIFEST, TENSORS, load_model_dir
from tests.compress.test_checkpoint import _tiny_bert_classifier


def test_compressed_dir_without_manifest_is_refused_not_loaded_as_plain(tmp_path):
    """Without the check, from_pretrained would rebuild the model with random compressed layers."""
    path = compress.save_compressed(compress.convert(_tiny_bert_classifier(), W8A8Config()), tmp_path / "w8a8")
    (path / MANIFEST).unlink()
    assert (path / "config.json").is_file() and (path / TENSORS).is_file()  # a plain loader would take it
    with pytest.raises(CheckpointError, match=r"w8a8: looks like a compressed-model directory .*w_q.* "
                                              r"but has no manifest\.json") as error:
        load_model_dir(path)
    assert "\n" not in str(error.value)


def test_dir_with_an_interrupted_save_sibling_and_no_manifest_is_refused(tmp_path):
    plain = _tiny_bert_classifier()
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
    if case == "no sha256":
        del manifest["sha256"]
    elif case == "no tensors":
        del manifest["tensors"]
    elif case == "alias to a missing tensor":
        manifest["aliases"] = {"4.bias_copy": "4.nothing"}
    elif case == "group size edited":
        manifest["layers"]["2"]["config"]["group_size"] = 64
    elif case == "nnz edited":
        manifest["layers"]["4"]["nnz"] += 1
    elif case == "unknown config field":
        manifest["layers"]["0"]["config"]["colour"] = "blue"
    elif case == "string in_features":
        manifest["layers"]["2"]["in_features"] = "96"
    return manifest


@pytest.mark.parametrize("case, fragment", [
    ("no sha256", r"field 'sha256' is missing"),
    ("no tensors", r"field 'tensors' is missing"),
    ("alias to a missing tensor", r"field 'aliases\.4\.bias_copy': expected the name of a stored tensor.*'4\.nothing'"),
    ("group size edited", r"layer '2': tensor '2\.\w+' has shape .* expects .*group_size"),
    ("nnz edited", r"layer '4': tensor '4\.\w+' has shape .* expects .*nnz"),
    ("unknown config field", r"field 'layers\.0\.config': .*colour"),
    ("string in_features", r"field 'layers\.2\.in_features': expected a positive integer, got '96'"),
])
def test_damaged_manifest_fields_are_named(tmp_path, case, fragment):
    path = compress.save_compressed(_converted_mlp(), tmp_path / "c")
    manifest = json.loads((path / MANIFEST).read_text())
    (path / MANIFEST).write_text(json.dumps(_edit(manifest, case)))
    with pytest.raises(CheckpointError, match=fragment) as error:
        compress.load_compressed(path, model=_skeleton())
    assert str(path) in str(error.value)


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
    path = compress.save_compressed(compress.convert(_tiny_bert_classifier(), W8A8Config()), tmp_path / "c")
    called = []
    monkeypatch.setattr(transformers, "pipeline", lambda *a, **k: called.append(a))
    manifest = json.loads((path / MANIFEST).read_text())
    for name in ("pipeline", "AutoTokenizer", "__class__", "NoSuchModel"):
        manifest["model"]["architecture"] = name
        (path / MANIFEST).write_text(json.dumps(manifest))
        with pytest.raises(CheckpointError, match=rf"field 'model\.architecture': expected a transformers model "
                                                  rf"class .*got '{name}'"):
            load_model_dir(path)
    assert called == []
