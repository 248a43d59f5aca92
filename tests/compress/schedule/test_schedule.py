"""Tests for compress/schedule/schedule.py: a plain PyTorch loop with the schedule (prune + QAT +
calibration + SmoothQuant; GPTQ at finish) trains a model whose export computes the same function;
finishing early; saving and resuming gives the uninterrupted run's model; clear errors."""
import io

import pytest
import torch
from torch import nn

import compress
from compress import (
    BlockSparseConfig,
    CalibrationSchedule,
    CompressionSchedule,
    PruningSchedule,
    QuantizationSchedule,
    W4A16Config,
    W8A8Config,
)
from compress.core.sparsity import expand_mask, mask_sparsity
from compress.nn.qat import compressed_layers
from tests.compress.models import PreNormMLP


def batches(count=12, seed=0):
    """``count`` (x, y) batches of 8 rows; channel 3 is an outlier for SmoothQuant to move."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(count, 8, 64, generator=generator)
    x[..., 3] *= 20
    return list(zip(x, torch.randint(0, 4, (count, 8), generator=generator)))


def model_and_optimizer():
    torch.manual_seed(0)
    model = PreNormMLP()
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)


def train(model, optimizer, schedule, data, until):
    """The plain loop: forward, backward, the schedule around optimizer.step(), up to step ``until``."""
    while schedule.global_step < until:
        x, y = data[schedule.global_step]
        nn.functional.cross_entropy(model(x), y).backward()
        schedule.before_optimizer_step(optimizer)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad()


def full_schedule(model, score="movement"):
    return CompressionSchedule(model, pruning=PruningSchedule(0.5, start_step=0, end_step=6, frequency=2, score=score),
                               quantization=QuantizationSchedule(W8A8Config(activation="static"), start_step=2),
                               calibration=CalibrationSchedule(num_batches=2, smoothquant_alpha=0.5))


def test_a_plain_loop_trains_the_function_the_export_computes():
    model, optimizer = model_and_optimizer()
    schedule = full_schedule(model)
    assert {n: type(m).__name__ for n, m in model.named_children()}["up"] == "CompressedLinear"
    train(model, optimizer, schedule, batches(), until=8)
    schedule.finish()
    layers = compressed_layers(model)
    assert set(layers) == {"up", "down"}
    for layer in layers.values():
        assert mask_sparsity(layer.mask) == pytest.approx(0.5)
        assert (layer.weight[~expand_mask(layer.mask, tuple(layer.weight.shape))] == 0).all()
        assert layer.fake_quant_enabled and layer.act_scale.item() > 0 and not layer.observing
    assert not model._forward_pre_hooks  # SmoothQuant's input recorder is gone
    assert model.norm.weight[3] < 0.5 or model.up.smoothing() is not None  # the outlier channel moved
    x = batches(1, seed=1)[0][0]
    with torch.no_grad():
        trained = model(x)
        compress.convert(model)
        exported = model(x)
    assert type(model.up).__name__ == "BSRW8A8Linear" and model.up.config.static
    torch.testing.assert_close(exported, trained, atol=1e-3, rtol=1e-3)


def test_fake_quantization_starts_at_its_step():
    model, optimizer = model_and_optimizer()
    schedule = CompressionSchedule(model, quantization=QuantizationSchedule(W4A16Config(32), start_step=2))
    flags = [model.up.fake_quant_enabled]
    for step in range(3):
        train(model, optimizer, schedule, batches(), until=step + 1)
        flags.append(model.up.fake_quant_enabled)
    assert flags == [False, False, True, True]
    # a bare config: step 0
    assert CompressionSchedule(PreNormMLP(), quantization=W8A8Config()).model.up.fake_quant_enabled


def test_finishing_early_gives_final_masks_and_fake_quantization():
    model, optimizer = model_and_optimizer()
    schedule = CompressionSchedule(model, pruning=PruningSchedule(0.5, start_step=1, end_step=10, frequency=1),
                                   quantization=QuantizationSchedule(W8A8Config(), start_step=50))
    train(model, optimizer, schedule, batches(), until=4)
    assert 0 < mask_sparsity(model.up.mask) < 0.5 and not model.up.fake_quant_enabled
    schedule.finish()
    assert mask_sparsity(model.up.mask) == pytest.approx(0.5) and model.up.fake_quant_enabled
    assert schedule.pruning.done and schedule.finished
    x = batches(1, seed=1)[0][0]
    with torch.no_grad():
        trained = model(x)
        compress.convert(model)
        torch.testing.assert_close(model(x), trained, atol=1e-3, rtol=1e-3)


def test_gptq_runs_at_finish_on_the_data_it_is_given():
    model, optimizer = model_and_optimizer()
    schedule = CompressionSchedule(model, quantization=W4A16Config(32, algorithm="gptq"))
    train(model, optimizer, schedule, batches(), until=3)
    with pytest.raises(ValueError, match="need calibration_data"):
        schedule.finish()
    assert not schedule.finished
    schedule.finish(calibration_data=batches(2, seed=2))
    assert model.up.weight_quantized and model.down.weight_quantized
    x = batches(1, seed=1)[0][0]
    with torch.no_grad():
        trained = model(x)
        compress.convert(model)
        torch.testing.assert_close(model(x), trained, atol=1e-3, rtol=1e-3)
    assert model.up.config.algorithm == "gptq"


@pytest.mark.parametrize("score", ["movement", "fisher", "magnitude"])
def test_resume_from_saved_state_continues_like_the_uninterrupted_run(score):
    data = batches()
    model, optimizer = model_and_optimizer()
    schedule = full_schedule(model, score)
    train(model, optimizer, schedule, data, until=8)
    schedule.finish()

    first, first_optimizer = model_and_optimizer()
    first_schedule = full_schedule(first, score)
    train(first, first_optimizer, first_schedule, data, until=3)  # mid-pruning, mid-calibration (after smoothing)
    assert first_schedule.calibration.phase == "observe" and 0 < mask_sparsity(first.up.mask) < 0.5
    buffer = io.BytesIO()
    torch.save({"model": first.state_dict(), "optimizer": first_optimizer.state_dict(),
                "schedule": first_schedule.state_dict()}, buffer)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)

    resumed, resumed_optimizer = model_and_optimizer()
    resumed_schedule = full_schedule(resumed, score)
    resumed.load_state_dict(saved["model"])
    resumed_optimizer.load_state_dict(saved["optimizer"])
    resumed_schedule.load_state_dict(saved["schedule"])
    assert resumed_schedule.global_step == 3 and resumed.up.fake_quant_enabled and resumed.up.observing
    train(resumed, resumed_optimizer, resumed_schedule, data, until=8)
    resumed_schedule.finish()
    for name, tensor in model.state_dict().items():
        assert torch.equal(resumed.state_dict()[name], tensor), name
    for name, total in schedule.pruning.gradient_scores.items():
        assert torch.equal(resumed_schedule.pruning.gradient_scores[name], total), name


def test_a_finished_schedule_restores_finished():
    model, optimizer = model_and_optimizer()
    schedule = CompressionSchedule(model, pruning=PruningSchedule(0.5, end_step=10),
                                   quantization=QuantizationSchedule(W8A8Config(), start_step=10))
    train(model, optimizer, schedule, batches(), until=2)
    schedule.finish()
    fresh = CompressionSchedule(model, pruning=PruningSchedule(0.5, end_step=10),
                                quantization=QuantizationSchedule(W8A8Config(), start_step=10))
    model.up.enable_fake_quant(False)
    fresh.load_state_dict(schedule.state_dict())
    assert fresh.finished and fresh.pruning.done and model.up.fake_quant_enabled


@pytest.mark.parametrize("make, error, fragment", [
    (lambda m: CompressionSchedule(m), ValueError, "got neither"),
    (lambda m: CompressionSchedule("model", quantization=W8A8Config()), TypeError, "nn.Module"),
    (lambda m: CompressionSchedule(m, pruning=0.5), TypeError, "PruningSchedule or None"),
    (lambda m: CompressionSchedule(m, quantization=BlockSparseConfig(0.5)), TypeError, "QuantizationSchedule"),
    (lambda m: CompressionSchedule(m, quantization=W8A8Config(), calibration=8), TypeError, "CalibrationSchedule"),
    (lambda m: CompressionSchedule(m, quantization=W8A8Config(activation="static")), ValueError,
     "calibration=CalibrationSchedule"),
])
def test_bad_arguments_get_clear_errors(make, error, fragment):
    with pytest.raises(error, match=fragment):
        make(PreNormMLP())


def test_misuse_of_the_steps_gets_clear_errors():
    model, optimizer = model_and_optimizer()
    schedule = CompressionSchedule(model, pruning=PruningSchedule(0.5, end_step=4, score="movement"))
    nn.functional.cross_entropy(model(batches()[0][0]), batches()[0][1]).backward()
    optimizer.step()
    with pytest.raises(RuntimeError, match="before_optimizer_step"):
        schedule.step()
    calibrating = CompressionSchedule(PreNormMLP(), quantization=W8A8Config(activation="static"),
                                      calibration=CalibrationSchedule(num_batches=4))
    with pytest.raises(ValueError, match="after 0 of 4 batches"):
        calibrating.finish()
    done = CompressionSchedule(PreNormMLP(), quantization=W8A8Config())
    done.finish()
    with pytest.raises(RuntimeError, match="finished"):
        done.step()


def test_loading_the_state_of_another_schedule_is_refused():
    pruned = CompressionSchedule(PreNormMLP(), pruning=PruningSchedule(0.5))
    quantized = CompressionSchedule(PreNormMLP(), quantization=W8A8Config())
    with pytest.raises(ValueError, match="has pruning state, this one has none"):
        quantized.load_state_dict(pruned.state_dict())
    with pytest.raises(ValueError, match="has no pruning state, this one has a PruningSchedule"):
        pruned.load_state_dict(quantized.state_dict())
    with pytest.raises(ValueError, match="'global_step'"):
        pruned.load_state_dict({"step": 3})


class RenamedMLP(PreNormMLP):
    """PreNormMLP's shapes under other layer names (``fc1``, ``fc2``)."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = self.up, self.down
        del self.up, self.down

    def forward(self, x):
        return self.classifier(x + self.fc2(torch.relu(self.fc1(self.norm(x)))))


