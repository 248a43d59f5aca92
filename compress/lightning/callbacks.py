"""Lightning callbacks that compress a model while it trains (in the shape of ``ModelPruning``).

Each callback has one job and only orchestrates: the math is in :mod:`compress.core`, the module
swaps in :mod:`compress.nn` and :mod:`compress.plan`.

* :class:`BlockPruning`: gradual 32x32 block pruning on the cubic schedule between ``start_step``
  and ``end_step``, re-scoring every ``frequency`` optimizer steps (magnitude, l2, movement or
  Fisher scores); masks are re-applied after every optimizer step (an optimizer step post-hook),
  so AdamW cannot revive pruned weights.
* :class:`QuantizationAware`: swaps in fake-quantized layers (in ``setup``) and switches fake
  quantization on at ``start_step``.
* :class:`Calibration`: observes the inputs of W8A8 layers for ``num_batches`` training batches,
  optionally migrates outliers (SmoothQuant, then observes again), then freezes static scales; at
  the end of training runs GPTQ on the layers whose config says ``algorithm="gptq"``.
* :class:`Export`: at the end of ``fit`` converts to inference modules and saves the directory.
* :class:`FloatWeightsSnapshot`: keeps the fine-tuned float weights at the end of training, before
  :class:`Export` converts them (``compress run`` reports them next to the compressed model).

The model to compress is ``pl_module.model`` when the LightningModule has one, else ``pl_module``
(:func:`target_model`).
Layers are swapped in ``setup()``, before Lightning restores a checkpoint, so masks, observer
statistics and scales (module buffers) come back with the model's ``state_dict``; schedules are in
each callback's own ``state_dict``. Under DDP every rank ends with the same masks (broadcast from
rank 0) and the same scales (observer statistics all-reduced with max). Logging is rank-zero only.
"""
from __future__ import annotations

import copy
import itertools
import logging
from typing import Optional, Union

import lightning.pytorch as pl
import torch
import torch.distributed as dist
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from torch import nn

from compress.checkpoint import save_compressed
from compress.configs import (BLOCK_SCORES, GRADIENT_SCORES, OBSERVERS, QUANT_CONFIGS, BlockSparseConfig, W4A16Config,
                              W8A8Config, W8A16Config)
from compress.core.neuron_order import find_mlps, kept_mass, reorder_mlp_neurons
from compress.core.smoothquant import apply_smoothquant
from compress.core.sparsity import (
    allocation_bounds,
    block_mask,
    block_scores,
    cubic_sparsity,
    fisher_block_scores,
    global_block_masks,
    mask_sparsity,
    movement_block_scores,
    shrink_mask,
)
from compress.nn.qat import CompressedLinear, compressed_layers
from compress.calibration import calibrate, forward_batch, gptq_layers, run_gptq
from compress.plan import DEFAULT_EXCLUDE, Plan, convert, prepare

logger = logging.getLogger(__name__)
ALLOCATIONS = ("layer", "global")  # BlockPruning: each layer to the target, or all layers ranked together


def target_model(pl_module: pl.LightningModule) -> nn.Module:
    """The model that is compressed: ``pl_module.model`` when it is an ``nn.Module`` (the tasks of
    :mod:`compress.lightning.tasks` hold their ``transformers`` model there), else ``pl_module``.

    The one rule for the callbacks and for ``compress run`` / ``compress export``."""
    model = getattr(pl_module, "model", None)
    return model if isinstance(model, nn.Module) else pl_module


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def _broadcast_(tensor: torch.Tensor) -> None:
    """Overwrite ``tensor`` with rank 0's copy (bool tensors travel as uint8 for gloo)."""
    if not _distributed():
        return
    carrier = tensor.to(torch.uint8) if tensor.dtype == torch.bool else tensor
    dist.broadcast(carrier, src=0)
    if carrier is not tensor:
        tensor.copy_(carrier.to(torch.bool))


def _sum_over_ranks(stats: dict[str, list]) -> None:
    """All-reduce (sum) the GPTQ statistics ``{name: [X^T X, tokens]}`` in place, so every rank solves the same."""
    if not _distributed():
        return
    for entry in stats.values():
        dist.all_reduce(entry[0])
        tokens = torch.tensor(entry[1], dtype=torch.int64, device=entry[0].device)
        dist.all_reduce(tokens)
        entry[1] = int(tokens)


