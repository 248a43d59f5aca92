"""Gradual 32x32 block pruning, one training step at a time, for any loop.

The target sparsity follows the cubic schedule (Zhu & Gupta, 2017; :func:`compress.core.sparsity.cubic_sparsity`)
from 0 at ``start_step`` to ``sparsity`` at ``end_step``; the blocks are re-scored at ``start_step``, every
``frequency`` steps after it and at ``end_step``. Masks only shrink: blocks pruned earlier score
``-inf`` (:func:`compress.core.sparsity.shrink_mask`), and the pruned weights are written back to exact
zeros after every optimizer step, so AdamW's momentum and weight decay cannot revive them.

Scores (``score``): ``"magnitude"`` (mean |w| per block) and ``"l2"`` read the weights at each
re-scoring. ``"movement"`` (Sanh et al., 2020; blocks as in Lagunas et al., 2021) sums
``-W * dL/dW`` per block over the optimizer steps (weights moving away from zero score high);
``"fisher"`` (Optimal Brain Surgeon with one empirical-Fisher block per 32x32 block, Kurtic et al.,
2022) sums ``(sum over the block of W * dL/dW)^2``, the loss increase that zeroing the block costs to
second order, and starts its sums again after every re-scoring, so each one ranks the blocks by the
steps since the one before. Both accumulate from the first training step on (the dense phase gives
signal before pruning starts) with ``W`` the masked weight and ``dL/dW`` its gradient as the optimizer
receives it (under DDP already all-reduced, so every rank sums the same); a step with a non-finite
contribution (AMP skips it) adds nothing; once the last re-scoring is done, nothing more is summed. A
layer whose sum is still all zero (pruning at step 0) is scored by magnitude for that re-scoring.

``allocation="global"`` ranks the blocks of all matched layers together: the model as a whole reaches
the schedule's sparsity while each layer stays within ``[(1 - spread) s, s + spread (1 - s)]`` of its
blocks (:func:`compress.core.sparsity.global_block_masks`); where some layer has no gradient sum yet,
every layer is scored by magnitude, so the ranking compares one kind of score.

``algorithm="obs"``: the masks come from second-order one-shot pruning on calibration data before the
first step (:mod:`compress.core.obs`; the Lightning ``Calibration`` callback runs it when training
starts, a plain loop passes ``calibration_data`` to :class:`compress.schedule.CompressionSchedule`), and
training then keeps them: the schedule re-scores nothing, its steps and ``score`` are not used, and
``allocation`` must stay ``"layer"`` (each layer at its sparsity).

``tile_rows`` > 1: every mask prunes tiles of that many block rows x one block column, ranked by their
blocks' mean score (the large-M kernel's pattern; :mod:`compress.core.sparsity`), in either allocation.

``reorder_neurons``: before the layers are swapped, list each MLP's hidden neurons by importance so weak
neurons share blocks (:func:`compress.core.neuron_order.reorder_mlp_neurons`; the function is unchanged).

Under DDP every rank computes its masks from identical weights and installs rank 0's (broadcast).
Under FSDP2 (``fully_shard`` applied after :meth:`PruningSchedule.prepare`) each rank holds some rows
of each weight: the block sums of its rows are summed over the ranks (:mod:`compress.schedule.block_scores`),
so every rank scores the whole weight, the masks (whole on every rank) come out the same and rank 0's
are installed; each rank then zeroes its own rows of the pruned blocks after every optimizer step.
The state (last re-scoring, gradient sums as CPU tensors, the settings and the layers it was made
with) is :meth:`PruningSchedule.state_dict`; the masks themselves are module buffers, in the model's
``state_dict``. Loading a state made with other settings (a changed sparsity, score, step counts) or
for other layers raises a ``ValueError`` naming what differs (:mod:`compress.schedule.state`).
"""
from __future__ import annotations

import logging
from typing import Optional

import torch
from torch import nn

