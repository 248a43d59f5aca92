"""Block sparsity math: block scores, block masks, the gradual (cubic) schedule, dense <-> BSR.

A weight W (N, K) is cut into ``block`` x ``block`` tiles (32x32 for the kernels), giving a block
grid (ceil(N/b), ceil(K/b)); edge tiles of a shape that is not a multiple of ``b`` are partial and
scored over their real elements only. Scores (higher = more important):

* ``"magnitude"``: mean |w| over the block (L1 per element),
* ``"l2"``: Frobenius norm of the block (sqrt of the sum of squares).

Movement (Sanh et al., 2020; blocks as in Lagunas et al., 2021) needs gradients, so it is not a
weight score: :func:`movement_block_scores` gives one optimizer step's contribution
``sum over the block of -W * dL/dW`` (float32, same grid), which a training loop sums over steps.
The Fisher score (:func:`fisher_block_scores`) squares the sum of ``W * dL/dW`` instead: averaged
over steps it estimates ``w_B^T F_B w_B`` with the empirical Fisher ``F_B`` of the block, twice the
loss increase that zeroing the block costs to second order at a minimum (Optimal Brain Surgeon
with one Fisher block per 32x32 block; Kurtic et al., 2022). It weighs a block by how much the loss
depends on it, so it sees the scale of the block's inputs, which magnitude does not.

Every score is a function of per-block sums (:func:`block_sums`): ``sum |w|`` over the block's
element count, ``sqrt(sum w^2)``, ``-sum w g``, ``(sum w g)^2``. :func:`block_sums` also takes a
slice of rows of the weight placed at its row offset, so processes that each hold some rows (FSDP2
shards, :mod:`compress.core.sharding`) sum their parts into the full grid; the parts added up are
the whole weight's sums, and the score is taken from those (:func:`scores_from_block_sums`).

A block mask is a bool grid, True = kept; :func:`mask_from_scores` prunes the ``floor(sparsity *
blocks)`` lowest-scoring blocks (ties broken by position with a stable sort, so every process that
sees the same weights builds the same mask). :func:`shrink_mask` does the same but never revives a
block that an earlier mask pruned (it scores them ``-inf``).

Tiles (``tile_rows`` > 1, the pattern of the large-M kernel, :class:`compress.BlockSparseConfig`):
the blocks are pruned in vertical tiles of ``tile_rows`` consecutive block rows x one block column
(the last tile of a block-row count that ``tile_rows`` does not divide is shorter), so every block row
of a tile keeps the same block columns. The mask functions then rank tiles by the mean score of
their blocks (:func:`tile_scores`) and prune ``floor(sparsity * tiles)`` of them; a tile counts as
pruned while any of its blocks is (:func:`tile_mask`), and :func:`untile` spreads the tile mask back
over the block grid.

:func:`global_block_masks` ranks the blocks of several layers together: the model as a whole
prunes ``floor(sparsity * all blocks)``, the lowest scores first, while each layer stays within
``[(1 - spread) * sparsity, sparsity + spread * (1 - sparsity)]`` of its own blocks (so layers whose
blocks matter less give more, none is emptied, and none is left whole).

Schedule (Zhu & Gupta, 2017): ``s(t) = s_f + (s_i - s_f) * (1 - (t - t0) / (t1 - t0))^3`` for
``t0 <= t <= t1``, ``s_i`` before ``t0`` and ``s_f`` after ``t1``.

BSR layout = ``torch.sparse_bsr``: ``crow_indices`` (N/b + 1,), ``col_indices`` (nnz,), ``values``
(nnz, b, b); block ``i`` of block row ``r`` covers rows ``r*b:(r+1)*b`` and columns
``col_indices[i]*b:(col_indices[i]+1)*b``. Only shapes that are multiples of ``b`` convert.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from compress import _kernels

SCORES = ("magnitude", "l2")  # scores of the weight alone (one-shot pruning); "movement", "fisher" need training


def block_grid(shape: tuple[int, int], block: int) -> tuple[int, int]:
    """Number of block rows and block columns (partial edge blocks count) for a (N, K) weight."""
    n, k = shape
    return -(-n // block), -(-k // block)


def _blocks(w: torch.Tensor, block: int) -> torch.Tensor:
    """(N, K) -> (N/b, K/b, b, b), zero-padded to whole blocks."""
    n, k = w.shape
    rows, cols = block_grid((n, k), block)
    padded = F.pad(w, (0, cols * block - k, 0, rows * block - n))
    return padded.reshape(rows, block, cols, block).permute(0, 2, 1, 3)


def _check_2d(where: str, w: torch.Tensor) -> None:
    if w.dim() != 2:
        raise ValueError(f"{where}: expected a 2-d weight (N, K), got shape {tuple(w.shape)}")


def block_sums(values: torch.Tensor, block: int, row_offset: int = 0, num_rows: int | None = None) -> torch.Tensor:
    """Rows ``row_offset : row_offset + R`` of an (N, K) matrix, given as ``values`` (R, K) -> the
    matrix's (N/b, K/b) block grid, float32, each entry the sum of the block's values among those rows
    (0 for blocks they do not reach). ``num_rows``: N (default R, the whole matrix from row 0)."""
    _check_2d("block_sums", values)
    rows, k = values.shape
    total = rows if num_rows is None else num_rows
    if row_offset < 0 or row_offset + rows > total:
        raise ValueError(f"block_sums: rows {row_offset}:{row_offset + rows} do not fit a matrix of {total} rows")
    grid_rows, grid_cols = block_grid((total, k), block)
    first = row_offset // block  # the first block row these rows reach
    lead = row_offset - first * block  # their offset inside it
    reached = -(-(lead + rows) // block)
    padded = F.pad(values.detach().float(), (0, grid_cols * block - k, lead, reached * block - lead - rows))
    partial = padded.reshape(reached, block, grid_cols, block).permute(0, 2, 1, 3).sum(dim=(2, 3))
    if first == 0 and reached == grid_rows:
        return partial
    sums = torch.zeros(grid_rows, grid_cols, dtype=torch.float32, device=values.device)
    sums[first:first + reached] = partial[: grid_rows - first]
    return sums


def block_counts(shape: tuple[int, int], block: int, device=None) -> torch.Tensor:
    """(N/b, K/b) float32: how many elements of an (N, K) matrix each block holds (fewer at the edges)."""
    return block_sums(torch.ones(shape, dtype=torch.float32, device=device), block)


def score_values(w: torch.Tensor, score: str) -> torch.Tensor:
    """What a weight-only ``score`` sums per block: ``|w|`` (magnitude) or ``w^2`` (l2), float32."""
    _check_weight_score(score)
    w = w.detach().float()
    return w.pow(2) if score == "l2" else w.abs()


def scores_from_block_sums(sums: torch.Tensor, score: str, shape: tuple[int, int], block: int) -> torch.Tensor:
    """The block scores of a weight of ``shape`` from the block sums of :func:`score_values`."""
    _check_weight_score(score)
    if score == "l2":
        return sums.sqrt()
    return sums / block_counts(shape, block, sums.device)


def _check_weight_score(score: str) -> None:
    if score in ("movement", "fisher"):
        raise ValueError(f"score: {score!r} needs gradients from training (compress.PruningSchedule); "
                         f"weight-only scoring expects one of {SCORES}")
    if score not in SCORES:
        raise ValueError(f"score: expected one of {SCORES}, got {score!r}")


def block_scores(w: torch.Tensor, block: int = 32, score: str = "magnitude") -> torch.Tensor:
    """(N, K) -> (N/b, K/b) float32 block importance (see the module docstring)."""
    _check_weight_score(score)
    _check_2d("block_scores", w)
    return scores_from_block_sums(block_sums(score_values(w, score), block), score, tuple(w.shape), block)


def _check_sparsity(sparsity: float) -> None:
    if not 0.0 <= sparsity < 1.0:
        raise ValueError(f"sparsity: expected a fraction in [0, 1), got {sparsity}")


TILE_ROWS = (1, 2, 4, 8)  # block rows per pruned tile (1: free blocks)


def _check_tile_rows(tile_rows: int) -> None:
    if isinstance(tile_rows, bool) or tile_rows not in TILE_ROWS:
        raise ValueError(f"tile_rows: expected one of {TILE_ROWS}, got {tile_rows!r}")


def _by_tile(grid: torch.Tensor, tile_rows: int, fill) -> torch.Tensor:
    """(R, C) grid -> (ceil(R / t), t, C): its block rows by tile, the short last tile padded with ``fill``."""
    _check_tile_rows(tile_rows)
    rows, cols = grid.shape
    tiles = -(-rows // tile_rows)
    return F.pad(grid, (0, 0, 0, tiles * tile_rows - rows), value=fill).reshape(tiles, tile_rows, cols)


def tile_sums(grid: torch.Tensor, tile_rows: int) -> torch.Tensor:
    """(R, C) block values -> (ceil(R / t), C): each tile's sum over its block rows."""
    return _by_tile(grid.float(), tile_rows, 0.0).sum(dim=1)


