"""Run by test_callbacks.py in a subprocess: 2-process DDP (gloo, CPU) with pruning + QAT +
calibration + GPTQ + export; each rank saves its masks, scales, smoothing factors, GPTQ's token
counts after the all-reduce and exported state to <out>/rank<r>.pt; rank 0 writes the export
directory <out>/export."""
import sys

import lightning.pytorch as pl
import torch

from compress.configs import W8A8Config
from compress.lightning.callbacks import BlockPruning, Calibration, Export, QuantizationAware
from compress.nn.qat import compressed_layers
from compress.schedule import distributed
from tests.compress.lightning.test_callbacks import TinyTask, loader

if __name__ == "__main__":
    out = sys.argv[1]
    pl.seed_everything(0)
    task = TinyTask()
    callbacks = [BlockPruning(0.5, start_step=0, end_step=4, frequency=2),
                 QuantizationAware(W8A8Config(activation="static", algorithm="gptq"), start_step=0),
                 Calibration(num_batches=2, smoothquant_alpha=0.5), Export(f"{out}/export")]
    trainer = pl.Trainer(strategy="ddp", accelerator="cpu", devices=2, max_steps=6, callbacks=callbacks,
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False)
    state = {}
    sum_over_ranks = distributed.sum_over_ranks

    def recording_sum(stats):
        sum_over_ranks(stats)
        state.setdefault("gptq_tokens", {}).update({name: tokens for name, (_, tokens) in stats.items()})  # per stage

    distributed.sum_over_ranks = recording_sum

    class Snapshot(pl.Callback):
        def on_train_end(self, trainer, pl_module):  # before Export converts the layers at fit end
            state.update({name: {"mask": layer.mask.clone(), "act_scale": layer.act_scale.clone(),
                                 "smoothing": layer.input_smoothing.clone(), "weight": layer.weight.detach().clone(),
                                 "weight_scale": layer.weight_scale.clone()}
                          for name, layer in compressed_layers(pl_module.model).items()})

    trainer.callbacks.append(Snapshot())
    trainer.fit(task, loader(seed_offset=0))
    state["exported"] = {k: v.clone() for k, v in task.model.state_dict().items()}
    torch.save(state, f"{out}/rank{trainer.global_rank}.pt")