def trained_schedule(until=3, **pruning):
    model, optimizer = model_and_optimizer()
    schedule = CompressionSchedule(model, pruning=PruningSchedule(**{"sparsity": 0.5, "end_step": 6, "frequency": 2,
                                                                     "score": "movement", **pruning}),
                                   quantization=QuantizationSchedule(W8A8Config(), start_step=2))
    train(model, optimizer, schedule, batches(), until=until)
    return schedule


def test_the_state_names_its_parts_settings_and_layers():
    state = trained_schedule().state_dict()
    assert state["global_step"] == 3 and state["parts"] == ["pruning", "quantization"]
    assert set(state["pruning"]["layers"]) == set(state["quantization"]["layers"]) == {"up", "down"}
    assert state["pruning"]["settings"]["sparsity"] == 0.5 and state["quantization"]["settings"]["start_step"] == 2


def test_resuming_with_another_sparsity_is_refused_and_changes_nothing():
    saved = trained_schedule().state_dict()
    model = PreNormMLP()
    changed = CompressionSchedule(model, pruning=PruningSchedule(0.7, end_step=6, frequency=2, score="movement"),
                                  quantization=QuantizationSchedule(W8A8Config(), start_step=2))
    masks = {name: layer.mask.clone() for name, layer in compressed_layers(model).items()}
    with pytest.raises(ValueError, match=r"PruningSchedule.load_state_dict: the saved state was made with "
                                         r"sparsity=0\.5, this schedule has sparsity=0\.7"):
        changed.load_state_dict(saved)
    assert changed.global_step == 0 and changed.pruning.last_pruned_step == 0
    assert all(torch.equal(layer.mask, masks[name]) for name, layer in compressed_layers(model).items())


