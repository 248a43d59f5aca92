"""Tests for compress/lightning/callbacks.py: validation, a composed run (prune + QAT + calibration +
export), the same on GPT-2's Conv1D layers, the model they compress, the float snapshot, resume from a
Lightning checkpoint, DDP on 2 CPU processes, movement and Fisher scores (accumulation, schedule, state,
resume, DDP), YAML
instantiation (jsonargparse; by class path, by the flat layout's ``compress.callbacks.X``, by short
name), and the model they train being the one a plain loop with ``compress.CompressionSchedule`` trains."""
import dataclasses
import itertools
import os
import pathlib
import subprocess
import sys

import lightning.pytorch as pl
import pytest
import torch
import yaml
from torch import nn

import compress
from compress.configs import W4A16Config, W8A8Config, W8A16Config
from compress.core.sparsity import block_mask, cubic_sparsity, expand_mask, mask_sparsity
from compress.lightning.callbacks import (
    BlockPruning,
    Calibration,
    Export,
    FloatWeightsSnapshot,
    QuantizationAware,
    target_model,
)
from compress.nn.qat import compressed_layers
from tests.compress.models import PreNormMLP

REPO = pathlib.Path(__file__).resolve().parents[3]


class TinyTask(pl.LightningModule):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.model = PreNormMLP()

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self.model(x), y)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-2, weight_decay=0.1)


def loader(seed_offset=0, batches=16):
    generator = torch.Generator().manual_seed(123 + seed_offset)
    x = torch.randn(batches * 8, 64, generator=generator)
    x[:, 3] *= 20  # an outlier channel for SmoothQuant to move
    y = torch.randint(0, 4, (batches * 8,), generator=generator)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8)


def _trainer(callbacks, max_steps, **kwargs):
    return pl.Trainer(max_steps=max_steps, callbacks=callbacks, accelerator="cpu", logger=False,
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False, **kwargs)


@pytest.mark.parametrize("make, fragment", [
    (lambda: BlockPruning(sparsity=1.2), "[0, 1)"),
    (lambda: BlockPruning(score="taylor"), "'magnitude'"),
    (lambda: BlockPruning(score="taylor"), "'movement'"),
    (lambda: BlockPruning(start_step=10, end_step=5), "end_step"),
    (lambda: BlockPruning(frequency=0), "positive int"),
    (lambda: BlockPruning(allocation="uniform"), "'global'"),
    (lambda: BlockPruning(allocation="global", plan={"*up*": 0.5}), "plan=None"),
    (lambda: BlockPruning(spread=1.0), "spread"),
    (lambda: BlockPruning(reorder_neurons="yes"), "bool"),
    (lambda: QuantizationAware(), "exactly one of config"),
    (lambda: QuantizationAware(W8A8Config(), start_step=-1), "non-negative"),
    (lambda: Calibration(observer="minmax"), "'absmax'"),
    (lambda: Calibration(num_batches=0), "positive int"),
    (lambda: Calibration(smoothquant_alpha=2.0), "[0, 1]"),
    (lambda: Export(dirpath=""), "non-empty"),
])
def test_init_validation_lists_valid_options(make, fragment):
    with pytest.raises(ValueError) as error:
        make()
    assert fragment in str(error.value)


def test_quantization_aware_rejects_a_sparse_config():
    with pytest.raises(TypeError, match="W8A8Config, W4A16Config, W8A16Config or W8A8BlockConfig"):
        QuantizationAware(plan={"*": compress.BlockSparseConfig(0.5)})


