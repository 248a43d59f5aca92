"""Full validation of BSR index *values* (the launchers' cheap checks see only shapes and dtypes).

For a weight of ``R = N / 32`` block rows and ``C = K / 32`` block columns with ``nnz`` stored blocks,
the kernels read block ``b`` of block row ``r`` for ``crow[r] <= b < crow[r + 1]`` at block column
``col[b]``. They trust, and this module checks, the invariants of ``torch.sparse_bsr``:

* ``crow[0] == 0``, ``crow`` non-decreasing, ``crow[R] == nnz`` (otherwise a kernel reads past
  ``values``: garbage, or the process killed by a memory fault);
* ``0 <= col[b] < C`` (otherwise x is read out of range);
* within each block row the columns strictly increase (a duplicate block would be summed twice).

One pass of vector operations on the indices' device and one host synchronisation (a single
``.tolist()`` of the five verdicts), so it costs a few small kernels: call it once when a layer is
built or loaded, not on every forward. It cannot run inside a CUDA graph capture or a compiled graph
(the host needs the verdict): the inference modules check at load and pass ``check_indices=False``.
"""
from __future__ import annotations

import torch


def _first(mask: torch.Tensor) -> torch.Tensor:
    """The index of the first True of a 1-d bool ``mask`` as a 0-d int64 tensor, -1 if none (no sync)."""
    if mask.numel() == 0:
        return torch.tensor(-1, device=mask.device)
    return torch.where(mask.any(), mask.to(torch.int8).argmax(), -1)


def check_bsr_indices(crow_indices: torch.Tensor, col_indices: torch.Tensor, block_cols: int) -> None:
    """Raise ``ValueError`` naming the first broken invariant (see the module docstring) and where."""
    crow = crow_indices.to(torch.int64)
    col = col_indices.to(torch.int64)
    nnz = col.shape[0]
    steps = crow[1:] - crow[:-1]
    decreasing = _first(steps < 0)
    out_of_range = _first((col < 0) | (col >= block_cols))
    # block row of each stored block, from the steps (clamped: a decreasing crow is reported above)
    row_of = torch.repeat_interleave(torch.arange(steps.shape[0], device=crow.device), steps.clamp(min=0))
    if row_of.shape[0] == nnz and nnz > 1:
        key = row_of * block_cols + col
        unsorted = _first(key[1:] <= key[:-1])
    else:  # crow[-1] != nnz is reported before the order is looked at
        unsorted = torch.tensor(-1, device=crow.device)
    first, last, decreasing, out_of_range, unsorted = torch.stack(
        [crow[0], crow[-1], decreasing, out_of_range, unsorted]).tolist()  # the one synchronisation
    if first != 0:
        raise ValueError(f"crow_indices: expected crow_indices[0] == 0, got {first}")
    if decreasing >= 0:
        r = decreasing
        raise ValueError(f"crow_indices: expected non-decreasing values, got crow_indices[{r}] = "
                         f"{int(crow[r])} > crow_indices[{r + 1}] = {int(crow[r + 1])}")
    if last != nnz:
        raise ValueError(f"crow_indices: expected crow_indices[-1] == nnz == {nnz} (the length of col_indices), "
                         f"got {last}")
    if out_of_range >= 0:
        raise ValueError(f"col_indices: expected block columns in [0, {block_cols}) (K / 32), got "
                         f"col_indices[{out_of_range}] = {int(col[out_of_range])}")
    if unsorted >= 0:
        b = unsorted + 1
        raise ValueError(f"col_indices: expected strictly increasing block columns within each block row, got "
                         f"col_indices[{b - 1}] = {int(col[b - 1])} then col_indices[{b}] = {int(col[b])}")


TILE_ROWS = (1, 2, 4, 8)  # block rows per tile of a tiled pattern (1: free blocks)


def tile_rows_of(crow_indices: torch.Tensor, col_indices: torch.Tensor) -> int:
    """The largest R of (8, 4, 2) such that every R consecutive block rows from a multiple of R hold the same
    block columns (the pattern of ``BlockSparseConfig(tile_rows=R)``; the last tile may be shorter), else 1.
    Valid indices expected (:func:`check_bsr_indices`); one host synchronisation."""
    crow = crow_indices.to(torch.int64)
    col = col_indices.to(torch.int64)
    steps = crow[1:] - crow[:-1]
    rows = torch.arange(steps.shape[0], device=crow.device)
    row_of = torch.repeat_interleave(rows, steps)
    place = torch.arange(col.shape[0], device=crow.device) - crow[row_of]  # position within its block row
    verdicts = []
    candidates = TILE_ROWS[:0:-1]  # 8, 4, 2: the largest that holds wins
    for tile in candidates:
        leader = (rows // tile) * tile  # each block row's tile's first block row
        tiled = (steps == steps[leader]).all()
        if col.shape[0]:  # counts equal: a row's p-th block must have its leader's p-th block's column
            leader_block = (crow[leader[row_of]] + place).clamp(max=col.shape[0] - 1)
            tiled = tiled & (col == col[leader_block]).all()
        verdicts.append(tiled)
    for tile, tiled in zip(candidates, torch.stack(verdicts).tolist()):
        if tiled:
            return tile
    return 1
