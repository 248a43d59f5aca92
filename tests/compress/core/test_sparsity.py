"""Tests for compress/core/sparsity.py: scores, masks, the cubic schedule, dense <-> BSR, block sums of row slices."""
import pytest
import torch

from compress.core import sparsity


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


def test_movement_block_scores_against_hand_computed_sums():
    w, grad = torch.zeros(40, 70), torch.zeros(40, 70)
    w[:32, :32], grad[:32, :32] = 2.0, -0.5  # moving away from zero: -w*g = +1 on 32*32 elements
    w[32:, 64:], grad[32:, 64:] = 3.0, 1.0  # towards zero on the partial 8x6 corner block: -3 each
    w[:32, 32:64] = 5.0  # no gradient, no movement
    scores = sparsity.movement_block_scores(w, grad, 32)
    assert scores.dtype == torch.float32
    assert scores.tolist() == [[1024.0, 0.0, 0.0], [0.0, 0.0, -3.0 * 8 * 6]]


def test_movement_block_scores_sum_every_element_of_each_block():
    torch.manual_seed(2)
    w, grad = torch.randn(70, 40, dtype=torch.float16), torch.randn(70, 40, dtype=torch.float16)
    scores = sparsity.movement_block_scores(w, grad, 32)
    product = -(w.float() * grad.float())
    for r, rows in enumerate((slice(0, 32), slice(32, 64), slice(64, 70))):
        for c, cols in enumerate((slice(0, 32), slice(32, 40))):
            assert scores[r, c].item() == pytest.approx(product[rows, cols].sum().item(), rel=1e-5, abs=1e-4)


def test_fisher_block_scores_square_each_blocks_sum_of_w_times_grad():
    w, grad = torch.zeros(40, 70), torch.zeros(40, 70)
    w[:32, :32], grad[:32, :32] = 2.0, -0.5  # sum -1024 over the full block
    w[32:, 64:], grad[32:, 64:] = 3.0, 1.0  # sum 144 over the partial 8x6 corner block
    w[:32, 32:64] = 5.0  # no gradient: the loss does not depend on the block
    scores = sparsity.fisher_block_scores(w, grad, 32)
    assert scores.dtype == torch.float32
    assert scores.tolist() == [[1024.0 ** 2, 0.0, 0.0], [0.0, 0.0, 144.0 ** 2]]
    torch.testing.assert_close(scores, sparsity.movement_block_scores(w, grad, 32).square())


def test_shrink_mask_never_revives_pruned_blocks():
    scores = torch.tensor([[5.0, 1.0], [2.0, 3.0]])
    previous = torch.tensor([[False, True], [True, True]])  # the best block was pruned before
    mask = sparsity.shrink_mask(scores, previous, 0.5)
    assert mask.tolist() == [[False, False], [True, True]]  # pruned stays pruned, then the lowest
    assert sparsity.mask_sparsity(mask) == 0.5
    assert torch.equal(sparsity.shrink_mask(scores, previous, 0.25), previous)
    assert torch.equal(sparsity.shrink_mask(scores, previous, 0.0), previous)  # never grows back
    assert torch.equal(sparsity.shrink_mask(scores, torch.ones(2, 2, dtype=torch.bool), 0.5),
                       sparsity.mask_from_scores(scores, 0.5))


def test_bad_inputs():
    with pytest.raises(ValueError, match="needs gradients"):
        sparsity.block_scores(torch.ones(32, 32), score="movement")
    with pytest.raises(ValueError, match="magnitude"):
        sparsity.block_scores(torch.ones(32, 32), score="random")
    with pytest.raises(ValueError, match=r"expected a gradient of shape \(32, 32\), got \(32, 16\)"):
        sparsity.movement_block_scores(torch.ones(32, 32), torch.ones(32, 16))
    with pytest.raises(ValueError, match=r"fisher_block_scores: expected a gradient of shape \(32, 32\)"):
        sparsity.fisher_block_scores(torch.ones(32, 32), torch.ones(32, 16))
    with pytest.raises(ValueError, match="'fisher' needs gradients"):
        sparsity.block_scores(torch.ones(32, 32), score="fisher")
    with pytest.raises(ValueError, match=r"shape \(2, 2\)"):
        sparsity.shrink_mask(torch.ones(2, 2), torch.ones(1, 4, dtype=torch.bool), 0.5)
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        sparsity.mask_from_scores(torch.ones(2, 2), 1.0)


