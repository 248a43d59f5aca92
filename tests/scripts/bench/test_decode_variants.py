"""scripts.bench.decode_variants on the CPU: the seeded model, the variants' modules and block masks."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import compress

from compress.core.quant import dequantize_groupwise, quantize_groupwise
from compress.nn.fusion import SiblingGroup, fuse_siblings
from compress.nn.inference import BSRLinear, BSRW4A16Linear, BSRW8A8Linear
from scripts.bench import decode_variants as variants

CPU = torch.device("cpu")


def _tiny_model(seed: int = 0, dtype=torch.float16):
    return variants.build_model(variants.llama_config(1, tiny=True, max_positions=16), dtype, CPU, seed)


def test_build_model_is_seeded():
    a, b, c = _tiny_model(3), _tiny_model(3), _tiny_model(4)
    wa, wb, wc = (m.model.layers[0].mlp.up_proj.weight for m in (a, b, c))
    assert torch.equal(wa, wb) and not torch.equal(wa, wc)
    assert wa.dtype == torch.float16 and 0.015 < wa.float().std() < 0.025
    assert torch.get_default_dtype() == torch.float32  # restored after the build


def test_build_model_seeds_a_mixtral_experts_and_router_too():
    from transformers import MixtralConfig

    config = MixtralConfig(hidden_size=32, intermediate_size=48, num_local_experts=4, num_attention_heads=2,
                           num_key_value_heads=1, vocab_size=64, num_hidden_layers=1)
    a, b = (variants.build_model(config, torch.float32, CPU, 5) for _ in range(2))
    experts, router = a.model.layers[0].mlp.experts, a.model.layers[0].mlp.gate
    assert torch.equal(experts.gate_up_proj, b.model.layers[0].mlp.experts.gate_up_proj)
    assert torch.equal(router.weight, b.model.layers[0].mlp.gate.weight)
    assert 0.015 < experts.down_proj.std() < 0.025 and 0.015 < router.weight.std() < 0.025


def test_siblings_fuse_into_two_groups_per_layer_with_the_same_bytes():
    model = _tiny_model()
    before = variants.weight_bytes(model)
    assert fuse_siblings(model, dense=True) == 2
    assert sum(isinstance(m, SiblingGroup) for m in model.modules()) == 2
    assert variants.weight_bytes(model) == before


def test_random_block_sparsity_prunes_exactly_the_fraction():
    model = _tiny_model()
    variants.apply_random_block_sparsity(model, 0.75, seed=1)
    layers = [m for m in model.model.layers.modules() if isinstance(m, BSRLinear)]
    assert len(layers) == 7
    for layer in layers:
        blocks = (layer.out_features // 32) * (layer.in_features // 32)
        assert layer.nnz == blocks - int(0.75 * blocks)
    assert isinstance(model.lm_head, nn.Linear)  # lm_head stays dense


@pytest.mark.parametrize(("name", "module_type"), [("dds50-w8a8", BSRW8A8Linear), ("dds50-w4a16", BSRW4A16Linear)])
def test_block_sparse_quantized_variants_export_their_block_modules(name, module_type):
    model = _tiny_model()
    variants.VARIANTS[name].apply(model, 0)
    layers = [m for m in model.model.layers.modules() if isinstance(m, module_type)]
    assert len(layers) == 7 and all(layer.nnz == layer.crow_indices[-1] for layer in layers)
    assert all(2 * layer.nnz == (layer.out_features // 32) * (layer.in_features // 32) for layer in layers)


def test_tinygemm_module_matches_our_dequantized_int4_weights():
    torch.manual_seed(0)
    linear = nn.Linear(256, 64, bias=False)
    module = variants.TinygemmInt4Linear.from_float(linear, group_size=128)
    q, scales = quantize_groupwise(linear.weight.detach(), 128)
    x = torch.randn(3, 5, 256, dtype=torch.bfloat16)
    y = module(x)
    want = x.float() @ dequantize_groupwise(q, scales, 128).T
    assert y.shape == (3, 5, 64) and y.dtype == torch.bfloat16
    assert ((y.float() - want).norm() / want.norm()) < 1e-2
    assert "group_size=128" in repr(module)


def test_int8_weight_only_module_holds_our_w8a16_weights():
    torch.manual_seed(0)
    linear = nn.Linear(256, 64, bias=False).half()
    module = variants.WeightInt8Linear.from_float(linear)
    ours = compress.nn.inference.W8A16Linear.from_float(linear, compress.W8A16Config())
    assert torch.equal(module.w_q, ours.w_q) and module.scales.dtype == torch.float16
    x = torch.randn(3, 5, 256, dtype=torch.float16)
    y = module(x)
    assert y.shape == (3, 5, 64) and y.dtype == torch.float16
    assert ((y.float() - ours(x).float()).norm() / ours(x).float().norm()) < 2e-3  # scales rounded to fp16
    assert "int8 weights per channel" in repr(module)
    with pytest.raises(ValueError, match="without bias"):
        variants.WeightInt8Linear.from_float(nn.Linear(256, 64, bias=True))


def test_tinygemm_module_rejects_bad_layers():
    with pytest.raises(ValueError, match="N % 16"):
        variants.TinygemmInt4Linear.from_float(nn.Linear(256, 40, bias=False))
    with pytest.raises(ValueError, match="without bias"):
        variants.TinygemmInt4Linear.from_float(nn.Linear(256, 64, bias=True))


def test_anchor_variants_swap_every_decoder_linear_and_keep_lm_head():
    model = _tiny_model()
    variants.VARIANTS["no-linears"].apply(model, 0)
    assert not any(isinstance(m, nn.Linear) for m in model.model.layers.modules())
    assert sum(isinstance(m, variants.SkippedLinear) for m in model.modules()) == 7
    x = torch.randn(2, 128, dtype=torch.float16)
    assert torch.equal(model.model.layers[0].mlp.down_proj(torch.randn(2, 256).half()), torch.zeros(2, 128).half())
    assert isinstance(model.lm_head, nn.Linear) and model.lm_head(x).shape == (2, 512)


def test_every_variant_has_a_dtype_and_the_default_order_starts_with_the_baseline():
    assert variants.ALL_VARIANTS[0] == "fp16" and set(variants.ALL_VARIANTS) == set(variants.VARIANTS)
    assert variants.VARIANTS["int4-aten"].dtype == torch.bfloat16
    assert [n for n, v in variants.VARIANTS.items() if not v.compiled] == ["fp16-eager"]
