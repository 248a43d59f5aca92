"""Block scores of the pruning schedule's layers, whether a process holds a layer's whole weight or an
FSDP2 shard of its rows.

Every score is a function of per-block sums (:mod:`compress.core.sparsity`): magnitude
``sum |w| / elements``, L2 ``sqrt(sum w^2)``, and per optimizer step movement ``-sum w g`` and Fisher
``(sum w g)^2``, with ``w`` the masked weight and ``g`` its gradient as the optimizer receives it.
A process holding rows ``[a, b)`` of a weight (:mod:`compress.core.sharding`) sums those rows into the
full block grid; the grids of all the layers are summed over the processes in one all-reduce
(:func:`compress.schedule.distributed.sum_grids_`) and the scores are taken from the totals, so every
process scores the blocks of the whole weight (a 32-row block cut by a shard boundary is summed in
two parts: equal to a single process's sum up to float32 reassociation). Fisher squares the total,
not the parts. Under FSDP2 the gradient of a shard is already averaged over the processes (FSDP's
reduce-scatter), as DDP's all-reduce averages a whole gradient. A weight that is not sharded (one
process, DDP) is scored where it is, with no communication.
"""
from __future__ import annotations

import torch

from compress.core.sharding import is_sharded, local_rows, local_tensor
from compress.core.sparsity import block_sums, score_values, scores_from_block_sums
from compress.nn.qat import CompressedLinear
from compress.schedule import distributed


def _summed(layers: dict[str, CompressedLinear], values) -> dict[str, torch.Tensor]:
    """``{name: block sums of values(layer) (R, K) over the layer's local rows}``, totalled over the
    processes for the sharded layers."""
    sums, sharded = {}, {}
    for name, layer in layers.items():
        rows_values, rows = values(layer)
        sums[name] = block_sums(rows_values, layer.sparse_config.block, rows.start, layer.out_features)
        if is_sharded(layer.weight):
            sharded[name] = sums[name]
    distributed.sum_grids_(sharded)
    return sums


def weight_block_scores(layers: dict[str, CompressedLinear], score: str) -> dict[str, torch.Tensor]:
    """``{name: (N/b, K/b) float32 scores}`` of the layers' masked weights: ``"magnitude"`` or ``"l2"``."""
    def values(layer):
        weight, rows = layer.local_masked_weight()
        return score_values(weight, score), rows

    return {name: scores_from_block_sums(sums, score, (layers[name].out_features, layers[name].in_features),
                                         layers[name].sparse_config.block)
            for name, sums in _summed(layers, values).items()}


def gradient_block_scores(layers: dict[str, CompressedLinear], score: str) -> dict[str, torch.Tensor]:
    """``{name: (N/b, K/b) float32}``: this optimizer step's ``"movement"`` or ``"fisher"`` contribution of
    each layer, from its weight and ``weight_grad()`` (every layer must have a gradient)."""
    if score not in ("movement", "fisher"):
        raise ValueError(f"score: expected 'movement' or 'fisher', got {score!r}")

    def values(layer):  # the pruned weights are zero already (apply_mask_), so the weight is the masked one
        weight, rows = local_tensor(layer.weight).detach(), local_rows(layer.weight)
        grad = local_tensor(layer.weight_grad()).detach()
        if grad.shape != weight.shape:
            raise ValueError(f"{score} scores: expected a gradient of shape {tuple(weight.shape)}, "
                             f"got {tuple(grad.shape)}")
        return weight.float() * grad.float(), rows

    sums = _summed(layers, values)
    return {name: total.square() if score == "fisher" else -total for name, total in sums.items()}
