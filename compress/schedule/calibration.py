"""Calibration during training: W8A8 observers over the first training batches, then static scales;
GPTQ at the end of training.

Phases (:attr:`CalibrationSchedule.phase`): ``"smooth"`` (only with ``smoothquant_alpha``): observe
``num_batches`` batches, migrate activation outliers into the weights (SmoothQuant,
:func:`compress.core.smoothquant.apply_smoothquant`: folded into the preceding norm where that keeps
the outputs, else an ``input_smoothing`` buffer), then ``"observe"``: observe ``num_batches`` more
batches and freeze (static layers take ``act_scale = observer.scale()``), then ``"done"``.
Observer statistics are all-reduced with ``max`` across ranks before they are used; SmoothQuant's
fold decisions depend on a batch, so rank 0's model state is broadcast after it.

SmoothQuant checks each fold by running one batch: the inputs of the model's latest forward in
training mode, recorded by a forward pre-hook during the ``"smooth"`` phase (so any loop works; the
hook is removed once smoothing is done).

GPTQ and OBS (:func:`run_hessian_passes_on_all_ranks`): the layers whose config says
``algorithm="gptq"`` are rounded once training is over, and those whose ``BlockSparseConfig`` prunes
from calibration inputs (``algorithm="obs"``, ``score="activation"``) are pruned one-shot when training
starts (the Lightning ``Calibration`` callback), stage by stage, from Hessians collected on
calibration batches and summed over ranks; rank 0's result is broadcast after each stage
(:func:`compress.calibration.run_hessian_passes`).
Under FSDP2 each rank rounds its own rows of each weight from the same summed Hessian, and nothing is
broadcast but a scale buffer, which every rank gathers whole
(:meth:`compress.nn.qat.CompressedLinear.set_quantized_weight`).

The state (:meth:`CalibrationSchedule.state_dict`): the phase and the batches seen in it, with the
settings (``num_batches``, ``observer``, ``smoothquant_alpha``) and the W8A8 layers it was made with;
loading a state made with others raises a ``ValueError`` naming what differs
(:mod:`compress.schedule.state`).
"""
from __future__ import annotations

import logging
from typing import Optional

import torch
from torch import nn

from compress.calibration import (
    calibrated_pruning_layers,
    check_observed,
    freeze_observers,
    gptq_layers,
    hessian_layers,
    run_hessian_passes,
)
from compress.configs import OBSERVERS
from compress.core.sharding import is_sharded
from compress.core.smoothquant import apply_smoothquant
from compress.nn.experts import ExpertLinear
from compress.nn.qat import CompressedLinear, compressed_layers
from compress.schedule import distributed
from compress.schedule.state import check_mapping, check_saved_layers, check_saved_settings, check_saved_step
from compress.schedule.validation import check_positive_int

logger = logging.getLogger(__name__)
PHASES = ("smooth", "observe", "done")


def w8a8_layers(model: nn.Module) -> dict[str, CompressedLinear]:
    """The prepared layers of ``model`` with a W8A8 config (the ones with an activation observer)."""
    return {name: m for name, m in compressed_layers(model).items()  # experts: dynamic scales only, never smoothed
            if m.quant_config is not None and m.quant_config.observes_activations and not isinstance(m, ExpertLinear)}


