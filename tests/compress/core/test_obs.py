"""OBS block pruning (compress/core/obs.py): exact single-block choice, exact compensation, block-structured
masks at the asked sparsity, and an advantage over magnitude on correlated inputs."""
import itertools

import pytest
import torch

from compress.core.obs import activation_block_scores, obs_block_prune
from compress.core.sparsity import block_mask, expand_mask


def _inputs(n: int, k: int, seed: int = 0) -> torch.Tensor:
    """Correlated inputs whose channels differ in scale by 100x, so weight magnitude misleads."""
    g = torch.Generator().manual_seed(seed)
    mixing = torch.randn(k, k, generator=g) / k ** 0.5 + torch.eye(k)
    scales = torch.logspace(-1, 1, k)[torch.randperm(k, generator=g)]
    return (torch.randn(n, k, generator=g) @ mixing) * scales


def _hessian(x: torch.Tensor) -> torch.Tensor:
    return 2.0 / x.shape[0] * x.T @ x


def _damped(h: torch.Tensor, damping: float = 0.01) -> torch.Tensor:
    return h + damping * h.diagonal().mean() * torch.eye(h.shape[0])


def _optimal_weight(w: torch.Tensor, h: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """Per row, the kept weights minimising (w - w') H (w - w')^T with the others zero (least squares)."""
    out = torch.zeros_like(w)
    for r in range(w.shape[0]):
        kept = keep[r]
        out[r, kept] = torch.linalg.solve(h[kept][:, kept], h[kept] @ w[r])
    return out


def _loss(w: torch.Tensor, w_new: torch.Tensor, h: torch.Tensor) -> float:
    d = (w - w_new).double()
    return float(0.5 * torch.einsum("ri,ij,rj->", d, h.double(), d))


def test_one_block_is_the_cheapest_by_enumeration():
    torch.manual_seed(0)
    w, h = torch.randn(8, 12, dtype=torch.float64), _hessian(_inputs(256, 12).double())
    hd = _damped(h)
    costs = {}
    for r, c in itertools.product(range(4), range(6)):
        keep = torch.ones(4, 6, dtype=torch.bool)
        keep[r, c] = False
        element = expand_mask(keep, (8, 12), 2)
        costs[(r, c)] = _loss(w, _optimal_weight(w, hd, element), hd)
    pruned, mask = obs_block_prune(w, h, sparsity=1 / 24 + 1e-9, block=2, rounds=1)
    (r, c), = (~mask).nonzero().tolist()
    assert (r, c) == min(costs, key=costs.get)
    assert _loss(w, pruned.double(), hd) == pytest.approx(costs[(r, c)], rel=1e-4)


@pytest.mark.parametrize("rounds", [1, 3, 8])
def test_kept_weights_are_the_least_squares_optimum_for_the_mask(rounds):
    torch.manual_seed(1)
    w, h = torch.randn(8, 16, dtype=torch.float64), _hessian(_inputs(512, 16, seed=1).double())
    pruned, mask = obs_block_prune(w, h, sparsity=0.5, block=4, rounds=rounds)
    element = expand_mask(mask, (8, 16), 4)
    assert torch.allclose(pruned.double(), _optimal_weight(w, _damped(h), element), atol=1e-8)
    assert bool((pruned[~element] == 0).all())


def test_greedy_rounds_find_the_enumerated_best_mask_and_beat_magnitude():
    w, h = torch.randn(4, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(3)), None
    h = _hessian(_inputs(256, 8, seed=3).double())
    hd = _damped(h)
    losses = {}
    for pruned_blocks in itertools.combinations(range(8), 4):
        keep = torch.ones(8, dtype=torch.bool)
        keep[list(pruned_blocks)] = False
        element = expand_mask(keep.reshape(2, 4), (4, 8), 2)
        losses[pruned_blocks] = _loss(w, _optimal_weight(w, hd, element), hd)
    best = min(losses.values())
    pruned, mask = obs_block_prune(w, h, sparsity=0.5, block=2, rounds=4)
    obs_loss = _loss(w, pruned.double(), hd)
    magnitude = block_mask(w, 0.5, block=2)
    magnitude_loss = _loss(w, w * expand_mask(magnitude, (4, 8), 2), hd)
    assert obs_loss == pytest.approx(best, rel=1e-6)
    assert obs_loss < magnitude_loss


@pytest.mark.parametrize("shape", [(64, 96), (70, 100)])
@pytest.mark.parametrize("sparsity", [0.25, 0.5, 0.75])
def test_masks_are_block_structured_at_the_asked_sparsity(shape, sparsity):
    n, k = shape
    w, h = torch.randn(n, k), _hessian(_inputs(4 * k, k))
    pruned, mask = obs_block_prune(w, h, sparsity, block=32, rounds=3)
    assert tuple(mask.shape) == (-(-n // 32), -(-k // 32))
    assert int((~mask).sum()) == int(sparsity * mask.numel())
    element = expand_mask(mask, shape, 32)
    assert bool((pruned[~element] == 0).all())
    assert bool((pruned[element] != 0).all())
    assert pruned.dtype == torch.float32 and tuple(pruned.shape) == shape


def test_blocks_pruned_before_stay_pruned_and_count():
    w, h = torch.randn(64, 64), _hessian(_inputs(256, 64))
    keep = torch.ones(2, 2, dtype=torch.bool)
    keep[0, 1] = False
    _, mask = obs_block_prune(w, h, 0.5, block=32, keep=keep)
    assert not bool(mask[0, 1]) and int((~mask).sum()) == 2


def test_bad_shapes_and_rounds_are_refused():
    w = torch.randn(64, 64)
    with pytest.raises(ValueError, match=r"expected a Hessian of shape \(64, 64\)"):
        obs_block_prune(w, torch.eye(32), 0.5)
    with pytest.raises(ValueError, match="rounds: expected a positive int"):
        obs_block_prune(w, torch.eye(64), 0.5, rounds=0)
    with pytest.raises(ValueError, match=r"sparsity: expected a fraction in \[0, 1\)"):
        obs_block_prune(w, torch.eye(64), 1.0)


def test_activation_scores_weigh_each_column_by_its_input_norm():
    w = torch.ones(64, 64)
    norms = torch.cat([torch.full((32,), 1.0), torch.full((32,), 3.0)])
    scores = activation_block_scores(w, norms, block=32)
    assert torch.equal(scores, torch.tensor([[1.0, 3.0], [1.0, 3.0]]))
    with pytest.raises(ValueError, match=r"expected input norms of shape \(64,\)"):
        activation_block_scores(w, torch.ones(32))


def test_tiles_of_block_rows_go_whole_and_the_cheapest_tile_by_enumeration():
    """tile_rows=2: a tile (2 block rows x 1 block column) costs the sum of its blocks' losses; one round
    removes the tile whose exact least-squares loss is the lowest, and the kept weights are that optimum."""
    torch.manual_seed(4)
    w, h = torch.randn(12, 12, dtype=torch.float64), _hessian(_inputs(256, 12, seed=4).double())
    hd = _damped(h)
    costs = {}
    for t, c in itertools.product(range(3), range(6)):  # 6 block rows of 2 -> 3 tiles
        keep = torch.ones(6, 6, dtype=torch.bool)
        keep[2 * t:2 * t + 2, c] = False
        costs[(t, c)] = _loss(w, _optimal_weight(w, hd, expand_mask(keep, (12, 12), 2)), hd)
    pruned, mask = obs_block_prune(w, h, sparsity=1 / 18 + 1e-9, block=2, rounds=1, tile_rows=2)
    rows, cols = (~mask).nonzero(as_tuple=True)
    assert rows.tolist() in ([0, 1], [2, 3], [4, 5]) and cols.unique().numel() == 1
    assert (int(rows[0]) // 2, int(cols[0])) == min(costs, key=costs.get)
    assert torch.allclose(pruned.double(), _optimal_weight(w, hd, expand_mask(mask, (12, 12), 2)), atol=1e-8)


@pytest.mark.parametrize("tile_rows", [2, 4])
def test_tiled_masks_keep_one_column_set_per_tile_at_the_asked_sparsity(tile_rows):
    from compress.core.sparsity import is_tiled

    w, h = torch.randn(6 * 32, 96), _hessian(_inputs(384, 96))
    pruned, mask = obs_block_prune(w, h, 0.5, block=32, rounds=3, tile_rows=tile_rows)
    tiles = -(-6 // tile_rows)
    assert is_tiled(mask, tile_rows)
    assert int((~mask[::tile_rows]).sum()) == int(0.5 * tiles * 3)
    assert bool((pruned[~expand_mask(mask, (192, 96), 32)] == 0).all())
    with pytest.raises(ValueError, match=r"tile_rows: expected one of \(1, 2, 4, 8\), got 3"):
        obs_block_prune(w, h, 0.5, tile_rows=3)