def test_the_state_of_another_model_with_the_same_shapes_is_refused():
    saved = trained_schedule().state_dict()
    other = CompressionSchedule(RenamedMLP(), pruning=PruningSchedule(0.5, end_step=6, frequency=2, score="movement"),
                                quantization=QuantizationSchedule(W8A8Config(), start_step=2))
    with pytest.raises(ValueError, match=r"expected the state of this model's layers \['fc1', 'fc2'\], got the state "
                                         r"of layers \['down', 'up'\]"):
        other.load_state_dict(saved)


def test_a_later_part_refused_leaves_the_earlier_parts_as_they_were():
    saved = trained_schedule().state_dict()
    saved["quantization"]["settings"]["start_step"] = 5
    schedule = trained_schedule(until=1)
    position = (schedule.global_step, schedule.pruning.last_pruned_step,
                {n: t.clone() for n, t in schedule.pruning.gradient_scores.items()})
    with pytest.raises(ValueError, match="QuantizationSchedule.load_state_dict: the saved state was made with "
                                         "start_step=5, this schedule has start_step=2"):
        schedule.load_state_dict(saved)
    assert (schedule.global_step, schedule.pruning.last_pruned_step) == position[:2]
    assert all(torch.equal(schedule.pruning.gradient_scores[n], t) for n, t in position[2].items())