def tile_scores(scores: torch.Tensor, tile_rows: int) -> torch.Tensor:
    """(R, C) block scores -> (ceil(R / t), C): each tile's mean over its block rows (``-inf`` stays ``-inf``)."""
    sums = tile_sums(scores, tile_rows)
    sizes = torch.full((sums.shape[0], 1), float(tile_rows), device=scores.device)
    sizes[-1] = scores.shape[0] - (sums.shape[0] - 1) * tile_rows
    return sums / sizes


def tile_mask(mask: torch.Tensor, tile_rows: int) -> torch.Tensor:
    """(R, C) block mask -> (ceil(R / t), C): a tile is kept only while every block of it is."""
    return _by_tile(mask.bool(), tile_rows, True).all(dim=1)


def untile(mask: torch.Tensor, tile_rows: int, rows: int) -> torch.Tensor:
    """(ceil(R / t), C) tile mask -> the (R, C) block mask."""
    return mask.repeat_interleave(tile_rows, dim=0)[:rows]


def is_tiled(mask: torch.Tensor, tile_rows: int) -> bool:
    """Whether every tile of ``tile_rows`` block rows of the (R, C) ``mask`` keeps the same block columns."""
    return bool(torch.equal(untile(tile_mask(mask, tile_rows), tile_rows, mask.shape[0]), mask.bool()))


