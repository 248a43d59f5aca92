"""SmoothQuant-style scale migration (Xiao et al., 2023): move activation outliers into the weights.

For a linear layer ``y = x W^T`` with per-input-channel smoothing factors ``s`` (K,)::

    y = (x / s) (W * s)^T,       s_k = max|x_k|^alpha / max|W_:,k|^(1 - alpha)

so the activations ``x / s`` that get quantized have flatter channels, and ``W * s`` absorbs the
difference (alpha = 0.5 balances both). Layers that read the same input share one ``s`` (their
weights' column maxima are combined). ``s`` is clamped to [1e-5, 1e5] and is 1 where either
statistic is zero.

Where ``x`` is the output of a norm (LayerNorm / RMSNorm) whose only consumers are those layers,
``1 / s`` is folded into the norm's weight and bias: no runtime cost. Whether a norm's output feeds
anything else (a post-LN residual, as in BERT) cannot be read off the module tree, so each fold is
checked by running one batch and comparing the model's outputs with those before smoothing; a fold
that changes them is undone. Layers with no foldable norm keep ``s`` as their ``input_smoothing``
buffer and divide their input by it at run time (exact, one elementwise op).

Across processes every process checks each fold on its own batch; under DDP the caller then installs
rank 0's model on every rank. Under FSDP2, whose shards cannot be broadcast (each process holds other
rows), the largest change over the processes decides each fold for all of them, the weights' column
maxima are taken over every process's rows (:func:`compress.core.sharding.column_absmax`), each process scales
its own rows of the weights and norms, and the model is put back on its shards after every forward
(:func:`compress.core.sharding.reshard_`), so the changes reach the shards and the next forward
gathers them.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

import torch
import torch.distributed as dist
from torch import nn

from compress.core.sharding import column_absmax, is_sharded, local_rows, local_tensor, reshard_

logger = logging.getLogger(__name__)

SMOOTHING_RANGE = (1e-5, 1e5)
FOLD_TOLERANCE = 1e-3  # max |y_folded - y| / max |y|: reassociation error is ~1e-6 in float32


def smoothing_factors(act_absmax: torch.Tensor, weights: list[torch.Tensor], alpha: float) -> torch.Tensor:
    """(K,) float32 factors ``max|x_k|^alpha / max|W_:,k|^(1-alpha)`` over all ``weights`` (N_i, K)."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha: expected a value in [0, 1], got {alpha}")
    w_absmax = torch.stack([column_absmax(w) for w in weights]).amax(dim=0)  # (K,), every process's rows
    act = act_absmax.float()
    factors = act.pow(alpha) / w_absmax.pow(1.0 - alpha)
    valid = (act > 0) & (w_absmax > 0) & torch.isfinite(factors)
    return torch.where(valid, factors, torch.ones_like(factors)).clamp(*SMOOTHING_RANGE)


def is_norm(module: nn.Module) -> bool:
    """LayerNorm or an RMSNorm-like module with a per-channel ``weight``."""
    if isinstance(module, nn.LayerNorm):
        return module.elementwise_affine
    name = type(module).__name__
    return name.endswith(("RMSNorm", "LayerNorm")) and isinstance(getattr(module, "weight", None), nn.Parameter)


def _tensor_key(t: torch.Tensor) -> tuple:
    return t.data_ptr(), tuple(t.shape), t.stride()


def find_input_norms(model: nn.Module, layers: Mapping[str, nn.Module], forward_fn: Callable) -> dict[str, str]:
    """Map each layer name to the name of the norm whose output is exactly its input (one forward)."""
    norm_outputs: dict[tuple, str] = {}
    layer_inputs: dict[str, tuple] = {}

    def record_norm(name):
        def hook(module, args, output):
            norm_outputs.setdefault(_tensor_key(output), name)
        return hook

    def record_input(name):
        def hook(module, args):
            layer_inputs.setdefault(name, _tensor_key(args[0]))
        return hook

    handles = [m.register_forward_hook(record_norm(n)) for n, m in model.named_modules() if is_norm(m)]
    handles += [m.register_forward_pre_hook(record_input(n)) for n, m in layers.items()]
    try:
        with torch.no_grad():
            forward_fn(model)
    finally:
        for handle in handles:
            handle.remove()
    return {name: norm_outputs[key] for name, key in layer_inputs.items() if key in norm_outputs}


def _output_tensors(output) -> list[torch.Tensor]:
    if isinstance(output, torch.Tensor):
        return [output] if output.is_floating_point() else []
    if isinstance(output, Mapping):
        output = list(output.values())
    if isinstance(output, (list, tuple)):
        return [t for item in output for t in _output_tensors(item)]
    return []


