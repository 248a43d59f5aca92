"""Run by test_callbacks.py in a subprocess: 2-process DDP (gloo, CPU) with block pruning by a
gradient score (argv[2]: movement or fisher); the ranks see different batches, so equal sums show
that they accumulate the all-reduced gradients. Each rank saves its masks and sums to <out>/rank<r>.pt.
Movement prunes to 50% by step 4 of 5; Fisher's sums restart at every re-scoring, so its schedule
runs past the last step (end_step 8) and the sums of step 4 are still there to compare."""
import sys

import lightning.pytorch as pl
import torch

from compress.lightning.callbacks import BlockPruning
from compress.nn.qat import compressed_layers
from tests.compress.lightning.test_callbacks import TinyTask, loader

if __name__ == "__main__":
    out, score = sys.argv[1], sys.argv[2]
    pl.seed_everything(0)
    task = TinyTask()
    pruning = BlockPruning(0.5, start_step=1, end_step=4 if score == "movement" else 8, frequency=1, score=score)
    trainer = pl.Trainer(strategy="ddp", accelerator="cpu", devices=2, max_steps=5, callbacks=[pruning],
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False)
    trainer.fit(task, loader(seed_offset=0))
    state = {name: {"mask": layer.mask.clone(), "sums": pruning.schedule.gradient_scores[name].clone()}
             for name, layer in compressed_layers(task.model).items()}
    torch.save(state, f"{out}/rank{trainer.global_rank}.pt")
