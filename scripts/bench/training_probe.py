"""A Lightning callback that measures training on each rank: peak GPU memory and the time of every step.

Added to a recipe's ``trainer.callbacks`` by :mod:`scripts.bench.fsdp` (by class path,
``scripts.bench.training_probe.TrainingProbe``). Per rank it records

* ``step_seconds``: for every training batch, the time from ``on_train_batch_start`` to
  ``on_train_batch_end`` (forward, backward, optimizer step and the compression callbacks' work in
  between), with the GPU synchronised at both ends;
* ``peak_allocated_bytes`` / ``peak_reserved_bytes``: ``torch.cuda.max_memory_allocated`` /
  ``max_memory_reserved`` after the last training batch, the statistics reset when training starts
  (None on the CPU);

and writes them, with the rank, world size and device name, to ``<path>/rank<r>.json`` when training
ends. It changes nothing in the run.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import lightning.pytorch as pl
import torch


class TrainingProbe(pl.Callback):
    """Peak GPU memory and step times of this rank, written to ``<path>/rank<r>.json`` (module docstring)."""

    def __init__(self, path: str):
        super().__init__()
        if not isinstance(path, str) or not path:
            raise ValueError(f"path: expected a non-empty directory path, got {path!r}")
        self.path = path
        self.step_seconds: list[float] = []
        self.peaks: tuple = (None, None)
        self._started = 0.0

    @staticmethod
    def _synchronize(device: torch.device) -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def on_train_start(self, trainer, pl_module):
        if pl_module.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(pl_module.device)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self._synchronize(pl_module.device)
        self._started = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self._synchronize(pl_module.device)
        self.step_seconds.append(time.perf_counter() - self._started)
        if pl_module.device.type == "cuda":
            self.peaks = (torch.cuda.max_memory_allocated(pl_module.device),
                          torch.cuda.max_memory_reserved(pl_module.device))

    def on_train_end(self, trainer, pl_module):
        device = pl_module.device
        record = {"rank": trainer.global_rank, "world_size": trainer.world_size,
                  "device": torch.cuda.get_device_name(device) if device.type == "cuda" else device.type,
                  "peak_allocated_bytes": self.peaks[0], "peak_reserved_bytes": self.peaks[1],
                  "step_seconds": self.step_seconds}
        Path(self.path).mkdir(parents=True, exist_ok=True)
        (Path(self.path) / f"rank{trainer.global_rank}.json").write_text(json.dumps(record, indent=1))