def no_training_steps(trainer: pl.Trainer) -> bool:
    """Whether ``fit`` runs no training step (``max_steps: 0`` or ``limit_train_batches: 0``): Lightning
    then skips the fit loop and its ``on_train_*`` hooks; ``on_fit_start`` / ``on_fit_end`` still run."""
    return trainer.max_steps == 0 or trainer.limit_train_batches == 0


def _check_step(name: str, value) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{name}: expected a non-negative int, got {value!r}")


def _install_mask(layer: CompressedLinear, mask: torch.Tensor) -> float:
    """Rank 0's ``mask`` into ``layer`` (pruned weights zeroed); returns its block sparsity."""
    _broadcast_(mask)
    layer.set_mask(mask)
    return mask_sparsity(mask)


def _kept_mlp_mass(mlps, sparsity: float) -> float:
    """Mean of :func:`compress.core.neuron_order.kept_mass` over the MLPs' matrices."""
    shares = [kept_mass(lin.weight, sparsity) for mlp in mlps for lin in (*mlp.inputs, mlp.output)]
    return sum(shares) / len(shares) if shares else float("nan")


def _layers_matching(model: nn.Module, plan: Plan) -> dict[str, CompressedLinear]:
    return {name: m for name, m in compressed_layers(model).items() if plan.configs_for(name) is not None}


