"""compress/lightning/callbacks.py with ``BlockPruning(algorithm="obs")``: pruned one-shot on calibration
batches when training starts (Calibration callback), then fine-tuned with the masks kept; and the plain
loop's ``CompressionSchedule(calibration_data=...)`` doing the same."""
import lightning.pytorch as pl
import pytest
import torch
from torch import nn

import compress
from compress.core.sparsity import expand_mask
from compress.lightning.callbacks import BlockPruning, Calibration, Export
from compress.nn.qat import compressed_layers
from compress.schedule import PruningSchedule
from tests.compress.lightning.test_callbacks import TinyTask, _trainer, loader


class MaskAtFirstStep(pl.Callback):
    """Records each layer's mask and weight as the first training batch starts."""

    def __init__(self):
        self.masks, self.weights = {}, {}

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if batch_idx == 0:
            for name, layer in compressed_layers(pl_module.model).items():
                self.masks[name] = layer.mask.clone()
                self.weights[name] = layer.weight.detach().clone()


def test_obs_prunes_before_the_first_step_and_training_keeps_the_masks(tmp_path):
    task, first = TinyTask(), MaskAtFirstStep()
    dense = {name: module.weight.detach().clone() for name, module in task.model.named_modules()
             if isinstance(module, nn.Linear)}
    callbacks = [BlockPruning(sparsity=0.5, algorithm="obs"), Calibration(num_batches=4), first,
                 Export(str(tmp_path / "export"))]
    _trainer(callbacks, max_steps=6).fit(task, loader())
    assert first.masks
    for name, mask in first.masks.items():
        assert int((~mask).sum()) == mask.numel() // 2
        kept = expand_mask(mask, tuple(first.weights[name].shape), 32)
        assert bool((first.weights[name][~kept] == 0).all())
        assert not torch.equal(first.weights[name][kept], dense[name][kept])  # compensated, not just masked
    exported = compress.load_compressed(tmp_path / "export", model=TinyTask().model)
    for name, layer in exported.named_modules():
        if name in first.masks:
            weight = layer.dequantized_weight() if hasattr(layer, "dequantized_weight") else layer.weight
            assert bool((weight.detach()[~expand_mask(first.masks[name], tuple(weight.shape), 32)] == 0).all())


def test_obs_without_a_calibration_callback_fails_before_training():
    with pytest.raises(ValueError, match="algorithm='obs' .* needs a compress.lightning.callbacks.Calibration"):
        _trainer([BlockPruning(sparsity=0.5, algorithm="obs")], max_steps=1).fit(TinyTask(), loader())


def test_plain_loop_schedule_prunes_one_shot_on_calibration_data():
    task = TinyTask()
    batches = [x for (x, _), _ in zip(loader(), range(4))]
    schedule = compress.CompressionSchedule(task.model, pruning=PruningSchedule(0.5, algorithm="obs"),
                                            calibration_data=batches)
    masks = {name: layer.mask.clone() for name, layer in compressed_layers(task.model).items()}
    assert all(int((~m).sum()) == m.numel() // 2 for m in masks.values())
    optimizer = torch.optim.AdamW(task.model.parameters(), lr=1e-2)
    for (x, y), _ in zip(loader(), range(3)):
        nn.functional.cross_entropy(task.model(x), y).backward()
        schedule.before_optimizer_step(optimizer)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad()
    schedule.finish()
    assert all(torch.equal(layer.mask, masks[name]) for name, layer in compressed_layers(task.model).items())


def test_plain_loop_schedule_without_calibration_data_is_refused():
    with pytest.raises(ValueError, match="expected calibration_data=batches"):
        compress.CompressionSchedule(TinyTask().model, pruning=PruningSchedule(0.5, algorithm="obs"))


def test_global_allocation_is_refused_with_obs():
    with pytest.raises(ValueError, match="algorithm='obs' prunes each layer to its sparsity one-shot: "
                                         "expected allocation='layer'"):
        BlockPruning(sparsity=0.5, algorithm="obs", allocation="global")
