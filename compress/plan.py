"""Compression plans and the two entry points that apply them: ``prepare`` and ``convert``.

A plan says which ``nn.Linear`` layers get which configs:

* one config (``W8A8Config()``): every eligible linear layer,
* a list (``[BlockSparseConfig(0.5), W8A8Config()]``): every eligible layer gets all of them
  (prune and quantize the same layer),
* a mapping ``{pattern: config or list}``: fnmatch patterns on module names
  (``"encoder.layer.*.intermediate.dense"``); the first matching pattern wins,
* a :class:`Plan` (rules + ``exclude`` patterns).

Eligible: ``nn.Linear`` modules whose names match no ``exclude`` pattern; by default embeddings,
classifier heads (``classifier``, ``score``, ``pooler``, ``qa_outputs``) and ``lm_head`` stay dense, and
so does any linear whose weight is an embedding's (tied, e.g. Whisper's ``proj_out``), with a log line.

``prepare(model, plan)`` swaps the targeted layers for :class:`compress.nn.qat.CompressedLinear`
(training path). ``convert(model)`` swaps every ``CompressedLinear`` for its inference module;
``convert(model, plan, calibration_data=...)`` is the post-training path: prepare, prune one-shot,
calibrate (SmoothQuant and static scales), GPTQ where a config says ``algorithm="gptq"``, then swap.

Calibration (observers, SmoothQuant, static scales) and GPTQ live in :mod:`compress.calibration`.

A layer that a kernel cannot take is handled on purpose: W4A16 and W8A16 pad K to the group size (and
to a multiple of 8) with zero channels (:class:`compress.nn.modules.W4A16Linear`,
:class:`compress.nn.modules.W8A16Linear`); block sparsity alone on a layer whose N or K is not a
multiple of 32 is exported as a dense ``nn.Linear`` holding the masked weight, with a logged reason.

Export picks the inference module from a layer's configs: W8A8 with block sparsity ->
:class:`compress.nn.modules.BSRW8A8Linear` (int8 blocks, the pruned ones not stored; N or K not a
multiple of 32: ``W8A8Linear`` with zero blocks); W8A8 -> ``W8A8Linear``; W4A16 / W8A16, with or without
sparsity -> ``W4A16Linear`` / ``W8A16Linear`` (pruned blocks are zeros in the int4 / int8 weight; the
kernels read them like any other weight, so there pruning saves no bytes or time); sparsity alone ->
``BSRLinear``.
"""
from __future__ import annotations

import fnmatch
import itertools
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import torch
from torch import nn

from compress.calibration import calibrate, gptq_layers, run_gptq
from compress.configs import BlockSparseConfig, W4A16Config, W8A8Config, W8A16Config, is_config
from compress.core.sparsity import block_mask
from compress.nn.modules import BSRLinear, BSRW8A8Linear, W4A16Linear, W8A8Linear, W8A16Linear
from compress.nn.qat import CompressedLinear, compressed_layers, split_configs

logger = logging.getLogger(__name__)

DEFAULT_EXCLUDE = ("*embed*", "*classifier*", "*score", "*pooler*", "*qa_outputs*", "*lm_head*")
_PLAN_FORMS = "a config, a list of configs, a mapping {pattern: config or list}, or a Plan"


def _normalize_configs(value, where: str) -> tuple:
    items = tuple(value) if isinstance(value, (list, tuple)) else (value,)
    if not items:
        raise ValueError(f"{where}: expected at least one config, got an empty list")
    try:
        split_configs(items)
    except (TypeError, ValueError) as error:
        raise type(error)(f"{where}: {error}") from None
    return items