def _full(*shape):
    return torch.ones(*shape, dtype=torch.bool)


def test_global_masks_give_more_to_layers_whose_blocks_score_lower():
    low = torch.arange(16.0).reshape(4, 4) / 100  # every block of this layer scores below the other's
    high = torch.arange(16.0).reshape(4, 4) + 1
    masks = sparsity.global_block_masks({"a": low, "b": high}, {"a": _full(4, 4), "b": _full(4, 4)}, 0.5, 0.5)
    pruned = {name: int((~m).sum()) for name, m in masks.items()}
    assert pruned["a"] + pruned["b"] == 16  # half of all 32 blocks
    assert pruned == {"a": 12, "b": 4}  # a at its ceiling (0.75 * 16), b at its floor (0.25 * 16)
    assert not masks["a"].flatten()[:12].any() and masks["a"].flatten()[12:].all()  # a's lowest blocks go
    assert not masks["b"].flatten()[:4].any() and masks["b"].flatten()[4:].all()


def test_global_masks_within_bounds_follow_the_scores():
    torch.manual_seed(0)
    scores = {"a": torch.rand(8, 8), "b": torch.rand(8, 8) * 0.9, "c": torch.rand(4, 16) * 1.1}
    kept = {name: _full(*s.shape) for name, s in scores.items()}
    masks = sparsity.global_block_masks(scores, kept, 0.5, 0.5)
    lo, hi = sparsity.allocation_bounds(0.5, 0.5)
    assert sum(int((~m).sum()) for m in masks.values()) == 96
    threshold = max(scores[n][~m].max() for n, m in masks.items())
    for name, mask in masks.items():
        share = float((~mask).float().mean())
        assert lo <= share <= hi
        if lo < share < hi:  # not held by a bound: every kept block scores above every pruned block
            assert (scores[name][mask] >= threshold).all()


def test_global_masks_keep_pruned_blocks_pruned_and_equal_spread_zero_to_per_layer_masks():
    torch.manual_seed(1)
    scores = {"a": torch.rand(4, 8), "b": torch.rand(4, 8)}
    earlier = {"a": torch.rand(4, 8) > 0.3, "b": _full(4, 8)}
    masks = sparsity.global_block_masks(scores, earlier, 0.5, 0.5)
    assert not (masks["a"] & ~earlier["a"]).any(), "a block pruned before stays pruned"
    uniform = sparsity.global_block_masks(scores, {"a": _full(4, 8), "b": _full(4, 8)}, 0.5, 0.0)
    for name in scores:
        assert torch.equal(uniform[name], sparsity.mask_from_scores(scores[name], 0.5))


def test_global_masks_never_leave_a_layer_whole_or_accept_bad_arguments():
    masks = sparsity.global_block_masks({"a": torch.full((1, 2), 9.0), "b": torch.zeros(8, 8)},
                                        {"a": _full(1, 2), "b": _full(8, 8)}, 0.1, 0.9)
    assert int((~masks["a"]).sum()) == 1  # two blocks: at least one pruned whenever sparsity > 0
    assert sparsity.global_block_masks({}, {}, 0.5, 0.5) == {}
    with pytest.raises(ValueError, match="spread"):
        sparsity.allocation_bounds(0.5, 1.0)
    with pytest.raises(ValueError, match="masks for the scored layers"):
        sparsity.global_block_masks({"a": torch.rand(2, 2)}, {}, 0.5, 0.5)


