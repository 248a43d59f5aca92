"""Tests for compress/sparsity.py: scores, masks, the cubic schedule, dense <-> BSR."""
import pytest
import torch

from compress import sparsity


def test_magnitude_and_l2_scores_per_block():
    w = torch.zeros(64, 64)
    w[:32, 32:] = 2.0
    w[32:, :32] = -1.0
    mag = sparsity.block_scores(w, 32, "magnitude")
    l2 = sparsity.block_scores(w, 32, "l2")
    assert mag.tolist() == [[0.0, 2.0], [1.0, 0.0]]
    assert l2.tolist() == [[0.0, 64.0], [32.0, 0.0]]


def test_partial_edge_blocks_are_scored_over_real_elements():
    w = torch.ones(40, 70)
    scores = sparsity.block_scores(w, 32, "magnitude")
    assert scores.shape == (2, 3) and torch.allclose(scores, torch.ones(2, 3))


def test_mask_prunes_the_lowest_blocks():
    torch.manual_seed(0)
    w = torch.randn(128, 128)
    mask = sparsity.block_mask(w, 0.5)
    assert mask.shape == (4, 4) and mask.sum() == 8
    scores = sparsity.block_scores(w)
    assert scores[~mask].max() <= scores[mask].min()


def test_expand_mask_and_sparsity():
    mask = torch.tensor([[True, False], [False, False]])
    full = sparsity.expand_mask(mask, (40, 64))
    assert full.shape == (40, 64) and full[:32, :32].all() and not full[:, 32:].any()
    assert sparsity.mask_sparsity(mask) == pytest.approx(0.75)


def test_cubic_schedule():
    assert sparsity.cubic_sparsity(0, 10, 20, 0.8) == 0.0
    assert sparsity.cubic_sparsity(10, 10, 20, 0.8) == 0.0
    assert sparsity.cubic_sparsity(15, 10, 20, 0.8) == pytest.approx(0.8 * (1 - 0.5 ** 3))
    assert sparsity.cubic_sparsity(25, 10, 20, 0.8) == 0.8
    values = [sparsity.cubic_sparsity(t, 0, 100, 0.9) for t in range(101)]
    assert all(a <= b for a, b in zip(values, values[1:]))


def test_dense_bsr_round_trip_matches_torch_layout():
    torch.manual_seed(1)
    w = torch.randn(96, 64)
    mask = sparsity.block_mask(w, 0.5)
    w = w * sparsity.expand_mask(mask, w.shape)
    crow, col, values = sparsity.dense_to_bsr(w, 32, mask)
    assert values.shape == (int(mask.sum()), 32, 32)
    assert torch.equal(sparsity.bsr_to_dense(crow, col, values, (96, 64)), w)
    theirs = w.to_sparse_bsr((32, 32))
    assert torch.equal(crow.long(), theirs.crow_indices()) and torch.equal(col.long(), theirs.col_indices())


def test_bsr_rejects_shapes_not_multiple_of_block():
    with pytest.raises(ValueError, match="multiples of 32"):
        sparsity.dense_to_bsr(torch.ones(40, 64))


def test_bad_inputs():
    with pytest.raises(ValueError, match="magnitude"):
        sparsity.block_scores(torch.ones(32, 32), score="movement")
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        sparsity.mask_from_scores(torch.ones(2, 2), 1.0)
