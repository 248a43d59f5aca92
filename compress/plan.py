"""Compression plans and the two entry points that apply them: ``prepare`` and ``convert``.

A plan says which linear layers (``nn.Linear``, and ``transformers``' ``Conv1D`` of the GPT-2 family)
get which configs:

* one config (``W8A8Config()``): every eligible linear layer,
* a list (``[BlockSparseConfig(0.5), W8A8Config()]``): every eligible layer gets all of them
  (prune and quantize the same layer),
* a mapping ``{pattern: config or list}``: fnmatch patterns on module names
  (``"encoder.layer.*.intermediate.dense"``); the first matching pattern wins,
* a :class:`Plan` (rules + ``exclude`` patterns).

Eligible: ``nn.Linear`` and ``Conv1D`` modules whose names match no ``exclude`` pattern; by default
embeddings, classifier heads (``classifier``, ``score``, ``pooler``, ``qa_outputs``) and ``lm_head`` stay
dense, and so does any linear whose weight is an embedding's (tied, e.g. Whisper's ``proj_out`` or
GPT-2's ``lm_head``) and any ``Conv1D`` whose weight another module holds too, with a log line.

``prepare(model, plan)`` swaps the targeted layers for :class:`compress.nn.qat.CompressedLinear`
(training path). A ``Conv1D`` becomes one as the ``nn.Linear`` it is: a transposed copy of its
weight, a new Parameter in the (out, in) layout, and its own bias (:mod:`compress.nn.conv1d`: build
optimizers after ``prepare``); after that nothing treats it apart, except that a layer exported dense
is a ``Conv1D`` again. ``convert(model)`` swaps every ``CompressedLinear`` for its inference module;
``convert(model, plan, calibration_data=...)`` is the post-training path: prepare, prune one-shot by
weight scores, calibrate (SmoothQuant and static scales), then layer by layer on calibration inputs
OBS or activation-aware pruning where a ``BlockSparseConfig`` says ``algorithm="obs"`` or
``score="activation"`` and GPTQ where a quantization config says ``algorithm="gptq"``, then swap.

Calibration (observers, SmoothQuant, static scales) and GPTQ live in :mod:`compress.calibration`.

A layer that a kernel cannot take is handled on purpose: W4A16 and W8A16 pad K to the group size (and
to a multiple of 8) with zero channels (:class:`compress.nn.inference.W4A16Linear`,
:class:`compress.nn.inference.W8A16Linear`); block sparsity alone on a layer whose N or K is not a
multiple of 32 is exported as a dense ``nn.Linear`` holding the masked weight, with a logged reason.

Export picks the inference module from a layer's configs (``config.inference_module`` and
``config.block_sparse_module``, :mod:`compress.configs`): W8A8 / W4A16 with block sparsity ->
:class:`compress.nn.inference.BSRW8A8Linear` / :class:`compress.nn.inference.BSRW4A16Linear` (int8 / int4
blocks, the pruned ones not stored; N or K not a multiple of 32: ``W8A8Linear`` / ``W4A16Linear`` with
zero blocks); W8A8 / W4A16 alone -> ``W8A8Linear`` / ``W4A16Linear``; W8A16 / W8A8Block, with or without
sparsity -> ``W8A16Linear`` / ``W8A8BlockLinear`` (pruned blocks are zeros in the int8 weight; the
kernels read them like any other weight, so there pruning saves no bytes or time); sparsity alone ->
``BSRLinear``. ``W8A8BlockLinear`` needs no padding: its kernels mask a last partial 128-channel block.
"""
from __future__ import annotations

import fnmatch
import itertools
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import torch
from torch import nn

