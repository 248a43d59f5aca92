"""Lightning callbacks that compress a model while it trains (in the shape of ``ModelPruning``).

The compression steps are those of :mod:`compress.schedule`, the same objects a plain PyTorch loop
or the ``transformers`` Trainer drives; each callback holds one of them (``callback.schedule``) and
calls it from Lightning's hooks:

* :class:`BlockPruning` -> :class:`compress.schedule.PruningSchedule`: gradual 32x32 block pruning
  on the cubic schedule (magnitude, l2, movement or Fisher scores), re-scored before the step's batch
  when due, gradient scores summed in ``on_before_optimizer_step``, masks re-applied after every
  optimizer step (an optimizer step post-hook), so AdamW cannot revive pruned weights.
* :class:`QuantizationAware` -> :class:`compress.schedule.QuantizationSchedule`: swaps in
  fake-quantized layers (in ``setup``) and switches fake quantization on at ``start_step``.
* :class:`Calibration` -> :class:`compress.schedule.CalibrationSchedule`: observes the inputs of
  W8A8 layers for ``num_batches`` training batches, optionally migrates outliers (SmoothQuant, then
  observes again), then freezes static scales; at the end of training runs GPTQ on the layers whose
  config says ``algorithm="gptq"``, on the first ``num_batches`` batches of the training data.
* :class:`Export`: at the end of ``fit`` converts to inference modules and saves the directory.
* :class:`FloatWeightsSnapshot`: keeps the fine-tuned float weights at the end of training, before
  :class:`Export` converts them (``compress run`` reports them next to the compressed model).

What stays here is Lightning's side: where the model is (:func:`target_model`), which step it is
(``trainer.global_step``), checks that need the other callbacks of the run, and the post-training path
(a run without training steps calibrates at fit start on the training data).

Layers are swapped in ``setup()``, before Lightning restores a checkpoint, so masks, observer
statistics and scales (module buffers) come back with the model's ``state_dict``; the schedules'
positions, with the settings and layers they were made with, are each callback's own ``state_dict``:
resuming with other settings (a changed sparsity, score, step counts, configs) or another model is
refused with a ``ValueError`` naming what differs (settings when the checkpoint is restored, layers
in ``on_train_start``; :mod:`compress.schedule.state`). Under DDP every rank ends with the same masks
(broadcast from rank 0) and the same scales (observer statistics all-reduced with max)
(:mod:`compress.schedule.distributed`).

FSDP2 (``ModelParallelStrategy``, :mod:`compress.lightning.strategy`): ``setup()`` runs before the
LightningModule's ``configure_model`` shards the model, so the swapped layers are what FSDP wraps. The
schedules then work on each rank's rows of the weights (block sums reduced across ranks, masks and
scales the same on every rank, pruned rows zeroed after every sharded optimizer step). :class:`Export`
and :class:`FloatWeightsSnapshot` gather the full model on rank 0's CPU
(:func:`compress.schedule.fsdp.gather_full_model`); rank 0 converts and writes it, once. A sharded
Lightning checkpoint (a directory) holds the masks and scales with the model's state and the
callbacks' state in its ``meta.pt``; ``trainer.fit(ckpt_path=<directory>)`` resumes from it.
Unsupported strategies (FSDP1's ``FSDPStrategy``, DeepSpeed, tensor parallelism) are refused in
``setup()`` with a ``ValueError``.
"""
from __future__ import annotations

import copy
import itertools
from typing import Optional, Union

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from torch import nn

from compress.calibration import calibrate, calibrated_pruning_layers, gptq_layers
from compress.checkpoint import save_compressed
from compress.configs import W4A16Config, W8A8BlockConfig, W8A8Config, W8A16Config
from compress.core.sharding import fsdp_modules
from compress.lightning.strategy import check_strategy, is_fsdp
from compress.nn.experts import CompressedExperts, ExpertLinear
from compress.nn.qat import CompressedLinear, compressed_layers
from compress.plan import convert
from compress.schedule import CalibrationSchedule, PruningSchedule, QuantizationSchedule, distributed
from compress.schedule.calibration import run_hessian_passes_on_all_ranks
from compress.schedule.fsdp import gather_full_model