class BlockPruning(pl.Callback):
    """Gradual 32x32 block pruning to ``sparsity`` between ``start_step`` and ``end_step``.

    ``plan``: None (every eligible linear) or ``{pattern: final sparsity}`` (fnmatch patterns on
    module names; each matched layer ends at its own sparsity). ``score``: ``"magnitude"``,
    ``"l2"``, ``"movement"`` or ``"fisher"``. ``exclude``: patterns left dense (None: embeddings,
    classifier heads, ``lm_head``).

    Movement (Sanh et al., 2020; 32x32 blocks as in Lagunas et al., 2021): the score of a weight is
    ``S = -sum_t W_t * dL/dW_t`` over optimizer steps ``t`` (weights moving away from zero score
    high) and a block's score is the sum of ``S`` over the block. Every optimizer step, from the
    first training step on (the dense phase gives signal before pruning starts), each matched
    layer's ``-W * grad`` is reduced at once to its (N/32, K/32) grid and added to a float32 sum
    (:func:`compress.core.sparsity.movement_block_scores`), with ``W`` the layer's weight (its pruned
    blocks are exact zeros: the masks are re-applied after every optimizer step) and
    ``grad`` the gradient of its ``weight`` Parameter as the optimizer receives it
    (``on_before_optimizer_step``: once per optimizer step under gradient accumulation, after AMP
    unscaling, before Lightning's gradient clipping; a step with a non-finite contribution, which
    AMP skips, adds nothing). At a re-scoring, blocks pruned earlier score ``-inf``, so masks only
    shrink and the schedule's sparsity is reached exactly (:func:`compress.core.sparsity.shrink_mask`);
    a layer whose sum is still all zero (e.g. pruning at step 0) is scored by magnitude for that
    re-scoring. The sums are in this callback's ``state_dict`` (CPU tensors keyed by layer name);
    a checkpoint without them starts them at zero. Under DDP the gradients are all-reduced before
    the optimizer step, so every rank accumulates the same sums; the masks are still broadcast from
    rank 0. Once the last re-scoring (at ``end_step``) is done, nothing more is accumulated.

    Fisher (Optimal Brain Surgeon with one empirical-Fisher block per 32x32 block, Kurtic et al.,
    2022): the same accumulation, of ``(sum over the block of W * dL/dW)^2``
    (:func:`compress.core.sparsity.fisher_block_scores`), so a block scores the loss increase its removal
    would cost to second order. The sums start again from zero after every re-scoring, so each one
    ranks the blocks by the gradients of the steps since the last (the dense phase before the first).

    ``allocation``: ``"layer"`` (default) prunes every layer to the schedule's sparsity;
    ``"global"`` ranks the blocks of all matched layers together, so the model as a whole reaches the
    schedule's sparsity while each layer stays within ``[(1 - spread) * s, s + spread * (1 - s)]`` of
    its blocks (:func:`compress.core.sparsity.global_block_masks`; ``spread`` 0 is per-layer pruning).
    Scores are compared as they are (mean |w| per block, or movement / Fisher sums), so layers whose
    blocks score lower give more. Needs one sparsity for all layers (no ``plan``). At a re-scoring
    where some layer has no sum yet, every layer is scored by magnitude, so the ranking compares one
    kind of score.

    ``reorder_neurons``: in ``setup``, before any layer is swapped, list each MLP's hidden neurons by
    importance so that weak neurons share blocks (:func:`compress.core.neuron_order.reorder_mlp_neurons`;
    the function is unchanged). Once per callback: a resumed run gets the reordered weights from its
    checkpoint. List this callback before ``QuantizationAware`` when both are used.
    """

    def __init__(self, sparsity: float = 0.5, start_step: int = 0, end_step: int = 100, frequency: int = 10,
                 score: str = "magnitude", plan: Optional[dict[str, float]] = None,
                 exclude: Optional[list[str]] = None, allocation: str = "layer", spread: float = 0.5,
                 reorder_neurons: bool = False):
        super().__init__()
        if score not in BLOCK_SCORES:
            raise ValueError(f"score: expected one of {BLOCK_SCORES}, got {score!r}")
        if allocation not in ALLOCATIONS:
            raise ValueError(f"allocation: expected one of {ALLOCATIONS}, got {allocation!r}")
        if allocation == "global" and plan is not None:
            raise ValueError("allocation='global' ranks all layers against one sparsity; expected plan=None, "
                             f"got plan={plan!r}")
        allocation_bounds(sparsity, spread)  # validates spread
        BlockSparseConfig(sparsity=sparsity, score=score)  # validates sparsity
        _check_step("start_step", start_step)
        _check_step("end_step", end_step)
        if end_step < start_step:
            raise ValueError(f"end_step: expected >= start_step ({start_step}), got {end_step}")
        if not isinstance(frequency, int) or isinstance(frequency, bool) or frequency < 1:
            raise ValueError(f"frequency: expected a positive int, got {frequency!r}")
        rules = {"*": sparsity} if plan is None else dict(plan)
        self.plan = Plan({p: BlockSparseConfig(sparsity=s, score=score) for p, s in rules.items()},
                         exclude=DEFAULT_EXCLUDE if exclude is None else tuple(exclude))
        self.start_step, self.end_step, self.frequency, self.score = start_step, end_step, frequency, score
        self.sparsity, self.allocation, self.spread = sparsity, allocation, spread
        if not isinstance(reorder_neurons, bool):
            raise ValueError(f"reorder_neurons: expected a bool, got {reorder_neurons!r}")
        self.reorder_neurons, self._reordered = reorder_neurons, False
        self.last_pruned_step: Optional[int] = None
        self.gradient_scores: dict[str, torch.Tensor] = {}  # movement or Fisher sums: name -> (N/32, K/32) float32
        self._hooks = []
        self._layers: dict[str, CompressedLinear] = {}  # the matched layers, found once per fit

    def setup(self, trainer, pl_module, stage):
        if self.reorder_neurons and not self._reordered:
            self._reorder(target_model(pl_module))
        prepare(target_model(pl_module), self.plan)

    def _reorder(self, model: nn.Module) -> None:
        mlps = find_mlps(model)
        before = _kept_mlp_mass(mlps, self.sparsity)
        reorder_mlp_neurons(model)
        self._reordered = True
        after = _kept_mlp_mass(mlps, self.sparsity)
        rank_zero_info(f"BlockPruning: reordered the hidden neurons of {len(mlps)} MLPs; at sparsity "
                       f"{self.sparsity:g} their blocks would keep {before:.3f} -> {after:.3f} of the L1 mass")

    def on_train_start(self, trainer, pl_module):
        matched = self._layers = _layers_matching(target_model(pl_module), self.plan)
        layers = list(matched.values())

        def reapply_masks(optimizer, args, kwargs):
            for layer in layers:
                layer.apply_mask_()

        self._hooks = [optimizer.register_step_post_hook(reapply_masks) for optimizer in trainer.optimizers]
        if self.score in GRADIENT_SCORES:
            self.gradient_scores = {name: self._initial_sum(name, layer) for name, layer in matched.items()}

    def _initial_sum(self, name: str, layer: CompressedLinear) -> torch.Tensor:
        """The restored sum for ``name`` on the layer's device, or zeros when there is none."""
        grid = tuple(layer.mask.shape)
        restored = self.gradient_scores.get(name)
        if restored is None:
            return torch.zeros(grid, dtype=torch.float32, device=layer.weight.device)
        if tuple(restored.shape) != grid:
            raise ValueError(f"BlockPruning: {self.score} scores of {name!r}: expected shape {grid}, "
                             f"got {tuple(restored.shape)} (checkpoint from another model?)")
        return restored.to(device=layer.weight.device, dtype=torch.float32)

    def on_train_end(self, trainer, pl_module):
        for hook in self._hooks:
            hook.remove()
        self._hooks = []

    @torch.no_grad()
    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        if self.score not in GRADIENT_SCORES or self._schedule_done():
            return
        block_step = movement_block_scores if self.score == "movement" else fisher_block_scores
        updated = {id(p) for group in optimizer.param_groups for p in group["params"]}
        layers = {name: layer for name, layer in self._layers.items()
                  if layer.weight.grad is not None and id(layer.weight) in updated}
        steps = {name: block_step(layer.weight, layer.weight.grad, layer.sparse_config.block)
                 for name, layer in layers.items()}
        if not steps:
            return
        finite = torch.stack([step.isfinite().all() for step in steps.values()]).all()
        for name, step in steps.items():
            total = self.gradient_scores.get(name)
            if total is None:
                total = self.gradient_scores[name] = self._initial_sum(name, layers[name])
            total.add_(torch.where(finite, step, torch.zeros_like(step)))

    def _schedule_done(self) -> bool:
        """True once the re-scoring at ``end_step`` has run: the masks are final."""
        return self.last_pruned_step is not None and self.last_pruned_step >= self.end_step

    def _due(self, step: int) -> bool:
        if step < self.start_step:
            return False
        if self.last_pruned_step is None:
            return True
        if step >= self.end_step:
            return self.last_pruned_step < self.end_step
        return step - self.last_pruned_step >= self.frequency

    def _summed_or_magnitude(self, name: str, layer: CompressedLinear) -> tuple[torch.Tensor, bool]:
        """(the layer's movement or Fisher sum, False), or (its magnitude scores, True) while the sum
        is all zero."""
        scores = self.gradient_scores.get(name)
        if scores is not None and bool(scores.any()):
            return scores, False
        return block_scores(layer.masked_weight(), layer.sparse_config.block, "magnitude"), True

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        step = trainer.global_step
        if not self._due(step):
            return
        if self.allocation == "global":
            self._prune_globally(target_model(pl_module), step)
            return
        reached, fallbacks = [], 0
        for name, layer in _layers_matching(target_model(pl_module), self.plan).items():
            config = layer.sparse_config
            target = cubic_sparsity(step, self.start_step, self.end_step, config.sparsity)
            if config.score in GRADIENT_SCORES:
                scores, fell_back = self._summed_or_magnitude(name, layer)
                fallbacks += fell_back
                mask = shrink_mask(scores, layer.mask, target)
            else:
                mask = block_mask(layer.masked_weight(), target, config.block, config.score)
            reached.append(_install_mask(layer, mask))
        self._rescored(step)
        if fallbacks:
            rank_zero_info(f"BlockPruning: step {step}, no {self.score} scores accumulated yet for {fallbacks} layers; "
                           "scored them by magnitude")
        if reached:
            rank_zero_info(f"BlockPruning: step {step}, mean block sparsity {sum(reached) / len(reached):.3f} "
                           f"over {len(reached)} layers")

    def _prune_globally(self, model: nn.Module, step: int) -> None:
        """One re-scoring with ``allocation="global"``: all matched layers ranked together."""
        layers = _layers_matching(model, self.plan)
        target = cubic_sparsity(step, self.start_step, self.end_step, self.sparsity)
        summed = self.score in GRADIENT_SCORES
        scores = {name: self.gradient_scores.get(name) for name in layers} if summed else {}
        fell_back = summed and any(s is None or not bool(s.any()) for s in scores.values())
        if not summed or fell_back:
            kind = "magnitude" if summed else self.score
            scores = {name: block_scores(layer.masked_weight(), layer.sparse_config.block, kind)
                      for name, layer in layers.items()}
        masks = global_block_masks(scores, {name: layer.mask for name, layer in layers.items()}, target, self.spread)
        shares = [_install_mask(layer, masks[name]) for name, layer in layers.items()]
        self._rescored(step)
        if fell_back:
            rank_zero_info(f"BlockPruning: step {step}, {self.score} scores not accumulated in every layer yet; "
                           "ranked all layers by magnitude")
        if shares:
            pruned = sum(int((~layer.mask).sum()) for layer in layers.values())
            blocks = sum(layer.mask.numel() for layer in layers.values())
            rank_zero_info(f"BlockPruning: step {step}, block sparsity {pruned / blocks:.3f} over {len(shares)} "
                           f"layers (global; per layer {min(shares):.3f} to {max(shares):.3f})")

    def _rescored(self, step: int) -> None:
        """Record a re-scoring at ``step``; Fisher sums start again from zero after it."""
        self.last_pruned_step = step
        if self.score == "fisher":
            for total in self.gradient_scores.values():
                total.zero_()

    def state_dict(self):
        return {"last_pruned_step": self.last_pruned_step,
                "gradient_scores": {name: t.detach().cpu().clone() for name, t in self.gradient_scores.items()}}

    def load_state_dict(self, state_dict):
        self.last_pruned_step = state_dict.get("last_pruned_step")
        saved = state_dict.get("gradient_scores", state_dict.get("movement_scores", {}))  # the older key
        self.gradient_scores = {name: t.detach().cpu().float() for name, t in saved.items()}


