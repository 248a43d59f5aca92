"""Tests for compress/schedule/pruning.py used directly (the schedule's math through a loop is tested in
test_schedule.py and, through Lightning, in tests/compress/lightning/test_callbacks.py): which
gradients are summed, non-finite steps, the final re-scoring, state for another model."""
import pytest
import torch
from torch import nn

from compress.core.sparsity import mask_sparsity, movement_block_scores
from compress.schedule import PruningSchedule


def two_layers():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64))
    return model


def bound(model, **kwargs):
    pruning = PruningSchedule(0.5, **kwargs)
    pruning.prepare(model)
    pruning.bind(model)
    return pruning


def backward(model):
    model(torch.randn(4, 64)).pow(2).sum().backward()


def test_accumulate_sums_only_the_layers_the_optimizer_updates():
    model = two_layers()
    pruning = bound(model, end_step=10, score="movement")
    optimizer = torch.optim.SGD(model[0].parameters(), lr=0.1)  # the first layer only
    backward(model)
    pruning.accumulate(optimizer)
    expected = movement_block_scores(model[0].weight, model[0].weight.grad)
    assert torch.equal(pruning.gradient_scores["0"], expected) and expected.any()
    assert not pruning.gradient_scores["2"].any()
    pruning.accumulate()  # no optimizer: every layer with a gradient
    assert pruning.gradient_scores["2"].any()


def test_a_step_with_a_non_finite_gradient_adds_nothing():
    model = two_layers()
    pruning = bound(model, end_step=10, score="fisher")
    backward(model)
    model[2].weight.grad[0, 0] = float("inf")
    pruning.accumulate()
    assert not any(total.any() for total in pruning.gradient_scores.values())


def test_finish_prunes_to_the_final_sparsity_once():
    model = two_layers()
    pruning = bound(model, start_step=5, end_step=20)
    assert not pruning.prune_if_due(4) and mask_sparsity(model[0].mask) == 0
    pruning.finish(step=4)
    assert pruning.done and mask_sparsity(model[0].mask) == pytest.approx(0.5)
    assert not pruning.prune_if_due(30)


def test_restored_sums_of_another_shape_are_refused():
    model = two_layers()
    pruning = PruningSchedule(score="movement")
    pruning.prepare(model)
    sums = {"0": torch.zeros(3, 3), "2": torch.zeros(2, 2)}
    pruning.load_state_dict({"last_pruned_step": 0, "gradient_scores": sums})
    with pytest.raises(ValueError, match=r"expected shape \(2, 2\), got \(3, 3\)"):
        pruning.bind(model)


