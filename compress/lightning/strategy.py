"""The Lightning strategies the compression callbacks run under, and the FSDP2 mesh of a task.

* One device, DDP (``"ddp"``, ``"ddp_spawn"``, ...): every rank holds the whole model
  (:mod:`compress.schedule.distributed`).
* FSDP: ``lightning.pytorch.strategies.ModelParallelStrategy`` with ``tensor_parallel_size=1`` and
  ``data_parallel_size`` = the number of processes. It is Lightning's route to FSDP2
  (``torch.distributed.fsdp.fully_shard``): the LightningModule shards its model in
  ``configure_model`` (the tasks of :mod:`compress.lightning.tasks` call
  :func:`compress.schedule.fsdp.fully_shard_model` there, after the callbacks' ``setup`` swapped the
  layers), parameters become DTensors sharded by rows, and checkpoints are sharded (one file per rank
  plus ``meta.pt`` holding the callbacks' state).

Refused with a ``ValueError`` saying what to use instead: ``FSDPStrategy`` (``"fsdp"``, FSDP1: it
flattens each unit's parameters into one 1-D buffer cut at arbitrary offsets, so a rank's shard is
no set of rows), DeepSpeed (ZeRO-3 partitions parameters its own way) and ``ModelParallelStrategy``
with tensor parallelism (it shards weights by columns too).
"""
from __future__ import annotations

from typing import Optional

import lightning.pytorch as pl
from lightning.pytorch.strategies import DeepSpeedStrategy, FSDPStrategy, ModelParallelStrategy

FSDP_ADVICE = ("use lightning.pytorch.strategies.ModelParallelStrategy(data_parallel_size=<number of devices>, "
               "tensor_parallel_size=1) for FSDP2, or 'ddp'")


def check_strategy(strategy: Optional[pl.strategies.Strategy], where: str) -> None:
    """ValueError for a strategy the compression callbacks do not support (module docstring); None (no
    trainer) passes."""
    if isinstance(strategy, FSDPStrategy):
        raise ValueError(f"{where}: FSDPStrategy ('fsdp', FSDP1) is not supported: it shards flattened parameters, "
                         f"not rows of each weight; {FSDP_ADVICE}")
    if isinstance(strategy, DeepSpeedStrategy):
        raise ValueError(f"{where}: DeepSpeedStrategy is not supported (ZeRO partitions parameters its own way); "
                         f"{FSDP_ADVICE}")
    if isinstance(strategy, ModelParallelStrategy):
        try:
            mesh = strategy.device_mesh
        except RuntimeError:  # no processes launched (e.g. `compress export` reading a recipe): nothing sharded
            return
        _check_data_parallel_only(mesh, where)


def _check_data_parallel_only(mesh, where: str) -> None:
    tensor_parallel = mesh["tensor_parallel"].size()
    if tensor_parallel != 1:
        raise ValueError(f"{where}: ModelParallelStrategy with tensor_parallel_size={tensor_parallel} "
                         f"is not supported: compress shards weights by rows with FSDP2 only; {FSDP_ADVICE}")


def is_fsdp(trainer: pl.Trainer) -> bool:
    """Whether ``trainer`` runs FSDP2 (``ModelParallelStrategy``)."""
    return isinstance(trainer.strategy, ModelParallelStrategy)


def data_parallel_mesh(pl_module: pl.LightningModule) -> Optional[object]:
    """The 1-D data-parallel mesh to shard over under ``ModelParallelStrategy``; None under other strategies."""
    mesh = pl_module.device_mesh
    if mesh is None:
        return None
    _check_data_parallel_only(mesh, type(pl_module).__name__)
    return mesh["data_parallel"]
