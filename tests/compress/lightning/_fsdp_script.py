"""Run by test_callbacks_fsdp.py in a subprocess: 2-process FSDP2 (Lightning's ModelParallelStrategy,
gloo, CPU) with pruning + QAT + calibration + GPTQ + export, twice: an uninterrupted run of 6 steps
(one batch per epoch) that checkpoints (sharded) at the end of every epoch, then a run resumed from
the checkpoint of step 4. Each rank saves what it holds after each run to <out>/rank<r>.pt; rank 0 also the exported
and the float models' state; the exports go to <out>/export-<run>."""
import sys

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.strategies import ModelParallelStrategy

from compress.lightning.callbacks import Export, FloatWeightsSnapshot
from tests.compress.lightning.test_callbacks_fsdp import (
    FsdpTask,
    HeldState,
    PrunedRowsCheck,
    compression_callbacks,
)


def fit(out: str, run: str, ckpt_path=None):
    pl.seed_everything(0)
    task = FsdpTask()
    snapshot, held, export = FloatWeightsSnapshot(), HeldState(), Export(f"{out}/export-{run}")
    zeros, checkpoints = PrunedRowsCheck(), ModelCheckpoint(dirpath=f"{out}/checkpoints-{run}", save_top_k=-1)
    callbacks = [snapshot, *compression_callbacks(), held, export, zeros, checkpoints]
    trainer = pl.Trainer(strategy=ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1),
                         accelerator="cpu", devices=2, max_steps=6, callbacks=callbacks, logger=False,
                         enable_progress_bar=False, enable_model_summary=False, use_distributed_sampler=False)
    trainer.fit(task, ckpt_path=ckpt_path)
    state = held.state
    state["zero_after_steps"] = zeros.steps
    state["float"] = None if snapshot.model is None else snapshot.model.state_dict()
    state["export"] = None if export.model is None else export.model.state_dict()
    return trainer.global_rank, state


if __name__ == "__main__":
    out = sys.argv[1]
    rank, uninterrupted = fit(out, "uninterrupted")
    _, resumed = fit(out, "resumed", ckpt_path=f"{out}/checkpoints-uninterrupted/epoch=3-step=4.ckpt")
    torch.save({"uninterrupted": uninterrupted, "resumed": resumed}, f"{out}/rank{rank}.pt")