def mask_from_scores(scores: torch.Tensor, sparsity: float, tile_rows: int = 1) -> torch.Tensor:
    """Bool grid like ``scores``: False for the ``floor(sparsity * numel)`` lowest scores (with ``tile_rows``
    > 1: for the blocks of the ``floor(sparsity * tiles)`` tiles of lowest mean score)."""
    _check_sparsity(sparsity)
    if tile_rows != 1:
        return untile(mask_from_scores(tile_scores(scores, tile_rows), sparsity), tile_rows, scores.shape[0])
    num_pruned = int(sparsity * scores.numel())
    mask = torch.ones(scores.numel(), dtype=torch.bool, device=scores.device)
    order = torch.argsort(scores.flatten(), stable=True)
    mask[order[:num_pruned]] = False
    return mask.reshape(scores.shape)


def _block_products(name: str, w: torch.Tensor, grad: torch.Tensor, block: int) -> torch.Tensor:
    """(N/b, K/b) float32 block sums of ``w * grad``, after checking the two shapes agree."""
    _check_2d(name, w)
    if grad.shape != w.shape:
        raise ValueError(f"{name}: expected a gradient of shape {tuple(w.shape)}, got {tuple(grad.shape)}")
    return block_sums(w.detach().float() * grad.detach().float(), block)


def movement_block_scores(w: torch.Tensor, grad: torch.Tensor, block: int = 32) -> torch.Tensor:
    """(N, K) weight and its gradient -> (N/b, K/b) float32 block sums of ``-w * grad``.

    Positive where the weights move away from zero under gradient descent (``-grad`` has the sign
    of ``w``); summed over optimizer steps this is the block's movement score.
    """
    return -_block_products("movement_block_scores", w, grad, block)


def fisher_block_scores(w: torch.Tensor, grad: torch.Tensor, block: int = 32) -> torch.Tensor:
    """(N, K) weight and its gradient -> (N/b, K/b) float32 ``(sum over the block of w * grad)^2``.

    One gradient's term of ``w_B^T F_B w_B``, the loss increase (times 2) that the empirical Fisher
    ``F_B = mean_t g_t g_t^T`` predicts for zeroing block ``B`` (Optimal Brain Surgeon with a
    Fisher block per 32x32 block, as in Kurtic et al., 2022); averaged over optimizer steps it is
    the block's Fisher score.
    """
    return _block_products("fisher_block_scores", w, grad, block).square()