@pytest.mark.parametrize("edit, fragment", [
    (dict(global_step=-1), "saved global_step: expected a non-negative int, got -1"),
    (dict(global_step=2.0), "saved global_step: expected a non-negative int, got 2.0"),
    (dict(finished="no"), "expected a bool 'finished', got 'no'"),
    (dict(parts=["pruning"]), "the saved schedule has no quantization state, this one has a QuantizationSchedule"),
    (dict(parts="pruning"), "expected 'parts' as a list of"),
    (dict(parts=["pruning", "quantization", "calibration"]),
     "expected the calibration state that its 'parts' list names, got keys"),
    (dict(global_step=1), r"expected the pruning schedule's last re-scoring at global_step \(1\) or before, got "
                          r"last_pruned_step=2"),
])
def test_an_inconsistent_state_is_refused(edit, fragment):
    saved = {**trained_schedule().state_dict(), **edit}
    with pytest.raises(ValueError, match=fragment):
        trained_schedule(until=0).load_state_dict(saved)


def test_a_state_written_before_parts_settings_and_layers_were_recorded_still_loads():
    schedule = trained_schedule()
    saved = schedule.state_dict()
    old = {"global_step": saved["global_step"], "finished": False,
           "pruning": {k: v for k, v in saved["pruning"].items() if k not in ("settings", "layers")}}
    resumed = trained_schedule(until=0)
    resumed.load_state_dict(old)
    assert resumed.global_step == 3 and resumed.pruning.last_pruned_step == 2
    assert all(torch.equal(resumed.pruning.gradient_scores[n], t) for n, t in schedule.pruning.gradient_scores.items())


def test_a_second_before_optimizer_step_in_one_step_is_refused():
    model, optimizer = model_and_optimizer()
    schedule = CompressionSchedule(model, pruning=PruningSchedule(0.5, end_step=4, score="movement"))
    train(model, optimizer, schedule, batches(), until=2)
    x, y = batches()[2]
    nn.functional.cross_entropy(model(x), y).backward()
    schedule.before_optimizer_step(optimizer)
    summed = {n: t.clone() for n, t in schedule.pruning.gradient_scores.items()}
    with pytest.raises(RuntimeError, match=r"scores of step 2 were already summed for 'down' and 1 more layers; "
                                           r"before_optimizer_step\(\).*"
                                           r"step\(\) \(after optimizer.step\(\)\) must run"):
        schedule.before_optimizer_step(optimizer)
    assert all(torch.equal(schedule.pruning.gradient_scores[n], t) for n, t in summed.items())
    optimizer.step()
    schedule.step()
    optimizer.zero_grad()
    train(model, optimizer, schedule, batches(), until=4)  # the loop goes on as before


def test_a_second_before_optimizer_step_without_gradient_scores_is_accepted():
    model, optimizer = model_and_optimizer()
    schedule = CompressionSchedule(model, pruning=PruningSchedule(0.5, end_step=4), quantization=W8A8Config())
    nn.functional.cross_entropy(model(batches()[0][0]), batches()[0][1]).backward()
    schedule.before_optimizer_step(optimizer)
    schedule.before_optimizer_step(optimizer)  # magnitude scores read no gradients: nothing to count twice
    optimizer.step()
    schedule.step()
    assert schedule.global_step == 1


def test_gradient_sums_of_other_shapes_are_refused_before_anything_changes():
    saved = trained_schedule().state_dict()
    torch.manual_seed(0)
    wider = CompressionSchedule(PreNormMLP(ffn=256), quantization=QuantizationSchedule(W8A8Config(), start_step=2),
                                pruning=PruningSchedule(0.5, end_step=6, frequency=2, score="movement"))
    with pytest.raises(ValueError, match=r"movement scores of 'up': expected shape \(8, 2\), got \(4, 2\)"):
        wider.load_state_dict(saved)
    assert wider.global_step == 0 and all(not total.any() for total in wider.pruning.gradient_scores.values())
