"""FSDP2 shards: which rows of a full tensor this process holds, and the few steps that need all of them.

``torch.distributed.fsdp.fully_shard`` (FSDP2) replaces each Parameter of the modules it wraps by a
``DTensor`` sharded on dim 0 over a 1-D device mesh of ``P`` processes: process ``r`` holds rows
``[r * c, min((r + 1) * c, N))`` of an (N, ...) tensor, ``c = ceil(N / P)`` (``torch.chunk``'s split;
the last processes may hold fewer rows, or none). Inside the forward FSDP all-gathers the full tensors;
outside it, a step that works row by row (zeroing a layer's pruned weights, initialising per-channel
or per-group scales, GPTQ, SmoothQuant's column scaling) works on this process's rows only:
:func:`local_tensor` gives them (a view: writing into it writes the shard) and :func:`local_rows`
says which rows they are. A layer's weight (N, K) and its per-row scales (N,) or (N, G) are split
alike, so a process's rows of the one match its rows of the other.

A plain tensor is its own local rows, so the same code serves a model that is not sharded.
Only ``Shard(0)`` on a 1-D mesh (FSDP2's default placement) is understood; any other placement is a
``ValueError``. :func:`reshard_` puts every FSDP2 module back on its shards: after a forward without
backward (evaluation, calibration) the root module keeps its gathered parameters, and an in-place
change made to those would not reach the shards.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

if dist.is_available():
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor, Shard
else:  # a build of torch without torch.distributed: nothing is ever sharded
    FSDPModule = DTensor = Shard = None


def is_sharded(t: torch.Tensor) -> bool:
    """Whether ``t`` is a ``DTensor`` (an FSDP2 shard), not a whole tensor."""
    return DTensor is not None and isinstance(t, DTensor)


def _check_row_sharded(t: DTensor) -> None:
    """ValueError unless ``t`` is sharded on dim 0 over a 1-D mesh of every process (FSDP2 as compress uses it)."""
    if t.device_mesh.ndim != 1 or tuple(t.placements) != (Shard(0),) or t.device_mesh.size() != dist.get_world_size():
        raise ValueError(f"expected a tensor sharded on dim 0 over a 1-D mesh of all {dist.get_world_size()} processes "
                         f"(FSDP2's fully_shard), got placements {tuple(t.placements)} "
                         f"on a {t.device_mesh.ndim}-D mesh of {t.device_mesh.size()}; compress supports FSDP2 "
                         "data parallelism only (no tensor parallelism, no HSDP)")


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """The rows of ``t`` this process holds (``t`` itself when it is not sharded)."""
    if not is_sharded(t):
        return t
    _check_row_sharded(t)
    return t.to_local()


def local_rows(t: torch.Tensor) -> slice:
    """Which rows of the full tensor :func:`local_tensor` holds: ``slice(start, stop)``."""
    if not is_sharded(t):
        return slice(0, t.shape[0])
    _check_row_sharded(t)
    rows, processes, rank = t.shape[0], t.device_mesh.size(), t.device_mesh.get_local_rank()
    chunk = -(-rows // processes)
    start = min(rank * chunk, rows)
    stop = min(start + chunk, rows)
    held = t.to_local().shape[0]
    if held != stop - start:
        raise ValueError(f"expected this process to hold rows {start}:{stop} of {rows} (torch.chunk's split over "
                         f"{processes} processes), got {held} rows")
    return slice(start, stop)


def rows_to_full(local: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """The full tensor whose rows ``local_rows(like)`` this process holds in ``local`` (the others hold
    theirs); a collective when ``like`` is sharded, ``local`` itself otherwise."""
    if not is_sharded(like):
        return local
    _check_row_sharded(like)
    shape = torch.Size((like.shape[0], *local.shape[1:]))
    stride = torch.empty(shape, device="meta").stride()
    return DTensor.from_local(local, like.device_mesh, like.placements, run_check=False, shape=shape,
                              stride=stride).full_tensor()


def max_over_shards_(partial: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``partial`` (computed from this process's rows of ``like``) replaced by its maximum over the
    processes of ``like``'s mesh (an all-reduce) when ``like`` is sharded; returned."""
    if is_sharded(like):
        dist.all_reduce(partial, op=dist.ReduceOp.MAX, group=like.device_mesh.get_group())
    return partial


def column_absmax(w: torch.Tensor) -> torch.Tensor:
    """(K,) float32 ``max_n |w[n, k]|`` over all rows of ``w`` (N, K): over every process's rows (an
    all-reduce with max over the mesh) when ``w`` is sharded."""
    rows = local_tensor(w).detach().float()
    return max_over_shards_(rows.abs().amax(dim=0) if rows.shape[0] else rows.new_zeros(rows.shape[1]), w)


def fsdp_modules(model: nn.Module) -> list[FSDPModule]:
    """The modules of ``model`` that ``fully_shard`` was applied to (none for a model it was not)."""
    if FSDPModule is None:
        return []
    return [m for m in model.modules() if isinstance(m, FSDPModule)]


def reshard_(model: nn.Module) -> None:
    """Put every FSDP2 module of ``model`` back on its shards (nothing to do when they are already, or
    when ``model`` is not sharded)."""
    for module in fsdp_modules(model):
        module.reshard()