from compress.calibration import calibrate, gptq_layers, hessian_layers, run_hessian_passes
from compress.configs import is_config
from compress.core.sharding import is_sharded
from compress.core.sparsity import block_mask
from compress.nn.conv1d import is_conv1d, is_linear_or_conv1d
from compress.nn.experts import (
    CompressedExperts,
    ExpertLinear,
    compressed_experts,
    experts_layout_problem,
    experts_module_name,
    is_fused_experts,
)
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
    """``rules``: {fnmatch pattern: config or list of configs}; ``exclude``: patterns left dense;
    ``dense_routers``: leave MoE routers and gates dense (:func:`is_router`)."""

    rules: Mapping = field(default_factory=dict)
    exclude: tuple = DEFAULT_EXCLUDE
    dense_routers: bool = True

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
        if not isinstance(self.dense_routers, bool):
            raise TypeError(f"Plan.dense_routers: expected a bool, got {self.dense_routers!r}")

    def configs_for(self, name: str) -> tuple | None:
        """The configs for module ``name``, or None if it is excluded or matches no rule."""
        if any(fnmatch.fnmatchcase(name, pattern) for pattern in self.exclude):
            return None
        for pattern, configs in self.rules.items():
            if fnmatch.fnmatchcase(name, pattern):
                return configs
        return None

    def prepared_layers(self, model: nn.Module) -> dict[str, CompressedLinear]:
        """{module name: layer} of the prepared layers (:func:`prepare`) of ``model`` the plan selects."""
        return {name: m for name, m in compressed_layers(model).items()
                if self.configs_for(experts_module_name(name) if isinstance(m, ExpertLinear) else name) is not None}

    def targets(self, model: nn.Module) -> dict[str, tuple]:
        """{module name: configs} for every linear layer (``nn.Linear`` or ``Conv1D``) and every fused-experts
        block (:mod:`compress.nn.experts`) of ``model`` the plan selects. Left dense, with a log line: a
        router or gate (:func:`is_router`, unless ``dense_routers`` is off); a linear whose weight is an
        embedding's (tied), since compressing it would rewrite the embedding table too; a ``Conv1D``
        whose weight another module (or the same module under another name) holds too, since preparing
        it would untie them (the prepared layer holds a transposed copy). Left dense with a warning: an
        experts block in another layout or with configs experts do not take yet, and any other module
        holding a matrix that a pattern matches (one warning per module type)."""
        tied = tied_to_embeddings(model)
        holders = weight_holders(model)
        found, unsupported = {}, {}
        for name, module in model.named_modules():
            if not name or isinstance(module, ExpertLinear) or (configs := self.configs_for(name)) is None:
                continue
            if self.dense_routers and is_router(name, module):
                logger.info("plan: %s left dense: a router or gate", name)
                continue
            if isinstance(module, CompressedExperts) or is_fused_experts(module):
                problem = None if isinstance(module, CompressedExperts) else experts_layout_problem(module)
                problem = problem or _experts_config_problem(configs)
                if problem is None:
                    found[name] = configs
                else:
                    logger.warning("plan: experts %s (%s) left dense: %s", name, type(module).__name__, problem)
                continue
            if not is_linear_or_conv1d(module):
                if not isinstance(module, nn.Embedding) and any(p.dim() >= 2 for p in module.parameters(recurse=False)):
                    unsupported.setdefault(type(module).__name__, []).append(name)
                continue
            if id(module.weight) in tied:
                logger.info("plan: %s left dense: its weight is the embedding %s's (tied)",
                            name, tied[id(module.weight)])
                continue
            others = [other for other in holders[id(module.weight)] if other != name]
            if is_conv1d(module) and others:
                logger.info("plan: %s left dense: a Conv1D whose weight %s also holds (preparing it would "
                            "untie them)", name, others[0])
                continue
            found[name] = configs
        for kind, names in unsupported.items():
            logger.warning("plan: %d %s modules matched but left dense: plans compress nn.Linear, Conv1D and "
                           "fused experts only (e.g. %r)", len(names), kind, names[0])
        return found


