"""Reordering MLP neurons: the function is unchanged, the order follows importance, blocks keep more mass."""
from __future__ import annotations

import pytest
import torch
from torch import nn
from transformers import BertConfig, BertModel, LlamaConfig, LlamaForCausalLM

import compress
from compress.core.neuron_order import find_mlps, kept_mass, neuron_importance, reorder_mlp_neurons

LLAMA = dict(hidden_size=64, intermediate_size=128, num_attention_heads=2, num_key_value_heads=2, vocab_size=50,
             num_hidden_layers=2, max_position_embeddings=32)
BERT = dict(vocab_size=40, hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
            max_position_embeddings=32)


def _llama():
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**LLAMA)).eval()


def _bert():
    torch.manual_seed(0)
    return BertModel(BertConfig(**BERT)).eval()


def _output(model, ids):
    out = model(input_ids=ids)
    return out.logits if hasattr(out, "logits") else out.last_hidden_state


@pytest.mark.parametrize("make, names", [
    (_llama, ["model.layers.0.mlp", "model.layers.1.mlp"]),
    (_bert, ["encoder.layer.0", "encoder.layer.1"]),
])
def test_reorder_keeps_the_function_and_sorts_by_importance(make, names):
    model = make()
    ids = torch.randint(0, 40, (2, 12))
    with torch.no_grad():
        before = _output(model, ids)
        importances = [neuron_importance(mlp) for mlp in find_mlps(model)]
        assert reorder_mlp_neurons(model) == names
        after = _output(model, ids)
    torch.testing.assert_close(after, before, rtol=1e-5, atol=1e-5)
    for mlp, old in zip(find_mlps(model), importances):
        new = neuron_importance(mlp)
        assert torch.all(new[:-1] >= new[1:])  # descending
        torch.testing.assert_close(new.sort().values, old.sort().values)  # the same neurons, moved


def test_gate_rows_move_with_up_rows():
    model = _llama()
    mlp = find_mlps(model)[0]
    gate, up, down = mlp.inputs[0].weight.clone(), mlp.inputs[1].weight.clone(), mlp.output.weight.clone()
    order = torch.argsort(neuron_importance(mlp), descending=True, stable=True)
    reorder_mlp_neurons(model)
    assert torch.equal(mlp.inputs[0].weight, gate[order]) and torch.equal(mlp.inputs[1].weight, up[order])
    assert torch.equal(mlp.output.weight, down[:, order])


def test_interleaved_weak_neurons_end_up_in_blocks_that_prune_cleanly():
    lin_up, lin_down = nn.Linear(64, 128), nn.Linear(128, 64)
    model = nn.Module()
    model.up_proj, model.down_proj = lin_up, lin_down
    strength = torch.tensor([1.0, 0.05]).repeat(64)  # strong and weak neurons alternate
    with torch.no_grad():
        lin_up.weight.copy_(torch.randn(128, 64) * strength[:, None])
        lin_down.weight.copy_(torch.randn(64, 128) * strength[None, :])
    up_before, down_before = kept_mass(lin_up.weight, 0.5), kept_mass(lin_down.weight, 0.5)
    reorder_mlp_neurons(model)
    assert kept_mass(lin_up.weight, 0.5) > up_before + 0.3  # whole blocks of weak neurons now go first
    assert kept_mass(lin_down.weight, 0.5) > down_before + 0.3
    assert kept_mass(lin_up.weight, 0.5) > 0.9


def test_parameters_keep_their_identity():
    model = _bert()
    params = {name: id(p) for name, p in model.named_parameters()}
    reorder_mlp_neurons(model)
    assert params == {name: id(p) for name, p in model.named_parameters()}


def test_refuses_layers_already_quantization_prepared():
    model = _bert()
    compress.prepare(model, compress.W8A8Config())
    with pytest.raises(ValueError, match="before .*QuantizationAware"):
        reorder_mlp_neurons(model)


def test_accepts_fresh_block_sparse_layers_with_all_ones_masks():
    model = _bert()
    compress.prepare(model, compress.BlockSparseConfig(sparsity=0.5))
    assert len(reorder_mlp_neurons(model)) == 2


def test_kept_mass_of_uniform_blocks_is_the_kept_share():
    assert kept_mass(torch.ones(64, 64), 0.5) == pytest.approx(0.5)
    assert kept_mass(torch.ones(64, 64), 0.0) == pytest.approx(1.0)