from compress.configs import BLOCK_SCORES, GRADIENT_SCORES, BlockSparseConfig
from compress.core.neuron_order import find_mlps, kept_mass, reorder_mlp_neurons
from compress.nn.experts import is_fused_experts
from compress.core.sharding import reshard_
from compress.core.sparsity import (
    allocation_bounds,
    cubic_sparsity,
    global_block_masks,
    mask_from_scores,
    mask_sparsity,
    shrink_mask,
)
from compress.nn.qat import CompressedLinear
from compress.plan import DEFAULT_EXCLUDE, Plan, prepare
from compress.schedule import distributed
from compress.schedule.block_scores import gradient_block_scores, weight_block_scores
from compress.schedule.state import (
    check_mapping,
    check_saved_layer_names,
    check_saved_layers,
    check_saved_settings,
    check_saved_step,
)
from compress.schedule.validation import check_positive_int, check_step

logger = logging.getLogger(__name__)
ALLOCATIONS = ("layer", "global")  # each layer to the target, or all layers ranked together


def _kept_mlp_mass(mlps, sparsity: float) -> float:
    """Mean of :func:`compress.core.neuron_order.kept_mass` over the MLPs' matrices."""
    shares = [kept_mass(lin.weight, sparsity) for mlp in mlps for lin in (*mlp.inputs, mlp.output)]
    return sum(shares) / len(shares) if shares else float("nan")


def _install_mask(layer: CompressedLinear, mask: torch.Tensor) -> float:
    """Rank 0's ``mask`` into ``layer`` (pruned weights zeroed); returns its block sparsity."""
    distributed.broadcast_(mask)
    layer.set_mask(mask)
    return mask_sparsity(mask)