def test_composed_run_prunes_quantizes_calibrates_and_exports(tmp_path):
    task = TinyTask()
    callbacks = [BlockPruning(0.5, start_step=0, end_step=6, frequency=2),
                 QuantizationAware(W8A8Config(activation="static"), start_step=2),
                 Calibration(num_batches=2, smoothquant_alpha=0.5),
                 Export(str(tmp_path / "export"))]
    seen = {}

    class Inspect(pl.Callback):
        def on_train_end(self, trainer, pl_module):
            for name, layer in compressed_layers(pl_module.model).items():
                seen[name] = (layer.mask.clone(), layer.weight.detach().clone(), layer.act_scale.clone())

    _trainer(callbacks + [Inspect()], max_steps=8).fit(task, loader())
    assert set(seen) == {"up", "down"}
    for name, (mask, weight, act_scale) in seen.items():
        assert mask_sparsity(mask) == pytest.approx(0.5)
        assert (weight[~expand_mask(mask, weight.shape)] == 0).all()
        assert act_scale.item() > 0
    assert type(task.model.up).__name__ == "BSRW8A8Linear" and task.model.up.config.static
    loaded = compress.load_compressed(tmp_path / "export", model=PreNormMLP())
    x = torch.randn(3, 64)
    with torch.no_grad():
        assert torch.equal(loaded(x), task.model(x))


def test_callbacks_train_and_export_the_conv1d_layers_of_gpt2(tmp_path):
    """prepare runs in setup, before configure_optimizers: the optimizer holds the Linear copies of
    GPT-2's Conv1D weights, so they train (and stay pruned), and the export reloads as GPT-2."""
    transformers = pytest.importorskip("transformers")

    class GPT2Task(pl.LightningModule):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
                n_embd=64, n_layer=1, n_head=2, vocab_size=128, n_positions=32, bos_token_id=1, eos_token_id=2))

        def training_step(self, batch, batch_idx):
            return self.model(input_ids=batch[0], labels=batch[0]).loss

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-2)

    task = GPT2Task()
    initial = task.model.transformer.h[0].mlp.c_fc.weight.detach().T.clone()
    ids = torch.randint(3, 128, (16, 12), generator=torch.Generator().manual_seed(0))
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(ids), batch_size=4)
    seen = {}

    class Inspect(pl.Callback):
        def on_train_end(self, trainer, pl_module):
            layer = pl_module.model.transformer.h[0].mlp.c_fc
            seen.update(from_conv1d=layer.from_conv1d, weight=layer.weight.detach().clone(), mask=layer.mask.clone())

    callbacks = [BlockPruning(0.5, start_step=0, end_step=2, frequency=1), QuantizationAware(W8A8Config()),
                 Export(str(tmp_path / "export"))]
    _trainer(callbacks + [Inspect()], max_steps=4).fit(task, data)
    kept = expand_mask(seen["mask"], seen["weight"].shape)
    assert seen["from_conv1d"] and mask_sparsity(seen["mask"]) == pytest.approx(0.5)
    assert (seen["weight"][~kept] == 0).all() and not torch.equal(seen["weight"][kept], initial[kept])
    assert type(task.model.transformer.h[0].mlp.c_fc).__name__ == "BSRW8A8Linear"
    loaded, exported = compress.load_compressed(tmp_path / "export"), task.model.eval()  # no dropout
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids[:2]).logits, exported(input_ids=ids[:2]).logits,
                                   atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("config, module", [(W4A16Config(32, algorithm="gptq"), compress.W4A16Linear),
                                            (W8A16Config(128, algorithm="gptq"), compress.W8A16Linear)])
def test_calibration_runs_gptq_at_train_end_and_export_stores_its_weights(config, module, tmp_path):
    task = TinyTask()
    float_weights = {}

    class FloatWeights(pl.Callback):  # listed before Calibration: its on_train_end runs first
        def on_train_end(self, trainer, pl_module):
            float_weights.update({name: layer.weight.detach().clone()
                                  for name, layer in compressed_layers(pl_module.model).items()})

    callbacks = [FloatWeights(), QuantizationAware(config, start_step=2), Calibration(num_batches=2),
                 Export(str(tmp_path / "export"))]
    _trainer(callbacks, max_steps=4).fit(task, loader())
    up = task.model.up
    assert type(up) is module and up.config.algorithm == "gptq"
    first_two = [batch[0] for batch, _ in zip(loader(), range(2))]  # the batches GPTQ saw
    x = torch.cat([task.model.norm(batch) for batch in first_two]).detach()
    float_w = float_weights["up"]
    rtn_config = dataclasses.replace(config, algorithm="rtn")
    rtn = module.from_float(nn.Linear(64, 128), rtn_config, weight=float_w).dequantized_weight()
    gptq_error = (x @ (up.dequantized_weight() - float_w).T).norm()
    assert gptq_error < 0.6 * (x @ (rtn - float_w).T).norm()  # measured: 0.20 (W4A16 g32), 0.20 (W8A16 g128)
    loaded = compress.load_compressed(tmp_path / "export", model=PreNormMLP())
    with torch.no_grad():
        assert torch.equal(loaded(x), task.model(x))