def shrink_mask(scores: torch.Tensor, mask: torch.Tensor, sparsity: float, tile_rows: int = 1) -> torch.Tensor:
    """Like :func:`mask_from_scores`, but blocks pruned in ``mask`` stay pruned.

    Pruned blocks score ``-inf``, so they are the first taken; when ``mask`` already prunes more
    than ``floor(sparsity * numel)`` blocks the result is ``mask`` itself (masks only shrink). With
    ``tile_rows`` > 1 the same over tiles (a tile with any pruned block is pruned whole).
    """
    _check_sparsity(sparsity)
    if mask.shape != scores.shape:
        raise ValueError(f"shrink_mask: expected a mask of shape {tuple(scores.shape)}, got {tuple(mask.shape)}")
    if tile_rows != 1:
        tiled = shrink_mask(tile_scores(scores, tile_rows), tile_mask(mask, tile_rows), sparsity)
        return untile(tiled, tile_rows, scores.shape[0])
    kept = mask.to(device=scores.device, dtype=torch.bool)
    if int((~kept).sum()) >= int(sparsity * scores.numel()):
        return kept.clone()
    return mask_from_scores(scores.float().masked_fill(~kept, float("-inf")), sparsity)


def allocation_bounds(sparsity: float, spread: float) -> tuple[float, float]:
    """(lowest, highest) per-layer sparsity :func:`global_block_masks` allows around ``sparsity``."""
    _check_sparsity(sparsity)
    if not 0.0 <= spread < 1.0:
        raise ValueError(f"spread: expected a fraction in [0, 1), got {spread}")
    return (1.0 - spread) * sparsity, sparsity + spread * (1.0 - sparsity)


def global_block_masks(scores: dict[str, torch.Tensor], masks: dict[str, torch.Tensor], sparsity: float,
                       spread: float, tile_rows: int = 1) -> dict[str, torch.Tensor]:
    """Block masks for several layers ranked together (module docstring). With ``tile_rows`` > 1 every
    layer's tiles are ranked instead of its blocks (by their mean block score; counts below in tiles).

    ``scores`` / ``masks``: {layer: (N/b, K/b) grid}; blocks pruned in ``masks`` stay pruned. Layer
    ``i`` of ``n_i`` blocks prunes at least ``max(floor(lo * n_i), its pruned blocks, 1 if sparsity > 0
    and n_i >= 2)`` and at most ``max(floor(hi * n_i), that)`` blocks, ``(lo, hi) =
    allocation_bounds(sparsity, spread)``; between those, the blocks with the lowest scores over all
    layers are pruned until ``floor(sparsity * sum n_i)`` are (or every layer is at its maximum).
    Ties go to the earlier layer and the earlier block (stable sorts), so equal inputs give equal masks.
    """
    if set(scores) != set(masks):
        raise ValueError(f"global_block_masks: expected masks for the scored layers {sorted(scores)}, "
                         f"got {sorted(masks)}")
    lo, hi = allocation_bounds(sparsity, spread)
    if tile_rows != 1:
        _check_tile_rows(tile_rows)
        for name, grid in scores.items():
            if tuple(masks[name].shape) != tuple(grid.shape):
                raise ValueError(f"global_block_masks: layer {name!r}: expected a mask of shape {tuple(grid.shape)}, "
                                 f"got {tuple(masks[name].shape)}")
        tiled = global_block_masks({name: tile_scores(grid, tile_rows) for name, grid in scores.items()},
                                   {name: tile_mask(mask, tile_rows) for name, mask in masks.items()}, sparsity, spread)
        return {name: untile(tiled[name], tile_rows, scores[name].shape[0]) for name in tiled}
    names = list(scores)
    if not names:
        return {}
    device = scores[names[0]].device
    orders, candidates, forced_total, total = {}, [], 0, 0
    for name in names:
        grid = scores[name]
        kept = masks[name].to(device=device, dtype=torch.bool).flatten()
        if kept.shape[0] != grid.numel():
            raise ValueError(f"global_block_masks: layer {name!r}: expected a mask of {grid.numel()} blocks, "
                             f"got {kept.shape[0]}")
        count = grid.numel()
        order = torch.argsort(grid.float().flatten().to(device).masked_fill(~kept, float("-inf")), stable=True)
        floor_blocks = 1 if sparsity > 0 and count >= 2 else 0
        low = max(int(lo * count), int((~kept).sum()), floor_blocks)
        high = max(int(hi * count), low)
        orders[name] = (order, low)
        ranked = grid.float().flatten().to(device)[order]
        candidates.append(ranked[low:high])
        forced_total += low
        total += count
    remaining = max(0, int(sparsity * total) - forced_total)
    pool = torch.cat(candidates)
    taken = torch.zeros(pool.numel(), dtype=torch.bool, device=device)
    taken[torch.argsort(pool, stable=True)[:remaining]] = True
    result, start = {}, 0
    for name, chosen in zip(names, candidates):
        order, low = orders[name]
        extra = int(taken[start:start + chosen.numel()].sum())  # the layer's lowest candidates, a prefix
        start += chosen.numel()
        mask = torch.ones(order.numel(), dtype=torch.bool, device=device)
        mask[order[:low + extra]] = False
        result[name] = mask.reshape(scores[name].shape)
    return result


