"""Quantization-aware training: fake quantization of a plan's layers from ``start_step`` on.

From that step on each layer's forward quantizes and dequantizes its weight (and, W8A8, its input) on
the grid the export stores (:class:`compress.nn.qat.CompressedLinear`), so training sees the function
the inference module computes. A learnable (LSQ) scale is initialised from the weight when fake
quantization first switches on. The switch is a module attribute, not a buffer: whoever restores a run
calls :meth:`QuantizationSchedule.start_if_due` for the restored step again.

Under FSDP2 the forward sees whole weights and scales (FSDP gathers them); an LSQ scale is a row
shard like its weight, and each rank initialises the scales of its own rows (a row's scale depends
on that row only; block-scaled W8A8's 128 x 128 block scales come from block maxima taken over every
rank's rows), so the gathered scale is the one a single process would start from.

Its state (:meth:`QuantizationSchedule.state_dict`) is no position, only what the run was made with:
``start_step`` and, once bound, each layer's quantization config; loading a state made with others
raises a ``ValueError`` naming what differs (:mod:`compress.schedule.state`).
"""
from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Optional

from torch import nn

from compress.configs import QUANT_CONFIGS
from compress.core.sharding import reshard_
from compress.nn.qat import CompressedLinear
from compress.plan import DEFAULT_EXCLUDE, Plan, prepare
from compress.schedule import distributed
from compress.schedule.state import check_mapping, check_saved_layers, check_saved_settings
from compress.schedule.validation import check_step

logger = logging.getLogger(__name__)


class QuantizationSchedule:
    """Fake-quantize ``plan``'s layers from ``start_step`` on (QAT).

    ``plan``: a :class:`W8A8Config`, :class:`W4A16Config`, :class:`W8A16Config` or :class:`W8A8BlockConfig`
    (every eligible linear) or
    ``{pattern: config}`` (fnmatch patterns on module names). ``exclude``: patterns left dense (None:
    embeddings, classifier heads, ``lm_head``).
    """

    def __init__(self, plan, start_step: int = 0, exclude=None):
        if isinstance(plan, QUANT_CONFIGS):
            rules = {"*": plan}
        elif isinstance(plan, Mapping):
            rules = dict(plan)
        else:
            raise TypeError(f"QuantizationSchedule.plan: expected a W8A8Config, W4A16Config, W8A16Config or "
                            f"W8A8BlockConfig, or a mapping {{pattern: config}}, got {type(plan).__name__}")
        for pattern, value in rules.items():
            if not isinstance(value, QUANT_CONFIGS):
                raise TypeError("QuantizationSchedule: expected W8A8Config, W4A16Config, W8A16Config or "
                                f"W8A8BlockConfig for {pattern!r}, got {type(value).__name__}")
        check_step("start_step", start_step)
        self.plan = Plan(rules, exclude=DEFAULT_EXCLUDE if exclude is None else tuple(exclude))
        self.start_step = start_step
        self.layers: dict[str, CompressedLinear] = {}
        self.model: Optional[nn.Module] = None
        self._restored_layers: Optional[dict] = None  # layers of a state loaded before bind, checked there

    @property
    def configs(self) -> list:
        return [config for configs in self.plan.rules.values() for config in configs]

    @property
    def needs_static_scales(self) -> bool:
        """Whether some config asks for static W8A8 activation scales (they need calibration)."""
        return any(c.static for c in self.configs)

    @property
    def needs_gptq(self) -> bool:
        return any(c.gptq for c in self.configs)

    def prepare(self, model: nn.Module) -> None:
        """Swap the plan's layers (fake quantization still off)."""
        prepare(model, self.plan)

    def bind(self, model: nn.Module) -> None:
        """Find the plan's (prepared) layers; a state loaded before is checked against them here."""
        self.model, self.layers = model, self.plan.prepared_layers(model)
        if self._restored_layers is not None:
            check_saved_layers("QuantizationSchedule.load_state_dict", self.layer_configs(), self._restored_layers)
            self._restored_layers = None

    def start_if_due(self, step: int) -> None:
        """Switch fake quantization on for every layer still off once ``step >= start_step``."""
        if step < self.start_step:
            return
        switched = [layer for layer in self.layers.values() if not layer.fake_quant_enabled]
        if switched and self.model is not None:
            reshard_(self.model)  # FSDP2: LSQ scales start from the shards, not from a gathered copy
        for layer in switched:
            layer.enable_fake_quant(True)
        if switched:
            distributed.info(logger, f"quantization: fake quantization on for {len(switched)} layers at step {step}")

    # ---- state ---------------------------------------------------------------------------------------
    def settings(self) -> dict:
        """The settings that define this run, recorded in :meth:`state_dict` and checked on load."""
        return {"start_step": self.start_step}

    def layer_configs(self) -> dict[str, Optional[dict]]:
        """``{name: quantization config dict}`` of the bound layers."""
        return {name: None if layer.quant_config is None else layer.quant_config.to_dict()
                for name, layer in self.layers.items()}

    def state_dict(self) -> dict:
        """The :meth:`settings` and, once bound (or loaded), the layers with their configs."""
        state = {"settings": self.settings()}
        layers = self.layer_configs() if self.model is not None else self._restored_layers
        if layers is not None:
            state["layers"] = layers
        return state

    def check_state_dict(self, state_dict: dict) -> None:
        """ValueError unless :meth:`load_state_dict` accepts ``state_dict`` (it changes nothing): the same
        ``start_step`` and, once bound, the same layers with the same configs."""
        where = "QuantizationSchedule.load_state_dict"
        check_mapping(where, state_dict)
        check_saved_settings(where, self.settings(), state_dict.get("settings"))
        if self.model is not None:
            check_saved_layers(where, self.layer_configs(), state_dict.get("layers"))

    def load_state_dict(self, state_dict: dict) -> None:
        """Check ``state_dict`` (:meth:`check_state_dict`; the layers at :meth:`bind` when not bound yet).
        A state without ``"settings"`` or ``"layers"`` (written before they were recorded) is not checked
        on those. Nothing else to restore: call :meth:`start_if_due` for the resumed step."""
        self.check_state_dict(state_dict)
        self._restored_layers = None if self.model is not None else state_dict.get("layers")
