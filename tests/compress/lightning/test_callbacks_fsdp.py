"""Tests for compress/lightning/callbacks.py under FSDP2 (Lightning's ModelParallelStrategy, 2 CPU
processes, gloo; _fsdp_script.py): the callbacks prune (Fisher scores), fake-quantize (W8A8, static
and LSQ scales), calibrate (SmoothQuant) and GPTQ-round a model sharded by FsdpTask.configure_model,
and export it; then a second run resumes from the sharded checkpoint of step 4.

Asserted: masks, activation scales, smoothing factors and Fisher sums bit-equal on both ranks; each
rank's rows of the pruned blocks exactly zero after every optimizer step; the export written once,
by rank 0, from the model gathered there; against the same callbacks in one process on the same
samples (batches of 16 instead of 2 x 8; FsdpTask): the same masks, scales within ``TOLERANCE``, and the export
and the float snapshot within the tolerances of tests/compress/schedule/test_fsdp.py (``TOLERANCE``,
``EXPORT_TOLERANCE``, ``assert_exports_close``); the run resumed from the sharded checkpoint ends
bit for bit where the uninterrupted one did (masks, scales, sums, the export). Also: the strategies
that are refused, with the error that says what to use, and a ModelParallelStrategy run whose model
was not sharded.
"""
import os
import pathlib
import subprocess
import sys

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.strategies import FSDPStrategy
from torch import nn

import compress
from compress.configs import W8A8Config
from compress.core.sharding import fsdp_modules, local_rows, local_tensor
from compress.core.sparsity import expand_mask
from compress.lightning.callbacks import BlockPruning, Calibration, Export, QuantizationAware, trained_model
from compress.lightning.strategy import check_strategy, data_parallel_mesh
from compress.nn.qat import compressed_layers
from compress.schedule.fsdp import fully_shard_model
from tests.compress.models import PreNormMLP
from tests.compress.schedule.test_fsdp import EXPORT_TOLERANCE, TOLERANCE, assert_close, assert_exports_close

REPO = pathlib.Path(__file__).resolve().parents[3]


class FsdpTask(pl.LightningModule):
    """PreNormMLP with 96 hidden units (its up layer's 96 rows split 48/48: a shard boundary inside a
    32-row block), sharded with FSDP2 in configure_model under ModelParallelStrategy. Its training data:
    16 samples, each rank every world_size-th one from its rank, as one batch of 16 / world_size (the
    trainer runs with use_distributed_sampler=False): every step of 2 ranks together sees the 16 samples
    that every step of one process sees. One batch per epoch, so a resumed run sees the same data
    (Lightning restarts an epoch's batches from the first when its dataloader cannot resume)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.model = PreNormMLP(ffn=96)

    def configure_model(self):
        mesh = data_parallel_mesh(self)
        if mesh is not None and not fsdp_modules(self.model):
            fully_shard_model(self.model, mesh)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self.model(x), y)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-2, weight_decay=0.1)

    def train_dataloader(self):
        rank, world_size = self.trainer.global_rank, self.trainer.world_size
        data = samples()
        return torch.utils.data.DataLoader(torch.utils.data.Subset(data, range(rank, len(data), world_size)),
                                           batch_size=16 // world_size)


class PrunedRowsCheck(pl.Callback):
    """Records, after every optimizer step, whether this rank's rows of the pruned blocks are all zero."""

    def __init__(self):
        self.steps = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        zero = True
        for layer in compressed_layers(pl_module.model).values():
            keep = expand_mask(layer.mask, (layer.out_features, layer.in_features))[local_rows(layer.weight)]
            zero = zero and not bool(local_tensor(layer.weight).detach()[~keep].any())
        self.steps.append(zero)


def samples(count=16):
    generator = torch.Generator().manual_seed(123)
    x = torch.randn(count, 64, generator=generator)
    x[:, 3] *= 20  # an outlier channel for SmoothQuant to move
    return torch.utils.data.TensorDataset(x, torch.randint(0, 4, (count,), generator=generator))


def compression_callbacks():
    """Pruning settles at step 3, when fake quantization starts; static scales freeze after step 3."""
    return [BlockPruning(0.5, start_step=1, end_step=3, frequency=1, score="fisher"),
            QuantizationAware(W8A8Config(activation="static", learnable_scale=True, algorithm="gptq"), start_step=3),
            Calibration(num_batches=2, smoothquant_alpha=0.5)]


class HeldState(pl.Callback):
    """What this rank holds at the end of training (before an export converts the layers): masks,
    scales, smoothing factors, Fisher sums."""

    def __init__(self):
        self.state = {}

    def on_train_end(self, trainer, pl_module):
        pruning = next(cb for cb in trainer.callbacks if isinstance(cb, BlockPruning))
        self.state = {name: {"mask": layer.mask.clone(), "act_scale": layer.act_scale.clone(),
                             "smoothing": layer.input_smoothing.clone(),
                             "sums": pruning.schedule.gradient_scores[name].cpu()}
                      for name, layer in compressed_layers(pl_module.model).items()}


def single_process_run(tmp_path):
    """The same callbacks in one process, on batches of 16 (the two ranks' batches of 8 together)."""
    from compress.lightning.callbacks import FloatWeightsSnapshot

    pl.seed_everything(0)
    task = FsdpTask()
    snapshot, held, export = FloatWeightsSnapshot(), HeldState(), Export(str(tmp_path / "single"))
    callbacks = [snapshot, *compression_callbacks(), held, export]
    pl.Trainer(accelerator="cpu", devices=1, max_steps=6, callbacks=callbacks, logger=False, enable_checkpointing=False,
               enable_progress_bar=False, enable_model_summary=False, use_distributed_sampler=False).fit(task)
    return held.state, snapshot.model.state_dict(), export.model.state_dict()