def block_mask(w: torch.Tensor, sparsity: float, block: int = 32, score: str = "magnitude",
               tile_rows: int = 1) -> torch.Tensor:
    """Block mask (N/b, K/b) keeping the highest-scoring ``1 - sparsity`` of the blocks (or tiles) of ``w``."""
    return mask_from_scores(block_scores(w, block, score), sparsity, tile_rows)


def expand_mask(mask: torch.Tensor, shape: tuple[int, int], block: int = 32) -> torch.Tensor:
    """Block mask (N/b, K/b) -> element mask (N, K) (edge blocks cropped)."""
    n, k = shape
    full = mask.repeat_interleave(block, dim=0).repeat_interleave(block, dim=1)
    return full[:n, :k]


def mask_sparsity(mask: torch.Tensor) -> float:
    """Fraction of pruned (False) blocks."""
    return 1.0 - mask.float().mean().item() if mask.numel() else 0.0


def cubic_sparsity(step: int, start_step: int, end_step: int, final: float, initial: float = 0.0) -> float:
    """Target sparsity at ``step`` on the cubic schedule from ``initial`` to ``final``."""
    if end_step < start_step:
        raise ValueError(f"end_step: expected >= start_step ({start_step}), got {end_step}")
    if step < start_step:
        return initial
    if step >= end_step:
        return final
    progress = (step - start_step) / (end_step - start_step)
    return final + (initial - final) * (1.0 - progress) ** 3


# ---- dense <-> BSR -----------------------------------------------------------------------------
def check_bsr_shape(shape: tuple[int, int], block: int = 32) -> None:
    """ValueError unless both dimensions of ``shape`` are multiples of ``block``."""
    n, k = shape
    if n % block or k % block:
        raise ValueError(f"BSR: expected N and K multiples of {block}, got (N, K) = ({n}, {k})")


def dense_to_bsr(w: torch.Tensor, block: int = 32, mask: torch.Tensor | None = None):
    """(N, K) -> (crow_indices int32, col_indices int32, values (nnz, b, b) in w's dtype).

    A block is stored when ``mask`` keeps it (or, without a mask, when it has any non-zero value).
    """
    check_bsr_shape(tuple(w.shape), block)
    blocks = _blocks(w.detach(), block)  # (R, C, b, b)
    keep = blocks.ne(0).any(dim=3).any(dim=2) if mask is None else mask.to(torch.bool)
    counts = keep.sum(dim=1)  # (R,)
    crow = torch.zeros(keep.shape[0] + 1, dtype=torch.int32, device=w.device)
    crow[1:] = torch.cumsum(counts, dim=0)
    rows, cols = keep.nonzero(as_tuple=True)  # row-major order, as BSR needs
    values = blocks[rows, cols].contiguous()  # (nnz, b, b)
    return crow, cols.to(torch.int32), values


def bsr_to_dense(crow: torch.Tensor, col: torch.Tensor, values: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
    """Inverse of :func:`dense_to_bsr`: the dense (N, K) weight, absent blocks zero."""
    check_bsr_shape(shape, values.shape[-1])
    return _kernels.reference.bsr_to_dense_ref(crow, col, values, *shape)