def target_model(pl_module: pl.LightningModule) -> nn.Module:
    """The model that is compressed: ``pl_module.model`` when it is an ``nn.Module`` (the tasks of
    :mod:`compress.lightning.tasks` hold their ``transformers`` model there), else ``pl_module``.

    The one rule for the callbacks and for ``compress run`` / ``compress export``."""
    model = getattr(pl_module, "model", None)
    return model if isinstance(model, nn.Module) else pl_module


def trained_model(trainer: pl.Trainer, pl_module: pl.LightningModule, where: str) -> nn.Module:
    """:func:`target_model`, checked to be sharded when the strategy is FSDP2 (``ModelParallelStrategy``
    leaves sharding to the LightningModule's ``configure_model``)."""
    model = target_model(pl_module)
    if is_fsdp(trainer) and not fsdp_modules(model):
        raise ValueError(f"{where}: ModelParallelStrategy, but the model is not sharded: apply FSDP2 in the "
                         "LightningModule's configure_model, e.g. compress.schedule.fsdp.fully_shard_model(model, "
                         "self.device_mesh['data_parallel']), as the tasks of compress.lightning.tasks do")
    return model


def no_training_steps(trainer: pl.Trainer) -> bool:
    """Whether ``fit`` runs no training step (``max_steps: 0`` or ``limit_train_batches: 0``): Lightning
    then skips the fit loop and its ``on_train_*`` hooks; ``on_fit_start`` / ``on_fit_end`` still run."""
    return trainer.max_steps == 0 or trainer.limit_train_batches == 0


class BlockPruning(pl.Callback):
    """Gradual 32x32 block pruning to ``sparsity`` between ``start_step`` and ``end_step``: the
    arguments and the math of :class:`compress.schedule.PruningSchedule` (``self.schedule``).

    ``plan``: None (every eligible linear) or ``{pattern: final sparsity}``. ``score``: ``"magnitude"``,
    ``"l2"``, ``"movement"`` or ``"fisher"``. ``exclude``: patterns left dense (None: embeddings,
    classifier heads, ``lm_head``). ``allocation``: ``"layer"`` or ``"global"`` (within ``spread``).
    ``tile_rows``: blocks pruned in tiles of that many block rows (the large-M kernel's pattern;
    :class:`compress.BlockSparseConfig`). ``reorder_neurons``: in ``setup``, before any layer is swapped,
    list each MLP's hidden neurons by importance; once per callback (a resumed run gets the reordered
    weights from its checkpoint). List this callback before ``QuantizationAware`` when both are used.

    Gradient scores are summed in ``on_before_optimizer_step``: once per optimizer step under gradient
    accumulation, after AMP unscaling, before Lightning's gradient clipping, for the layers that
    optimizer updates; the sums are in this callback's ``state_dict`` (CPU tensors keyed by layer name).
    """

    def __init__(self, sparsity: float = 0.5, start_step: int = 0, end_step: int = 100, frequency: int = 10,
                 score: str = "magnitude", plan: Optional[dict[str, float]] = None,
                 exclude: Optional[list[str]] = None, allocation: str = "layer", spread: float = 0.5,
                 reorder_neurons: bool = False, algorithm: str = "score", tile_rows: int = 1):
        super().__init__()
        self.schedule = PruningSchedule(sparsity, start_step, end_step, frequency, score, plan, exclude, allocation,
                                        spread, reorder_neurons, algorithm, tile_rows)
        self._hooks = []

    @property
    def plan(self):
        return self.schedule.plan

    @property
    def start_step(self) -> int:
        return self.schedule.start_step

    def setup(self, trainer, pl_module, stage):
        check_strategy(getattr(trainer, "strategy", None), type(self).__name__)
        self.schedule.prepare(target_model(pl_module))
        calibrated = any(isinstance(callback, Calibration) for callback in getattr(trainer, "callbacks", None) or ())
        if self.schedule.algorithm == "obs" and stage == "fit" and not calibrated:
            raise ValueError("BlockPruning: algorithm='obs' prunes one-shot on calibration batches when training "
                             "starts; it needs a compress.lightning.callbacks.Calibration callback in the same run")

    def on_train_start(self, trainer, pl_module):
        self.schedule.bind(trained_model(trainer, pl_module, type(self).__name__))

        def reapply_masks(optimizer, args, kwargs):
            self.schedule.apply_masks()

        self._hooks = [optimizer.register_step_post_hook(reapply_masks) for optimizer in trainer.optimizers]

    def on_train_end(self, trainer, pl_module):
        for hook in self._hooks:
            hook.remove()
        self._hooks = []

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        self.schedule.accumulate(optimizer, step=trainer.global_step)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.schedule.prune_if_due(trainer.global_step)

    def state_dict(self):
        return self.schedule.state_dict()

    def load_state_dict(self, state_dict):
        self.schedule.load_state_dict(state_dict)