class CalibrationSchedule:
    """Observe W8A8 layer inputs for ``num_batches`` training batches, then freeze static scales.

    ``observer``: ``"absmax"``, ``"percentile"`` or ``"moving_average"``. ``smoothquant_alpha`` (in
    [0, 1]): first observe ``num_batches``, migrate outliers (SmoothQuant), then observe ``num_batches``
    more for the static scales. Call :meth:`bind` when training starts (and again after
    :meth:`load_state_dict`), :meth:`batch_done` after each training batch.
    """

    def __init__(self, num_batches: int = 8, observer: str = "absmax", smoothquant_alpha: Optional[float] = None):
        check_positive_int("num_batches", num_batches)
        if observer not in OBSERVERS:
            raise ValueError(f"observer: expected one of {OBSERVERS}, got {observer!r}")
        if smoothquant_alpha is not None and not (
                isinstance(smoothquant_alpha, (int, float)) and not isinstance(smoothquant_alpha, bool)
                and 0.0 <= smoothquant_alpha <= 1.0):
            raise ValueError(f"smoothquant_alpha: expected None or a value in [0, 1], got {smoothquant_alpha!r}")
        self.num_batches, self.observer, self.smoothquant_alpha = num_batches, observer, smoothquant_alpha
        self.phase = "smooth" if smoothquant_alpha is not None else "observe"
        self.batches_seen = 0
        self.model: Optional[nn.Module] = None
        self.layers: dict[str, CompressedLinear] = {}
        self._recorder = None  # the forward pre-hook recording the latest training inputs ("smooth" phase)
        self._latest_inputs: Optional[tuple] = None
        self._restored_layers: Optional[dict] = None  # layers of a state loaded before bind, checked there

    def bind(self, model: nn.Module) -> None:
        """Start (or, after :meth:`load_state_dict`, resume) the current phase on ``model``'s W8A8 layers;
        a state loaded before is checked against them here."""
        self.model, self.layers = model, w8a8_layers(model)
        if self._restored_layers is not None:
            check_saved_layers("CalibrationSchedule.load_state_dict", self.layer_configs(), self._restored_layers)
            self._restored_layers = None
        self.stop_recording()
        if self.phase == "done":
            for layer in self.layers.values():
                layer.observing = False
            return
        if not self.layers:
            pruned_on_data = any(m.sparse_config is not None and m.sparse_config.needs_calibration
                                 for m in compressed_layers(model).values())
            if not gptq_layers(model) and not pruned_on_data:
                distributed.warn("calibration: no W8A8, GPTQ or OBS layers to calibrate (quantize some layers with "
                                 "a W8A8Config, use a config with algorithm='gptq', or prune with algorithm='obs'); "
                                 "nothing to do")
            self.phase = "done"
            return
        for layer in self.layers.values():
            if layer.observer.kind != self.observer:
                layer.replace_observer(self.observer, layer.quant_config.percentile)
            if self.batches_seen == 0:
                layer.observer.reset()
            layer.observe(True)
        if self.phase == "smooth":
            self._recorder = model.register_forward_pre_hook(self._record_inputs, with_kwargs=True)

    def _record_inputs(self, module, args, kwargs):
        if module.training:
            self._latest_inputs = (args, kwargs)

    def stop_recording(self) -> None:
        """Remove the input recorder (if any) and drop what it recorded."""
        if self._recorder is not None:
            self._recorder.remove()
        self._recorder, self._latest_inputs = None, None

    def batch_done(self) -> None:
        """Count one training batch; after ``num_batches`` of them, smooth or freeze."""
        if self.phase == "done":
            return
        self.batches_seen += 1
        if self.batches_seen < self.num_batches:
            return
        for layer in self.layers.values():
            layer.observing = False
            layer.observer.sync_()
        if self.phase == "smooth":
            self._smooth()
        else:
            self._freeze()

    def _smooth(self) -> None:
        inputs = self._latest_inputs
        self.stop_recording()
        if inputs is None:
            raise ValueError("calibration: SmoothQuant checks its folds on one training batch, but no forward of "
                             "the model in training mode was seen while observing; call the model itself "
                             "(model(...)) in the training step")
        args, kwargs = inputs
        check_observed(self.layers)
        placement = apply_smoothquant(self.model, self.layers, self.smoothquant_alpha,
                                      lambda model: model(*args, **kwargs))
        distributed.broadcast_floating_state_(self.model)  # fold decisions may differ per batch: rank 0's win
        distributed.info(logger, f"calibration: SmoothQuant alpha={self.smoothquant_alpha} applied to "
                                 f"{len(placement)} layers")
        self.phase, self.batches_seen = "observe", 0
        for layer in self.layers.values():
            layer.observer.reset()
            layer.observe(True)

    def _freeze(self) -> None:
        freeze_observers(self.layers)
        static = sum(1 for m in self.layers.values() if m.quant_config.static)
        distributed.info(logger, f"calibration: froze the observers of {len(self.layers)} W8A8 layers "
                                 f"({static} static scales)")
        self.phase = "done"

    # ---- state ---------------------------------------------------------------------------------------
    def settings(self) -> dict:
        """The settings that define this run, recorded in :meth:`state_dict` and checked on load."""
        return {"num_batches": self.num_batches, "observer": self.observer, "smoothquant_alpha": self.smoothquant_alpha}

    def layer_configs(self) -> dict[str, dict]:
        """``{name: W8A8 config dict}`` of the bound layers."""
        return {name: layer.quant_config.to_dict() for name, layer in self.layers.items()}

    def state_dict(self) -> dict:
        """The phase and the batches seen in it, with the :meth:`settings` and, once bound (or loaded), the
        W8A8 layers with their configs."""
        state = {"settings": self.settings(), "phase": self.phase, "batches_seen": self.batches_seen}
        layers = self.layer_configs() if self.model is not None else self._restored_layers
        if layers is not None:
            state["layers"] = layers
        return state

    def check_state_dict(self, state_dict: dict) -> None:
        """ValueError unless :meth:`load_state_dict` accepts ``state_dict`` (it changes nothing): the same
        settings, a phase this schedule has, ``batches_seen`` in [0, num_batches] and, once bound, the
        same W8A8 layers with the same configs."""
        where = "CalibrationSchedule.load_state_dict"
        check_mapping(where, state_dict)
        check_saved_settings(where, self.settings(), state_dict.get("settings"))
        phase = state_dict.get("phase", self.phase)
        phases = PHASES if self.smoothquant_alpha is not None else PHASES[1:]
        if phase not in phases:
            raise ValueError(f"{where}: expected a phase in {phases}, got {phase!r}"
                             f"{' (smoothing needs smoothquant_alpha)' if phase == 'smooth' else ''}")
        seen = state_dict.get("batches_seen", 0)
        check_saved_step(where, "batches_seen", seen)
        if seen > self.num_batches:
            raise ValueError(f"{where}: expected at most num_batches={self.num_batches} batches seen, got "
                             f"batches_seen={seen}; state from a run with another num_batches?")
        if self.model is not None:
            check_saved_layers(where, self.layer_configs(), state_dict.get("layers"))

    def load_state_dict(self, state_dict: dict) -> None:
        """Restore :meth:`state_dict`'s output once :meth:`check_state_dict` accepts it (the layers are
        checked at :meth:`bind` when not bound yet); :meth:`bind` then resumes the phase on the model.
        A state without ``"settings"`` or ``"layers"`` (written before they were recorded) is not
        checked on those."""
        self.check_state_dict(state_dict)
        self.phase, self.batches_seen = state_dict.get("phase", self.phase), state_dict.get("batches_seen", 0)
        self._restored_layers = None if self.model is not None else state_dict.get("layers")


def run_hessian_passes_on_all_ranks(model: nn.Module, calibration_data, gptq: bool = True) -> int:
    """OBS / activation-aware pruning and (``gptq``) GPTQ on every layer that still needs them
    (:func:`compress.calibration.hessian_layers`), stage by stage: Hessians summed over ranks, rank 0's
    weights, masks and scales broadcast before the next stage's pass; returns the number of layers done."""
    todo = hessian_layers(model) if gptq else calibrated_pruning_layers(model)
    if not todo:
        return 0
    layers = compressed_layers(model)

    def publish(names):
        for name in names:
            layer = layers[name]
            if not is_sharded(layer.weight):  # FSDP2: each rank rounded its own rows (module docstring)
                distributed.broadcast_(layer.weight.data)
                if layer.weight_scale is not None:
                    distributed.broadcast_(layer.weight_scale.data)
            if layer.mask is not None:
                distributed.broadcast_(layer.mask)

    with torch.no_grad():
        run_hessian_passes(model, calibration_data, sync=distributed.sum_over_ranks, publish=publish, gptq=gptq)
    return len(todo)
