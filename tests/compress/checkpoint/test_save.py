"""compress/checkpoint/save.py: a model never converted is refused unless saved as a float model on purpose,
and the config.json of every save is a plain one, without the quantization_config a loaded model carried."""
import json

import pytest
import torch
from torch import nn

import compress
from compress import W8A8Config
from compress.checkpoint import MODEL_CONFIG
from tests.compress.checkpoint.helpers import logits, tiny_llama, token_ids

transformers = pytest.importorskip("transformers")

GGUF_CONFIG = {"quant_method": "gguf"}  # what transformers leaves on a model it loaded from a GGUF file


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 32))


def _llama_from_gguf():
    """A tiny Llama whose config carries a GGUF quantization_config, as a GGUF-loaded SmolLM2's does."""
    model = tiny_llama()
    model.config.quantization_config = dict(GGUF_CONFIG)
    return model


def test_a_model_never_converted_is_refused_and_nothing_is_written(tmp_path):
    with pytest.raises(ValueError, match=r"save_compressed: the model \(Sequential\) has no compressed layers: it was "
                                         r"never converted \(call compress\.convert\(model\) first\).*pass "
                                         r"float_model=True"):
        compress.save_compressed(_mlp(), tmp_path / "c")
    assert list(tmp_path.iterdir()) == []


def test_float_model_saves_a_float_model_and_refuses_a_compressed_one(tmp_path):
    model = _mlp()
    path = compress.save_compressed(model, tmp_path / "float", float_model=True)
    loaded = compress.load_compressed(path, model=_mlp().apply(lambda m: torch.nn.init.zeros_(m.weight)
                                                               if isinstance(m, nn.Linear) else None))
    assert all(torch.equal(loaded.state_dict()[n], t) for n, t in model.state_dict().items())
    converted = compress.convert(_mlp(), {"0": W8A8Config()})
    with pytest.raises(ValueError, match=r"float_model=True but the model has compressed layers \['0'\] \(1 in all\)"):
        compress.save_compressed(converted, tmp_path / "c", float_model=True)
    with pytest.raises(ValueError, match=r"float_model=True: only format='compress' saves a float model"):
        compress.save_compressed(tiny_llama(), tmp_path / "ct", float_model=True, format="compressed-tensors")
    with pytest.raises(TypeError, match=r"float_model: expected a bool, got str"):
        compress.save_compressed(model, tmp_path / "c", float_model="yes")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["float"]


def test_a_float_model_dir_is_a_plain_float_checkpoint_other_tools_load(tmp_path):
    """Its config.json keeps no GGUF quantization_config: transformers loads it as a float model."""
    model = _llama_from_gguf()
    path = compress.save_compressed(model, tmp_path / "float", float_model=True)
    config = json.loads((path / MODEL_CONFIG).read_text())
    assert "quantization_config" not in config and config["architectures"] == ["LlamaForCausalLM"]
    assert model.config.quantization_config == GGUF_CONFIG  # the model in memory is left as it was
    theirs = transformers.AutoModelForCausalLM.from_pretrained(str(path)).eval()
    torch.testing.assert_close(logits(theirs, token_ids()), logits(model, token_ids()), rtol=0, atol=0)
    ours = compress.load_compressed(path)
    assert getattr(ours.config, "quantization_config", None) is None


def test_a_compressed_save_of_a_gguf_loaded_model_drops_the_gguf_config_too(tmp_path):
    model = compress.convert(_llama_from_gguf(), {"model.layers.0.mlp.down_proj": W8A8Config()})
    path = compress.save_compressed(model, tmp_path / "c")
    assert "quantization_config" not in json.loads((path / MODEL_CONFIG).read_text())
    torch.testing.assert_close(logits(compress.load_compressed(path), token_ids()), logits(model, token_ids()))
