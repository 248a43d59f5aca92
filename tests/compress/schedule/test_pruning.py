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
    pruning.load_state_dict({"last_pruned_step": 0, "gradient_scores": {"0": torch.zeros(3, 3), "2": torch.zeros(2, 2)}})
    with pytest.raises(ValueError, match=r"expected shape \(2, 2\), got \(3, 3\)"):
        pruning.bind(model)