class QuantizationAware(pl.Callback):
    """Fake-quantize the plan's layers from ``start_step`` on (QAT): :class:`compress.schedule.QuantizationSchedule`
    (``self.schedule``).

    ``config``: the scheme for every eligible linear when ``plan`` is None; ``plan``:
    ``{pattern: W8A8Config, W4A16Config, W8A16Config or W8A8BlockConfig}``. ``exclude`` as in
    :class:`BlockPruning`. In YAML a W8A16Config needs its ``class_path``: a plain ``{group_size: 128}`` is a
    W4A16Config (and a W8A8BlockConfig too: ``class_path: compress.configs.W8A8BlockConfig``).
    """

    def __init__(self, config: Optional[Union[W8A8Config, W4A16Config, W8A16Config, W8A8BlockConfig]] = None,
                 start_step: int = 0,
                 plan: Optional[dict[str, Union[W8A8Config, W4A16Config, W8A16Config, W8A8BlockConfig]]] = None,
                 exclude: Optional[list[str]] = None):
        super().__init__()
        if (config is None) == (plan is None):
            raise ValueError("QuantizationAware: expected exactly one of config (every eligible linear) "
                             f"or plan ({{pattern: config}}), got config={config!r}, plan={plan!r}")
        self.schedule = QuantizationSchedule(config if plan is None else plan, start_step, exclude)

    @property
    def plan(self):
        return self.schedule.plan

    @property
    def start_step(self) -> int:
        return self.schedule.start_step

    def setup(self, trainer, pl_module, stage):
        check_strategy(getattr(trainer, "strategy", None), type(self).__name__)
        calibrated = any(isinstance(cb, Calibration) for cb in trainer.callbacks)
        if self.schedule.needs_static_scales and stage == "fit" and not calibrated:
            raise ValueError("QuantizationAware: a static W8A8Config needs a compress.lightning.callbacks.Calibration "
                             "callback in the same run (or use activation='dynamic')")
        if self.schedule.needs_gptq and stage == "fit" and not calibrated:
            raise ValueError("QuantizationAware: algorithm='gptq' needs a compress.lightning.callbacks.Calibration "
                             "callback in the same run (it runs GPTQ at the end of training)")
        self.schedule.prepare(target_model(pl_module))

    def on_train_start(self, trainer, pl_module):
        self.schedule.bind(trained_model(trainer, pl_module, type(self).__name__))

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.schedule.start_if_due(trainer.global_step)

    def state_dict(self):
        return self.schedule.state_dict()

    def load_state_dict(self, state_dict):
        self.schedule.load_state_dict(state_dict)