class QuantizationAware(pl.Callback):
    """Fake-quantize the plan's layers from ``start_step`` on (QAT).

    ``config``: the scheme for every eligible linear when ``plan`` is None; ``plan``:
    ``{pattern: W8A8Config, W4A16Config or W8A16Config}``. ``exclude`` as in :class:`BlockPruning`.
    In YAML a W8A16Config needs its ``class_path``: a plain ``{group_size: 128}`` is a W4A16Config.
    """

    def __init__(self, config: Optional[Union[W8A8Config, W4A16Config, W8A16Config]] = None, start_step: int = 0,
                 plan: Optional[dict[str, Union[W8A8Config, W4A16Config, W8A16Config]]] = None,
                 exclude: Optional[list[str]] = None):
        super().__init__()
        if (config is None) == (plan is None):
            raise ValueError("QuantizationAware: expected exactly one of config (every eligible linear) "
                             f"or plan ({{pattern: config}}), got config={config!r}, plan={plan!r}")
        rules = {"*": config} if plan is None else dict(plan)
        for pattern, value in rules.items():
            if not isinstance(value, QUANT_CONFIGS):
                raise TypeError(f"QuantizationAware: expected W8A8Config, W4A16Config or W8A16Config for {pattern!r}, "
                                f"got {type(value).__name__}")
        _check_step("start_step", start_step)
        self.plan = Plan(rules, exclude=DEFAULT_EXCLUDE if exclude is None else tuple(exclude))
        self.start_step = start_step

    def setup(self, trainer, pl_module, stage):
        configs = [c for configs in self.plan.rules.values() for c in configs]
        static = any(isinstance(c, W8A8Config) and c.static for c in configs)
        calibrated = any(isinstance(cb, Calibration) for cb in trainer.callbacks)
        if static and stage == "fit" and not calibrated:
            raise ValueError("QuantizationAware: a static W8A8Config needs a compress.lightning.callbacks.Calibration "
                             "callback in the same run (or use activation='dynamic')")
        if any(c.gptq for c in configs) and stage == "fit" and not calibrated:
            raise ValueError("QuantizationAware: algorithm='gptq' needs a compress.lightning.callbacks.Calibration "
                             "callback in the same run (it runs GPTQ at the end of training)")
        prepare(target_model(pl_module), self.plan)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step < self.start_step:
            return
        layers = [m for m in _layers_matching(target_model(pl_module), self.plan).values() if not m.fake_quant_enabled]
        for layer in layers:
            layer.enable_fake_quant(True)
        if layers:
            rank_zero_info(f"QuantizationAware: fake quantization on for {len(layers)} layers at step "
                           f"{trainer.global_step}")


