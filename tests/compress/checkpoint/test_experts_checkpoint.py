"""Checkpoints of MoE models: a QuantizedExperts block saves as a manifest entry of its own with its experts'
layers, loads back bit for bit, and an entry whose sizes the rebuilt model does not have is refused."""
import json

import pytest
import torch

import compress
from compress import W4A16Config
from compress.checkpoint import MANIFEST, CheckpointError
from compress.nn.experts import QuantizedExperts
from tests.compress.checkpoint.helpers import write_sealed

transformers = pytest.importorskip("transformers")


def _saved_olmoe(path):
    torch.manual_seed(0)
    config = transformers.OlmoeConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=2,
                                      num_key_value_heads=1, vocab_size=128, num_experts=4, num_experts_per_tok=2)
    model = compress.convert(compress.prepare(transformers.OlmoeForCausalLM(config).eval(), W4A16Config(32)))
    compress.save_compressed(model, path)
    return model


def test_experts_round_trip_and_their_manifest_entry(tmp_path):
    model = _saved_olmoe(tmp_path / "model")
    entry = json.loads((tmp_path / "model" / MANIFEST).read_text())["layers"]["model.layers.0.mlp.experts"]
    assert entry == {"module": "QuantizedExperts", "in_features": 64, "out_features": 64, "bias": False,
                     "num_experts": 4, "intermediate_size": 128}
    loaded = compress.load_compressed(tmp_path / "model")
    assert isinstance(loaded.model.layers[0].mlp.experts, QuantizedExperts)
    saved, restored = model.state_dict(), loaded.state_dict()
    assert saved.keys() == restored.keys() and all(torch.equal(saved[k], restored[k]) for k in saved)


def test_an_experts_entry_with_other_sizes_is_refused(tmp_path):
    _saved_olmoe(tmp_path / "model")
    manifest = json.loads((tmp_path / "model" / MANIFEST).read_text())
    manifest["layers"]["model.layers.0.mlp.experts"]["num_experts"] = 8
    write_sealed(tmp_path / "model", manifest)
    with pytest.raises(CheckpointError, match="expected an experts block of .*'num_experts': 8"):
        compress.load_compressed(tmp_path / "model")
