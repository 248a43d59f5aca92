"""Tests for compress/schedule/calibration.py used directly: the phases, SmoothQuant's recorded batch,
state, and a model with nothing to calibrate."""
import pytest
import torch
from torch import nn

import compress
from compress import W8A8Config
from compress.schedule import CalibrationSchedule


def prepared(activation="static"):
    torch.manual_seed(0)
    model = nn.Sequential(nn.LayerNorm(64), nn.Linear(64, 64))
    return compress.prepare(model, W8A8Config(activation=activation))


def test_observe_then_freeze_after_num_batches():
    model = prepared()
    calibration = CalibrationSchedule(num_batches=2)
    calibration.bind(model)
    for expected in ("observe", "done"):
        model(torch.randn(4, 64))
        calibration.batch_done()
        assert calibration.phase == expected
    assert model[1].act_scale.item() > 0 and not model[1].observing and int(model[1].observer.batches) == 2


def test_smoothquant_replays_the_latest_training_batch_and_drops_it():
    model = prepared()
    calibration = CalibrationSchedule(num_batches=1, smoothquant_alpha=0.5)
    calibration.bind(model)
    x = torch.randn(4, 64)
    x[:, 3] *= 30
    model(x)
    calibration.batch_done()
    assert calibration.phase == "observe" and calibration.batches_seen == 0
    assert not model._forward_pre_hooks and model[1].observing
    assert model[0].weight[3] < 0.5 or model[1].smoothing() is not None


def test_smoothquant_without_a_training_forward_is_a_clear_error():
    model = prepared()
    calibration = CalibrationSchedule(num_batches=1, smoothquant_alpha=0.5)
    calibration.bind(model)
    model.eval()
    model(torch.randn(4, 64))  # eval mode: not a training batch
    with pytest.raises(ValueError, match="no forward of the model in training mode"):
        calibration.batch_done()


def test_state_round_trip_resumes_the_phase():
    model = prepared()
    calibration = CalibrationSchedule(num_batches=3, observer="percentile")
    calibration.bind(model)
    model(torch.randn(4, 64))
    calibration.batch_done()
    restored = CalibrationSchedule(num_batches=3, observer="percentile")
    restored.load_state_dict(calibration.state_dict())
    model[1].observing = False
    restored.bind(model)
    assert (restored.phase, restored.batches_seen) == ("observe", 1)
    assert model[1].observing and int(model[1].observer.batches) == 1 and model[1].observer.kind == "percentile"
    with pytest.raises(ValueError, match="expected a phase in"):
        restored.load_state_dict({"phase": "warmup"})


@pytest.mark.parametrize("make, fragment", [
    (lambda: CalibrationSchedule(num_batches=0), "positive int"),
    (lambda: CalibrationSchedule(observer="minmax"), "'absmax'"),
    (lambda: CalibrationSchedule(smoothquant_alpha=True), r"\[0, 1\]"),
])
def test_bad_arguments_get_clear_errors(make, fragment):
    with pytest.raises(ValueError, match=fragment):
        make()


def test_a_model_without_w8a8_layers_warns_and_is_done():
    model = compress.prepare(nn.Sequential(nn.Linear(64, 64)), compress.W4A16Config(32))
    calibration = CalibrationSchedule()
    with pytest.warns(UserWarning, match="nothing to do"):
        calibration.bind(model)
    assert calibration.phase == "done"


def test_the_state_records_the_settings_and_the_w8a8_layers():
    calibration = CalibrationSchedule(num_batches=3, observer="percentile", smoothquant_alpha=0.5)
    calibration.bind(prepared())
    state = calibration.state_dict()
    assert state["settings"] == {"num_batches": 3, "observer": "percentile", "smoothquant_alpha": 0.5}
    assert state["layers"] == {"1": W8A8Config(activation="static").to_dict()}
    assert (state["phase"], state["batches_seen"]) == ("smooth", 0)


@pytest.mark.parametrize("change, fragment", [
    (dict(num_batches=4), "made with num_batches=3, this schedule has num_batches=4"),
    (dict(observer="absmax"), "made with observer='percentile', this schedule has observer='absmax'"),
])
def test_a_state_made_with_other_settings_is_refused(change, fragment):
    calibration = CalibrationSchedule(num_batches=3, observer="percentile")
    calibration.bind(prepared())
    changed = CalibrationSchedule(**{"num_batches": 3, "observer": "percentile", **change})
    with pytest.raises(ValueError, match=fragment):
        changed.load_state_dict(calibration.state_dict())
    assert (changed.phase, changed.batches_seen) == ("observe", 0)


@pytest.mark.parametrize("state, fragment", [
    ({"phase": "observe", "batches_seen": -1}, "saved batches_seen: expected a non-negative int, got -1"),
    ({"phase": "observe", "batches_seen": 5}, "expected at most num_batches=3 batches seen, got batches_seen=5"),
    ({"phase": "smooth", "batches_seen": 0}, r"expected a phase in \('observe', 'done'\), got 'smooth' \(smoothing "
                                             r"needs smoothquant_alpha\)"),
])
def test_a_bad_position_is_refused(state, fragment):
    with pytest.raises(ValueError, match=fragment):
        CalibrationSchedule(num_batches=3).load_state_dict(state)


def test_the_state_of_other_w8a8_layers_is_refused_at_bind():
    calibration = CalibrationSchedule(num_batches=3)
    calibration.bind(prepared())
    dynamic = prepared(activation="dynamic")
    restored = CalibrationSchedule(num_batches=3)
    restored.load_state_dict(calibration.state_dict())
    with pytest.raises(ValueError, match="layer '1': saved with activation='static', this schedule has "
                                         "activation='dynamic'"):
        restored.bind(dynamic)
