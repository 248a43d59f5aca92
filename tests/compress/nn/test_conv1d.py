"""Tests for compress/nn/conv1d.py and transformers' Conv1D (GPT-2) through prepare, convert, GPTQ,
calibration, rollback and save / load (the four schemes' full stages are in tests/compress/test_architectures.py)."""
import copy
import logging

import pytest
import torch
from torch import nn

import compress
from compress import BlockSparseConfig, Plan, W4A16Config, W8A8Config
from compress.lightning.callbacks import strip_training_modules
from compress.nn.conv1d import conv1d_from_linear, is_conv1d, linear_features, linear_from_conv1d
from compress.nn.inference import W4A16Linear, W8A8Linear
from compress.nn.qat import compressed_layers

transformers = pytest.importorskip("transformers")
from transformers.pytorch_utils import Conv1D  # noqa: E402

CONV1D_NAMES = {"transformer.h.0.attn.c_attn", "transformer.h.0.attn.c_proj", "transformer.h.0.mlp.c_fc",
                "transformer.h.0.mlp.c_proj"}


def _gpt2(n_embd=64, seed=0):
    torch.manual_seed(seed)
    config = transformers.GPT2Config(n_embd=n_embd, n_layer=1, n_head=2, vocab_size=128, n_positions=64,
                                     bos_token_id=1, eos_token_id=2, pad_token_id=0)
    return transformers.GPT2LMHeadModel(config).eval()


def _ids(seed=1, batch=2, length=8):
    return torch.randint(3, 128, (batch, length), generator=torch.Generator().manual_seed(seed))


def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits


def test_linear_from_conv1d_computes_the_same_and_leaves_the_conv1d_as_it_was():
    torch.manual_seed(0)
    conv = Conv1D(48, 64)
    nn.init.normal_(conv.bias)
    weight = conv.weight.detach().clone()
    linear = linear_from_conv1d(conv)
    assert (linear.in_features, linear.out_features) == (64, 48) == linear_features(conv)
    assert linear.weight is not conv.weight and torch.equal(linear.weight, weight.T) and linear.weight.is_contiguous()
    assert linear.bias is conv.bias and torch.equal(conv.weight, weight)
    x = torch.randn(3, 5, 64)
    torch.testing.assert_close(linear(x), conv(x), atol=1e-6, rtol=1e-6)
    back = conv1d_from_linear(linear.weight, linear.bias)
    assert is_conv1d(back) and back.bias is conv.bias and torch.equal(back.weight, weight)
    assert torch.equal(back(x), conv(x))


def test_bad_input_gets_clear_errors():
    with pytest.raises(TypeError, match="expected a transformers Conv1D, got Linear"):
        linear_from_conv1d(nn.Linear(4, 4))
    conv = Conv1D(48, 64)
    conv.weight = nn.Parameter(torch.zeros(48, 64))
    with pytest.raises(ValueError, match=r"shape \(nx, nf\) = \(64, 48\), got \(48, 64\)"):
        linear_from_conv1d(conv)
    with pytest.raises(TypeError, match="expected an nn.Linear or a transformers Conv1D, got Conv2d"):
        linear_features(nn.Conv2d(3, 3, 3))


def test_prepare_takes_gpt2_conv1d_layers_computes_the_same_and_logs_the_count(caplog):
    model, ids = _gpt2(), _ids()
    original = _logits(model, ids)
    with caplog.at_level(logging.INFO, logger="compress.plan"):
        compress.prepare(model, [BlockSparseConfig(0.5), W8A8Config()])
    layers = compressed_layers(model)
    assert set(layers) == CONV1D_NAMES and all(layer.from_conv1d for layer in layers.values())
    assert "prepare: 4 transformers Conv1D layers converted to nn.Linear" in caplog.text
    torch.testing.assert_close(_logits(model, ids), original, atol=1e-5, rtol=1e-5)


def test_gpt2_lm_head_is_tied_to_the_embedding_and_stays_dense(caplog):
    model = _gpt2()
    with caplog.at_level(logging.INFO, logger="compress.plan"):
        compress.prepare(model, Plan({"*": W8A8Config()}, exclude=()))
    assert set(compressed_layers(model)) == CONV1D_NAMES
    assert "plan: lm_head left dense: its weight is the embedding transformer.wte's (tied)" in caplog.text
    compress.convert(model)
    assert type(model.lm_head) is nn.Linear and model.lm_head.weight is model.transformer.wte.weight


