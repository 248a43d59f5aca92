"""Run by test_distill.py in a subprocess: 2-process DDP (gloo, CPU) fine-tuning of a tiny Bert with
block pruning and distillation from a snapshot; each rank saves its teacher's and student's
state and whether the teacher is ready to <out>/rank<r>.pt."""
import sys

import lightning.pytorch as pl
import torch

from compress.lightning.callbacks import BlockPruning
from compress.lightning.data import DigitsData
from compress.lightning.distill import DistillationConfig
from compress.lightning.tasks import SequenceClassificationTask
from tests.compress.lightning.test_tasks import TINY_BERT

if __name__ == "__main__":
    out = sys.argv[1]
    pl.seed_everything(0)
    task = SequenceClassificationTask(config=TINY_BERT, num_labels=10, learning_rate=1e-3,
                                      distillation=DistillationConfig(alpha=0.5, start_step=1))
    trainer = pl.Trainer(strategy="ddp", accelerator="cpu", devices=2, max_steps=4,
                         callbacks=[BlockPruning(0.5, start_step=1, end_step=3, frequency=1)], logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         limit_val_batches=0)
    trainer.fit(task, datamodule=DigitsData(batch_size=8, max_train_samples=64))
    torch.save({"ready": bool(task.teacher.ready),
                "teacher": {k: v.clone() for k, v in task.teacher.model.state_dict().items()},
                "student": {k: v.clone() for k, v in task.model.state_dict().items()}},
               f"{out}/rank{trainer.global_rank}.pt")
