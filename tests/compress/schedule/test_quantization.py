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


def bound_schedule(plan, start_step=0, model=None):
    torch.manual_seed(0)
    model = model if model is not None else nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64))
    schedule = QuantizationSchedule(plan, start_step=start_step)
    schedule.prepare(model)
    schedule.bind(model)
    return schedule


def test_the_state_records_start_step_and_each_layers_config():
    state = bound_schedule({"0": W8A8Config(), "2": W4A16Config(32)}, start_step=3).state_dict()
    assert state["settings"] == {"start_step": 3}
    assert state["layers"] == {"0": W8A8Config().to_dict(), "2": W4A16Config(32).to_dict()}
    bound_schedule({"0": W8A8Config(), "2": W4A16Config(32)}, start_step=3).load_state_dict(state)


def test_a_state_made_with_another_start_step_is_refused():
    state = bound_schedule(W8A8Config(), start_step=3).state_dict()
    with pytest.raises(ValueError, match="made with start_step=3, this schedule has start_step=5"):
        QuantizationSchedule(W8A8Config(), start_step=5).load_state_dict(state)


def test_a_state_made_with_another_config_is_refused_at_bind_naming_the_layer():
    state = bound_schedule({"0": W8A8Config(), "2": W4A16Config(32)}).state_dict()
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64))
    changed = QuantizationSchedule({"0": W8A8Config(), "2": W4A16Config(64)})
    changed.prepare(model)
    changed.load_state_dict(state)
    with pytest.raises(ValueError, match="layer '2': saved with group_size=32, this schedule has group_size=64"):
        changed.bind(model)
    with pytest.raises(ValueError, match="layer '2': saved with type='W4A16Config', this schedule has "
                                         "type='W8A8Config'"):
        bound_schedule(W8A8Config()).load_state_dict(state)


def test_the_state_of_another_model_is_refused():
    state = bound_schedule(W8A8Config()).state_dict()
    other = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Identity(), nn.Linear(64, 64))
    with pytest.raises(ValueError, match=r"only in the state: \['2'\]; only in this model: \['3'\]"):
        bound_schedule(W8A8Config(), model=other).load_state_dict(state)
    bound_schedule(W8A8Config(), model=other).load_state_dict({})  # written before anything was recorded
