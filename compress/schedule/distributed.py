"""What the schedule does across processes, whichever loop started them (Lightning DDP or FSDP2,
``torchrun``, ``accelerate`` under the ``transformers`` Trainer): plain ``torch.distributed``
collectives, used only when a process group of more than one rank is initialized, so a single process
pays nothing.

* masks, SmoothQuant's folds and GPTQ's results are computed on every rank and rank 0's copy is
  broadcast (:func:`broadcast_`, :func:`broadcast_floating_state_`): every rank ends with the same model;
  tensors sharded by FSDP2 (``DTensor``) are left out of those broadcasts: each rank holds other rows
  of them, and every rank applies the same change to its own rows;
* GPTQ's statistics ``{layer: [X^T X, tokens]}`` are summed over the ranks (:func:`sum_over_ranks`), so
  every rank solves the same problem from all ranks' batches;
* under FSDP2, the partial block sums that each rank computes from its rows of a weight are summed over
  the ranks in one collective (:func:`sum_grids_`), so every rank ranks the blocks of the whole weight;
* observer statistics are all-reduced with ``max`` by the observers themselves
  (:meth:`compress.core.observers.Observer.sync_`);
* log lines and warnings come from rank 0 only (:func:`info`, :func:`warn`).
"""
from __future__ import annotations

import logging
import warnings

import torch
import torch.distributed as dist
from torch import nn

from compress.core.sharding import is_sharded


def is_distributed() -> bool:
    """Whether a process group of more than one rank is initialized."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def is_rank_zero() -> bool:
    return not is_distributed() or dist.get_rank() == 0


def broadcast_(tensor: torch.Tensor) -> None:
    """Overwrite ``tensor`` with rank 0's copy (bool tensors travel as uint8, which gloo takes)."""
    if not is_distributed():
        return
    carrier = tensor.to(torch.uint8) if tensor.dtype == torch.bool else tensor
    dist.broadcast(carrier, src=0)
    if carrier is not tensor:
        tensor.copy_(carrier.to(torch.bool))


def broadcast_floating_state_(model: nn.Module) -> None:
    """Every floating-point tensor of ``model``'s ``state_dict`` from rank 0 (after a step whose result
    may depend on each rank's own batch: SmoothQuant's folds, calibration on local batches); FSDP2
    shards excepted (module docstring)."""
    for tensor in model.state_dict().values():
        if tensor.is_floating_point() and not is_sharded(tensor):
            broadcast_(tensor)


def sum_over_ranks(stats: dict[str, list]) -> None:
    """All-reduce (sum) GPTQ's statistics ``{name: [X^T X, tokens]}`` in place."""
    if not is_distributed():
        return
    for entry in stats.values():
        dist.all_reduce(entry[0])
        tokens = torch.tensor(entry[1], dtype=torch.int64, device=entry[0].device)
        dist.all_reduce(tokens)
        entry[1] = int(tokens)


def sum_grids_(grids: dict[str, torch.Tensor]) -> None:
    """All-reduce (sum) float32 grids ``{name: tensor}`` in place, in one collective."""
    if not is_distributed() or not grids:
        return
    flat = torch.cat([grid.reshape(-1) for grid in grids.values()])
    dist.all_reduce(flat)
    offset = 0
    for grid in grids.values():
        grid.copy_(flat[offset:offset + grid.numel()].view_as(grid))
        offset += grid.numel()


def info(logger: logging.Logger, message: str) -> None:
    """``logger.info(message)`` on rank 0."""
    if is_rank_zero():
        logger.info(message)


def warn(message: str) -> None:
    """``warnings.warn(message)`` on rank 0."""
    if is_rank_zero():
        warnings.warn(message, stacklevel=3)
