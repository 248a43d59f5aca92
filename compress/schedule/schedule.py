"""One object that compresses a model while it trains, driven from any training loop.

``CompressionSchedule(model, pruning=..., quantization=..., calibration=...)`` prepares ``model`` (swaps
the targeted ``nn.Linear`` layers for :class:`compress.nn.qat.CompressedLinear`) and then advances one
optimizer step at a time::

    schedule = CompressionSchedule(model, pruning=PruningSchedule(0.5, end_step=800), quantization=W8A8Config())
    optimizer = torch.optim.AdamW(model.parameters())     # after the schedule or before: the Parameters are kept
    for batch in loader:
        model(**batch).loss.backward()
        schedule.before_optimizer_step(optimizer)         # movement / Fisher scores read the gradients here
        optimizer.step()
        schedule.step()                                   # masks re-applied; the next step's pruning, QAT, calibration
        optimizer.zero_grad()
    schedule.finish(calibration_data=batches)             # final masks, QAT on, GPTQ where configured
    compress.convert(model)                               # computes what the trained model computed

Step ``t`` (``global_step``, the number of optimizer steps taken) is set up before its forward: the
construction sets up step 0, each :meth:`CompressionSchedule.step` ends step ``t`` (masks written back
to zeros, the calibration batch counted) and sets up ``t + 1`` (the pruning schedule's re-scoring and
QAT's start when due). So from the QAT start (``QuantizationSchedule.start_step``, 0 for a bare config)
the model fake-quantizes as its export computes, and after :meth:`CompressionSchedule.finish` (masks
final, fake quantization on, observers frozen, GPTQ applied) its forward is the function
``compress.convert(model)`` exports, to float32 reassociation.

Resuming: build the model and the schedule as before, load the model's ``state_dict`` (masks, observer
statistics, scales and weights are module buffers and Parameters), then
``schedule.load_state_dict(saved)``: the step, the pruning schedule's position and gradient sums and the
calibration phase; the run then continues as the uninterrupted one would. The state also records the
parts, their settings and their layers: a state from another model, from a run with other settings (a
changed sparsity, score, step counts, quantization configs) or with a negative step is refused with a
``ValueError`` naming what differs, and the schedule is left as it was (:mod:`compress.schedule.state`).

Under ``torch.distributed`` (DDP from any launcher) the ranks stay identical: masks and SmoothQuant's
folds from rank 0, observer statistics all-reduced with max, GPTQ's Hessians summed
(:mod:`compress.schedule.distributed`).
"""
from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Optional

import torch
from torch import nn

from compress.calibration import calibrated_pruning_layers, gptq_layers
from compress.schedule import distributed
from compress.schedule.calibration import CalibrationSchedule, run_hessian_passes_on_all_ranks
from compress.schedule.pruning import PruningSchedule
from compress.schedule.quantization import QUANT_CONFIGS, QuantizationSchedule
from compress.schedule.state import check_mapping, check_saved_step

logger = logging.getLogger(__name__)
PARTS = ("pruning", "quantization", "calibration")


def _as_quantization(quantization) -> Optional[QuantizationSchedule]:
    if quantization is None or isinstance(quantization, QuantizationSchedule):
        return quantization
    if isinstance(quantization, (*QUANT_CONFIGS, Mapping)):
        return QuantizationSchedule(quantization)
    raise TypeError(f"quantization: expected a QuantizationSchedule, a W8A8Config, W4A16Config, W8A16Config or "
                    f"W8A8BlockConfig, or a mapping {{pattern: config}}, got {type(quantization).__name__}")


