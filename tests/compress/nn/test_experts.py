"""Tests for compress/nn/experts.py and the plan rules for MoE models: per-expert CompressedLinear math on
shared 3-D Parameters, gradient masking, layouts and configs left dense with a warning, routers and gates
dense, the share of matrix weights logged, configs composed, and the inference module's checks."""
import logging

import pytest
import torch
from torch import nn

import compress
from compress import BlockSparseConfig, W4A16Config, W8A8Config
from compress.nn.experts import CompressedExperts, ExpertLinear, QuantizedExperts
from compress.nn.qat import CompressedLinear, compressed_layers
from compress.plan import Plan

transformers = pytest.importorskip("transformers")
T = transformers
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
            head_dim=32, vocab_size=128)


def _mixtral():
    torch.manual_seed(0)
    return T.MixtralForCausalLM(T.MixtralConfig(num_local_experts=4, num_experts_per_tok=2, **TINY)).eval()


def _routing(tokens=12, experts=4, k=2):
    generator = torch.Generator().manual_seed(2)
    x = torch.randn(tokens, 64, generator=generator)
    index = torch.stack([torch.randperm(experts, generator=generator)[:k] for _ in range(tokens)])
    return x, index, torch.rand(tokens, k, generator=generator)


@pytest.mark.parametrize("configs", [[W8A8Config()], [W4A16Config(32)], [BlockSparseConfig(0.5), W8A8Config()]])
def test_each_expert_computes_what_a_compressed_linear_of_its_weight_computes(configs):
    experts = _mixtral().model.layers[0].mlp.experts
    x, index, weights = _routing()
    with torch.no_grad():
        original = experts(x, index, weights)
    block = CompressedExperts(experts, configs)
    assert block.gate_up_proj is experts.gate_up_proj and block.down_proj is experts.down_proj  # shared
    with torch.no_grad():  # transformers may run its grouped implementation: float rounding differs (measured 3e-9)
        torch.testing.assert_close(block(x, index, weights), original, atol=1e-7, rtol=1e-5)
    for layer in block.layers():
        if layer.sparse_config is not None:
            layer.set_mask(torch.rand(layer.mask.shape, generator=torch.Generator().manual_seed(layer.expert)) > 0.5)
        layer.enable_fake_quant(True)
    for layers, parameter in ((block.gate_up, block.gate_up_proj), (block.down, block.down_proj)):
        for e, layer in enumerate(layers):
            linear = nn.Linear(parameter.shape[2], parameter.shape[1], bias=False)
            linear.weight = nn.Parameter(parameter[e].detach().clone())
            reference = CompressedLinear.from_float(linear, configs)
            if layer.mask is not None:
                reference.set_mask(layer.mask)
            reference.enable_fake_quant(True)
            inputs = torch.randn(5, parameter.shape[2])
            assert torch.equal(layer(inputs), reference(inputs))
    masks = block.masks("gate_up")
    assert masks is None or tuple(masks.shape) == (4, 256 // 32, 64 // 32)


def test_pruned_blocks_get_no_gradient_and_apply_mask_zeroes_them():
    block = CompressedExperts(_mixtral().model.layers[0].mlp.experts, [BlockSparseConfig(0.5)])
    for layer in block.layers():
        layer.set_mask(torch.rand(layer.mask.shape, generator=torch.Generator().manual_seed(layer.expert)) > 0.5)
    x, index, weights = _routing()
    block(x, index, weights).pow(2).sum().backward()
    for layers, parameter in (("gate_up", block.gate_up_proj), ("down", block.down_proj)):
        pruned = ~block.element_masks(layers)
        assert pruned.any() and (parameter.grad[pruned] == 0).all() and (parameter[pruned] == 0).all()


def test_experts_in_another_layout_or_with_static_scales_stay_dense_with_a_warning(caplog):
    config = T.GptOssConfig(num_local_experts=4, num_experts_per_tok=2, **TINY)
    holder = nn.Module()
    holder.experts = T.models.gpt_oss.modeling_gpt_oss.GptOssExperts(config)
    holder.proj = nn.Linear(64, 64)
    with caplog.at_level(logging.WARNING, logger="compress.plan"):
        assert set(Plan({"*": W8A8Config()}).targets(holder)) == {"proj"}
    assert "experts experts (GptOssExperts) left dense" in caplog.text and "transposed" in caplog.text
    caplog.clear()
    model = _mixtral()
    with caplog.at_level(logging.WARNING, logger="compress.plan"):
        compress.prepare(model, W8A8Config(activation="static"))
    assert "static W8A8 activation scales are not supported for experts" in caplog.text
    assert not any(isinstance(m, CompressedExperts) for m in model.modules())
    caplog.clear()
    model = _mixtral()
    with caplog.at_level(logging.WARNING, logger="compress.plan"):
        compress.prepare(model, compress.W8A8BlockConfig())
    assert "W8A8BlockConfig) is not supported for experts yet" in caplog.text
    assert not any(isinstance(m, CompressedExperts) for m in model.modules())


def test_a_pattern_on_a_module_it_cannot_compress_warns(caplog):
    class Scaled(nn.Module):
        def __init__(self):
            super().__init__()
            self.matrix = nn.Parameter(torch.randn(64, 64))

    holder = nn.Sequential(nn.Linear(64, 64), Scaled())
    with caplog.at_level(logging.WARNING, logger="compress.plan"):
        assert set(Plan({"*": W8A8Config()}).targets(holder)) == {"0"}
    assert "1 Scaled modules matched but left dense" in caplog.text


def test_routers_and_gates_stay_dense_and_prepare_logs_the_share_of_matrix_weights(caplog):
    torch.manual_seed(0)
    model = T.Qwen2MoeForCausalLM(T.Qwen2MoeConfig(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=128,
                                                   shared_expert_intermediate_size=128, **TINY))
    with caplog.at_level(logging.INFO, logger="compress.plan"):
        compress.prepare(model, W8A8Config())
    mlp = model.model.layers[0].mlp
    assert type(mlp.shared_expert_gate) is nn.Linear and isinstance(mlp.experts, CompressedExperts)
    assert isinstance(mlp.shared_expert.gate_proj, CompressedLinear)
    assert "shared_expert_gate left dense: a router or gate" in caplog.text
    matrices = sum(p.numel() for p in model.parameters() if p.dim() >= 2)
    prepared = (sum(m.weight_parameter.numel() for m in compressed_layers(model).values()
                    if not isinstance(m, ExpertLinear))
                + mlp.experts.gate_up_proj.numel() + mlp.experts.down_proj.numel())
    assert f"prepared layers hold {100 * prepared / matrices:.1f}% of the model's matrix weights" in caplog.text


def test_plans_compose_on_experts_and_a_conflict_names_the_block_and_changes_nothing():
    model = _mixtral()
    compress.prepare(model, {"*.experts": BlockSparseConfig(0.5)})
    compress.prepare(model, {"*.experts": W8A8Config()})
    block = model.model.layers[0].mlp.experts
    assert all(isinstance(m.quant_config, W8A8Config) and m.sparse_config is not None for m in block.layers())
    with pytest.raises(ValueError, match="model.layers.0.mlp.experts"):
        compress.prepare(model, {"*.experts": W4A16Config()})
    assert all(isinstance(m.quant_config, W8A8Config) for m in block.layers())


def test_quantized_experts_checks_its_modules():
    with pytest.raises(ValueError, match="as many gate_up as down"):
        QuantizedExperts(nn.SiLU(), [nn.Linear(64, 256)], [])
    with pytest.raises(ValueError, match="expert 0: expected gate_up and down"):
        QuantizedExperts(nn.SiLU(), [nn.Linear(64, 256)], [nn.Linear(64, 64)])
    with pytest.raises(ValueError, match="expected a 3-D"):
        ExpertLinear(nn.Parameter(torch.zeros(4, 4)), 0)