class Calibration(pl.Callback):
    """Observe W8A8 layer inputs for ``num_batches`` training batches, then freeze static scales.

    ``observer``: ``"absmax"``, ``"percentile"`` or ``"moving_average"``. ``smoothquant_alpha``
    (in [0, 1]): first observe ``num_batches``, migrate outliers (SmoothQuant), then observe
    ``num_batches`` more for the static scales. Needs the W8A8 layers to exist, i.e. a
    :class:`QuantizationAware` callback with a W8A8 config in the same run.

    A run without training steps (``trainer.max_steps: 0``, the post-training path in a recipe) is
    calibrated at fit start instead, on the first ``num_batches`` training batches (see ``on_fit_start``).

    GPTQ (layers whose config says ``algorithm="gptq"``: W8A8, W4A16 or W8A16): at the end of training
    (``on_train_end``, before :class:`Export` converts in ``on_fit_end``), the first ``num_batches``
    batches of the training dataloader are run once more (eval mode, no gradients) to collect each
    layer's Hessian, summed over DDP ranks, then each layer's weight is rounded by GPTQ (rank 0's
    result broadcast) and held on its grid, so the export stores GPTQ's integers and scales.
    """

    PHASES = ("smooth", "observe", "done")

    def __init__(self, num_batches: int = 8, observer: str = "absmax", smoothquant_alpha: Optional[float] = None):
        super().__init__()
        if not isinstance(num_batches, int) or isinstance(num_batches, bool) or num_batches < 1:
            raise ValueError(f"num_batches: expected a positive int, got {num_batches!r}")
        if observer not in OBSERVERS:
            raise ValueError(f"observer: expected one of {OBSERVERS}, got {observer!r}")
        if smoothquant_alpha is not None and not (
                isinstance(smoothquant_alpha, (int, float)) and 0.0 <= smoothquant_alpha <= 1.0):
            raise ValueError(f"smoothquant_alpha: expected None or a value in [0, 1], got {smoothquant_alpha!r}")
        self.num_batches, self.observer, self.smoothquant_alpha = num_batches, observer, smoothquant_alpha
        self.phase = "smooth" if smoothquant_alpha is not None else "observe"
        self.batches_seen = 0

    @staticmethod
    def _w8a8_layers(pl_module) -> dict[str, CompressedLinear]:
        return {n: m for n, m in compressed_layers(target_model(pl_module)).items()
                if isinstance(m.quant_config, W8A8Config)}

    def on_train_start(self, trainer, pl_module):
        if self.phase == "done":
            return
        layers = self._w8a8_layers(pl_module)
        if not layers:
            if not gptq_layers(target_model(pl_module)):
                rank_zero_warn("Calibration: no W8A8 or GPTQ layers to calibrate (add a QuantizationAware callback "
                               "with a W8A8Config, or a config with algorithm='gptq'); nothing to do")
            self.phase = "done"
            return
        for layer in layers.values():
            if layer.observer.kind != self.observer:
                layer.replace_observer(self.observer, layer.quant_config.percentile)
            if self.batches_seen == 0:
                layer.observer.reset()
            layer.observe(True)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if self.phase == "done":
            return
        self.batches_seen += 1
        if self.batches_seen < self.num_batches:
            return
        layers = self._w8a8_layers(pl_module)
        for layer in layers.values():
            layer.observing = False
            layer.observer.sync_()
        if self.phase == "smooth":
            self._smooth(pl_module, layers, batch)
        else:
            self._freeze(layers)

    def _smooth(self, pl_module, layers, batch) -> None:
        model = target_model(pl_module)
        placement = apply_smoothquant(model, layers, self.smoothquant_alpha, lambda m: forward_batch(m, batch))
        for tensor in model.state_dict().values():  # fold decisions may differ per batch: rank 0's win
            if tensor.is_floating_point():
                _broadcast_(tensor)
        rank_zero_info(f"Calibration: SmoothQuant alpha={self.smoothquant_alpha} applied to {len(placement)} layers")
        self.phase, self.batches_seen = "observe", 0
        for layer in layers.values():
            layer.observer.reset()
            layer.observe(True)

    def _freeze(self, layers) -> None:
        for layer in layers.values():
            layer.freeze_observer()
        static = sum(1 for m in layers.values() if m.quant_config.static)
        rank_zero_info(f"Calibration: froze observers of {len(layers)} W8A8 layers ({static} static scales)")
        self.phase = "done"

    def on_fit_start(self, trainer, pl_module):
        """A run without training steps (the post-training path: ``trainer.max_steps: 0``) is calibrated
        here, on the first ``num_batches`` training batches, as :func:`compress.convert` does with
        ``calibration_data``: SmoothQuant and static W8A8 scales, then GPTQ."""
        if not no_training_steps(trainer):
            return
        model = target_model(pl_module)
        run_batches = self._batch_runner(trainer, pl_module)
        was_training = model.training
        model.eval()
        with torch.no_grad():
            calibrate(model, run_batches)
        model.train(was_training)
        for tensor in model.state_dict().values():  # scales and smoothing from rank 0's batches
            if tensor.is_floating_point():
                _broadcast_(tensor)
        self.phase = "done"
        self._run_gptq(model, run_batches)

    def on_train_end(self, trainer, pl_module):
        self._run_gptq(target_model(pl_module), self._batch_runner(trainer, pl_module))

    def _batch_runner(self, trainer, pl_module):
        """``run(model)``: the model's forward over the first ``num_batches`` training batches."""
        def run(model):
            loader = trainer.train_dataloader
            if loader is None:  # no fit loop ran: ask the data module (or the task) for its loader
                source = trainer.datamodule if trainer.datamodule is not None else pl_module
                loader = source.train_dataloader()
            for batch in itertools.islice(loader, self.num_batches):
                forward_batch(model, trainer.strategy.batch_to_device(batch))
        return run

    def _run_gptq(self, model, run_batches) -> None:
        if not gptq_layers(model):
            return
        with torch.no_grad():
            results = run_gptq(model, run_batches, sync=_sum_over_ranks)
        layers = compressed_layers(model)
        for name in results:
            _broadcast_(layers[name].weight.data)
            _broadcast_(layers[name].weight_scale.data)
        rank_zero_info(f"Calibration: GPTQ quantized {len(results)} layers on {self.num_batches} training batches")

    def state_dict(self):
        return {"phase": self.phase, "batches_seen": self.batches_seen}

    def load_state_dict(self, state_dict):
        self.phase = state_dict.get("phase", self.phase)
        self.batches_seen = state_dict.get("batches_seen", 0)