@dataclass(frozen=True)
class Plan:
    """``rules``: {fnmatch pattern: config or list of configs}; ``exclude``: patterns left dense."""

    rules: Mapping = field(default_factory=dict)
    exclude: tuple = DEFAULT_EXCLUDE

    def __post_init__(self):
        if not isinstance(self.rules, Mapping):
            raise TypeError(f"Plan.rules: expected a mapping {{pattern: config}}, got {type(self.rules).__name__}")
        normalized = {}
        for pattern, configs in self.rules.items():
            if not isinstance(pattern, str):
                raise TypeError(f"Plan.rules: expected str patterns, got {type(pattern).__name__} ({pattern!r})")
            normalized[pattern] = _normalize_configs(configs, f"Plan.rules[{pattern!r}]")
        object.__setattr__(self, "rules", normalized)
        if isinstance(self.exclude, str) or not all(isinstance(p, str) for p in self.exclude):
            raise TypeError(f"Plan.exclude: expected a list of str patterns, got {self.exclude!r}")
        object.__setattr__(self, "exclude", tuple(self.exclude))

    def configs_for(self, name: str) -> tuple | None:
        """The configs for module ``name``, or None if it is excluded or matches no rule."""
        if any(fnmatch.fnmatchcase(name, pattern) for pattern in self.exclude):
            return None
        for pattern, configs in self.rules.items():
            if fnmatch.fnmatchcase(name, pattern):
                return configs
        return None

    def targets(self, model: nn.Module) -> dict[str, tuple]:
        """{module name: configs} for every linear layer of ``model`` the plan selects; a linear whose
        weight is an embedding's (tied) stays dense, with a log line: compressing it would rewrite the
        embedding table too."""
        tied = tied_to_embeddings(model)
        found = {}
        for name, module in model.named_modules():
            if not name or not isinstance(module, nn.Linear) or (configs := self.configs_for(name)) is None:
                continue
            if id(module.weight) in tied:
                logger.info("plan: %s left dense: its weight is the embedding %s's (tied)", name, tied[id(module.weight)])
                continue
            found[name] = configs
        return found


def tied_to_embeddings(model: nn.Module) -> dict[int, str]:
    """{id(weight): embedding module name} of every ``nn.Embedding``'s weight in ``model``."""
    return {id(module.weight): name for name, module in model.named_modules() if isinstance(module, nn.Embedding)}


def as_plan(plan) -> Plan:
    """Normalize every accepted plan form to a :class:`Plan` (TypeError listing the forms otherwise)."""
    if isinstance(plan, Plan):
        return plan
    if is_config(plan) or isinstance(plan, (list, tuple)):
        return Plan({"*": plan})
    if isinstance(plan, Mapping):
        return Plan(plan)
    raise TypeError(f"plan: expected {_PLAN_FORMS}, got {type(plan).__name__}")


def _other_matrix_modules(model: nn.Module) -> str:
    """A sentence naming the module types other than ``nn.Linear`` / ``nn.Embedding`` that hold a 2-D
    ``weight`` (e.g. transformers' ``Conv1D`` in GPT-2), with a count and one name each; "" if none."""
    seen: dict[str, list[str]] = {}
    for name, module in model.named_modules():
        weight = module._parameters.get("weight") if name else None
        if weight is not None and weight.dim() == 2 and not isinstance(module, (nn.Linear, nn.Embedding)):
            seen.setdefault(type(module).__name__, []).append(name)
    if not seen:
        return ""
    listed = ", ".join(f"{kind} x{len(names)} (e.g. {names[0]!r})" for kind, names in seen.items())
    return f"; it also has matrix layers of other types, which plans do not target: {listed}"


def _linear_names(model: nn.Module) -> list[str]:
    return [name for name, module in model.named_modules() if name and isinstance(module, nn.Linear)]


def replace_submodule(model: nn.Module, name: str, new: nn.Module) -> None:
    """``model.<name> = new`` for a dotted module name."""
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, child, new)