class CompressionSchedule:
    """Prune, quantize and calibrate ``model`` while it trains (see the module docstring).

    ``pruning``: a :class:`PruningSchedule` or None. ``quantization``: a :class:`QuantizationSchedule`,
    or a W8A8 / W4A16 / W8A16 config or ``{pattern: config}`` (fake quantization from step 0), or None.
    ``calibration``: a :class:`CalibrationSchedule` (needed by static W8A8 scales; counts one batch per
    step) or None. The parts are applied in that order at each step. ``calibration_data`` (batches or a
    callable(model), as :func:`compress.convert` takes): needed when the pruning schedule says
    ``algorithm="obs"``; its layers are pruned one-shot on it (OBS) before step 0.
    """

    def __init__(self, model: nn.Module, *, pruning: Optional[PruningSchedule] = None, quantization=None,
                 calibration: Optional[CalibrationSchedule] = None, calibration_data=None):
        if not isinstance(model, nn.Module):
            raise TypeError(f"model: expected an nn.Module, got {type(model).__name__}")
        if pruning is not None and not isinstance(pruning, PruningSchedule):
            raise TypeError(f"pruning: expected a PruningSchedule or None, got {type(pruning).__name__}")
        if calibration is not None and not isinstance(calibration, CalibrationSchedule):
            raise TypeError(f"calibration: expected a CalibrationSchedule or None, got {type(calibration).__name__}")
        quantization = _as_quantization(quantization)
        if pruning is None and quantization is None:
            raise ValueError("CompressionSchedule: expected pruning=PruningSchedule(...) and/or "
                             "quantization=(a config or a QuantizationSchedule), got neither")
        if quantization is not None and quantization.needs_static_scales and calibration is None:
            raise ValueError("CompressionSchedule: a static W8A8Config needs calibration=CalibrationSchedule(...) "
                             "(or use activation='dynamic')")
        self.model, self.pruning, self.quantization, self.calibration = model, pruning, quantization, calibration
        self.global_step = 0
        self.finished = False
        self._gradients_read = False
        for part in (pruning, quantization):
            if part is not None:
                part.prepare(model)
        self._bind()
        self._prune_one_shot(calibration_data)
        self._set_up_step()

    def _prune_one_shot(self, calibration_data) -> None:
        """OBS on ``calibration_data`` for the layers whose sparse config reads calibration inputs."""
        waiting = calibrated_pruning_layers(self.model)
        if not waiting:
            return
        if calibration_data is None:
            raise ValueError(f"CompressionSchedule: {len(waiting)} layers prune one-shot from calibration inputs "
                             f"(algorithm='obs', e.g. {next(iter(waiting))!r}); expected calibration_data=batches")
        run_hessian_passes_on_all_ranks(self.model, calibration_data, gptq=False)
        distributed.info(logger, f"schedule: pruned {len(waiting)} layers one-shot on calibration data")

    def _bind(self) -> None:
        for part in (self.pruning, self.quantization, self.calibration):
            if part is not None:
                part.bind(self.model)

    def _set_up_step(self) -> None:
        """What step ``global_step`` needs before its forward: the pruning schedule's re-scoring, QAT's start."""
        if self.pruning is not None:
            self.pruning.prune_if_due(self.global_step)
        if self.quantization is not None:
            self.quantization.start_if_due(self.global_step)

    def _check_open(self, call: str) -> None:
        if self.finished:
            raise RuntimeError(f"CompressionSchedule.{call}: the schedule is finished (finish() was called); "
                               "the model is ready for compress.convert")

    def before_optimizer_step(self, optimizer: Optional[torch.optim.Optimizer] = None) -> None:
        """After the backward, before ``optimizer.step()``: movement / Fisher pruning scores read the
        gradients (of the layers ``optimizer`` updates, when given). Needed with those scores only.

        Once per optimizer step (once per optimizer, with several): a second call in the same step that
        would sum a layer's gradients again raises ``RuntimeError``; :meth:`step` must run in between."""
        self._check_open("before_optimizer_step")
        if self.pruning is not None:
            self.pruning.accumulate(optimizer, step=self.global_step)
        self._gradients_read = True

    def step(self) -> None:
        """After ``optimizer.step()``: end step ``global_step`` and set up the next one."""
        self._check_open("step")
        if self.pruning is not None and self.pruning.reads_gradients and not self._gradients_read:
            raise RuntimeError(f"CompressionSchedule.step: score={self.pruning.score!r} sums the gradients of every "
                               "step, but before_optimizer_step() was not called since the last step(); call it "
                               "after the backward, before optimizer.step()")
        if self.pruning is not None:
            self.pruning.apply_masks()
        if self.calibration is not None:
            self.calibration.batch_done()
        self.global_step += 1
        self._gradients_read = False
        self._set_up_step()

    def finish(self, calibration_data=None) -> None:
        """End training: final masks (if the pruning schedule has not reached ``end_step``), fake
        quantization on everywhere, then GPTQ on ``calibration_data`` (an iterable of batches or a
        callable(model), as :func:`compress.convert` takes) where a config says ``algorithm="gptq"``.

        Raises ``ValueError`` when calibration has not seen its batches yet or GPTQ has no data. A second
        call does nothing."""
        if self.finished:
            return
        if self.calibration is not None and self.calibration.phase != "done":
            raise ValueError(f"CompressionSchedule.finish: calibration is in phase {self.calibration.phase!r} after "
                             f"{self.calibration.batches_seen} of {self.calibration.num_batches} batches; train "
                             "more steps first or use a smaller num_batches")
        gptq = gptq_layers(self.model)
        if gptq and calibration_data is None:
            raise ValueError(f"CompressionSchedule.finish: {len(gptq)} layers with algorithm='gptq' (e.g. "
                             f"{next(iter(gptq))!r}) need calibration_data (an iterable of batches or a "
                             "callable(model))")
        self._finish_schedules()
        rounded = run_hessian_passes_on_all_ranks(self.model, calibration_data)
        if rounded:
            distributed.info(logger, f"schedule: GPTQ rounded {rounded} layers")
        self.finished = True

    def _finish_schedules(self) -> None:
        """Final masks and fake quantization on, whatever step training stopped at."""
        if self.pruning is not None:
            self.pruning.finish(self.global_step)
        if self.quantization is not None:
            self.quantization.start_if_due(max(self.global_step, self.quantization.start_step))

    def _parts(self) -> dict:
        """``{name: part}`` of the parts this schedule has, in :data:`PARTS` order."""
        parts = dict(zip(PARTS, (self.pruning, self.quantization, self.calibration)))
        return {name: part for name, part in parts.items() if part is not None}

    def state_dict(self) -> dict:
        """The schedule's position (plain Python values and CPU tensors; ``torch.save`` it beside the
        model's and the optimizer's ``state_dict``), with the parts it has and each part's state (which
        records its settings and layers)."""
        state = {"global_step": self.global_step, "finished": self.finished, "parts": list(self._parts())}
        state.update({name: part.state_dict() for name, part in self._parts().items()})
        return state

    def check_state_dict(self, state_dict: dict) -> None:
        """ValueError unless :meth:`load_state_dict` accepts ``state_dict`` (it changes nothing): a
        non-negative int ``global_step``, the same parts, and each part's state made with this part's
        settings and layers (:meth:`PruningSchedule.check_state_dict` and the others')."""
        where = "CompressionSchedule.load_state_dict"
        check_mapping(where, state_dict, required=("global_step",))
        check_saved_step(where, "global_step", state_dict["global_step"])
        if not isinstance(state_dict.get("finished", False), bool):
            raise ValueError(f"{where}: expected a bool 'finished', got {state_dict['finished']!r}")
        self._check_saved_parts(state_dict)
        for name, part in self._parts().items():
            if name in state_dict:
                part.check_state_dict(state_dict[name])
        last = state_dict["pruning"].get("last_pruned_step") if self.pruning is not None else None
        if last is not None and last > state_dict["global_step"] and not state_dict.get("finished", False):
            raise ValueError(f"{where}: expected the pruning schedule's last re-scoring at global_step "
                             f"({state_dict['global_step']}) or before, got last_pruned_step={last}")

    def _check_saved_parts(self, state_dict: dict) -> None:
        """The saved schedule must have the parts this one has. A state written before ``"parts"`` was
        recorded tells them by its keys, and had no quantization state: that part is not checked there."""
        saved = state_dict.get("parts")
        if saved is not None and not (isinstance(saved, (list, tuple)) and set(saved) <= set(PARTS)):
            raise ValueError(f"CompressionSchedule.load_state_dict: expected 'parts' as a list of {PARTS}, "
                             f"got {saved!r}")
        for name in PARTS:
            if saved is None and name == "quantization":
                continue
            has = name in (state_dict if saved is None else saved)
            if has and name not in state_dict:
                raise ValueError(f"CompressionSchedule.load_state_dict: expected the {name} state that its "
                                 f"'parts' list names, got keys {sorted(map(str, state_dict))}")
            part = getattr(self, name)
            if (part is None) == has:
                raise ValueError(f"CompressionSchedule.load_state_dict: the saved schedule "
                                 f"{'has' if has else 'has no'} {name} state, this one "
                                 f"{'has none' if part is None else 'has a ' + type(part).__name__}")

    def load_state_dict(self, state_dict: dict) -> None:
        """Continue from :meth:`state_dict`'s output (load the model's ``state_dict`` too, before or
        after), once :meth:`check_state_dict` accepts it: a refused state leaves the schedule as it was.
        States written before the parts, settings and layers were recorded load unchecked on those."""
        self.check_state_dict(state_dict)
        for name, part in self._parts().items():
            if name in state_dict:
                part.load_state_dict(state_dict[name])
        self.global_step, self.finished = state_dict["global_step"], state_dict.get("finished", False)
        self._gradients_read = False
        self._bind()
        if self.finished:
            self._finish_schedules()
        else:
            self._set_up_step()
