"""Tests for compress/nn/qat.py: shared Parameters, masks that survive AdamW, STE gradients, configs."""
import pytest
import torch
from torch import nn

from compress.configs import BlockSparseConfig, W4A16Config, W8A8BlockConfig, W8A8Config, W8A16Config
from compress.core.sparsity import block_mask, expand_mask
from compress.nn.qat import CompressedLinear


def _layer(configs, n=64, k=96, seed=0):
    torch.manual_seed(seed)
    linear = nn.Linear(k, n)
    return linear, CompressedLinear.from_float(linear, configs)


def test_from_float_shares_parameters_and_starts_as_the_float_layer():
    linear, layer = _layer([BlockSparseConfig(0.5), W8A8Config()])
    assert layer.weight is linear.weight and layer.bias is linear.bias
    x = torch.randn(3, 96)
    assert torch.equal(layer(x), linear(x))
    assert layer.mask.shape == (2, 3) and layer.mask.all()


@pytest.mark.parametrize("configs", [[BlockSparseConfig(0.5)], [BlockSparseConfig(0.5), W8A8Config()],
                                     [BlockSparseConfig(0.5), W4A16Config(32)],
                                     [BlockSparseConfig(0.5), W8A16Config()],
                                     [BlockSparseConfig(0.5), W8A8BlockConfig()]])
def test_masked_blocks_stay_exactly_zero_under_adamw(configs):
    linear, layer = _layer(configs)
    if layer.quant_config is not None:
        layer.enable_fake_quant(True)
    optimizer = torch.optim.AdamW(layer.parameters(), lr=0.1, weight_decay=0.1)
    optimizer.register_step_post_hook(lambda *args: layer.apply_mask_())
    x = torch.randn(16, 96)
    for step in range(6):  # momentum builds before the mask, then must not revive pruned weights
        if step == 3:
            layer.set_mask(block_mask(layer.weight, 0.5))
        optimizer.zero_grad()
        layer(x).pow(2).sum().backward()
        if step >= 3:
            pruned = ~expand_mask(layer.mask, layer.weight.shape)
            assert (layer.weight.grad[pruned] == 0).all()
        optimizer.step()
    pruned = ~expand_mask(layer.mask, layer.weight.shape)
    assert pruned.any() and (layer.weight[pruned] == 0).all()


@pytest.mark.parametrize("config", [W8A8Config(), W4A16Config(32), W8A8Config(learnable_scale=True),
                                    W4A16Config(32, learnable_scale=True), W8A16Config(learnable_scale=True),
                                    W8A16Config(128, learnable_scale=True), W8A8BlockConfig(),
                                    W8A8BlockConfig(learnable_scale=True)])
def test_gradients_flow_through_the_ste(config):
    linear, layer = _layer([config])
    layer.enable_fake_quant(True)
    x = torch.randn(4, 96, requires_grad=True)
    layer(x).sum().backward()
    assert layer.weight.grad.abs().sum() > 0 and x.grad.abs().sum() > 0
    if config.learnable_scale:
        assert layer.weight_scale.grad is not None and layer.weight_scale.grad.abs().sum() > 0


def test_fake_quant_changes_the_output_only_when_enabled():
    linear, layer = _layer([W4A16Config(32)])
    x = torch.randn(4, 96)
    assert torch.equal(layer(x), linear(x))
    layer.enable_fake_quant(True)
    assert not torch.equal(layer(x), linear(x))


@pytest.mark.parametrize("group_size", [None, 128])
def test_w8a16_fake_quantizes_the_weight_on_the_int8_grid_and_keeps_x(group_size):
    """The weight becomes ``q * s`` with q in [-128, 127] (per row, or per 128 input channels of the K padded
    to 128 as the export pads it); x passes unquantized."""
    linear, layer = _layer([W8A16Config(group_size)])
    layer.enable_fake_quant(True)
    x = torch.randn(4, 96)
    w = layer.weight.detach()
    scale = w.abs().amax(dim=1, keepdim=True) / 127  # one group of 128 holds the 96 channels too
    expected = torch.nn.functional.linear(x, torch.clamp(torch.round(w / scale), -128, 127) * scale, linear.bias)
    torch.testing.assert_close(layer(x), expected, rtol=0, atol=1e-6)
    assert tuple(layer._absmax_weight_scale().shape) == ((64,) if group_size is None else (64, 1))


def test_observer_and_static_scale():
    linear, layer = _layer([W8A8Config(activation="static")])
    assert not layer.calibrated and layer.static_act_scale() is None
    layer.observe(True)
    x = torch.randn(8, 96)
    layer(x)
    layer.freeze_observer()
    assert layer.act_scale.item() == pytest.approx(x.abs().max().item() / 127)
    assert not layer.observing and layer.static_act_scale() is not None


def test_conflicting_configs_are_refused():
    with pytest.raises(ValueError, match="at most one quantization config"):
        _layer([W8A8Config(), W4A16Config()])
    linear, layer = _layer([BlockSparseConfig(0.5)])
    with pytest.raises(ValueError, match="at most one BlockSparseConfig"):
        layer.add_configs([BlockSparseConfig(0.75)])
    with pytest.raises(TypeError, match="W8A8Config"):
        _layer(["int8"])


def test_bad_calls_name_the_problem():
    linear, layer = _layer([W4A16Config(32)])
    with pytest.raises(ValueError, match="no BlockSparseConfig"):
        layer.set_mask(torch.ones(2, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="only W8A8"):
        layer.observe(True)
    linear, layer = _layer([BlockSparseConfig(0.5)])
    with pytest.raises(ValueError, match=r"\(2, 3\)"):
        layer.set_mask(torch.ones(3, 3, dtype=torch.bool))
    with pytest.raises(TypeError, match="nn.Linear"):
        CompressedLinear.from_float(nn.Conv1d(2, 2, 1), [W8A8Config()])


def test_state_dict_has_masks_and_scales_and_reloads():
    _, layer = _layer([BlockSparseConfig(0.5), W8A8Config(activation="static", learnable_scale=True)])
    layer.set_mask(block_mask(layer.weight, 0.5))
    layer.observe(True)
    layer(torch.randn(4, 96))
    layer.freeze_observer()
    layer.enable_fake_quant(True)
    state = layer.state_dict()
    assert {"mask", "act_scale", "weight_scale", "observer.stat", "input_smoothing"} <= set(state)
    _, fresh = _layer([BlockSparseConfig(0.5), W8A8Config(activation="static", learnable_scale=True)], seed=1)
    fresh.load_state_dict(state)
    assert torch.equal(fresh.mask, layer.mask) and torch.equal(fresh.act_scale, layer.act_scale)


def test_to_float_keeps_the_masked_weight():
    linear, layer = _layer([BlockSparseConfig(0.5)])
    layer.set_mask(block_mask(layer.weight, 0.5))
    plain = layer.to_float()
    assert type(plain) is nn.Linear and plain.weight is layer.weight
    x = torch.randn(2, 96)
    assert torch.equal(plain(x), layer(x))


def test_half_keeps_scales_and_observer_statistics_float32():
    _, layer = _layer([W8A8Config(activation="static")])
    layer.observe(True)
    layer(torch.randn(4, 96))
    layer.freeze_observer()
    layer.half()
    assert layer.weight.dtype == torch.float16
    assert layer.act_scale.dtype == torch.float32 and layer.input_smoothing.dtype == torch.float32
    assert layer.observer.stat.dtype == torch.float32 and layer.observer.channel_absmax.dtype == torch.float32