@pytest.fixture(scope="module")
def fsdp_runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("fsdp-callbacks")
    env = dict(os.environ, PYTHONPATH=f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    result = subprocess.run([sys.executable, str(pathlib.Path(__file__).with_name("_fsdp_script.py")), str(out)],
                            cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return out, [torch.load(out / f"rank{r}.pt", weights_only=True) for r in (0, 1)]


@pytest.mark.slow
@pytest.mark.parametrize("run", ["uninterrupted", "resumed"])
def test_fsdp_ranks_hold_identical_masks_and_scales_and_zero_pruned_rows(fsdp_runs, run):
    _, (rank0, rank1) = fsdp_runs
    steps = 6 if run == "uninterrupted" else 2
    assert rank0[run]["zero_after_steps"] == rank1[run]["zero_after_steps"] == [True] * steps
    for name in ("up", "down"):
        for key, tensor in rank0[run][name].items():
            assert torch.equal(tensor, rank1[run][name][key]), (run, name, key)
        assert not rank0[run][name]["mask"].all() and rank0[run][name]["act_scale"] > 0


@pytest.mark.slow
def test_the_export_is_gathered_and_written_once_by_rank_zero(fsdp_runs):
    out, (rank0, rank1) = fsdp_runs
    assert rank1["uninterrupted"]["export"] is None and rank1["uninterrupted"]["float"] is None
    assert sorted(p.name for p in out.iterdir() if p.name.startswith("export")) == ["export-resumed",
                                                                                 "export-uninterrupted"]
    loaded = compress.load_compressed(out / "export-uninterrupted", model=PreNormMLP(ffn=96))
    assert type(loaded.up).__name__ == "BSRW8A8Linear"
    for key, tensor in loaded.state_dict().items():
        assert torch.equal(tensor, rank0["uninterrupted"]["export"][key]), key


@pytest.mark.slow
def test_fsdp_ends_with_the_single_process_masks_scales_and_export(fsdp_runs, tmp_path):
    _, (rank0, _) = fsdp_runs
    held, float_state, exported = single_process_run(tmp_path)
    fsdp = rank0["uninterrupted"]
    for name in ("up", "down"):
        assert torch.equal(fsdp[name]["mask"], held[name]["mask"]), name
        for key in ("act_scale", "smoothing", "sums"):
            assert_close(fsdp[name][key], held[name][key], TOLERANCE, (name, key))
    assert_exports_close(fsdp["export"], exported, EXPORT_TOLERANCE)
    for key, tensor in fsdp["float"].items():
        assert_close(tensor, float_state[key], EXPORT_TOLERANCE, key)


@pytest.mark.slow
def test_a_run_resumed_from_the_sharded_checkpoint_ends_where_the_uninterrupted_one_did(fsdp_runs):
    out, (rank0, _) = fsdp_runs
    assert (out / "checkpoints-uninterrupted" / "epoch=3-step=4.ckpt" / "meta.pt").is_file()  # sharded: a directory
    uninterrupted, resumed = rank0["uninterrupted"], rank0["resumed"]
    for name in ("up", "down"):
        for key in ("mask", "act_scale", "smoothing", "sums"):
            assert torch.equal(resumed[name][key], uninterrupted[name][key]), (name, key)
    for key, tensor in resumed["export"].items():
        assert torch.equal(tensor, uninterrupted["export"][key]), key


class _Trainer:
    def __init__(self, strategy):
        self.strategy = strategy


class _Mesh:
    def __init__(self, tensor_parallel):
        self.sizes = {"tensor_parallel": tensor_parallel, "data_parallel": 1}

    def __getitem__(self, name):
        size = self.sizes[name]
        return type("Sub", (), {"size": lambda self: size})()


def test_fsdp1_and_tensor_parallelism_are_refused_with_what_to_use():
    with pytest.raises(ValueError, match="FSDPStrategy .*ModelParallelStrategy\\(data_parallel_size"):
        BlockPruning().setup(_Trainer(FSDPStrategy()), pl.LightningModule(), "fit")
    from lightning.pytorch.strategies import ModelParallelStrategy

    strategy = ModelParallelStrategy(data_parallel_size=1, tensor_parallel_size=2)
    strategy._device_mesh = _Mesh(tensor_parallel=2)
    with pytest.raises(ValueError, match="tensor_parallel_size=2 is not supported"):
        check_strategy(strategy, "Export")
    task = FsdpTask()
    task._device_mesh = _Mesh(tensor_parallel=2)
    with pytest.raises(ValueError, match="tensor_parallel_size=2"):
        task.configure_model()


def test_a_model_parallel_run_whose_model_was_not_sharded_is_refused_at_train_start():
    from lightning.pytorch.strategies import ModelParallelStrategy

    trainer = _Trainer(ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1))
    with pytest.raises(ValueError,
                       match="the model is not sharded: apply FSDP2 in the LightningModule's configure_model"):
        trained_model(trainer, FsdpTask(), "BlockPruning")


def test_a_task_shards_nothing_outside_model_parallel_strategy():
    task = FsdpTask()
    task.configure_model()
    assert not fsdp_modules(task.model)