def test_gptq_without_calibration_fails_before_training():
    with pytest.raises(ValueError, match="algorithm='gptq' needs a compress.lightning.callbacks.Calibration"):
        _trainer([QuantizationAware(W4A16Config(32, algorithm="gptq"))], max_steps=1).fit(TinyTask(), loader())


def test_target_model_is_the_tasks_model_else_the_task():
    task = TinyTask()
    assert target_model(task) is task.model
    bare = pl.LightningModule()
    assert target_model(bare) is bare
    bare.model = "a name, not a module"
    assert target_model(bare) is bare


def test_float_snapshot_keeps_the_pruned_float_weights_before_export(tmp_path):
    task, snapshot = TinyTask(), FloatWeightsSnapshot()
    callbacks = [snapshot, BlockPruning(0.5, start_step=0, end_step=2, frequency=1),
                 QuantizationAware(W8A8Config(), start_step=0), Export(str(tmp_path / "export"))]
    _trainer(callbacks, max_steps=3).fit(task, loader())
    assert type(task.model.up).__name__ == "BSRW8A8Linear"  # Export converted the task's model afterwards
    up = snapshot.model.up
    assert type(up) is nn.Linear and up.weight.device.type == "cpu"
    block_is_zero = up.weight.detach().reshape(128 // 32, 32, 64 // 32, 32).abs().sum(dim=(1, 3)) == 0
    assert block_is_zero.float().mean().item() == pytest.approx(0.5)
    assert not compressed_layers(snapshot.model)


def test_static_qat_without_calibration_fails_before_training():
    with pytest.raises(ValueError, match="Calibration"):
        _trainer([QuantizationAware(W8A8Config(activation="static"))], max_steps=2).fit(TinyTask(), loader())


def test_qat_is_off_before_its_start_step():
    task = TinyTask()
    flags = []

    class Record(pl.Callback):
        def on_train_batch_end(self, trainer, pl_module, *args):
            flags.append(pl_module.model.up.fake_quant_enabled)

    _trainer([QuantizationAware(W4A16Config(32), start_step=2), Record()], max_steps=4).fit(task, loader())
    assert flags == [False, False, True, True]


def test_resume_restores_schedule_and_masks(tmp_path):
    def callbacks():
        return [BlockPruning(0.5, start_step=0, end_step=8, frequency=2),
                QuantizationAware(W8A8Config(activation="static"), start_step=0),
                Calibration(num_batches=2)]

    task = TinyTask()
    trainer = _trainer(callbacks(), max_steps=4)
    trainer.fit(task, loader())
    ckpt = tmp_path / "mid.ckpt"
    trainer.save_checkpoint(ckpt)
    saved = {name: (layer.mask.clone(), layer.act_scale.clone())
             for name, layer in compressed_layers(task.model).items()}
    assert 0 < mask_sparsity(saved["up"][0]) < 0.5  # mid-schedule

    restored = {}

    class Capture(pl.Callback):
        def on_train_start(self, trainer, pl_module):
            restored.update({name: (layer.mask.clone(), layer.act_scale.clone())
                             for name, layer in compressed_layers(pl_module.model).items()})
            restored["step"] = trainer.global_step
            restored["pruning"] = trainer.callbacks[0].schedule.last_pruned_step
            restored["calibration"] = trainer.callbacks[2].schedule.phase

    resumed_task = TinyTask()
    resumed = _trainer(callbacks() + [Capture()], max_steps=10)
    resumed.fit(resumed_task, loader(), ckpt_path=ckpt)
    assert restored["step"] == 4 and restored["pruning"] == 2 and restored["calibration"] == "done"
    for name, (mask, act_scale) in saved.items():
        assert torch.equal(restored[name][0], mask) and torch.equal(restored[name][1], act_scale)
    assert mask_sparsity(resumed_task.model.up.mask) == pytest.approx(0.5)


def _checkpoint_of(callbacks, tmp_path, max_steps=4):
    """Train ``callbacks`` for ``max_steps`` and save a Lightning checkpoint; returns its path."""
    trainer = _trainer(callbacks, max_steps=max_steps)
    trainer.fit(TinyTask(), loader())
    ckpt = tmp_path / "mid.ckpt"
    trainer.save_checkpoint(ckpt)
    return ckpt


def test_resuming_with_another_sparsity_is_refused(tmp_path):
    ckpt = _checkpoint_of([BlockPruning(0.5, end_step=8, frequency=2)], tmp_path)
    resumed = _trainer([BlockPruning(0.7, end_step=8, frequency=2)], max_steps=10)
    with pytest.raises(ValueError, match=r"PruningSchedule.load_state_dict: the saved state was made with "
                                         r"sparsity=0\.5, this schedule has sparsity=0\.7"):
        resumed.fit(TinyTask(), loader(), ckpt_path=ckpt)
    assert resumed.global_step == 0


def test_resuming_with_another_quantization_config_is_refused(tmp_path):
    ckpt = _checkpoint_of([QuantizationAware(W4A16Config(32))], tmp_path)
    stored = torch.load(ckpt, weights_only=True)["callbacks"]
    assert [s["layers"]["up"]["group_size"] for s in stored.values()] == [32]
    resumed = _trainer([QuantizationAware(W4A16Config(64))], max_steps=10)
    with pytest.raises(ValueError, match="layer 'up': saved with group_size=32, this schedule has group_size=64"):
        resumed.fit(TinyTask(), loader(), ckpt_path=ckpt)
    assert resumed.global_step == 4  # refused in on_train_start, before any step


def test_a_second_on_before_optimizer_step_in_one_step_is_refused():
    pruning = BlockPruning(0.5, end_step=8, score="movement")

    class CallsTwice(pl.Callback):
        def on_before_optimizer_step(self, trainer, pl_module, optimizer):
            pruning.on_before_optimizer_step(trainer, pl_module, optimizer)

    with pytest.raises(RuntimeError, match="scores of step 0 were already summed"):
        _trainer([pruning, CallsTwice()], max_steps=2).fit(TinyTask(), loader())


class DirectionTask(pl.LightningModule):
    """Loss ``sum(W * D)`` through ``proj``'s (masked) forward, so the gradient of ``proj.weight``
    is ``D`` (kept blocks) whatever the batch: SGD moves each block along ``-D``."""

    def __init__(self, weight, direction):
        super().__init__()
        self.model = nn.Module()
        self.model.proj = nn.Linear(64, 64, bias=False)
        with torch.no_grad():
            self.model.proj.weight.copy_(weight)
        self.register_buffer("direction", direction)

    def training_step(self, batch, batch_idx):
        transposed_weight = self.model.proj(torch.eye(64))  # I @ W^T
        return (transposed_weight.T * self.direction).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def _per_block(values):
    """(2, 2) values -> (64, 64) tensor constant on each 32x32 block."""
    return values.repeat_interleave(32, dim=0).repeat_interleave(32, dim=1)


class RecordMovement(pl.Callback):
    """Sums -W*grad per block by hand at every optimizer step before ``end_step`` (the last
    re-scoring) and keeps each step's mask."""

    def __init__(self, end_step):
        self.movement, self.masks, self.end_step = torch.zeros(2, 2), [], end_step

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        layer = pl_module.model.proj
        product = -(layer.masked_weight() * layer.weight.grad).detach()
        if trainer.global_step < self.end_step:
            self.movement += product.reshape(2, 32, 2, 32).sum(dim=(1, 3))
        self.masks.append((trainer.global_step, layer.mask.clone()))  # this step's pruning is done


@pytest.mark.parametrize("accumulate", [1, 2])
def test_movement_prunes_blocks_moving_towards_zero_on_schedule(accumulate):
    weight = _per_block(torch.tensor([[1.0, 0.1], [0.5, 0.05]]))  # magnitude keeps the left column
    away = torch.tensor([[False, True], [False, True]])  # the right column grows, the left shrinks
    direction = _per_block(torch.where(away, -1.0, 1.0))
    assert torch.equal(block_mask(weight, 0.5), ~away)  # magnitude and movement disagree everywhere
    pruning = BlockPruning(0.5, start_step=1, end_step=3, frequency=1, score="movement")
    record = RecordMovement(end_step=3)
    task = DirectionTask(weight, direction)
    _trainer([pruning, record], max_steps=5, accumulate_grad_batches=accumulate).fit(task, loader())
    assert torch.equal(task.model.proj.mask, away)
    assert torch.allclose(pruning.schedule.gradient_scores["proj"], record.movement, rtol=1e-5)
    previous = torch.ones(2, 2, dtype=torch.bool)
    for step, mask in record.masks:
        assert mask_sparsity(mask) == int(cubic_sparsity(step, 1, 3, 0.5) * 4) / 4
        assert not (mask & ~previous).any()  # masks only shrink
        previous = mask


class RecordMasks(pl.Callback):
    """Every layer's mask after each training batch."""

    def __init__(self):
        self.masks = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.masks.append({n: m.mask.clone() for n, m in compressed_layers(pl_module.model).items()})


@pytest.mark.parametrize("score", ["magnitude", "movement"])
def test_global_allocation_reaches_the_target_over_all_layers(score):
    task = TinyTask()
    with torch.no_grad():
        task.model.down.weight.mul_(0.01)  # down's blocks score far below up's: it should give more
    pruning = BlockPruning(0.5, start_step=0, end_step=4, frequency=1, allocation="global", spread=0.5, score=score)
    record = RecordMasks()
    _trainer([pruning, record], max_steps=6).fit(task, loader())
    up, down = task.model.up.mask, task.model.down.mask  # 8 blocks each
    assert int((~up).sum()) + int((~down).sum()) == 8  # half of all 16 blocks
    if score == "magnitude":
        assert (int((~up).sum()), int((~down).sum())) == (2, 6)  # the bounds: 0.25 and 0.75 of 8
    assert 2 <= int((~up).sum()) <= 6 and 2 <= int((~down).sum()) <= 6
    for before, after in zip(record.masks, record.masks[1:]):
        for name in before:
            assert not (after[name] & ~before[name]).any(), "masks only shrink"


class GatedMLPTask(TinyTask):
    """TinyTask whose model is an MLP in the Llama layout (``up_proj`` / ``down_proj``), so neurons reorder."""

    def __init__(self):
        super().__init__()
        self.model.up_proj, self.model.down_proj = self.model.up, self.model.down
        del self.model.up, self.model.down
        self.model.forward = lambda x: self.model.classifier(x + self.model.down_proj(
            torch.relu(self.model.up_proj(self.model.norm(x)))))


def test_reorder_neurons_once_in_setup_then_prune(caplog):
    task = GatedMLPTask()
    x = torch.randn(8, 64)
    with torch.no_grad():
        before = task.model(x)
    pruning = BlockPruning(0.5, start_step=0, end_step=2, frequency=1, reorder_neurons=True)
    pruning.setup(None, task, "fit")
    importance = task.model.up_proj.weight.abs().sum(1) + task.model.down_proj.weight.abs().sum(0)
    assert torch.all(importance[:-1] >= importance[1:])
    with torch.no_grad():
        torch.testing.assert_close(task.model(x), before, rtol=1e-5, atol=1e-5)
    weights = task.model.up_proj.weight.clone()
    pruning.setup(None, task, "validate")  # a later stage of the same run: no second reordering
    assert torch.equal(task.model.up_proj.weight, weights)
    _trainer([pruning], max_steps=3).fit(task, loader())
    assert float((~task.model.up_proj.mask).float().mean()) == 0.5


def test_movement_falls_back_to_magnitude_before_any_step():
    torch.manual_seed(3)
    weight = torch.randn(64, 64)
    pruning = BlockPruning(0.5, start_step=0, end_step=0, score="movement")
    task = DirectionTask(weight, torch.ones(64, 64))
    _trainer([pruning], max_steps=1).fit(task, loader())
    assert torch.equal(task.model.proj.mask, block_mask(weight, 0.5))
    assert not pruning.schedule.gradient_scores["proj"].any()  # that was the last re-scoring: nothing summed after it


def test_movement_state_dict_round_trip_and_old_checkpoints():
    pruning = BlockPruning(score="movement")
    pruning.schedule.last_pruned_step = 7
    pruning.schedule.gradient_scores = {"up": torch.randn(4, 2), "down": torch.randn(2, 4)}
    state = pruning.state_dict()
    restored = BlockPruning(score="movement")
    restored.load_state_dict(state)
    assert restored.schedule.last_pruned_step == 7 and set(restored.schedule.gradient_scores) == {"up", "down"}
    for name, scores in pruning.schedule.gradient_scores.items():
        assert torch.equal(restored.schedule.gradient_scores[name], scores)
        assert state["gradient_scores"][name].device.type == "cpu"
    old = BlockPruning(score="movement")
    old.load_state_dict({"last_pruned_step": 3})
    assert old.schedule.last_pruned_step == 3 and old.schedule.gradient_scores == {}
    older = BlockPruning(score="movement")  # checkpoints written before Fisher scores used this key
    older.load_state_dict({"last_pruned_step": 5, "movement_scores": {"up": torch.ones(4, 2)}})
    assert torch.equal(older.schedule.gradient_scores["up"], torch.ones(4, 2))


class RecordFisher(pl.Callback):
    """The Fisher sums as each step starts (listed before BlockPruning: before its re-scoring), and
    each step's ``(sum over the block of W * grad)^2`` by hand."""

    def __init__(self, pruning):
        self.pruning, self.sums, self.terms = pruning, {}, {}

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.sums[trainer.global_step] = self.pruning.schedule.gradient_scores["proj"].clone()

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        layer = pl_module.model.proj
        product = (layer.masked_weight() * layer.weight.grad).detach()
        self.terms[trainer.global_step] = product.reshape(2, 32, 2, 32).sum(dim=(1, 3)).square()


def test_fisher_keeps_the_blocks_the_loss_depends_on_and_restarts_its_sums():
    weight = _per_block(torch.tensor([[1.0, 0.1], [0.5, 0.05]]))  # magnitude keeps the left column
    direction = _per_block(torch.tensor([[0.01, 1.0], [0.01, 1.0]]))  # the loss hardly sees the left one
    pruning = BlockPruning(0.5, start_step=1, end_step=3, frequency=1, score="fisher")
    record = RecordFisher(pruning)
    task = DirectionTask(weight, direction)
    _trainer([record, pruning], max_steps=5).fit(task, loader())
    assert torch.equal(task.model.proj.mask, torch.tensor([[False, True], [False, True]]))
    assert torch.equal(block_mask(weight, 0.5), torch.tensor([[True, False], [True, False]]))
    for step in (1, 2, 3):  # each re-scoring saw the steps since the one before: here the last step
        assert torch.allclose(record.sums[step], record.terms[step - 1], rtol=1e-5)
    assert not pruning.schedule.gradient_scores["proj"].any()  # restarted at step 3; nothing summed after the last


def test_resume_keeps_gradient_scores_and_masks(tmp_path):
    def pruning():
        return BlockPruning(0.5, start_step=0, end_step=8, frequency=2, score="movement")

    trainer = _trainer([pruning()], max_steps=4)
    task = TinyTask()
    trainer.fit(task, loader())
    ckpt = tmp_path / "mid.ckpt"
    trainer.save_checkpoint(ckpt)
    saved_scores = {name: t.clone() for name, t in trainer.callbacks[0].schedule.gradient_scores.items()}
    saved_masks = {name: layer.mask.clone() for name, layer in compressed_layers(task.model).items()}
    assert set(saved_scores) == {"up", "down"} and all(t.any() for t in saved_scores.values())
    assert 0 < mask_sparsity(saved_masks["up"]) < 0.5
    stored = [s for s in torch.load(ckpt, weights_only=True)["callbacks"].values() if "gradient_scores" in s]
    assert all(t.device.type == "cpu" for t in stored[0]["gradient_scores"].values())

    restored = {}

    class Capture(pl.Callback):
        def on_train_start(self, trainer, pl_module):
            restored["scores"] = {n: t.clone() for n, t in trainer.callbacks[0].schedule.gradient_scores.items()}
            restored["masks"] = {n: m.mask.clone() for n, m in compressed_layers(pl_module.model).items()}

    resumed_task = TinyTask()
    _trainer([pruning(), Capture()], max_steps=10).fit(resumed_task, loader(), ckpt_path=ckpt)
    for name in saved_scores:
        assert torch.equal(restored["scores"][name], saved_scores[name])
        assert torch.equal(restored["masks"][name], saved_masks[name])
        final = getattr(resumed_task.model, name).mask
        assert mask_sparsity(final) == pytest.approx(0.5) and not (final & ~saved_masks[name]).any()


@pytest.mark.slow
def test_ddp_ranks_end_with_identical_masks_and_scales(tmp_path):
    env = dict(os.environ, PYTHONPATH=f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    result = subprocess.run([sys.executable, str(pathlib.Path(__file__).with_name("_ddp_script.py")), str(tmp_path)],
                            cwd=REPO, env=env, capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    rank0, rank1 = (torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in (0, 1))
    assert set(rank0) == set(rank1) == {"up", "down", "exported", "gptq_tokens"}
    # GPTQ's statistics are summed over the ranks: 2 batches of 8 rows on each of the 2 ranks
    assert rank0.pop("gptq_tokens") == rank1.pop("gptq_tokens") == {"up": 32, "down": 32}
    for key, tensor in rank0.pop("exported").items():
        assert torch.equal(tensor, rank1["exported"][key]), key
    loaded = compress.load_compressed(tmp_path / "export", model=PreNormMLP())
    assert type(loaded.up).__name__ == "BSRW8A8Linear"
    for name in rank0:
        for key in ("mask", "act_scale", "smoothing", "weight", "weight_scale"):
            assert torch.equal(rank0[name][key], rank1[name][key]), (name, key)
        assert rank0[name]["act_scale"].item() > 0 and name in rank1 and not rank0[name]["mask"].all()


@pytest.mark.slow
@pytest.mark.parametrize("score, sparsity", [("movement", 0.5), ("fisher", int(cubic_sparsity(4, 1, 8, 0.5) * 8) / 8)])
def test_ddp_ranks_accumulate_identical_gradient_scores(tmp_path, score, sparsity):
    env = dict(os.environ, PYTHONPATH=f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    script = pathlib.Path(__file__).with_name("_ddp_gradient_scores_script.py")
    result = subprocess.run([sys.executable, str(script), str(tmp_path), score], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    rank0, rank1 = (torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in (0, 1))
    assert set(rank0) == set(rank1) == {"up", "down"}
    for name in rank0:
        assert torch.equal(rank0[name]["sums"], rank1[name]["sums"]) and rank0[name]["sums"].any()
        assert torch.equal(rank0[name]["mask"], rank1[name]["mask"])
        assert mask_sparsity(rank0[name]["mask"]) == pytest.approx(sparsity)


@pytest.mark.parametrize("prefix", ["compress.lightning.callbacks.", "compress.callbacks.", ""],
                         ids=["class-path", "flat-class-path", "short-name"])
def test_callbacks_build_from_yaml_with_jsonargparse(prefix):
    jsonargparse = pytest.importorskip("jsonargparse")
    parser = jsonargparse.ArgumentParser(exit_on_error=False)
    parser.add_argument("--callbacks", type=list[pl.Callback])
    config = yaml.safe_load(f"""
    callbacks:
      - class_path: {prefix}BlockPruning
        init_args: {{sparsity: 0.75, start_step: 10, end_step: 100, plan: {{"*intermediate*": 0.5}}}}
      - class_path: {prefix}QuantizationAware
        init_args:
          config: {{class_path: compress.W8A8Config, init_args: {{activation: static}}}}
      - class_path: {prefix}QuantizationAware
        init_args:
          plan: {{"*attention*": {{group_size: 64}}}}
      - class_path: {prefix}Calibration
        init_args: {{num_batches: 4, observer: percentile, smoothquant_alpha: 0.5}}
      - class_path: {prefix}Export
        init_args: {{dirpath: out}}
    """)
    built = parser.instantiate(parser.parse_object(config)).callbacks
    assert [type(c).__name__ for c in built] == ["BlockPruning", "QuantizationAware", "QuantizationAware",
                                                 "Calibration", "Export"]
    assert built[1].plan.rules["*"][0] == W8A8Config(activation="static")
    assert built[2].plan.rules["*attention*"][0] == W4A16Config(group_size=64)
    assert built[0].plan.rules["*intermediate*"][0].sparsity == 0.5
    with pytest.raises(jsonargparse.ArgumentError, match="num_batches"):
        parser.parse_object({"callbacks": [{"class_path": "compress.lightning.callbacks.Calibration",
                                            "init_args": {"num_batches": "many"}}]})


def test_a_w8a16_config_in_yaml_is_named_by_its_class_path():
    """A plain ``{group_size: 128}`` resolves to the first config class it fits, W4A16Config (the docstring
    of QuantizationAware says so); W8A16 is asked for by class path."""
    jsonargparse = pytest.importorskip("jsonargparse")
    parser = jsonargparse.ArgumentParser(exit_on_error=False)
    parser.add_argument("--callbacks", type=list[pl.Callback])
    built = parser.instantiate(parser.parse_object(yaml.safe_load("""
    callbacks:
      - class_path: compress.lightning.callbacks.QuantizationAware
        init_args: {plan: {"*up*": {class_path: compress.W8A16Config, init_args: {group_size: 128}},
                           "*": {group_size: 128}}}
    """))).callbacks
    assert built[0].plan.rules["*up*"][0] == W8A16Config(group_size=128)
    assert built[0].plan.rules["*"][0] == W4A16Config(group_size=128)


def test_the_callbacks_train_the_model_a_plain_loop_with_the_schedule_trains():
    """The callbacks are Lightning's hooks around compress.schedule: the same steps give the same model."""
    task = TinyTask()
    callbacks = [BlockPruning(0.5, start_step=1, end_step=5, frequency=2, score="movement"),
                 QuantizationAware(W8A8Config(activation="static"), start_step=2),
                 Calibration(num_batches=2, smoothquant_alpha=0.5)]
    _trainer(callbacks, max_steps=7).fit(task, loader())

    plain = TinyTask()
    model, optimizer = plain.model, plain.configure_optimizers()
    schedule = compress.CompressionSchedule(
        model, pruning=compress.PruningSchedule(0.5, start_step=1, end_step=5, frequency=2, score="movement"),
        quantization=compress.QuantizationSchedule(W8A8Config(activation="static"), start_step=2),
        calibration=compress.CalibrationSchedule(num_batches=2, smoothquant_alpha=0.5))
    for x, y in itertools.islice(loader(), 7):
        nn.functional.cross_entropy(model(x), y).backward()
        schedule.before_optimizer_step(optimizer)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad()
    for name, tensor in task.model.state_dict().items():
        assert torch.equal(model.state_dict()[name], tensor), name
    for name, total in callbacks[0].schedule.gradient_scores.items():
        assert torch.equal(schedule.pruning.gradient_scores[name], total), name
    assert callbacks[2].schedule.phase == schedule.calibration.phase == "done"
