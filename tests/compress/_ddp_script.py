"""Run by test_callbacks.py in a subprocess: 2-process DDP (gloo, CPU) with pruning + QAT +
calibration; each rank saves its masks, scales and smoothing factors to <out>/rank<r>.pt."""
import sys

import lightning.pytorch as pl
import torch

from compress.callbacks import BlockPruning, Calibration, QuantizationAware
from compress.configs import W8A8Config
from compress.plan import compressed_layers
from tests.compress.test_callbacks import TinyTask, loader

if __name__ == "__main__":
    out = sys.argv[1]
    pl.seed_everything(0)
    task = TinyTask()
    callbacks = [BlockPruning(0.5, start_step=0, end_step=4, frequency=2),
                 QuantizationAware(W8A8Config(activation="static"), start_step=0),
                 Calibration(num_batches=2, smoothquant_alpha=0.5)]
    trainer = pl.Trainer(strategy="ddp", accelerator="cpu", devices=2, max_steps=6, callbacks=callbacks,
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False)
    trainer.fit(task, loader(seed_offset=0))
    state = {name: {"mask": layer.mask, "act_scale": layer.act_scale, "smoothing": layer.input_smoothing,
                    "weight": layer.weight.detach()} for name, layer in compressed_layers(task.model).items()}
    torch.save(state, f"{out}/rank{trainer.global_rank}.pt")
