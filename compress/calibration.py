"""The post-training passes over calibration data: observers (static scales, SmoothQuant) and GPTQ.

``calibration_data`` is an iterable of batches, each run as ``model(**batch)`` (a mapping, e.g. a
tokenized batch), ``model(batch[0])`` (the ``(inputs, targets)`` convention) or ``model(batch)``, or a
callable that runs the model itself. :func:`calibrate` observes the W8A8 layers' inputs, applies
SmoothQuant where a config asks and freezes static scales. :func:`run_gptq` quantizes the layers
whose config says ``algorithm="gptq"``.

GPTQ (math in :mod:`compress.core.gptq`) runs in stages, so that a layer's Hessian sees the layers
the forward runs before it already quantized, as the exported model runs them (GPTQ quantizes
sequentially, Frantar et al. section 4). A stage is one role of a repeated block: layers called one
after the other on the same input tensor share a stage (a transformer block gives q/k/v, o,
gate/up, down), and the stages of every block with the same name but for the block index
(:func:`layer_role`) are one stage, in the order the forward first reaches them. For each stage one
pass over the calibration data collects ``X^T X`` of its layers' inputs (a forward pre-hook; X is
what the layer multiplies: all tokens, divided by its SmoothQuant factors if it holds any), then each
of its weights is swept and held on its grid (``CompressedLinear.set_quantized_weight``), so the
export stores GPTQ's q and scales. The passes are as many as a block has roles, whatever the depth; a
pass stops at its stage's last layer when the batches are ours to run (an iterable of batches, not a
callable, and no FSDP2 shards). The order comes from one forward of the first batch; when that forward
does not reach every GPTQ layer exactly once (mixture-of-experts layers, a layer called twice) all
layers form one stage, their Hessians from the model as it was. On SmolLM2-135M (CPU, W4A16 g128,
16 x 512 calibration tokens; docs/journal.md): one stage 35.35 perplexity (94 s), a stage per role
34.94 (167 s), a stage per input group of each block 34.78 (1,273 s), a stage per block 35.32.
One-shot pruning on calibration inputs (OBS, activation scores; :func:`run_hessian_passes`) uses
the finer stages, one per input group of each block in forward order: pruning half of a block's
weights moves the residual stream far more than rounding does, so a later block's Hessian must come
from the earlier blocks as pruned (pretrained SmolLM2 on the CPU, 50% OBS blocks one-shot: per role
1,091 perplexity, per block 643; docs/journal.md).
It runs after SmoothQuant, on the smoothed weights. With block sparsity the pruned weights stay
exact zeros: they quantize to 0 and their error is spread over the kept ones; one-shot pruning leaves
the weights of GPTQ layers in place (masked in the forward), so GPTQ also compensates for what
pruning removed (SparseGPT's update, with the magnitude mask fixed). GPTQ picks its own scales: a
learnable (LSQ) scale is overwritten with them.

GPTQ treats the rows of a weight independently (each row's sweep reads only that row and the shared
Hessian), so under FSDP2 each process rounds its own rows of each weight (:mod:`compress.core.sharding`)
from the Hessian summed over all processes: together they hold what one process rounding the whole
weight would.
"""
from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable, Mapping

import torch
import torch.nn.functional as F
from torch import nn

from compress.core.gptq import add_to_hessian, gptq_quantize, hessian
from compress.core.obs import activation_block_scores, obs_block_prune
from compress.core.quant import dequantize_groupwise, dequantize_per_channel, per_channel_scale
from compress.core.sharding import fsdp_modules, is_sharded, local_tensor, reshard_
from compress.core.smoothquant import apply_smoothquant
from compress.core.sparsity import expand_mask, mask_from_scores
from compress.nn.experts import ExpertLinear
from compress.nn.qat import CompressedLinear, compressed_layers

logger = logging.getLogger(__name__)


