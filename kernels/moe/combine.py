"""The top-k weighted sum of a grouped MoE layer: each token's k expert outputs, weighted, summed, in one launch.

The down projection leaves, for every pair p = t k + j (token t, slot j) and K split s, the fp32 partial
``partials[s, p, :]`` of ``y_p = act_p @ W_down[e].T``. This kernel writes::

    out[t, n] = rd( sum_j  w[t, j] * (sum_s partials[s, t k + j, n]) )        j = 0 .. k-1 in order, fp32

``w = topk_weights`` (any float dtype, taken to fp32), ``rd`` the rounding to x's dtype, the slots whose
expert id is outside [0, E) left out (their partials were never written: they are not even read). Sums in
a fixed order, so the output is deterministic (atomic adds into the output would not be), and the K splits
of the down projection cost no extra launch: they are summed here. Program (token, column block) of the
grid (T, H / BLOCK).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from compress_kernels.common.launch import launch

BLOCK = 1024  # output columns per program


@triton.jit
def _combine_topk_kernel(
    partial_ptr, ids_ptr, w_ptr, out_ptr,  # partials (SPLIT_K, P, H) fp32, topk ids (T, k), weights (T, k), out (T, H)
    H, E, stride_ps, stride_pm, stride_it, stride_ij, stride_wt, stride_wj, stride_ot,
    TOP_K: tl.constexpr, SPLIT_K: tl.constexpr, BLOCK: tl.constexpr,
):
    token = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    in_row = offs < H
    total = tl.zeros((BLOCK,), dtype=tl.float32)
    for j in tl.static_range(TOP_K):
        expert = tl.load(ids_ptr + token * stride_it + j * stride_ij)
        routed = (expert >= 0) & (expert < E)
        columns = tl.where(routed, H, 0)  # the columns to read: none for a slot sent nowhere
        weight = tl.load(w_ptr + token * stride_wt + j * stride_wj).to(tl.float32)
        row = partial_ptr + (token * TOP_K + j).to(tl.int64) * stride_pm + offs
        y = tl.zeros((BLOCK,), dtype=tl.float32)
        for s in tl.static_range(SPLIT_K):
            y += tl.load(row + s * stride_ps, mask=offs < columns, other=0.0)
        total += tl.where(routed, weight * y, 0.0)
    tl.store(out_ptr + token.to(tl.int64) * stride_ot + offs, total.to(out_ptr.dtype.element_ty), mask=in_row)


def combine_topk(partials: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, num_experts: int,
                 out: torch.Tensor) -> torch.Tensor:
    """Write the weighted top-k sum of ``partials`` (SPLIT_K, T k, H) fp32 into ``out`` (T, H) (module docstring)."""
    split, _, hidden = partials.shape
    tokens, top_k = topk_ids.shape
    if tokens:
        block = min(BLOCK, triton.next_power_of_2(hidden))
        launch(_combine_topk_kernel, (tokens, triton.cdiv(hidden, block)),
            partials, topk_ids, topk_weights, out, hidden, num_experts,
            partials.stride(0), partials.stride(1), topk_ids.stride(0), topk_ids.stride(1),
            topk_weights.stride(0), topk_weights.stride(1), out.stride(0),
            TOP_K=top_k, SPLIT_K=split, BLOCK=block, num_warps=4,
        )
    return out