def is_router(name: str, module: nn.Module) -> bool:
    """Whether ``module`` is an MoE router or gate, left dense by default: its name contains "router", or
    its last part ends in "gate" and it has few outputs (at most an eighth of its inputs, as a router's
    one per expert or Qwen2-MoE's one-output ``shared_expert_gate``; ``gate_proj`` is no gate)."""
    if "router" in name.lower():
        return True
    if not name.rpartition(".")[2].lower().endswith("gate"):
        return False
    weight = module._parameters.get("weight")
    return weight is not None and weight.dim() == 2 and weight.shape[0] <= max(1, weight.shape[1] // 8)


def _experts_config_problem(configs) -> str | None:
    """Why an experts block cannot take ``configs`` yet, or None: experts take dynamic W8A8, W4A16, W8A16 and
    block sparsity; static scales, SmoothQuant and GPTQ need calibration data routed to every expert."""
    for config in configs:
        if config.static:
            return "static W8A8 activation scales are not supported for experts (use activation='dynamic')"
        if config.smoothquant:
            return "SmoothQuant is not supported for experts"
        if config.gptq:
            return "GPTQ is not supported for experts (use algorithm='rtn')"
        if config.weight_scales == "block":
            return "block-scaled W8A8 (W8A8BlockConfig) is not supported for experts yet"
    return None


def tied_to_embeddings(model: nn.Module) -> dict[int, str]:
    """{id(weight): embedding module name} of every ``nn.Embedding``'s weight in ``model``."""
    return {id(module.weight): name for name, module in model.named_modules() if isinstance(module, nn.Embedding)}


def weight_holders(model: nn.Module) -> dict[int, list[str]]:
    """{id(weight): names of every module holding it as its ``weight``}, a module registered under
    several names counted under each."""
    holders: dict[int, list[str]] = {}
    for name, module in model.named_modules(remove_duplicate=False):
        weight = module._parameters.get("weight")
        if weight is not None:
            holders.setdefault(id(weight), []).append(name)
    return holders


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
    """A sentence naming the module types other than ``nn.Linear`` / ``Conv1D`` / ``nn.Embedding`` that
    hold a 2-D ``weight``, with a count and one name each; "" if none."""
    seen: dict[str, list[str]] = {}
    for name, module in model.named_modules():
        weight = module._parameters.get("weight") if name else None
        if (weight is not None and weight.dim() == 2 and not is_linear_or_conv1d(module)
                and not isinstance(module, nn.Embedding)):
            seen.setdefault(type(module).__name__, []).append(name)
    if not seen:
        return ""
    listed = ", ".join(f"{kind} x{len(names)} (e.g. {names[0]!r})" for kind, names in seen.items())
    return f"; it also has matrix layers of other types, which plans do not target: {listed}"


def linear_layer_names(model: nn.Module) -> list[str]:
    """Names of the layers a plan can target (``nn.Linear`` and ``Conv1D``), in module order."""
    return [name for name, module in model.named_modules() if name and is_linear_or_conv1d(module)]


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


def _check_additions(name: str, layer: CompressedLinear | CompressedExperts, configs) -> None:
    """Raise (naming the layer) if ``configs`` cannot be added to an already prepared layer or experts block."""
    if isinstance(layer, CompressedExperts):
        layer = layer.down[0]  # every expert layer holds the same configs
    quant, sparse = split_configs(list(configs))
    split_configs([c for c in (layer.quant_config, quant, layer.sparse_config, sparse) if c is not None])


def _check_not_sharded(name: str, module: nn.Module, configs) -> None:
    """ValueError when preparing ``module`` would swap it or add a config to it while FSDP2 shards it:
    FSDP manages the Parameters of the modules it wrapped, not those of a new module or a new scale."""
    if not any(is_sharded(p) for p in module.parameters()):
        return
    if isinstance(module, CompressedLinear):
        quant, sparse = split_configs(list(configs))
        if (quant is None or module.quant_config is not None) and (sparse is None or module.sparse_config is not None):
            return  # nothing to add: the prepared layer stays as FSDP wrapped it
    raise ValueError(f"prepare: layer {name!r} is sharded by FSDP2 (fully_shard); prepare the model (build the "
                     "CompressionSchedule, or let the Lightning callbacks' setup run) before sharding it")


def prepare(model: nn.Module, plan, fake_quant: bool = False) -> nn.Module:
    """Swap the plan's layers for ``CompressedLinear`` (in place; returns ``model``).

    ``fake_quant``: switch fake quantization on in the plan's quantized layers right away, so the model
    trains on the function its export computes (QAT without a schedule); needs a quantization config in
    the plan. Off by default: :class:`compress.schedule.CompressionSchedule` and the Lightning callbacks
    switch it on at their start step. Block masks stay full either way until a pruning schedule (or
    :func:`convert`'s one-shot pruning) sets them, and static W8A8 scales need calibration.

    Layers that are already ``CompressedLinear`` get the new configs added (so a pruning plan and a
    quantization plan compose); conflicting configs raise ``ValueError``. A ``Conv1D`` is taken as
    the ``nn.Linear`` it is, with a transposed copy of its weight (build optimizers afterwards;
    :mod:`compress.nn.conv1d`); the number of such layers is logged.

    Under FSDP2, prepare before ``fully_shard`` (:mod:`compress.schedule.fsdp`): a sharded layer can only
    be given configs it holds already (``ValueError`` otherwise), since FSDP manages the Parameters of
    the modules it wrapped, not those of a swapped-in layer.

    All or nothing: every target is checked before any is changed, and should building or swapping
    a layer still fail, the model is put back as it was (same module at every name, same configs
    and buffers on layers prepared before, no gradient hooks left on shared weights). The error
    names the layer that failed, so a plan that conflicts with an earlier one on only some layers
    does not leave the model half converted.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model: expected an nn.Module, got {type(model).__name__}")
    if not isinstance(fake_quant, bool):
        raise TypeError(f"fake_quant: expected a bool, got {type(fake_quant).__name__}")
    targets = as_plan(plan).targets(model)
    if not targets:
        names = linear_layer_names(model)
        raise ValueError(f"plan matched no eligible linear layer; the model's linear layers (nn.Linear, Conv1D) "
                         f"are {names[:20]}{' ...' if len(names) > 20 else ''}{_other_matrix_modules(model)}")
    if fake_quant and not any(split_configs(list(configs))[0] is not None for configs in targets.values()):
        raise ValueError("prepare: fake_quant=True needs a quantization config (W8A8Config, W4A16Config, "
                         "W8A16Config or W8A8BlockConfig) in the plan; it has block sparsity only")
    # 1. check every target before touching any.
    for name, configs in targets.items():
        module = model.get_submodule(name)
        _check_not_sharded(name, module, configs)
        if isinstance(module, (CompressedLinear, CompressedExperts)):
            _layer_step(name, "prepare", _check_additions, name, module, configs)
    from_conv1d = sum(is_conv1d(model.get_submodule(name)) for name in targets)
    already = sum(isinstance(model.get_submodule(name), (CompressedLinear, CompressedExperts)) for name in targets)
    # 2. build and swap, undoing everything if a later layer still fails.
    rollback = _Rollback(model)
    try:
        for name, configs in targets.items():
            module = model.get_submodule(name)
            rollback.keep_module(name)
            if isinstance(module, CompressedLinear):
                rollback.keep_state(module)
                _layer_step(name, "prepare", module.add_configs, list(configs))
            elif isinstance(module, CompressedExperts):
                for layer in module.layers():
                    rollback.keep_state(layer)
                _layer_step(name, "prepare", module.add_configs, list(configs))
            elif is_fused_experts(module):
                rollback.keep_weight_hooks(module.gate_up_proj)
                rollback.keep_weight_hooks(module.down_proj)
                new = _layer_step(name, "prepare", CompressedExperts, module, list(configs))
                replace_submodule(model, name, new)
            else:
                rollback.keep_weight_hooks(module.weight)
                new = _layer_step(name, "prepare", CompressedLinear.from_float, module, list(configs))
                replace_submodule(model, name, new)
    except BaseException:
        rollback.restore()
        raise
    if fake_quant:
        for layer in as_plan(plan).prepared_layers(model).values():  # experts' layers too
            if layer.quant_config is not None:
                layer.enable_fake_quant(True)
    _log_prepared(model, targets, already, fake_quant)
    if from_conv1d:
        logger.info("prepare: %d transformers Conv1D layers converted to nn.Linear (weights transposed)", from_conv1d)
    return model


def _log_prepared(model: nn.Module, targets: dict, already: int, fake_quant: bool) -> None:
    """Log what one ``prepare`` call did: the configs it gave, how many targets it swapped in and how many
    already prepared layers it added them to, and (when it swapped any in) the share of the model's matrix
    weights the prepared layers now hold. Plans that compose (pruning, then quantization) each log their
    own line, and the share once per change."""
    experts = sum(isinstance(model.get_submodule(name), CompressedExperts) for name in targets)
    kinds = ", ".join(sorted({type(config).__name__ for configs in targets.values() for config in configs}))
    logger.info("prepare: %s on %d layers and %d experts blocks (%d set up for compression, %d already prepared; "
                "fake quantization %s)", kinds, len(targets) - experts, experts, len(targets) - already, already,
                "on" if fake_quant else "off until a schedule starts it")
    if already == len(targets):
        return
    compressed, total = prepared_matrix_weights(model), matrix_weights(model)
    logger.info("prepare: prepared layers hold %.1f%% of the model's matrix weights (%d of %d, embeddings and "
                "heads included)", 100 * compressed / max(total, 1), compressed, total)


def matrix_weights(model: nn.Module) -> int:
    """Number of weights in ``model``'s Parameters of two or more dimensions (each tied one counted once):
    linear layers, embeddings, fused 3-D expert weights."""
    return sum(p.numel() for p in model.parameters() if p.dim() >= 2)


def prepared_matrix_weights(model: nn.Module) -> int:
    """Number of weights held by ``model``'s prepared layers and experts blocks."""
    weights = {id(m.weight_parameter): m.weight_parameter for m in compressed_layers(model).values()}
    return sum(w.numel() for w in weights.values())


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
    """Give every sparse layer whose mask is still full its final mask (magnitude/L2 blocks); layers whose
    config reads calibration inputs (OBS, the activation score) are left to the Hessian passes.

    Layers named in ``keep_weights`` keep their pruned weights (masked in the forward) for GPTQ,
    which starts from them and zeroes them itself."""
    for name, layer in compressed_layers(model).items():
        config = layer.sparse_config
        if config is None or config.sparsity == 0 or config.needs_calibration or not bool(layer.mask.all()):
            continue
        mask = block_mask(layer.weight, config.sparsity, config.block, config.score, config.tile_rows)
        layer.set_mask(mask, zero_weights=name not in keep_weights)
        logger.info("prune: %s pruned one-shot to %.0f%% of its blocks", name, 100 * config.sparsity)


# ---- export --------------------------------------------------------------------------------------
def export_module(name: str, layer: CompressedLinear) -> nn.Module:
    """The inference module for one prepared layer (see the module docstring for the rules)."""
    quant, sparse = layer.quant_config, layer.sparse_config
    weight = layer.masked_weight().detach()
    if quant is not None:
        state = {"weight": weight, "weight_scale": layer.weight_scale}
        if quant.observes_activations:
            state.update(act_scale=layer.static_act_scale(), input_smoothing=layer.smoothing())
        blocks = quant.block_sparse_module if sparse is not None else None
        if blocks is not None and _bsr_shaped(name, layer, sparse, f"int{quant.weight_bits} weight"):
            return blocks.from_float(layer, quant, sparse, mask=layer.mask, **state)
        return quant.inference_module.from_float(layer, quant, **state)
    if sparse is not None and _bsr_shaped(name, layer, sparse, "weight"):
        return sparse.inference_module.from_float(layer, sparse, weight=weight, mask=layer.mask)
    return layer.to_float()


def _bsr_shaped(name: str, layer: CompressedLinear, sparse, what: str) -> bool:
    """True when ``sparse``'s blocks tile the layer; otherwise logs that the layer stays dense."""
    n, k = layer.out_features, layer.in_features
    if sparse.tiles(n, k):
        return True
    logger.warning("convert: %s (N=%d, K=%d) left dense: BSR needs N and K multiples of %d; "
                   "its pruned blocks are zero in the dense %s", name, n, k, sparse.block, what)
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
        if isinstance(module, CompressedExperts):  # listed before its layers: restored first
            rollback.keep_module(name)
            rollback.keep_weight_hooks(module.gate_up_proj)
            rollback.keep_weight_hooks(module.down_proj)
        if name and is_linear_or_conv1d(module):
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
    gptq, second_order = gptq_layers(model), hessian_layers(model)
    if second_order and calibration_data is None:
        raise ValueError(f"convert: {len(second_order)} layers with algorithm='gptq', algorithm='obs' or "
                         f"score='activation' (e.g. {next(iter(second_order))!r}) need calibration_data (an "
                         "iterable of batches or a callable(model))")
    quantized = [m for m in layers.values() if m.quant_config is not None]
    needs_calibration = any(
        (m.quant_config.static and not m.calibrated)
        or (m.quant_config.smoothquant and m.smoothing() is None and plan is not None)
        for m in quantized)
    if needs_calibration and second_order and isinstance(calibration_data, Iterable) and not isinstance(
            calibration_data, (list, tuple)):
        calibration_data = list(calibration_data)  # read once, run by calibration and by GPTQ
    # Pruning zeroes weights and calibration rewrites scales (SmoothQuant also folds into the norms
    # before the layers): keep the values those steps may edit so a later failure can put them back.
    # Calibration alone writes buffers only; pruning zeroes weights; SmoothQuant scales the layers'
    # weights and folds into norms (whose parameters are all 1-D); GPTQ rewrites its layers' weights
    # (and learnable scales): copy just those, never the model.
    smoothing = needs_calibration and any(m.quant_config.smoothquant for m in quantized)
    for name, layer in layers.items():
        config = layer.sparse_config
        to_prune = config is not None and config.sparsity != 0 and bool(layer.mask.all())
        if to_prune or needs_calibration or name in second_order:
            rollback.keep_values(layer, parameters=to_prune or smoothing or name in second_order)
            if to_prune and isinstance(layer, ExpertLinear):  # its weight is a view of the block's Parameter
                rollback.keep_values(model.get_submodule(experts_module_name(name)))
    if smoothing:
        for module in model.modules():
            own = list(module.parameters(recurse=False))
            if own and not isinstance(module, CompressedLinear) and all(p.dim() == 1 for p in own):
                rollback.keep_values(module)
    prune_one_shot(model, keep_weights=gptq)
    if needs_calibration:  # OBS first, so that static scales and SmoothQuant see the pruned model
        run_hessian_passes(model, calibration_data, gptq=False)
        calibrate(model, calibration_data)
    run_hessian_passes(model, calibration_data)
    # Build every inference module before swapping any, so an export failure swaps nothing.
    exported = {name: _layer_step(name, "convert", export_module, name, layer) for name, layer in layers.items()}
    for name, module in exported.items():
        replace_submodule(model, name, module)
    experts = compressed_experts(model)
    for name, block in experts.items():
        replace_submodule(model, name, _layer_step(name, "convert", block.to_inference))
    logger.info("convert: %d layers exported (%d of them expert layers of %d experts blocks)", len(layers),
                sum(isinstance(layer, ExpertLinear) for layer in layers.values()), len(experts))