def forward_batch(model: nn.Module, batch):
    """Run ``model`` on one batch: ``model(**batch)`` for a mapping (e.g. a tokenized batch),
    ``model(batch[0])`` for a tuple / list (the ``(inputs, targets)`` convention), else ``model(batch)``."""
    if isinstance(batch, Mapping):
        return model(**batch)
    if isinstance(batch, (list, tuple)):
        return model(batch[0])
    return model(batch)


class StopForward(Exception):
    """Raised by a GPTQ stage's hook once its last layer's input is collected: the rest of the forward
    is not needed (caught per batch by the runners :func:`calibration_runner` builds)."""


def calibration_runner(calibration_data) -> tuple[Callable, Callable]:
    """(run all batches, run one batch) callables from an iterable of batches or a callable."""
    if callable(calibration_data):
        return calibration_data, calibration_data
    if not isinstance(calibration_data, Iterable):
        raise TypeError(f"calibration_data: expected an iterable of batches or a callable(model), "
                        f"got {type(calibration_data).__name__}")
    batches = list(calibration_data)
    if not batches:
        raise ValueError("calibration_data: expected at least one batch, got none")

    def run(model, batch):
        try:
            return forward_batch(model, batch)
        except StopForward:
            return None

    def run_all(model):
        for batch in batches:
            run(model, batch)

    return run_all, lambda model: run(model, batches[0])


@torch.no_grad()
def _observe(model: nn.Module, layers: dict[str, CompressedLinear], run_all: Callable) -> None:
    was_training = model.training
    model.eval()
    try:
        for layer in layers.values():
            layer.observer.reset()
            layer.observe(True)
        run_all(model)
    finally:
        model.train(was_training)
        for layer in layers.values():
            layer.observing = False


def calibrate(model: nn.Module, calibration_data) -> None:
    """Observe W8A8 layers on ``calibration_data``; SmoothQuant where asked; freeze static scales."""
    quantized = {n: m for n, m in compressed_layers(model).items() if m.quant_config is not None}
    smooth = {n: m for n, m in quantized.items() if m.quant_config.smoothquant}
    static = {n: m for n, m in quantized.items() if m.quant_config.static}
    if not smooth and not static:
        return
    if calibration_data is None:
        raise ValueError(f"convert: {len(static)} static and {len(smooth)} SmoothQuant W8A8 layers need "
                         "calibration_data (an iterable of batches or a callable(model))")
    run_all, run_one = calibration_runner(calibration_data)
    alphas = {m.quant_config.smoothquant_alpha for m in smooth.values()}
    for alpha in alphas:
        group = {n: m for n, m in smooth.items() if m.quant_config.smoothquant_alpha == alpha}
        _observe(model, group, run_all)
        check_observed(group)
        apply_smoothquant(model, group, alpha, run_one)
    if static:
        _observe(model, static, run_all)
        freeze_observers(static)


def check_observed(layers: dict[str, CompressedLinear]) -> None:
    """ValueError naming the first layer whose observer saw no batch, non-finite inputs or only zeros:
    a static scale or SmoothQuant factors from such statistics would be meaningless (a scale of 1, NaN)."""
    for name, layer in layers.items():
        observer = layer.observer
        if int(observer.batches) == 0:
            problem = "no calibration batch reached it"
        elif not bool(torch.isfinite(observer.channel_absmax).all() and torch.isfinite(observer.stat)):
            problem = "its calibration inputs hold NaN or Inf values"
        elif float(observer.stat) == 0.0:
            problem = "its calibration inputs were all zero"
        else:
            continue
        raise ValueError(f"calibration: layer {name!r}: {problem} ({int(observer.batches)} batches observed); "
                         "expected finite, non-zero activations: check calibration_data")


def freeze_observers(layers: dict[str, CompressedLinear]) -> None:
    """Check every layer's statistics (:func:`check_observed`), then freeze them into static scales."""
    check_observed(layers)
    for layer in layers.values():
        layer.freeze_observer()


# ---- the Hessian passes: GPTQ, OBS and activation-aware pruning ---------------------------------------
def gptq_layers(model: nn.Module) -> dict[str, CompressedLinear]:
    """Prepared layers whose quantization config says ``algorithm="gptq"`` and that GPTQ has not set yet."""
    return {name: m for name, m in compressed_layers(model).items()
            if m.quant_config is not None and m.quant_config.gptq and not m.weight_quantized}


