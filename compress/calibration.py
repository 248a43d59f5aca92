"""The post-training passes over calibration data: observers (static scales, SmoothQuant) and GPTQ.

``calibration_data`` is an iterable of batches, each run as ``model(**batch)`` (a mapping, e.g. a
tokenized batch), ``model(batch[0])`` (the ``(inputs, targets)`` convention) or ``model(batch)``, or a
callable that runs the model itself. :func:`calibrate` observes the W8A8 layers' inputs, applies
SmoothQuant where a config asks and freezes static scales. :func:`run_gptq` quantizes the layers
whose config says ``algorithm="gptq"``.

GPTQ (math in :mod:`compress.core.gptq`): one pass over the calibration data
collects ``X^T X`` of every GPTQ layer's input (a forward pre-hook; X is what the layer multiplies:
all tokens, divided by its SmoothQuant factors if it holds any), then each layer's weight is swept
and held on its grid (``CompressedLinear.set_quantized_weight``), so the export stores GPTQ's q and
scales. All Hessians come from that one pass over the model as it was (not GPTQ's layer-by-layer
order, where later layers see earlier ones quantized); converting a model in chunks of layers, in
order, gives that order and bounds the memory (one K x K float32 Hessian per layer of a chunk).
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
from collections.abc import Callable, Iterable, Mapping

import torch
import torch.nn.functional as F
from torch import nn

from compress.configs import W8A8Config, W8A16Config
from compress.core.gptq import add_to_hessian, gptq_quantize, hessian
from compress.core.quant import INT4_QMAX, INT8_QMAX, dequantize_groupwise, dequantize_per_channel, per_channel_scale
from compress.core.sharding import local_tensor, reshard_
from compress.core.smoothquant import apply_smoothquant
from compress.core.sparsity import expand_mask
from compress.nn.modules import padded_in_features
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

    def run_all(model):
        for batch in batches:
            forward_batch(model, batch)

    return run_all, lambda model: forward_batch(model, batches[0])


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
    w8a8 = {n: m for n, m in compressed_layers(model).items() if isinstance(m.quant_config, W8A8Config)}
    smooth = {n: m for n, m in w8a8.items() if m.quant_config.smoothquant_alpha is not None}
    static = {n: m for n, m in w8a8.items() if m.quant_config.static}
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
        apply_smoothquant(model, group, alpha, run_one)
    if static:
        _observe(model, static, run_all)
        for layer in static.values():
            layer.freeze_observer()


# ---- GPTQ ----------------------------------------------------------------------------------------
def gptq_layers(model: nn.Module) -> dict[str, CompressedLinear]:
    """Prepared layers whose quantization config says ``algorithm="gptq"`` and that GPTQ has not set yet."""
    return {name: m for name, m in compressed_layers(model).items()
            if m.quant_config is not None and m.quant_config.gptq and not m.weight_quantized}


@torch.no_grad()
def collect_hessians(model: nn.Module, layers: dict[str, CompressedLinear], run_all: Callable) -> dict[str, list]:
    """``{name: [X^T X (K, K) float32, tokens]}`` over one ``run_all(model)`` (eval mode), X the input each
    layer multiplies (divided by its SmoothQuant factors, as its forward does)."""
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
        return hook

    handles = [layer.register_forward_pre_hook(hook_for(name)) for name, layer in layers.items()]
    was_training = model.training
    model.eval()
    try:
        run_all(model)
    finally:
        model.train(was_training)
        for handle in handles:
            handle.remove()
    return stats


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
    if isinstance(config, W8A8Config) or (isinstance(config, W8A16Config) and config.group_size is None):
        row_scale = per_channel_scale(masked.float())  # the export's rule
        q, scale = gptq_quantize(w, h, INT8_QMAX, k, scale=row_scale[:, None], **knobs)
        scale = scale[:, 0]
        layer.set_quantized_weight(dequantize_per_channel(q, scale), scale)
        return q, scale
    padded, group_size = padded_in_features(k, config.group_size)
    pad = padded - k
    if keep is not None:
        knobs["keep"] = F.pad(keep, (0, pad), value=True)
    qmax = INT8_QMAX if isinstance(config, W8A16Config) else INT4_QMAX
    q, scale = gptq_quantize(F.pad(w, (0, pad)), F.pad(h, (0, pad, 0, pad)), qmax, group_size, **knobs)
    layer.set_quantized_weight(dequantize_groupwise(q, scale, group_size)[:, :k], scale)
    return q, scale


def run_gptq(model: nn.Module, calibration_data, sync: Callable | None = None) -> dict[str, tuple]:
    """GPTQ on every layer :func:`gptq_layers` lists: one calibration pass, then one layer at a time.

    ``sync(stats)`` may combine the statistics before they are used (the schedules' DDP all-reduce).
    Returns ``{name: (q, scale)}`` (:func:`gptq_layer`). Raises ``ValueError`` naming the layer for
    non-finite inputs, a layer no batch reached, or a Hessian that no damping makes positive definite.
    """
    layers = gptq_layers(model)
    if not layers:
        return {}
    run_all, _ = calibration_runner(calibration_data)
    stats = collect_hessians(model, layers, run_all)
    reshard_(model)  # FSDP2: round the shards, not the copy the forward gathered
    if sync is not None:
        sync(stats)
    unreached = [name for name, (_, tokens) in stats.items() if tokens == 0]
    if unreached:
        raise ValueError(f"GPTQ: no calibration input reached layers {unreached}: the batches never run them, "
                         "so they have no Hessian (check calibration_data and the model's forward)")
    results = {}
    for name, layer in layers.items():
        try:
            results[name] = gptq_layer(layer, *stats.pop(name))
        except ValueError as error:
            raise ValueError(f"GPTQ: layer {name!r}: {error}") from error
    logger.info("GPTQ: %d layers quantized", len(results))
    return results