def renamed_two_layers():
    """The layers of :func:`two_layers` (same shapes) under other names."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Identity(), nn.Linear(64, 64))


def test_the_state_records_the_settings_and_the_layers():
    state = bound(two_layers(), end_step=10, score="movement").state_dict()
    assert state["settings"] == {"sparsity": 0.5, "start_step": 0, "end_step": 10, "frequency": 10,
                                 "score": "movement", "allocation": "layer", "spread": 0.5, "algorithm": "score",
                                 "tile_rows": 1}
    assert state["layers"] == {name: {"type": "BlockSparseConfig", "sparsity": 0.5, "block": 32, "score": "movement",
                                      "algorithm": "score", "obs_damping": 0.01, "obs_rounds": 8, "tile_rows": 1}
                               for name in ("0", "2")}
    assert set(state["gradient_scores"]) == {"0", "2"}


@pytest.mark.parametrize("score", ["magnitude", "movement"])
def test_the_state_of_another_model_is_refused_when_bound_and_at_bind(score):
    saved = bound(two_layers(), score=score).state_dict()
    with pytest.raises(ValueError, match=r"expected the state of this model's layers \['0', '3'\], got the state of "
                                         r"layers \['0', '2'\]"):
        bound(renamed_two_layers(), score=score).load_state_dict(saved)
    model = renamed_two_layers()
    unbound = PruningSchedule(0.5, score=score)
    unbound.prepare(model)
    unbound.load_state_dict(saved)  # layers not known yet: checked at bind
    assert unbound.state_dict()["layers"] == saved["layers"]  # what was loaded is what a save before bind writes
    with pytest.raises(ValueError, match=r"only in the state: \['2'\]; only in this model: \['3'\]"):
        unbound.bind(model)


@pytest.mark.parametrize("change, fragment", [
    (dict(sparsity=0.7), r"made with sparsity=0\.5, this schedule has sparsity=0\.7"),
    (dict(score="l2"), r"made with score='magnitude', this schedule has score='l2'"),
    (dict(end_step=20), r"made with end_step=100, this schedule has end_step=20"),
    (dict(allocation="global"), r"made with allocation='layer', this schedule has allocation='global'"),
    (dict(tile_rows=2), r"made with tile_rows=1, this schedule has tile_rows=2"),
])
def test_a_state_made_with_other_settings_is_refused(change, fragment):
    saved = bound(two_layers()).state_dict()
    changed = PruningSchedule(**{"sparsity": 0.5, **change})
    with pytest.raises(ValueError, match=fragment + ".*resume with"):
        changed.load_state_dict(saved)
    assert changed.last_pruned_step is None


def test_a_plan_whose_layer_sparsity_changed_is_refused_naming_the_layer():
    model = two_layers()
    saved = PruningSchedule(plan={"0": 0.5, "2": 0.25})
    saved.prepare(model)
    saved.bind(model)
    changed = PruningSchedule(plan={"0": 0.5, "2": 0.75})
    other = two_layers()
    changed.prepare(other)
    changed.load_state_dict(saved.state_dict())
    with pytest.raises(ValueError, match=r"layer '2': saved with sparsity=0\.25, this schedule has sparsity=0\.75"):
        changed.bind(other)


@pytest.mark.parametrize("last, fragment", [
    (-1, "saved last_pruned_step: expected a non-negative int, got -1"),
    (True, "saved last_pruned_step: expected a non-negative int, got True"),
    (3, r"expected a last re-scoring at start_step \(5\) or later, got last_pruned_step=3"),
])
def test_a_bad_last_re_scoring_is_refused(last, fragment):
    pruning = PruningSchedule(start_step=5)
    with pytest.raises(ValueError, match=fragment):
        pruning.load_state_dict({"last_pruned_step": last})


def test_gradient_sums_must_be_tensors():
    with pytest.raises(ValueError, match=r"expected gradient_scores as \{layer name: tensor\}, got list"):
        PruningSchedule(score="movement").load_state_dict({"last_pruned_step": 0, "gradient_scores": [1.0]})


def test_a_state_written_before_settings_and_layers_were_recorded_still_loads():
    model = two_layers()
    full = bound(model, end_step=10, score="movement").state_dict()
    old = {"last_pruned_step": 0, "gradient_scores": {n: t + 1 for n, t in full["gradient_scores"].items()}}
    restored = bound(model, end_step=10, score="movement")
    restored.load_state_dict(old)
    restored.bind(model)
    assert restored.last_pruned_step == 0 and torch.equal(restored.gradient_scores["0"], torch.ones(2, 2))
    with pytest.raises(ValueError, match=r"got the state of layers \['0'\]"):  # old sums name their layers
        restored.load_state_dict({"last_pruned_step": 0, "gradient_scores": {"0": torch.ones(2, 2)}})


def test_a_second_accumulate_for_the_same_step_is_refused():
    model = two_layers()
    pruning = bound(model, end_step=10, score="movement")
    pruning.prune_if_due(0)
    backward(model)
    pruning.accumulate()
    summed = {name: total.clone() for name, total in pruning.gradient_scores.items()}
    with pytest.raises(RuntimeError, match=r"the movement scores of step 0 were already summed for '0' and 1 more "
                                           r"layers; before_optimizer_step\(\)"):
        pruning.accumulate()
    assert all(torch.equal(pruning.gradient_scores[n], t) for n, t in summed.items())  # nothing counted twice
    pruning.accumulate(step=1)  # the next step's gradients are summed
    assert torch.equal(pruning.gradient_scores["0"], 2 * summed["0"])


def test_one_accumulate_per_optimizer_in_a_step_is_not_a_second_call():
    model = two_layers()
    pruning = bound(model, end_step=10, score="fisher")
    backward(model)
    pruning.accumulate(torch.optim.SGD(model[0].parameters(), lr=0.1), step=4)
    pruning.accumulate(torch.optim.SGD(model[2].parameters(), lr=0.1), step=4)
    assert all(total.any() for total in pruning.gradient_scores.values())
    with pytest.raises(RuntimeError, match="scores of step 4 were already summed for '2';"):
        pruning.accumulate(torch.optim.SGD(model[2].parameters(), lr=0.1), step=4)


def test_a_loaded_state_starts_a_fresh_count_of_the_steps_summed():
    model = two_layers()
    pruning = bound(model, end_step=10, score="movement")
    backward(model)
    pruning.accumulate(step=3)
    pruning.load_state_dict(pruning.state_dict())
    pruning.accumulate(step=3)  # a resumed run sums the step it resumes at


@pytest.mark.parametrize("allocation, score", [("layer", "fisher"), ("global", "fisher"), ("layer", "magnitude")])
def test_tiled_pruning_keeps_one_column_set_per_tile_at_every_re_scoring(allocation, score):
    """tile_rows=2: every mask the schedule installs prunes tiles of 2 block rows whole, and masks only shrink."""
    from compress.core.sparsity import is_tiled

    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64))
    pruning = bound(model, start_step=0, end_step=4, frequency=2, score=score, allocation=allocation, tile_rows=2)
    before = {name: layer.mask.clone() for name, layer in pruning.layers.items()}
    for step in range(6):
        pruning.prune_if_due(step)
        backward(model)
        pruning.accumulate()
        model.zero_grad()
        for name, layer in pruning.layers.items():
            assert is_tiled(layer.mask, 2) and bool((layer.mask <= before[name]).all())
            before[name] = layer.mask.clone()
    pruned = sum(int((~layer.mask).sum()) for layer in pruning.layers.values())
    assert pruned == pytest.approx(0.5 * sum(layer.mask.numel() for layer in pruning.layers.values()), abs=2)
    with pytest.raises(ValueError, match=r"tile_rows: expected one of \(1, 2, 4, 8\), got 3"):
        PruningSchedule(0.5, tile_rows=3)


def test_a_state_saved_before_tiles_existed_still_resumes():
    """Saved settings and layer configs without tile_rows (written before the option) load into a schedule
    with the default; a saved tiled config is still refused by an untiled schedule."""
    saved = bound(two_layers()).state_dict()
    del saved["settings"]["tile_rows"]
    for config in saved["layers"].values():
        del config["tile_rows"]
    resumed = bound(two_layers())
    resumed.load_state_dict(saved)
    saved["layers"]["0"]["tile_rows"] = 4
    with pytest.raises(ValueError, match=r"layer '0': saved with tile_rows=4, this schedule has tile_rows=1"):
        bound(two_layers()).load_state_dict(saved)
