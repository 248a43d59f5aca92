"""Second-order one-shot block pruning (Optimal Brain Surgeon on whole 32x32 blocks).

Problem. One linear layer, weight W (N, K), Hessian ``H = 2/n X^T X`` (K, K) of its calibration
inputs X, the same for every output row. Zero a fraction of the b x b blocks of W and move the
weights left so that the layer's outputs on X change as little as possible:
``min sum_rows (w - w') H (w - w')^T / 2`` with the pruned weights of ``w'`` zero.

Blocks share rows. The 32 rows of one block row ``R`` lose the same columns (those of its pruned
blocks), so they share one inverse Hessian: ``Hinv_R``, the inverse of H restricted to the columns
the block row keeps. Removing a set S of columns from the block row costs (OBS, Hassibi & Stork
1993, for a group of weights; Frantar & Alistarh 2022 for groups)::

    cost(R, S) = 1/2 sum_{r in R} w_{r,S} ([Hinv_R]_{SS})^-1 w_{r,S}^T

and the best update of the row's other weights is ``w_r -= w_{r,S} ([Hinv_R]_{SS})^-1 [Hinv_R]_{S,:}``
(which also zeroes ``w_{r,S}``). The cost of one block (R, c) is this with S the block's b columns:
the loss that removing the block adds, given every other weight may move to compensate. It is not a
sum of magnitudes: a block of small weights on inputs with much energy can cost more than a block of
large weights on quiet ones.

Selection. The layer prunes ``floor(sparsity * blocks)`` blocks (as every mask here does) in
``rounds`` steps: each round scores every kept block with the current weights and inverse Hessians,
prunes the cheapest ``1/rounds`` of the total over the whole layer (a block row may lose several blocks
in one round, removed jointly, or none), and applies the OBS update. One round is plain OBS
saliency with one update; more rounds let later choices see the compensation the earlier ones made
(greedy OBS in the limit of one block a round). The block rows of the layer compete, so a block row
whose blocks matter less gives more.

Each round recomputes ``Hinv_R`` from the damped H with the row's pruned columns taken out (replaced
by identity rows and columns, which keeps the others' inverse exact), batched over block rows; the
update composes exactly, so the result is the least-squares optimum of the kept weights for the final
mask under the damped Hessian. Damping as GPTQ's: ``damping * mean(diag H)`` on the diagonal; inputs
that never fire get ``H[i,i] = 1`` and their weights are zero (they change no output).

Shapes that are not multiples of b are padded with zero weights and identity Hessian entries (the
padding costs nothing and moves nothing); edge blocks count as blocks, as in
:func:`compress.core.sparsity.block_grid`.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from compress.core.gptq import drop_dead_inputs
from compress.core.sparsity import (_check_sparsity, _check_tile_rows, block_counts, block_grid, block_sums, tile_mask,
                                    tile_sums, untile)

HINV_CHUNK_BYTES = 1 << 29  # the batch of per-block-row inverse Hessians is built in pieces of at most 512 MiB


def damped(h: torch.Tensor, damping: float) -> torch.Tensor:
    """``H + damping * mean(diag H) * I``."""
    return h + damping * h.diagonal().mean() * torch.eye(h.shape[0], dtype=h.dtype, device=h.device)


def row_inverse_hessians(h: torch.Tensor, pruned_columns: torch.Tensor):
    """Yield (first row, (B, K, K)) pieces of the block rows' inverse Hessians: for each block row, the
    inverse of ``h`` (K, K, positive definite) on the columns it keeps. ``pruned_columns`` (R, K) bool marks
    the others, whose rows and columns become identity (so the kept columns' inverse is exact). Pieces
    hold at most ``HINV_CHUNK_BYTES``."""
    rows, k = pruned_columns.shape
    chunk = max(1, HINV_CHUNK_BYTES // (k * k * h.element_size()))
    for start in range(0, rows, chunk):
        cut = pruned_columns[start:start + chunk]
        keep = (~cut).to(h.dtype)
        restricted = h * keep[:, :, None] * keep[:, None, :] + torch.diag_embed(cut.to(h.dtype))
        lower, info = torch.linalg.cholesky_ex(restricted)
        if int(info.max()) != 0:
            raise ValueError("OBS: the damped Hessian is not positive definite on a block row's kept columns; "
                             "calibrate on more tokens or raise the damping")
        yield start, torch.cholesky_inverse(lower)


def block_costs(w: torch.Tensor, hinv: torch.Tensor, block: int) -> torch.Tensor:
    """(R, C) OBS cost of removing each block alone: ``1/2 sum_r w_{r,S} ([Hinv]_{SS})^-1 w_{r,S}^T``.

    ``w`` (R*b, C*b) padded weights, ``hinv`` (R, C*b, C*b) each block row's inverse Hessian."""
    rows, cols = w.shape[0] // block, w.shape[1] // block
    diag = hinv.reshape(rows, cols, block, cols, block).diagonal(dim1=1, dim2=3).permute(0, 3, 1, 2)  # (R, C, b, b)
    lower, info = torch.linalg.cholesky_ex(diag)  # (R, C, b, b); pruned blocks' are identity
    if int(info.max()) != 0:
        raise ValueError("OBS: a diagonal block of the inverse Hessian is not positive definite")
    blocks = w.reshape(rows, block, cols, block).permute(0, 2, 3, 1)  # (R, C, b cols, b rows)
    solved = torch.cholesky_solve(blocks, lower)  # ([Hinv]_SS)^-1 w_S^T for each row of the block
    return 0.5 * (blocks * solved).sum(dim=(2, 3))


def remove_columns_(w_rows: torch.Tensor, hinv: torch.Tensor, columns: torch.Tensor) -> None:
    """OBS update of one block row's weights ``w_rows`` (b, K) for removing ``columns`` (index tensor) jointly."""
    sub = hinv[columns][:, columns]
    coefficients = torch.linalg.solve(sub, w_rows[:, columns].T).T  # (b, |S|): w_S ([Hinv]_SS)^-1
    w_rows -= coefficients @ hinv[columns]
    w_rows[:, columns] = 0


def obs_block_prune(weight: torch.Tensor, h: torch.Tensor, sparsity: float, block: int = 32,
                    damping: float = 0.01, rounds: int = 8, keep: torch.Tensor | None = None,
                    tile_rows: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Prune ``floor(sparsity * blocks)`` b x b blocks of ``weight`` (N, K) by OBS cost and compensate
    (module docstring). ``h``: (K, K) Hessian of the layer's inputs. ``keep``: a block mask (N/b, K/b)
    whose pruned blocks stay pruned (and count towards the total). ``tile_rows`` > 1: ``floor(sparsity *
    tiles)`` tiles of that many block rows go instead (:mod:`compress.core.sparsity`), each costing the sum
    of its blocks' costs (the block rows of a tile lose the same columns, so they share one inverse
    Hessian and their costs add). Returns (the updated weight (N, K) float32 with the pruned blocks
    exactly zero, the block mask (N/b, K/b) bool, True = kept)."""
    _check_sparsity(sparsity)
    n, k = weight.shape
    if tuple(h.shape) != (k, k):
        raise ValueError(f"OBS: expected a Hessian of shape ({k}, {k}) for a weight of shape {(n, k)}, "
                         f"got {tuple(h.shape)}")
    if not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"OBS: rounds: expected a positive int, got {rounds!r}")
    _check_tile_rows(tile_rows)
    rows, cols = block_grid((n, k), block)
    mask = torch.ones(rows, cols, dtype=torch.bool, device=weight.device) if keep is None else keep.clone().bool()
    if tuple(mask.shape) != (rows, cols):
        raise ValueError(f"OBS: expected a block mask of shape {(rows, cols)}, got {tuple(mask.shape)}")
    w, h = drop_dead_inputs(weight.detach().float(), h.float())
    pad_n, pad_k = rows * block - n, cols * block - k
    w = F.pad(w, (0, pad_k, 0, pad_n))
    h = F.pad(damped(h, damping), (0, pad_k, 0, pad_k))
    h.diagonal()[k:] = 1.0
    mask = untile(tile_mask(mask, tile_rows), tile_rows, rows)
    w.view(rows, block, cols, block).mul_(mask[:, None, :, None])
    tiles = -(-rows // tile_rows)
    target = int(sparsity * tiles * cols)
    for round_index in range(rounds):
        pruned_now = int((~tile_mask(mask, tile_rows)).sum())
        goal = max(pruned_now, target - (target - pruned_now) * (rounds - 1 - round_index) // (rounds - round_index))
        if goal <= pruned_now:
            continue
        pruned_columns = (~mask).repeat_interleave(block, dim=1)
        costs = torch.cat([block_costs(w[start * block:(start + len(hinv)) * block], hinv, block)
                           for start, hinv in row_inverse_hessians(h, pruned_columns)])
        costs = tile_sums(costs.masked_fill(~mask, float("inf")), tile_rows)  # inf where any block is pruned
        chosen = torch.argsort(costs.flatten(), stable=True)[:goal - pruned_now]
        newly = torch.zeros(tiles * cols, dtype=torch.bool, device=w.device)
        newly[chosen] = True
        newly = untile(newly.reshape(tiles, cols), tile_rows, rows)
        changed = newly.any(dim=1).nonzero().flatten()
        for start, hinv in row_inverse_hessians(h, pruned_columns[changed]):
            for offset, r in enumerate(changed[start:start + len(hinv)].tolist()):
                columns = newly[r].repeat_interleave(block).nonzero().flatten()
                remove_columns_(w[r * block:(r + 1) * block], hinv[offset], columns)
        mask &= ~newly
    w.view(rows, block, cols, block).mul_(mask[:, None, :, None])
    return w[:n, :k].contiguous(), mask


def activation_block_scores(weight: torch.Tensor, input_norms: torch.Tensor, block: int = 32) -> torch.Tensor:
    """(N/b, K/b) mean over each block of ``|w_ij| * ||x_j||``: magnitude weighted by the calibration
    inputs' channel norms (``input_norms`` (K,), e.g. ``sqrt(diag(X^T X))``), as Wanda scores single
    weights (Sun et al., 2023), summed over a block."""
    if input_norms.shape != (weight.shape[1],):
        raise ValueError(f"activation scores: expected input norms of shape ({weight.shape[1]},), "
                         f"got {tuple(input_norms.shape)}")
    values = weight.detach().float().abs() * input_norms.float()[None, :]
    return block_sums(values, block) / block_counts(tuple(weight.shape), block, weight.device)
