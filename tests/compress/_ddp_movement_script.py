"""Run by test_callbacks.py in a subprocess: 2-process DDP (gloo, CPU) with movement block pruning;
the ranks see different batches, so equal movement sums show that they accumulate the all-reduced
gradients. Each rank saves its masks and movement sums to <out>/rank<r>.pt."""
import sys

import lightning.pytorch as pl
import torch

from compress.callbacks import BlockPruning
from compress.plan import compressed_layers
from tests.compress.test_callbacks import TinyTask, loader

if __name__ == "__main__":
    out = sys.argv[1]
    pl.seed_everything(0)
    task = TinyTask()
    pruning = BlockPruning(0.5, start_step=1, end_step=4, frequency=1, score="movement")
    trainer = pl.Trainer(strategy="ddp", accelerator="cpu", devices=2, max_steps=5, callbacks=[pruning],
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False)
    trainer.fit(task, loader(seed_offset=0))
    state = {name: {"mask": layer.mask.clone(), "movement": pruning.gradient_scores[name].clone()}
             for name, layer in compressed_layers(task.model).items()}
    torch.save(state, f"{out}/rank{trainer.global_rank}.pt")