class _Rollback:
    """Undo record for ``prepare`` / ``convert``: put everything back as it was before the call.

    It remembers, per touched name, the module that was there; per ``CompressedLinear`` mutated in
    place, its attributes, parameters, buffers and submodules (shallow: the same tensor objects, so
    in-place tensor edits are not undone, only which tensors/configs the layer holds); per weight,
    the gradient hooks it carried (``CompressedLinear.from_float`` shares the original ``nn.Linear``
    weight and puts a mask-gradient hook on it, which must not outlive a failed call).
    """

    def __init__(self, model: nn.Module):
        self.model = model
        self.modules: dict[str, nn.Module] = {}
        self.states: dict[int, tuple] = {}
        self.hooks: dict[int, tuple] = {}
        self.values: dict[int, tuple] = {}

    def keep_values(self, module: nn.Module, parameters: bool = True) -> None:
        """Copy the values of ``module``'s buffers (its observer's too) and, with ``parameters``, its own
        parameters, for steps that edit them in place."""
        own = module.parameters(recurse=False) if parameters else ()
        for tensor in itertools.chain(own, module.buffers()):
            if id(tensor) not in self.values:
                self.values[id(tensor)] = (tensor, tensor.detach().clone())

    def keep_module(self, name: str) -> None:
        if name not in self.modules:
            self.modules[name] = self.model.get_submodule(name)

    def keep_weight_hooks(self, weight: torch.Tensor) -> None:
        if id(weight) not in self.hooks:
            hooks = weight._backward_hooks
            self.hooks[id(weight)] = (weight, None if hooks is None else dict(hooks))

    def keep_state(self, layer: nn.Module) -> None:
        if id(layer) not in self.states:
            self.states[id(layer)] = (layer, dict(layer.__dict__), dict(layer._parameters),
                                      dict(layer._buffers), dict(layer._modules))
        self.keep_weight_hooks(layer.weight)

    def restore(self) -> None:
        with torch.no_grad():
            for tensor, value in self.values.values():
                tensor.copy_(value)
        for layer, attributes, parameters, buffers, modules in self.states.values():
            layer.__dict__.clear()
            layer.__dict__.update(attributes)
            # __dict__ holds the same _parameters/_buffers/_modules dict objects; refill them too.
            for current, saved in ((layer._parameters, parameters), (layer._buffers, buffers),
                                   (layer._modules, modules)):
                current.clear()
                current.update(saved)
        for weight, hooks in self.hooks.values():
            if hooks is None:
                weight._backward_hooks = None
            elif weight._backward_hooks is not None:
                weight._backward_hooks.clear()
                weight._backward_hooks.update(hooks)
        for name, module in self.modules.items():
            replace_submodule(self.model, name, module)


def _check_additions(name: str, layer: CompressedLinear, configs) -> None:
    """Raise (naming the layer) if ``configs`` cannot be added to an already prepared layer."""
    quant, sparse = split_configs(list(configs))
    split_configs([c for c in (layer.quant_config, quant, layer.sparse_config, sparse) if c is not None])