def _relative_change(before: list[torch.Tensor], after: list[torch.Tensor], agree: bool) -> float:
    """The largest relative change of the outputs; with ``agree``, over every process's batch (an all-reduce)."""
    worst = 0.0
    for a, b in zip(before, after):
        scale = a.float().abs().max().clamp_min(1e-12)
        worst = max(worst, ((a.float() - b.float()).abs().max() / scale).item())
    if agree:
        agreed = torch.tensor(worst, dtype=torch.float64, device=before[0].device if before else "cpu")
        dist.all_reduce(agreed, op=dist.ReduceOp.MAX)
        worst = agreed.item()
    return worst


def _on_shards(forward_fn: Callable) -> Callable:
    """``forward_fn`` followed by :func:`reshard_`: FSDP2 modules back on their shards after each forward."""
    def run(model):
        output = forward_fn(model)
        reshard_(model)
        return output
    return run


@torch.no_grad()
def _scale_norm_(norm: nn.Module, factors: torch.Tensor) -> None:
    for vector in (norm.weight, getattr(norm, "bias", None)):
        if vector is not None:
            rows = local_tensor(vector)
            rows.div_(factors[local_rows(vector)].to(rows.dtype))


@torch.no_grad()
def _scale_weights_(layers: list[nn.Module], factors: torch.Tensor) -> None:
    for layer in layers:
        rows = local_tensor(layer.weight)
        rows.mul_(factors.to(rows.dtype)[None, :])


@torch.no_grad()
def _try_fold(model, norm, layers, factors, forward_fn, reference, agree: bool) -> bool:
    """Fold ``factors`` into ``norm`` and ``layers``; undo and return False if the outputs change."""
    _scale_norm_(norm, factors)
    _scale_weights_(layers, factors)
    change = _relative_change(reference, _output_tensors(forward_fn(model)), agree)
    if change <= FOLD_TOLERANCE:
        return True
    _scale_norm_(norm, 1.0 / factors)
    _scale_weights_(layers, 1.0 / factors)
    logger.info("SmoothQuant: folding into a norm changed the outputs by %.2e (another consumer); using buffers",
                change)
    return False


def _pause_compression(model: nn.Module) -> dict:
    """Switch fake quantization and observing off (float forwards); returns the old flags."""
    paused = {}
    for module in model.modules():
        if hasattr(module, "fake_quant_enabled") and hasattr(module, "observing"):
            paused[module] = (module.fake_quant_enabled, module.observing)
            module.fake_quant_enabled, module.observing = False, False
    return paused


@torch.no_grad()
def apply_smoothquant(model: nn.Module, layers: Mapping[str, nn.Module], alpha: float, forward_fn: Callable) -> dict:
    """Smooth ``layers`` (CompressedLinear with observed ``observer.channel_absmax``) in place.

    ``forward_fn(model)`` runs one calibration batch and returns the model output. Returns
    ``{layer name: "norm <name>" or "buffer"}`` saying where each layer's factors went.
    """
    for name, layer in layers.items():
        if layer.observer is None or int(layer.observer.batches) == 0:
            raise ValueError(f"SmoothQuant: layer {name!r} has no observed activations; calibrate first")
    was_training = model.training
    paused = _pause_compression(model)
    forward_fn = _on_shards(forward_fn)
    reshard_(model)
    agree = any(is_sharded(p) for p in model.parameters())  # FSDP2: every process decides each fold alike
    model.eval()
    try:
        reference = _output_tensors(forward_fn(model))
        norms = find_input_norms(model, layers, forward_fn)
        placement = {}
        groups: dict[str, list[str]] = {}
        for name, norm_name in norms.items():
            groups.setdefault(norm_name, []).append(name)
        modules = dict(model.named_modules())
        for norm_name, names in groups.items():
            members = [layers[n] for n in names]
            act = torch.stack([m.observer.channel_absmax for m in members]).amax(dim=0)
            factors = smoothing_factors(act, [m.weight for m in members], alpha)
            if _try_fold(model, modules[norm_name], members, factors, forward_fn, reference, agree):
                placement.update({n: f"norm {norm_name}" for n in names})
        for name, layer in layers.items():
            if name in placement:
                continue
            factors = smoothing_factors(layer.observer.channel_absmax, [layer.weight], alpha)
            layer.input_smoothing.mul_(factors)
            _scale_weights_([layer], factors)
            placement[name] = "buffer"
    finally:
        model.train(was_training)
        for module, (fake_quant, observing) in paused.items():
            module.fake_quant_enabled, module.observing = fake_quant, observing
    logger.info("SmoothQuant (alpha=%s): %d layers folded into norms, %d with smoothing buffers", alpha,
                sum(v != "buffer" for v in placement.values()), sum(v == "buffer" for v in placement.values()))
    return placement