class Calibration(pl.Callback):
    """Observe W8A8 layer inputs for ``num_batches`` training batches, then freeze static scales:
    :class:`compress.schedule.CalibrationSchedule` (``self.schedule``), one batch counted per
    ``on_train_batch_end``.

    ``observer``: ``"absmax"``, ``"percentile"`` or ``"moving_average"``. ``smoothquant_alpha``
    (in [0, 1]): first observe ``num_batches``, migrate outliers (SmoothQuant), then observe
    ``num_batches`` more for the static scales. Needs the W8A8 layers to exist, i.e. a
    :class:`QuantizationAware` callback with a W8A8 config in the same run.

    A run without training steps (``trainer.max_steps: 0``, the post-training path in a recipe) is
    calibrated at fit start instead, on the first ``num_batches`` training batches (see ``on_fit_start``).

    OBS (a ``BlockPruning`` callback with ``algorithm="obs"``): when training starts (``on_train_start``,
    before the first step), the first ``num_batches`` training batches are run layer stage by stage
    (eval mode, no gradients) and each layer is pruned one-shot by second-order block costs, its kept
    weights compensated (:mod:`compress.core.obs`); training then fine-tunes the pruned model.

    GPTQ (layers whose config says ``algorithm="gptq"``: W8A8, W4A16 or W8A16): at the end of training
    (``on_train_end``, before :class:`Export` converts in ``on_fit_end``), the first ``num_batches``
    batches of the training dataloader are run once more (eval mode, no gradients) to collect each
    layer's Hessian, summed over DDP ranks, then each layer's weight is rounded by GPTQ (rank 0's
    result broadcast) and held on its grid, so the export stores GPTQ's integers and scales.
    """

    def __init__(self, num_batches: int = 8, observer: str = "absmax", smoothquant_alpha: Optional[float] = None):
        super().__init__()
        self.schedule = CalibrationSchedule(num_batches, observer, smoothquant_alpha)

    @property
    def num_batches(self) -> int:
        return self.schedule.num_batches

    def setup(self, trainer, pl_module, stage):
        check_strategy(getattr(trainer, "strategy", None), type(self).__name__)

    def on_train_start(self, trainer, pl_module):
        model = trained_model(trainer, pl_module, type(self).__name__)
        waiting = calibrated_pruning_layers(model)
        if waiting:
            done = run_hessian_passes_on_all_ranks(model, self._calibration_batches(trainer, pl_module), gptq=False)
            rank_zero_info(f"Calibration: pruned {done} layers one-shot on {self.num_batches} training batches")
        self.schedule.bind(model)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.schedule.batch_done()

    def on_fit_start(self, trainer, pl_module):
        """A run without training steps (the post-training path: ``trainer.max_steps: 0``) is calibrated
        here, on the first ``num_batches`` training batches, as :func:`compress.convert` does with
        ``calibration_data``: OBS pruning, SmoothQuant and static W8A8 scales, then GPTQ."""
        if not no_training_steps(trainer):
            return
        model = target_model(pl_module)
        batches = self._calibration_batches(trainer, pl_module)
        run_hessian_passes_on_all_ranks(model, batches, gptq=False)  # OBS before the scales see the model
        was_training = model.training
        model.eval()
        with torch.no_grad():
            calibrate(model, batches)
        model.train(was_training)
        distributed.broadcast_floating_state_(model)  # scales and smoothing from rank 0's batches
        self.schedule.phase = "done"
        self._run_gptq(model, batches)

    def on_train_end(self, trainer, pl_module):
        self.schedule.stop_recording()
        model = target_model(pl_module)
        if gptq_layers(model):
            self._run_gptq(model, self._calibration_batches(trainer, pl_module))

    def _calibration_batches(self, trainer, pl_module) -> list:
        """The first ``num_batches`` training batches, on the model's device."""
        loader = trainer.train_dataloader
        if loader is None:  # no fit loop ran: ask the data module (or the task) for its loader
            source = trainer.datamodule if trainer.datamodule is not None else pl_module
            loader = source.train_dataloader()
        return [trainer.strategy.batch_to_device(batch) for batch in itertools.islice(loader, self.num_batches)]

    def _run_gptq(self, model, batches) -> None:
        rounded = run_hessian_passes_on_all_ranks(model, batches)
        if rounded:
            rank_zero_info(f"Calibration: GPTQ quantized {rounded} layers on {self.num_batches} training batches")

    def state_dict(self):
        return self.schedule.state_dict()

    def load_state_dict(self, state_dict):
        self.schedule.load_state_dict(state_dict)