def calibrated_pruning_layers(model: nn.Module) -> dict[str, CompressedLinear]:
    """Prepared layers whose sparse config prunes from calibration inputs (``algorithm="obs"`` or
    ``score="activation"``) and that are not pruned yet (full mask)."""
    return {name: m for name, m in compressed_layers(model).items()
            if m.sparse_config is not None and m.sparse_config.needs_calibration and m.sparse_config.sparsity > 0
            and bool(m.mask.all())}


def hessian_layers(model: nn.Module) -> dict[str, CompressedLinear]:
    """The layers a Hessian pass serves: :func:`calibrated_pruning_layers` and :func:`gptq_layers`, in model order."""
    wanted = {**calibrated_pruning_layers(model), **gptq_layers(model)}
    return {name: m for name, m in compressed_layers(model).items() if name in wanted}


def _run_with_input_hooks(model: nn.Module, layers: dict[str, CompressedLinear], hook_for: Callable,
                          run: Callable) -> None:
    """``run(model)`` in eval mode with ``hook_for(name)`` as a forward pre-hook of each layer, then
    the hooks removed and the mode restored."""
    handles = [layer.register_forward_pre_hook(hook_for(name)) for name, layer in layers.items()]
    was_training = model.training
    model.eval()
    try:
        run(model)
    finally:
        model.train(was_training)
        for handle in handles:
            handle.remove()


@torch.no_grad()
def collect_hessians(model: nn.Module, layers: dict[str, CompressedLinear], run_all: Callable,
                     stop_after: str | None = None) -> dict[str, list]:
    """``{name: [X^T X (K, K) float32, tokens]}`` over one ``run_all(model)`` (eval mode), X the input each
    layer multiplies (divided by its SmoothQuant factors, as its forward does). ``stop_after``: a layer
    whose hook raises :class:`StopForward` once its input is added (the runner must catch it)."""
    stats = {name: [torch.zeros(m.in_features, m.in_features, device=m.weight.device), 0]
             for name, m in layers.items()}

    def hook_for(name):
        def hook(module, args):
            x, smoothing = args[0], module.smoothing()
            if smoothing is not None:
                x = (x.float() / smoothing).to(x.dtype)
            try:
                stats[name][1] += add_to_hessian(stats[name][0], x)
            except ValueError as error:
                raise ValueError(f"layer {name!r}: {error}") from None
            if name == stop_after:
                raise StopForward
        return hook

    _run_with_input_hooks(model, layers, hook_for, run_all)
    return stats