@pytest.mark.parametrize("cuts", [(48,), (31, 33, 64), (0, 70), (10, 11, 12)])
def test_block_sums_of_row_slices_add_up_to_the_whole_weights(cuts):
    """The FSDP2 case: each process sums its rows at their offset; the parts add up to the whole."""
    w = torch.randn(70, 100)
    bounds = [0, *cuts, 70]
    parts = [sparsity.block_sums(w[a:b], 32, row_offset=a, num_rows=70) for a, b in zip(bounds, bounds[1:])]
    assert all(part.shape == (3, 4) for part in parts)
    assert torch.allclose(sum(parts), sparsity.block_sums(w, 32), rtol=1e-5, atol=1e-5)
    abs_sums = sum(sparsity.block_sums(w[a:b].abs(), 32, a, 70) for a, b in zip(bounds, bounds[1:]))
    magnitude = sparsity.scores_from_block_sums(abs_sums, "magnitude", (70, 100), 32)
    assert torch.allclose(magnitude, sparsity.block_scores(w, 32, "magnitude"), rtol=1e-5)
    with pytest.raises(ValueError, match="do not fit"):
        sparsity.block_sums(w[:10], 32, row_offset=65, num_rows=70)


def test_tile_scores_are_each_tiles_mean_and_the_short_last_tile_counts_its_own_rows():
    scores = torch.arange(10, dtype=torch.float32).reshape(5, 2)  # 5 block rows: tiles of 2, 2 and 1 rows
    assert torch.equal(sparsity.tile_scores(scores, 2), torch.tensor([[1.0, 2.0], [5.0, 6.0], [8.0, 9.0]]))
    mask = torch.ones(5, 2, dtype=torch.bool)
    mask[3, 1] = False
    assert torch.equal(sparsity.tile_mask(mask, 2), torch.tensor([[True, True], [True, False], [True, True]]))
    assert torch.equal(sparsity.untile(sparsity.tile_mask(mask, 2), 2, 5)[2:4, 1], torch.tensor([False, False]))
    assert not sparsity.is_tiled(mask, 2) and sparsity.is_tiled(mask, 1)


@pytest.mark.parametrize("rows", [16, 18])
def test_tiled_masks_prune_the_lowest_mean_tiles_whole(rows):
    scores = torch.rand(rows, 6, generator=torch.Generator().manual_seed(rows))
    mask = sparsity.mask_from_scores(scores, 0.5, tile_rows=4)
    tiles = sparsity.tile_scores(scores, 4)
    assert sparsity.is_tiled(mask, 4)
    pruned = ~sparsity.tile_mask(mask, 4)
    assert int(pruned.sum()) == int(0.5 * tiles.numel())
    assert float(tiles[pruned].max()) <= float(tiles[~pruned].min())  # the lowest means went


def test_tiled_shrink_and_global_masks_stay_tiled_and_never_revive():
    g = torch.Generator().manual_seed(0)
    first = sparsity.mask_from_scores(torch.rand(8, 4, generator=g), 0.25, tile_rows=2)
    later = sparsity.shrink_mask(torch.rand(8, 4, generator=g), first, 0.5, tile_rows=2)
    assert sparsity.is_tiled(later, 2) and bool((later <= first).all()) and int((~later).sum()) == 16
    scores = {"a": torch.rand(8, 4, generator=g), "b": torch.rand(6, 8, generator=g)}
    masks = sparsity.global_block_masks(scores, {"a": first, "b": torch.ones(6, 8, dtype=torch.bool)}, 0.5, 0.5,
                                        tile_rows=2)
    assert all(sparsity.is_tiled(m, 2) for m in masks.values()) and bool((masks["a"] <= first).all())
    assert int((~masks["a"][::2]).sum()) + int((~masks["b"][::2]).sum()) == int(0.5 * (16 + 24))
    with pytest.raises(ValueError, match="expected a mask of shape"):
        sparsity.global_block_masks(scores, {"a": first, "b": torch.ones(8, 6, dtype=torch.bool)}, 0.5, 0.5, 2)
    with pytest.raises(ValueError, match=r"tile_rows: expected one of \(1, 2, 4, 8\), got 3"):
        sparsity.mask_from_scores(torch.rand(8, 4), 0.5, tile_rows=3)