def test_a_conv1d_whose_weight_another_module_holds_stays_dense(caplog):
    class Shared(nn.Module):
        def __init__(self):
            super().__init__()
            self.first, self.second, self.other = Conv1D(64, 64), Conv1D(64, 64), Conv1D(64, 64)
            self.second.weight = self.first.weight

        def forward(self, x):
            return self.other(self.second(self.first(x)))

    model = Shared()
    with caplog.at_level(logging.INFO, logger="compress.plan"):
        compress.prepare(model, W8A8Config())
    assert set(compressed_layers(model)) == {"other"} and model.second.weight is model.first.weight
    assert "plan: first left dense: a Conv1D whose weight second also holds" in caplog.text


def test_a_conv1d_exported_dense_is_a_conv1d_again_and_saves_and_loads(tmp_path):
    """n_embd = 48: c_fc (48 -> 192) is not made of 32x32 blocks, so sparsity alone exports it dense."""
    model, ids = _gpt2(n_embd=48), _ids()
    compress.convert(model, {"*.mlp.c_fc": BlockSparseConfig(0.5), "*.attn.c_attn": W8A8Config()})
    assert is_conv1d(model.transformer.h[0].mlp.c_fc) and isinstance(model.transformer.h[0].attn.c_attn, W8A8Linear)
    assert is_conv1d(model.transformer.h[0].attn.c_proj)  # not in the plan: untouched
    out = _logits(model, ids)
    compress.save_compressed(model, tmp_path / "m")
    loaded = compress.load_compressed(tmp_path / "m")
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), loaded.state_dict().values()))
    torch.testing.assert_close(_logits(loaded, ids), out, atol=1e-6, rtol=1e-6)


def test_the_float_snapshot_of_a_prepared_gpt2_saves_and_loads_as_gpt2(tmp_path):
    """What ``compress run`` saves as ``float/``: the training modules stripped, Conv1D layers again."""
    model, ids = _gpt2(), _ids()
    compress.prepare(model, [BlockSparseConfig(0.5), W4A16Config(32)])
    compress.plan.prune_one_shot(model)
    expected = _logits(model, ids)  # fake quantization off: the pruned float model
    snapshot = strip_training_modules(copy.deepcopy(model))
    assert all(is_conv1d(snapshot.get_submodule(name)) for name in CONV1D_NAMES)
    compress.save_compressed(snapshot, tmp_path / "float", float_model=True)
    loaded = compress.load_compressed(tmp_path / "float")
    torch.testing.assert_close(_logits(loaded, ids), expected, atol=1e-5, rtol=1e-5)


def test_a_failed_convert_puts_the_conv1d_layers_back():
    model, ids = _gpt2(), _ids()
    before = {name: model.get_submodule(name) for name in CONV1D_NAMES}
    original = _logits(model, ids)
    with pytest.raises(ValueError, match="need calibration_data"):
        compress.convert(model, W8A8Config(activation="static"))
    assert all(model.get_submodule(name) is module for name, module in before.items())
    assert torch.equal(_logits(model, ids), original)


def test_post_training_gptq_on_gpt2_beats_round_to_nearest():
    batches = [{"input_ids": _ids(seed)} for seed in range(4)]
    reference = [_logits(_gpt2(), b["input_ids"]) for b in batches]
    errors = {}
    for algorithm in ("rtn", "gptq"):
        model = compress.convert(_gpt2(), W4A16Config(32, algorithm=algorithm), calibration_data=batches)
        assert {n for n, m in model.named_modules() if isinstance(m, W4A16Linear)} == CONV1D_NAMES
        errors[algorithm] = sum((_logits(model, b["input_ids"]) - y).norm().item() for b, y in zip(batches, reference))
    assert errors["gptq"] < 0.8 * errors["rtn"]  # measured: 0.41


def test_post_training_static_w8a8_with_smoothquant_on_gpt2():
    model, ids = _gpt2(), _ids(9)
    original = _logits(model, ids)
    compress.convert(model, W8A8Config(activation="static", smoothquant_alpha=0.5),
                     calibration_data=[{"input_ids": _ids(seed)} for seed in range(3)])
    layer = model.transformer.h[0].attn.c_attn
    assert isinstance(layer, W8A8Linear) and layer.config.static
    out = _logits(model, ids)
    assert (out - original).norm() / original.norm() < 0.05