@torch.no_grad()
def gptq_stages(model: nn.Module, layers: dict[str, CompressedLinear], run_one: Callable,
                per_block: bool = False) -> list[list[str]]:
    """The stages of the Hessian passes (module docstring): the layers in the order one forward
    (``run_one``; a callable may run several, each the same sequence) first calls them, grouped by role
    (:func:`layer_role`) with the roles in the order the forward first reaches them, or with
    ``per_block`` the groups of layers on one input in forward order (each block's roles apart); all
    layers in one stage when a forward does not call each of them exactly once, or when any is an
    expert's layer (routing decides which run)."""
    if any(isinstance(layer, ExpertLinear) for layer in layers.values()):
        return [list(layers)]
    calls, stages, last = [], [], [None]

    def hook_for(name):
        def hook(module, args):
            calls.append(name)
            if len(calls) > len(layers):
                return
            if stages and args[0] is last[0]:
                stages[-1].append(name)
            else:
                stages.append([name])
            last[0] = args[0]  # held, so a later tensor cannot reuse its id
        return hook

    _run_with_input_hooks(model, layers, hook_for, run_one)
    first = calls[:len(layers)]
    if sorted(first) != sorted(layers) or calls != first * (len(calls) // len(layers)):
        return [list(layers)]
    if per_block:
        return stages
    by_role = {}
    for stage in stages:
        by_role.setdefault(layer_role(stage[0]), []).extend(stage)
    return list(by_role.values())


def layer_role(name: str) -> str:
    """A layer's name with the indices of repeated blocks starred: ``model.layers.3.self_attn.q_proj`` ->
    ``model.layers.*.self_attn.q_proj``."""
    return re.sub(r"(?<=\.)\d+(?=\.)|^\d+(?=\.)", "*", name)


def gptq_layer(layer: CompressedLinear, xtx: torch.Tensor, tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """GPTQ of one layer from its inputs' ``X^T X``; the layer then holds the result. Returns (q, scale):
    W8A8 and per-channel W8A16 (N, K) int8 and (N,), the row scales fixed up front; W4A16 and grouped W8A16
    (N, Kp) int8 and (N, Kp/G), each group's scale searched by the sweep, K zero-padded as the export pads it.
    Under FSDP2, N is the rows this process holds (module docstring)."""
    config, k = layer.quant_config, layer.in_features
    masked, rows = layer.local_masked_weight()
    h, w = hessian(xtx, tokens), local_tensor(layer.weight).detach().float()  # pruned weights too, if still there
    keep = None
    if layer.mask is not None:
        keep = expand_mask(layer.mask, (layer.out_features, k), layer.sparse_config.block)[rows]
    act_order = config.gptq_act_order if config.gptq_act_order is not None else keep is None
    knobs = dict(keep=keep, damping=config.gptq_damping, act_order=act_order, block=config.gptq_block)
    if config.weight_scales == "channel":
        row_scale = per_channel_scale(masked.float())  # the export's rule
        q, scale = gptq_quantize(w, h, config.qmax, k, scale=row_scale[:, None], **knobs)
        scale = scale[:, 0]
        layer.set_quantized_weight(dequantize_per_channel(q, scale), scale)
        return q, scale
    padded, group_size = config.padding(k)
    pad = padded - k
    if keep is not None:
        knobs["keep"] = F.pad(keep, (0, pad), value=True)
    q, scale = gptq_quantize(F.pad(w, (0, pad)), F.pad(h, (0, pad, 0, pad)), config.qmax, group_size, **knobs)
    layer.set_quantized_weight(dequantize_groupwise(q, scale, group_size)[:, :k], scale)
    return q, scale


def check_layer_inputs(name: str, xtx: torch.Tensor, tokens: int) -> None:
    """Refuse (ValueError) a layer's calibration inputs, from their ``X^T X`` and count, when there are
    none, they overflow float32 when squared, or they are all zero (GPTQ would zero the layer, OBS prune
    it blindly); warn when there are fewer tokens than input channels. With fewer tokens than channels
    the Hessian is singular and GPTQ is no better than rounding to nearest: on a synthetic 256-channel
    layer (W4A16 g32) its output error on other tokens was 0.87-1.14x round-to-nearest's with 1 to 128
    tokens, 0.57x with 256 and 0.36x with 1,024."""
    k = xtx.shape[0]
    if tokens == 0:
        raise ValueError("no calibration input reached it: the batches never run it, so it has no Hessian "
                         "(check calibration_data and the model's forward)")
    if not bool(torch.isfinite(xtx).all()):
        raise ValueError(f"its calibration inputs overflow float32 when squared (X^T X of {tokens} tokens is not "
                         "finite); expected activations of a normal range: check calibration_data")
    if not bool((xtx.diagonal() > 0).any()):
        raise ValueError(f"its calibration inputs were all zero ({tokens} tokens); expected real activations: "
                         "check calibration_data")
    if tokens < k:
        logger.warning("calibration: layer %r saw %d calibration tokens, fewer than its %d input channels: its "
                       "Hessian is singular and GPTQ / OBS fit those tokens alone (no better than rounding to "
                       "nearest); calibrate on at least %d tokens", name, tokens, k, k)


@torch.no_grad()
def prune_layer(layer: CompressedLinear, xtx: torch.Tensor, tokens: int) -> None:
    """One-shot pruning of a layer whose sparse config reads calibration inputs: OBS (the layer then holds
    the compensated weights) or the activation score (pruned weights zeroed)."""
    config = layer.sparse_config
    if is_sharded(layer.weight):
        raise ValueError(f"{config.algorithm}/{config.score} pruning ranks each layer's blocks over its whole "
                         "weight; expected an unsharded layer (prune before fully_shard, or use FSDP's full model)")
    weight = layer.weight.detach()
    if config.algorithm == "obs":
        pruned, mask = obs_block_prune(weight, hessian(xtx, tokens), config.sparsity, config.block,
                                       config.obs_damping, config.obs_rounds, tile_rows=config.tile_rows)
        weight.copy_(pruned.to(weight.dtype))
        layer.set_mask(mask)
        return
    scores = activation_block_scores(weight, xtx.diagonal().clamp_min(0).sqrt(), config.block)
    layer.set_mask(mask_from_scores(scores, config.sparsity, config.tile_rows))


def run_hessian_passes(model: nn.Module, calibration_data, sync: Callable | None = None,
                       publish: Callable | None = None, gptq: bool = True) -> dict[str, tuple]:
    """OBS / activation-aware pruning and GPTQ on every layer :func:`hessian_layers` lists, stage by
    stage (:func:`gptq_stages`; when any layer is pruned, a stage per block and input group, so each
    layer's Hessian comes from the earlier blocks already pruned): one calibration pass per stage
    collects its layers' ``X^T X``, then
    each layer is pruned (if its sparse config reads calibration inputs) and GPTQ-rounded (if its
    quantization config says so), the same Hessian serving both: GPTQ rounds the survivors of the
    pruning. Later stages see these layers already pruned and rounded. ``gptq=False``: pruning only
    (training starts from the pruned model; GPTQ comes when it ends).

    ``sync(stats)`` may combine a stage's statistics before they are used (the schedules' DDP
    all-reduce); ``publish(names)`` runs after each stage's layers are done, before the next pass (the
    schedules' broadcast of rank 0's weights). Returns ``{name: (q, scale)}`` for the GPTQ layers
    (:func:`gptq_layer`). Raises ``ValueError`` naming the layer for calibration inputs
    :func:`check_layer_inputs` refuses, or a Hessian that no damping makes positive definite.
    """
    to_prune, to_round = calibrated_pruning_layers(model), gptq_layers(model) if gptq else {}
    layers = {**to_prune, **to_round}
    if not layers:
        return {}
    run_all, run_one = calibration_runner(calibration_data)
    stops_early = not callable(calibration_data) and not fsdp_modules(model)
    results = {}
    for stage in gptq_stages(model, layers, run_one, per_block=bool(to_prune)):
        stats = collect_hessians(model, {name: layers[name] for name in stage}, run_all,
                                 stop_after=stage[-1] if stops_early and len(stage) < len(layers) else None)
        reshard_(model)  # FSDP2: round the shards, not the copy the forward gathered
        if sync is not None:
            sync(stats)
        unreached = [name for name, (_, tokens) in stats.items() if tokens == 0]
        if unreached:
            raise ValueError(f"calibration: no calibration input reached layers {unreached}: the batches never run "
                             "them, so they have no Hessian (check calibration_data and the model's forward)")
        for name in stage:
            xtx, tokens = stats.pop(name)
            try:
                check_layer_inputs(name, xtx, tokens)
                if name in to_prune:
                    prune_layer(layers[name], xtx, tokens)
                if name in to_round:
                    results[name] = gptq_layer(layers[name], xtx, tokens)
            except ValueError as error:
                raise ValueError(f"calibration: layer {name!r}: {error}") from error
        if publish is not None:
            publish(stage)
    if to_prune:
        logger.info("calibration: %d layers pruned one-shot (%s)", len(to_prune),
                    ", ".join(sorted({m.sparse_config.algorithm if m.sparse_config.algorithm == "obs"
                                      else m.sparse_config.score for m in to_prune.values()})))
    if results:
        logger.info("GPTQ: %d layers quantized", len(results))
    return results