def prepare(model: nn.Module, plan) -> nn.Module:
    """Swap the plan's layers for ``CompressedLinear`` (in place; returns ``model``).

    Layers that are already ``CompressedLinear`` get the new configs added (so a pruning plan and a
    quantization plan compose); conflicting configs raise ``ValueError``.

    All or nothing: every target is checked before any is changed, and should building or swapping
    a layer still fail, the model is put back as it was (same module at every name, same configs
    and buffers on layers prepared before, no gradient hooks left on shared weights). The error
    names the layer that failed, so a plan that conflicts with an earlier one on only some layers
    does not leave the model half converted.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model: expected an nn.Module, got {type(model).__name__}")
    targets = as_plan(plan).targets(model)
    if not targets:
        names = _linear_names(model)
        raise ValueError(f"plan matched no eligible linear layer; the model's linear layers are {names[:20]}"
                         f"{' ...' if len(names) > 20 else ''}{_other_matrix_modules(model)}")
    # 1. check every target before touching any.
    for name, configs in targets.items():
        module = model.get_submodule(name)
        if isinstance(module, CompressedLinear):
            _layer_step(name, "prepare", _check_additions, name, module, configs)
    # 2. build and swap, undoing everything if a later layer still fails.
    rollback = _Rollback(model)
    try:
        for name, configs in targets.items():
            module = model.get_submodule(name)
            rollback.keep_module(name)
            if isinstance(module, CompressedLinear):
                rollback.keep_state(module)
                _layer_step(name, "prepare", module.add_configs, list(configs))
            else:
                rollback.keep_weight_hooks(module.weight)
                new = _layer_step(name, "prepare", CompressedLinear.from_float, module, list(configs))
                replace_submodule(model, name, new)
    except BaseException:
        rollback.restore()
        raise
    logger.info("prepare: %d layers set up for compression", len(targets))
    return model


def _layer_step(name: str, step: str, function, *args):
    """``function(*args)``, re-raising a failure as ``<step>: layer '<name>' failed, model left unchanged: ...``.

    The error keeps its type (``TypeError``, ``ValueError``, ...) so callers catching those still
    do; the original is chained as ``__cause__``.
    """
    try:
        return function(*args)
    except Exception as error:
        if getattr(error, "_compress_layer", None) is not None:
            raise
        try:
            named = type(error)(f"{step}: layer {name!r} failed, model left unchanged: {error}")
        except Exception:  # an exception type whose constructor takes other arguments
            raise error
        named._compress_layer = name
        raise named from error


# ---- post-training steps -------------------------------------------------------------------------
def prune_one_shot(model: nn.Module, keep_weights=()) -> None:
    """Give every sparse layer whose mask is still full its final mask (magnitude/L2 blocks).

    Layers named in ``keep_weights`` keep their pruned weights (masked in the forward) for GPTQ,
    which starts from them and zeroes them itself."""
    for name, layer in compressed_layers(model).items():
        config = layer.sparse_config
        if config is None or config.sparsity == 0 or not bool(layer.mask.all()):
            continue
        mask = block_mask(layer.weight, config.sparsity, config.block, config.score)
        layer.set_mask(mask, zero_weights=name not in keep_weights)
        logger.info("prune: %s pruned one-shot to %.0f%% of its blocks", name, 100 * config.sparsity)


# ---- export --------------------------------------------------------------------------------------
def export_module(name: str, layer: CompressedLinear) -> nn.Module:
    """The inference module for one prepared layer (see the module docstring for the rules)."""
    quant, sparse = layer.quant_config, layer.sparse_config
    weight = layer.masked_weight().detach()
    if isinstance(quant, W8A8Config):
        dense = W8A8Linear.from_float(layer, quant, weight=weight, weight_scale=layer.weight_scale,
                                      act_scale=layer.static_act_scale(), input_smoothing=layer.smoothing())
        if isinstance(sparse, BlockSparseConfig) and _bsr_shaped(name, layer, sparse.block, "int8 weight"):
            return BSRW8A8Linear.from_w8a8(dense, sparse.block, layer.mask)
        return dense
    if isinstance(quant, W4A16Config):
        return W4A16Linear.from_float(layer, quant, weight=weight, weight_scale=layer.weight_scale)
    if isinstance(quant, W8A16Config):
        return W8A16Linear.from_float(layer, quant, weight=weight, weight_scale=layer.weight_scale)
    if isinstance(sparse, BlockSparseConfig) and _bsr_shaped(name, layer, sparse.block, "weight"):
        return BSRLinear.from_float(layer, sparse, weight=weight, mask=layer.mask)
    return layer.to_float()


def _bsr_shaped(name: str, layer: CompressedLinear, block: int, what: str) -> bool:
    """True when N and K are multiples of ``block``; otherwise logs that the layer stays dense."""
    n, k = layer.out_features, layer.in_features
    if n % block == 0 and k % block == 0:
        return True
    logger.warning("convert: %s (N=%d, K=%d) left dense: BSR needs N and K multiples of %d; "
                   "its pruned blocks are zero in the dense %s", name, n, k, block, what)
    return False


def convert(model: nn.Module, plan=None, calibration_data=None) -> nn.Module:
    """Swap prepared layers (or, given ``plan``, the plan's plain linears) for inference modules.

    With ``plan`` this is the post-training path: prepare, prune one-shot, calibrate on
    ``calibration_data`` (batches fed as ``model(**batch)`` / ``model(batch[0])`` / ``model(batch)``,
    or a callable that runs the model itself) where static scales or SmoothQuant need it, GPTQ where
    a config says ``algorithm="gptq"`` (after SmoothQuant; see the module docstring), export.
    Without ``plan``, layers prepared with a sparse config but never pruned are pruned one-shot too.

    All or nothing: if any step fails (a plan conflict, missing calibration data, one layer's
    export), the model is put back as it was before the call (modules, configs, hooks, and the
    values that pruning, calibration and GPTQ edit in place) and the error names the layer where one is
    to blame. SmoothQuant calibration keeps a copy of the model's other tensors for this while it runs.
    """
    rollback = _Rollback(model)
    for name, module in model.named_modules():
        if name and isinstance(module, nn.Linear):
            rollback.keep_module(name)
            rollback.keep_weight_hooks(module.weight)
            if isinstance(module, CompressedLinear):
                rollback.keep_state(module)
    try:
        _convert(model, plan, calibration_data, rollback)
    except BaseException:
        rollback.restore()
        raise
    return model


def _convert(model: nn.Module, plan, calibration_data, rollback: _Rollback) -> None:
    """The steps of :func:`convert`; ``rollback`` learns what they edit in place before they do."""
    if plan is not None:
        prepare(model, plan)
    layers = compressed_layers(model)
    if not layers:
        raise ValueError("convert: the model has no prepared layers; call compress.prepare(model, plan) "
                         "first or pass a plan")
    gptq = gptq_layers(model)
    if gptq and calibration_data is None:
        raise ValueError(f"convert: {len(gptq)} layers with algorithm='gptq' (e.g. {next(iter(gptq))!r}) need "
                         "calibration_data (an iterable of batches or a callable(model))")
    needs_calibration = any(
        isinstance(m.quant_config, W8A8Config) and (
            (m.quant_config.static and not m.calibrated)
            or (m.quant_config.smoothquant_alpha is not None and m.smoothing() is None and plan is not None))
        for m in layers.values())
    if needs_calibration and gptq and isinstance(calibration_data, Iterable) and not isinstance(
            calibration_data, (list, tuple)):
        calibration_data = list(calibration_data)  # read once, run by calibration and by GPTQ
    # Pruning zeroes weights and calibration rewrites scales (SmoothQuant also folds into the norms
    # before the layers): keep the values those steps may edit so a later failure can put them back.
    # Calibration alone writes buffers only; pruning zeroes weights; SmoothQuant scales the layers'
    # weights and folds into norms (whose parameters are all 1-D); GPTQ rewrites its layers' weights
    # (and learnable scales): copy just those, never the model.
    smoothing = needs_calibration and any(m.quant_config.smoothquant_alpha is not None for m in layers.values()
                                          if isinstance(m.quant_config, W8A8Config))
    for name, layer in layers.items():
        config = layer.sparse_config
        to_prune = config is not None and config.sparsity != 0 and bool(layer.mask.all())
        if to_prune or needs_calibration or name in gptq:
            rollback.keep_values(layer, parameters=to_prune or smoothing or name in gptq)
    if smoothing:
        for module in model.modules():
            own = list(module.parameters(recurse=False))
            if own and not isinstance(module, CompressedLinear) and all(p.dim() == 1 for p in own):
                rollback.keep_values(module)
    prune_one_shot(model, keep_weights=gptq)
    if needs_calibration:
        calibrate(model, calibration_data)
    run_gptq(model, calibration_data)
    # Build every inference module before swapping any, so an export failure swaps nothing.
    exported = {name: _layer_step(name, "convert", export_module, name, layer) for name, layer in layers.items()}
    for name, module in exported.items():
        replace_submodule(model, name, module)
    logger.info("convert: %d layers exported", len(layers))