class PruningSchedule:
    """Gradual block pruning to ``sparsity`` between ``start_step`` and ``end_step`` (module docstring).

    ``plan``: None (every eligible linear) or ``{pattern: final sparsity}`` (fnmatch patterns on module
    names; each matched layer ends at its own sparsity). ``exclude``: patterns left dense (None:
    embeddings, classifier heads, ``lm_head``). ``allocation="global"`` needs ``plan=None`` and
    ``algorithm="score"``.

    Per training step, in this order: :meth:`prune_if_due` before the step's forward,
    :meth:`accumulate` after its backward (gradient scores only), :meth:`apply_masks` after the
    optimizer step. :meth:`prepare` swaps the layers (once per model), :meth:`bind` finds them.
    """

    def __init__(self, sparsity: float = 0.5, start_step: int = 0, end_step: int = 100, frequency: int = 10,
                 score: str = "magnitude", plan: Optional[dict[str, float]] = None,
                 exclude: Optional[list[str]] = None, allocation: str = "layer", spread: float = 0.5,
                 reorder_neurons: bool = False, algorithm: str = "score", tile_rows: int = 1):
        if score not in BLOCK_SCORES:
            raise ValueError(f"score: expected one of {BLOCK_SCORES}, got {score!r}")
        if allocation not in ALLOCATIONS:
            raise ValueError(f"allocation: expected one of {ALLOCATIONS}, got {allocation!r}")
        if allocation == "global" and plan is not None:
            raise ValueError("allocation='global' ranks all layers against one sparsity; expected plan=None, "
                             f"got plan={plan!r}")
        if allocation == "global" and algorithm == "obs":
            raise ValueError("allocation='global' ranks the gradual scores of all layers; algorithm='obs' prunes each "
                             "layer to its sparsity one-shot: expected allocation='layer'")
        allocation_bounds(sparsity, spread)  # validates spread
        BlockSparseConfig(sparsity=sparsity, score=score, algorithm=algorithm, tile_rows=tile_rows)  # validates them
        check_step("start_step", start_step)
        check_step("end_step", end_step)
        if end_step < start_step:
            raise ValueError(f"end_step: expected >= start_step ({start_step}), got {end_step}")
        check_positive_int("frequency", frequency)
        if not isinstance(reorder_neurons, bool):
            raise ValueError(f"reorder_neurons: expected a bool, got {reorder_neurons!r}")
        rules = {"*": sparsity} if plan is None else dict(plan)
        self.plan = Plan({p: BlockSparseConfig(sparsity=s, score=score, algorithm=algorithm, tile_rows=tile_rows)
                          for p, s in rules.items()},
                         exclude=DEFAULT_EXCLUDE if exclude is None else tuple(exclude))
        self.sparsity, self.start_step, self.end_step, self.frequency = sparsity, start_step, end_step, frequency
        self.score, self.allocation, self.spread, self.reorder_neurons = score, allocation, spread, reorder_neurons
        self.algorithm, self.tile_rows = algorithm, tile_rows
        self.has_plan = plan is not None
        self.last_pruned_step: Optional[int] = None
        self.gradient_scores: dict[str, torch.Tensor] = {}  # movement or Fisher sums: name -> (N/32, K/32) float32
        self.layers: dict[str, CompressedLinear] = {}  # the matched layers (bind)
        self.model: Optional[nn.Module] = None  # the bound model (bind)
        self._reordered = False
        self._pruned_one_shot = False  # algorithm="obs": the one-shot masks were seen in place
        self._current_step: Optional[int] = None  # the step of the latest prune_if_due call
        self._summed_at: dict[str, int] = {}  # layer name -> the step whose gradients were last summed into it
        self._restored: Optional[tuple] = None  # (saved layers, saved score shapes) loaded before bind, checked there

    # ---- set-up ----------------------------------------------------------------------------------
    def prepare(self, model: nn.Module) -> None:
        """Reorder the MLP neurons (once per schedule, if asked), then swap the plan's layers."""
        if self.reorder_neurons and not self._reordered:
            mlps = find_mlps(model)
            before = _kept_mlp_mass(mlps, self.sparsity)
            reorder_mlp_neurons(model)
            self._reordered = True
            skipped = sum(is_fused_experts(m) for m in model.modules())
            if skipped:
                distributed.info(logger, f"pruning: the neurons of {skipped} fused experts blocks are not reordered")
            distributed.info(logger, f"pruning: reordered the hidden neurons of {len(mlps)} MLPs; at sparsity "
                                     f"{self.sparsity:g} their blocks would keep {before:.3f} -> "
                                     f"{_kept_mlp_mass(mlps, self.sparsity):.3f} of the L1 mass")
        prepare(model, self.plan)

    def bind(self, model: nn.Module) -> None:
        """Find the plan's (prepared) layers; gradient sums restored on their devices, else zeros. A state
        loaded before (:meth:`load_state_dict`) is checked against these layers here."""
        self.model, self.layers = model, self.plan.prepared_layers(model)
        if self._restored is not None:
            self._check_layers(*self._restored)
            self._restored = None
        if self.score in GRADIENT_SCORES:
            self.gradient_scores = {name: self._initial_sum(name, layer) for name, layer in self.layers.items()}

    def _initial_sum(self, name: str, layer: CompressedLinear) -> torch.Tensor:
        grid = tuple(layer.mask.shape)
        restored = self.gradient_scores.get(name)
        if restored is None:
            return torch.zeros(grid, dtype=torch.float32, device=layer.weight.device)
        if tuple(restored.shape) != grid:
            raise ValueError(f"pruning: {self.score} scores of {name!r}: expected shape {grid}, "
                             f"got {tuple(restored.shape)} (state from another model?)")
        return restored.to(device=layer.weight.device, dtype=torch.float32)

    # ---- the schedule --------------------------------------------------------------------------------
    @property
    def done(self) -> bool:
        """True once the re-scoring at ``end_step`` has run: the masks are final."""
        return self.last_pruned_step is not None and self.last_pruned_step >= self.end_step

    @property
    def reads_gradients(self) -> bool:
        """Whether :meth:`accumulate` still has gradients to read (a gradient score, schedule not done)."""
        return self.score in GRADIENT_SCORES and not self.done

    def due(self, step: int) -> bool:
        if step < self.start_step:
            return False
        if self.last_pruned_step is None:
            return True
        if step >= self.end_step:
            return self.last_pruned_step < self.end_step
        return step - self.last_pruned_step >= self.frequency

    def prune_if_due(self, step: int) -> bool:
        """Re-score and install the masks for ``step`` if the schedule says so; True if it did. ``step`` is
        also the step :meth:`accumulate` sums for by default."""
        self._current_step = step
        if self.algorithm == "obs":
            if not self._pruned_one_shot:  # once: the masks only shrink, so a later step cannot undo it
                self._check_pruned_one_shot()
                self._pruned_one_shot = True
            return False
        if not self.due(step):
            return False
        if self.model is not None:
            reshard_(self.model)  # FSDP2: score and mask the shards, not a copy gathered by a forward
        if self.allocation == "global":
            self._prune_globally(step)
        else:
            self._prune_each_layer(step)
        return True

    def _check_pruned_one_shot(self) -> None:
        """RuntimeError unless every layer with ``algorithm="obs"`` got its mask from the one-shot pass."""
        waiting = [name for name, layer in self.layers.items()
                   if layer.sparse_config.sparsity > 0 and bool(layer.mask.all())]
        if waiting:
            raise RuntimeError(f"pruning: algorithm='obs' prunes from calibration data before training, but "
                               f"{len(waiting)} layers (e.g. {waiting[0]!r}) are not pruned yet: add the Calibration "
                               "callback (Lightning) or pass calibration_data to CompressionSchedule")

    def finish(self, step: int) -> None:
        """Give every layer its final mask now if the schedule has not reached ``end_step`` (training
        ended at ``step``, earlier): one last re-scoring at the final sparsity."""
        if self.done or self.algorithm == "obs":
            return
        distributed.info(logger, f"pruning: training ended at step {step}, before end_step {self.end_step}; "
                                 "pruning to the final sparsity now")
        self.prune_if_due(self.end_step)

    @torch.no_grad()
    def accumulate(self, optimizer: Optional[torch.optim.Optimizer] = None, step: Optional[int] = None) -> None:
        """Add this step's movement or Fisher block scores from the layers' ``weight.grad`` (after the
        backward, before the optimizer step; only the layers ``optimizer`` updates, when given).

        ``step``: the optimizer step these gradients belong to (default: the step of the latest
        :meth:`prune_if_due`). A layer's gradients are summed once per step: a second call for the same
        step that would sum a layer again raises ``RuntimeError`` instead of counting the step twice."""
        if not self.reads_gradients:
            return
        updated = None if optimizer is None else {id(p) for group in optimizer.param_groups for p in group["params"]}
        layers = {name: layer for name, layer in self.layers.items()
                  if layer.weight_grad() is not None and (updated is None or id(layer.weight_parameter) in updated)}
        step = self._current_step if step is None else step
        self._check_not_summed(layers, step)
        contributions = gradient_block_scores(layers, self.score)
        if step is not None:
            self._summed_at.update({name: step for name in layers})
        if not contributions:
            return
        finite = torch.stack([c.isfinite().all() for c in contributions.values()]).all()
        for name, contribution in contributions.items():
            self.gradient_scores[name].add_(torch.where(finite, contribution, torch.zeros_like(contribution)))

    def _check_not_summed(self, layers: dict, step: Optional[int]) -> None:
        """RuntimeError if the gradients of ``step`` were already summed into one of ``layers``."""
        again = sorted(name for name in layers if step is not None and self._summed_at.get(name) == step)
        if again:
            more = f" and {len(again) - 1} more layers" if len(again) > 1 else ""
            raise RuntimeError(f"PruningSchedule.accumulate: the {self.score} scores of step {step} were already "
                               f"summed for {again[0]!r}{more}; before_optimizer_step() (on_before_optimizer_step) "
                               "reads the gradients once per optimizer step, after the backward and before "
                               "optimizer.step(); step() (after optimizer.step()) must run before the next call")

    def apply_masks(self) -> None:
        """Write exact zeros into the pruned weights (after every optimizer step)."""
        for layer in self.layers.values():
            layer.apply_mask_()

    # ---- re-scoring --------------------------------------------------------------------------------------
    def _layer_scores(self) -> tuple[dict[str, torch.Tensor], int]:
        """({name: block scores} of every layer, how many layers fell back to magnitude): the gradient sum
        where it has any signal, else (and for weight scores) the masked weight's scores."""
        summed = {}
        if self.score in GRADIENT_SCORES:
            summed = {name: self.gradient_scores[name] for name in self.layers
                      if name in self.gradient_scores and bool(self.gradient_scores[name].any())}
        rest = {name: layer for name, layer in self.layers.items() if name not in summed}
        weighed = weight_block_scores(rest, "magnitude" if self.score in GRADIENT_SCORES else self.score)
        fallbacks = len(rest) if self.score in GRADIENT_SCORES else 0
        return {name: summed[name] if name in summed else weighed[name] for name in self.layers}, fallbacks

    def _prune_each_layer(self, step: int) -> None:
        reached = []
        scores, fallbacks = self._layer_scores()
        for name, layer in self.layers.items():
            target = cubic_sparsity(step, self.start_step, self.end_step, layer.sparse_config.sparsity)
            tile_rows = layer.sparse_config.tile_rows
            if self.score in GRADIENT_SCORES:
                mask = shrink_mask(scores[name], layer.mask, target, tile_rows)
            else:
                mask = mask_from_scores(scores[name], target, tile_rows)
            reached.append(_install_mask(layer, mask))
        self._rescored(step)
        if fallbacks:
            distributed.info(logger, f"pruning: step {step}, no {self.score} scores accumulated yet for {fallbacks} "
                                     "layers; scored them by magnitude")
        if reached:
            distributed.info(logger, f"pruning: step {step}, mean block sparsity {sum(reached) / len(reached):.3f} "
                                     f"over {len(reached)} layers")

    def _prune_globally(self, step: int) -> None:
        """One re-scoring with ``allocation="global"``: all matched layers ranked together."""
        layers = self.layers
        target = cubic_sparsity(step, self.start_step, self.end_step, self.sparsity)
        summed = self.score in GRADIENT_SCORES
        scores = {name: self.gradient_scores.get(name) for name in layers} if summed else {}
        fell_back = summed and any(s is None or not bool(s.any()) for s in scores.values())
        if not summed or fell_back:
            scores = weight_block_scores(layers, "magnitude" if summed else self.score)
        masks = global_block_masks(scores, {name: layer.mask for name, layer in layers.items()}, target, self.spread,
                                   self.tile_rows)
        shares = [_install_mask(layer, masks[name]) for name, layer in layers.items()]
        self._rescored(step)
        if fell_back:
            distributed.info(logger, f"pruning: step {step}, {self.score} scores not accumulated in every layer "
                                     "yet; ranked all layers by magnitude")
        if shares:
            pruned = sum(int((~layer.mask).sum()) for layer in layers.values())
            blocks = sum(layer.mask.numel() for layer in layers.values())
            distributed.info(logger, f"pruning: step {step}, block sparsity {pruned / blocks:.3f} over "
                                     f"{len(shares)} layers (global; per layer {min(shares):.3f} to {max(shares):.3f})")

    def _rescored(self, step: int) -> None:
        """Record a re-scoring at ``step``; Fisher sums start again from zero after it."""
        self.last_pruned_step = step
        if self.score == "fisher":
            for total in self.gradient_scores.values():
                total.zero_()

    # ---- state ---------------------------------------------------------------------------------------
    def settings(self) -> dict:
        """The settings that define this run, recorded in :meth:`state_dict` and checked on load
        (``sparsity`` when every layer has it; with a ``plan`` each layer's config holds its own)."""
        settings = {"start_step": self.start_step, "end_step": self.end_step, "frequency": self.frequency,
                    "score": self.score, "allocation": self.allocation, "spread": self.spread,
                    "algorithm": self.algorithm, "tile_rows": self.tile_rows}
        return settings if self.has_plan else {"sparsity": self.sparsity, **settings}

    def layer_configs(self) -> dict[str, Optional[dict]]:
        """``{name: sparse config dict}`` of the bound layers."""
        return {name: _config_dict(layer.sparse_config) for name, layer in self.layers.items()}

    def state_dict(self) -> dict:
        """The position (last re-scoring, gradient sums as CPU tensors) with the :meth:`settings` and, once
        bound, the layers it belongs to (``"layers"``: ``{name: config dict}``)."""
        state = {"settings": self.settings(), "last_pruned_step": self.last_pruned_step,
                 "gradient_scores": {name: t.detach().cpu().clone() for name, t in self.gradient_scores.items()}}
        layers = self._recorded_layers()
        if layers is not None:
            state["layers"] = layers
        return state

    def _recorded_layers(self) -> Optional[dict]:
        """The bound layers' configs; before :meth:`bind`, those of a loaded state (None if unknown)."""
        if self.model is not None:
            return self.layer_configs()
        return None if self._restored is None else self._restored[0]

    def check_state_dict(self, state_dict: dict) -> None:
        """ValueError unless :meth:`load_state_dict` accepts ``state_dict`` (it changes nothing): the same
        settings, a non-negative ``last_pruned_step`` from ``start_step`` on, and, once bound, the same
        layers with the same configs."""
        where = "PruningSchedule.load_state_dict"
        check_mapping(where, state_dict)
        check_saved_settings(where, self.settings(), state_dict.get("settings"))
        last = state_dict.get("last_pruned_step")
        check_saved_step(where, "last_pruned_step", last, allow_none=True)
        if last is not None and last < self.start_step:
            raise ValueError(f"{where}: expected a last re-scoring at start_step ({self.start_step}) or later, got "
                             f"last_pruned_step={last}; state from a run with another start_step?")
        scores = _saved_scores(state_dict)
        if self.model is not None:
            self._check_layers(state_dict.get("layers"), _shapes(scores))

    def _check_layers(self, saved_layers, score_shapes: dict[str, tuple]) -> None:
        """The saved layers must be the bound ones, with their configs; so must the layers of the saved
        gradient sums (if any), each the shape of its layer's block grid."""
        where = "PruningSchedule.load_state_dict"
        check_saved_layers(where, self.layer_configs(), saved_layers)
        if not score_shapes:
            return
        check_saved_layer_names(where, set(self.layers), set(score_shapes))
        for name, shape in score_shapes.items():
            grid = tuple(self.layers[name].mask.shape)
            if shape != grid:
                raise ValueError(f"{where}: {self.score} scores of {name!r}: expected shape {grid}, got {shape} "
                                 "(state from another model?)")

    def load_state_dict(self, state_dict: dict) -> None:
        """Restore :meth:`state_dict`'s output (call :meth:`bind` after it to put the sums on the layers'
        devices), once :meth:`check_state_dict` accepts it; the layers are checked here when bound, else at
        :meth:`bind`. ``movement_scores`` is the key older Lightning checkpoints used for the sums; states
        without ``"settings"`` or ``"layers"`` (written before they were recorded) load unchecked on those."""
        self.check_state_dict(state_dict)
        scores = _saved_scores(state_dict)
        self.last_pruned_step = state_dict.get("last_pruned_step")
        self.gradient_scores = {name: t.detach().cpu().float() for name, t in scores.items()}
        self._summed_at = {}
        self._restored = None if self.model is not None else (state_dict.get("layers"), _shapes(scores))


def _config_dict(config) -> Optional[dict]:
    return None if config is None else config.to_dict()


def _shapes(tensors: dict) -> dict[str, tuple]:
    return {name: tuple(t.shape) for name, t in tensors.items()}


def _saved_scores(state_dict: dict) -> dict:
    """The saved gradient sums (``movement_scores`` in older Lightning checkpoints), checked to be tensors."""
    scores = state_dict.get("gradient_scores", state_dict.get("movement_scores", {}))
    if not isinstance(scores, dict) or not all(isinstance(t, torch.Tensor) for t in scores.values()):
        raise ValueError("PruningSchedule.load_state_dict: expected gradient_scores as {layer name: tensor}, got "
                         f"{type(scores).__name__}")
    return scores