class Export(pl.Callback):
    """At the end of ``fit``: convert to inference modules and (if ``save``) write ``dirpath``.

    ``self.model`` is then the converted model: the trained model itself, converted in place, or under
    FSDP2 a copy gathered whole on rank 0's CPU and converted there (None on the other ranks; the
    sharded model is left as it trained). Rank 0 writes ``dirpath``, once."""

    def __init__(self, dirpath: str = "compressed", save: bool = True):
        super().__init__()
        if not isinstance(dirpath, str) or not dirpath:
            raise ValueError(f"dirpath: expected a non-empty path string, got {dirpath!r}")
        self.dirpath, self.save = dirpath, bool(save)
        self.model: Optional[nn.Module] = None

    def setup(self, trainer, pl_module, stage):
        check_strategy(getattr(trainer, "strategy", None), type(self).__name__)

    def on_fit_end(self, trainer, pl_module):
        model = target_model(pl_module)
        if not compressed_layers(model):
            rank_zero_warn("Export: the model has no prepared layers; nothing to convert")
            return
        if fsdp_modules(model):
            model = gather_full_model(model)  # every rank takes part; rank 0 gets the whole model
        if model is not None:
            self.model = convert(model)
        if self.save and trainer.is_global_zero:
            # overwrite: an earlier export of ours in dirpath is replaced; any other files there are not
            path = save_compressed(self.model, self.dirpath, overwrite=True)
            rank_zero_info(f"Export: compressed model saved to {path}")
        trainer.strategy.barrier("compress-export")


class FloatWeightsSnapshot(pl.Callback):
    """Keeps a copy of the task's model at the end of training, before any export converts it.

    ``on_train_end`` runs before every ``on_fit_end`` (where the Export callback converts), so the
    copy holds the fine-tuned float weights; training-only wrappers (fake quantization, masks) are
    replaced by plain ``nn.Linear`` layers holding the same (pruned) float weights. Rank 0 keeps it
    (on the CPU); under FSDP2 it is gathered from every rank's shards.
    """

    def __init__(self):
        self.model = None

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Without training steps there is no ``on_train_end``: the copy is taken here, before any
        callback after this one calibrates (the CLI puts this callback first)."""
        if no_training_steps(trainer):
            self.on_train_end(trainer, pl_module)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        model = target_model(pl_module)
        if fsdp_modules(model):
            gathered = gather_full_model(model)  # every rank takes part; rank 0 gets the whole model
            self.model = None if gathered is None else strip_training_modules(gathered)
        elif trainer.is_global_zero:
            self.model = strip_training_modules(copy.deepcopy(model).cpu())


def strip_training_modules(model: nn.Module) -> nn.Module:
    """Replace every training module (:class:`compress.nn.qat.CompressedLinear`,
    :class:`compress.nn.experts.CompressedExperts`) by its ``to_float()``."""
    for name, module in list(model.named_modules()):
        if isinstance(module, (CompressedLinear, CompressedExperts)) and not isinstance(module, ExpertLinear):
            parent_name, _, child = name.rpartition(".")
            parent = model.get_submodule(parent_name) if parent_name else model
            setattr(parent, child, module.to_float())
    return model