class Export(pl.Callback):
    """At the end of ``fit``: convert to inference modules and (if ``save``) write ``dirpath``."""

    def __init__(self, dirpath: str = "compressed", save: bool = True):
        super().__init__()
        if not isinstance(dirpath, str) or not dirpath:
            raise ValueError(f"dirpath: expected a non-empty path string, got {dirpath!r}")
        self.dirpath, self.save = dirpath, bool(save)

    def on_fit_end(self, trainer, pl_module):
        model = target_model(pl_module)
        if not compressed_layers(model):
            rank_zero_warn("Export: the model has no prepared layers; nothing to convert")
            return
        convert(model)
        if self.save and trainer.is_global_zero:
            # overwrite: an earlier export of ours in dirpath is replaced; any other files there are not
            path = save_compressed(model, self.dirpath, overwrite=True)
            rank_zero_info(f"Export: compressed model saved to {path}")
        trainer.strategy.barrier("compress-export")


class FloatWeightsSnapshot(pl.Callback):
    """Keeps a copy of the task's model at the end of training, before any export converts it.

    ``on_train_end`` runs before every ``on_fit_end`` (where the Export callback converts), so the
    copy holds the fine-tuned float weights; training-only wrappers (fake quantization, masks) are
    replaced by plain ``nn.Linear`` layers holding the same (pruned) float weights.
    """

    def __init__(self):
        self.model = None

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Without training steps there is no ``on_train_end``: the copy is taken here, before any
        callback after this one calibrates (the CLI puts this callback first)."""
        if no_training_steps(trainer):
            self.on_train_end(trainer, pl_module)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.is_global_zero:
            self.model = strip_training_modules(copy.deepcopy(target_model(pl_module)).cpu())


def strip_training_modules(model: nn.Module) -> nn.Module:
    """Replace every training module (:class:`compress.nn.qat.CompressedLinear`) by its ``to_float()``."""
    for name, module in list(model.named_modules()):
        if isinstance(module, CompressedLinear):
            parent_name, _, child = name.rpartition(".")
            parent = model.get_submodule(parent_name) if parent_name else model
            setattr(parent, child, module.to_float())
    return model
