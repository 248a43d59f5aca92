"""Tests for compress/schedule/quantization.py: accepted plans, what the configs need, the start step."""
import pytest
import torch
from torch import nn

from compress import BlockSparseConfig, W4A16Config, W8A8Config, W8A16Config
from compress.schedule import QuantizationSchedule


@pytest.mark.parametrize("plan, fragment", [
    ("int8", "W8A8Config, W4A16Config, W8A16Config or W8A8BlockConfig, or a mapping"),
    ({"*": BlockSparseConfig(0.5)}, "for '\\*', got BlockSparseConfig"),
])
def test_a_plan_of_anything_but_quantization_configs_is_refused(plan, fragment):
    with pytest.raises(TypeError, match=fragment):
        QuantizationSchedule(plan)


def test_start_step_is_checked():
    with pytest.raises(ValueError, match="non-negative int"):
        QuantizationSchedule(W8A8Config(), start_step=-1)


def test_what_the_configs_need():
    mixed = QuantizationSchedule({"*up*": W8A8Config(activation="static"), "*": W4A16Config(32, algorithm="gptq")})
    assert mixed.needs_static_scales and mixed.needs_gptq
    plain = QuantizationSchedule(W8A8Config())
    assert not plain.needs_static_scales and not plain.needs_gptq
    weight_only = QuantizationSchedule(W8A16Config(algorithm="gptq"))
    assert weight_only.needs_gptq and not weight_only.needs_static_scales


def test_fake_quantization_switches_on_from_the_start_step_and_stays_on():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64))
    schedule = QuantizationSchedule({"0": W8A8Config()}, start_step=3)
    schedule.prepare(model)
    schedule.bind(model)
    assert list(schedule.layers) == ["0"] and type(model[2]) is nn.Linear
    schedule.start_if_due(2)
    assert not model[0].fake_quant_enabled
    schedule.start_if_due(3)
    schedule.start_if_due(4)
    assert model[0].fake_quant_enabled
