"""Block-scaled int8 math (:class:`compress.configs.W8A8BlockConfig`): pure functions, their inverses,
fake quantization.

Contract (``compress_kernels.reference``, docs/architecture.md), blocks of ``B = 128``, symmetric int8 in
[-127, 127], rounding half to even, a zero scale replaced by 1:

* activations X (M, K): one scale per token and B consecutive channels,
  ``s_x[m, kb] = max|X[m, B kb : B (kb+1)]| / 127``, shape (M, ceil(K / B)); always dynamic;
* weights W (N, K): one scale per B x B block, ``s_w[nb, kb] = max|W[B nb : B (nb+1), B kb : B (kb+1)]| / 127``,
  shape (ceil(N / B), ceil(K / B)).

A last partial block (K or N not a multiple of B) takes the max over the values it has. Fake quantization
returns ``dequantize(quantize(v))`` in float32 with the straight-through estimator of
:mod:`compress.core.quant` (the gradient passes ``round``; zero where the clamp cut). Activation scales
get no gradient; a learnable weight scale gets LSQ's, scaled by ``1 / sqrt(B * B * 127)``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from compress._kernels import reference
from compress.core.quant import fake_quantize, lsq_gradient_factor, safe_scale, scale_gradient

BLOCK = reference.SCALE_BLOCK
QMAX = 127


def blocks(channels: int) -> int:
    """Blocks of :data:`BLOCK` covering ``channels``."""
    return reference.scale_blocks(channels)


def expand_weight_scale(scale: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """(ceil(N/B), ceil(K/B)) block scales -> (N, K), each block's scale on its values (differentiable)."""
    return scale.repeat_interleave(BLOCK, dim=0).repeat_interleave(BLOCK, dim=1)[:n, :k]


# ---- weights ---------------------------------------------------------------------------------------
def weight_block_scale(w: torch.Tensor) -> torch.Tensor:
    """W (N, K) -> (ceil(N/B), ceil(K/B)) float32 scales ``max|W[block]| / 127`` (0 -> 1)."""
    return safe_scale(weight_block_absmax(w), QMAX)


def weight_block_absmax(rows: torch.Tensor, row_offset: int = 0, num_rows: int | None = None) -> torch.Tensor:
    """Rows ``row_offset : row_offset + R`` of W (N, K), given as ``rows`` (R, K) -> (ceil(N/B), ceil(K/B))
    float32 ``max|W[block]|`` over those rows (0 for blocks they do not reach); ``num_rows``: N (default R).
    The maximum of the grids of processes holding the other rows (FSDP2 shards) is the whole weight's."""
    r, k = rows.shape
    n = r if num_rows is None else num_rows
    if row_offset < 0 or row_offset + r > n:
        raise ValueError(f"weight_block_absmax: rows {row_offset}:{row_offset + r} do not fit a weight of {n} rows")
    nb, kb = blocks(n), blocks(k)
    first = row_offset // BLOCK  # the first block row these rows reach, and their offset inside it
    lead = row_offset - first * BLOCK
    reached = -(-(lead + r) // BLOCK)
    padded = F.pad(rows.detach().float().abs(), (0, kb * BLOCK - k, lead, reached * BLOCK - lead - r))
    partial = padded.reshape(reached, BLOCK, kb, BLOCK).amax(dim=(1, 3))
    if first == 0 and reached == nb:
        return partial
    absmax = torch.zeros(nb, kb, dtype=torch.float32, device=rows.device)
    absmax[first:first + reached] = partial[: nb - first]
    return absmax


def quantize_weight_blocks(w: torch.Tensor, scale: torch.Tensor | None = None):
    """W (N, K) -> ``(w_q int8 (N, K), scale float32 (ceil(N/B), ceil(K/B)))``; ``scale`` given (e.g. learned)
    or the block absmax's."""
    if scale is None:
        return reference.quantize_weight_blocks_ref(w.detach())
    scale = scale.detach().float()
    expanded = expand_weight_scale(scale, *w.shape)
    return torch.clamp(torch.round(w.detach().float() / expanded), -QMAX, QMAX).to(torch.int8), scale


def dequantize_weight_blocks(w_q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """(N, K) int8 and its block scales -> W (N, K) float32: the inverse of :func:`quantize_weight_blocks`."""
    return reference.dequantize_weight_blocks(w_q, scale)


def fake_quantize_weight_blocks(w: torch.Tensor, scale: torch.Tensor | None = None) -> torch.Tensor:
    """Block-wise int8 fake quantization of W (N, K) in float32; ``scale`` learnable (LSQ) or the absmax's."""
    if scale is None:
        scale = weight_block_scale(w)
    else:
        scale = scale_gradient(scale, lsq_gradient_factor(BLOCK * BLOCK, QMAX))
    return fake_quantize(w, expand_weight_scale(scale, *w.shape), -QMAX, QMAX)


# ---- activations -----------------------------------------------------------------------------------
def quantize_act_blocks(x: torch.Tensor):
    """X (M, K) -> ``(xq int8 (M, K), s_x float32 (M, ceil(K/B)))``."""
    return reference.quantize_act_blocks_ref(x)


def dequantize_act_blocks(xq: torch.Tensor, s_x: torch.Tensor) -> torch.Tensor:
    """(M, K) int8 and (M, ceil(K/B)) scales -> (M, K) float32: the inverse of :func:`quantize_act_blocks`."""
    return reference.dequantize_act_blocks(xq, s_x)


def fake_quantize_act_blocks(x: torch.Tensor) -> torch.Tensor:
    """1 x B int8 fake quantization of X (..., K) in float32 (dynamic scales, no gradient to them)."""
    k = x.shape[-1]
    kb = blocks(k)
    x32 = F.pad(x.float(), (0, kb * BLOCK - k)).unflatten(-1, (kb, BLOCK))  # (..., Kb, B)
    scale = safe_scale(x32.detach().abs().amax(dim=-1, keepdim=True), QMAX)
    return fake_quantize(x32, scale, -QMAX, QMAX).flatten(-2)[..., :k]
