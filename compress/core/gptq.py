"""GPTQ (Frantar et al., 2022, arXiv 2210.17323) in the numerical contract of the kernels.

Problem. One linear layer, weight W (N, K), calibration inputs X (n tokens, K). Find Q on the
kernel's grid minimising ``||X W^T - X Q^T||_F^2``, which is ``sum_rows (w - q) H (w - q)^T / 2``
with the Hessian ``H = 2/n X^T X`` (K, K), the same for every output row.

Sweep. GPTQ quantizes the input channels (columns of W) one at a time, in one order for all rows,
and after column j spreads its rounding error over the columns not yet quantized (the Optimal Brain
Surgeon update)::

    err = (W[:, j] - Q[:, j]) / U[j, j]          W[:, j+1:] -= err U[j, j+1:]

with U the upper Cholesky factor of ``H^-1`` (``H^-1 = U^T U``): row j of U is, up to ``U[j, j]``, the
row of the inverse Hessian of the columns left after j, so nothing is inverted inside the loop.
Lazy batches: columns go in blocks of B; inside a block the update reaches only the block's
columns, the later ones get the block's errors in one matmul at its end (the same result up to float
rounding; B only changes speed). Before the sweep: inputs that never fire (``H[i,i] == 0``) get
``H[i,i] = 1`` and ``W[:, i] = 0``; ``damping * mean(diag H)`` is added to the diagonal (retried
with 10x more when the Cholesky factorization fails).

Grid (``compress/core/quant.py``): ``q = clamp(round(w / s), -qmax - 1, qmax)``, one scale per row
and group of G consecutive *original* input channels. W8A8 and per-channel W8A16 pass their per-row
scales up front (``max|W[n, :]| / 127`` of the original rows, G = K). W4A16 and W8A16 with groups of 128
(qmax 7 and 127) let the sweep choose them: when the
sweep first reaches any column of a group, the group's scale is searched (:func:`search_group_scales`)
on its *current* (error-updated) weights: per row, ``s = p * absmax / qmax`` with the shrink ``p`` on
a grid from 1 down to ``MIN_SHRINK``, the one that minimises the group's rounding error weighted by
the Hessian's diagonal, ``sum_k H[k,k] (w_k - s q_k)^2`` (the layer's output error if the inputs were
uncorrelated): clipping a rare large weight buys a finer step for all the others, and the inputs
that carry energy decide. The result is (q int8 (N, K), scales (N, K/G)) and the dequantized weight
is exactly ``q * s``: the kernel's ``unpack(qweight) * scales``. Measured on SmolLM2-135M (CPU, g32,
docs/journal.md): round-to-nearest +29% perplexity over the float model, GPTQ with plain absmax
scales +16%, with the searched scales +6% to +7% (activation order both).

Activation order (``act_order``; the configs use it on dense layers): columns are swept by
decreasing ``diag(H)`` (the inputs with the most energy first, while most columns are left to absorb
their error), then put back. Groups stay groups of consecutive original channels, as the kernel reads them; the rule
above still holds, so a group's scale comes from its weights as they are when the sweep first
touches it, and its later columns are clamped to that range.

``keep`` (N, K) bool (block sparsity): pruned weights quantize to 0 and their error (the drift the
updates gave them) is spread like any rounding error, so they stay exact zeros; group scales look at
kept weights only.
"""
from __future__ import annotations

import torch

from compress.core.quant import quantize, safe_scale

DAMPING_RETRIES = 4  # damping, 10x, 100x, 1000x the configured fraction
SCALE_GRID = 40  # shrink factors tried by search_group_scales: 1, 1 - 0.5/40, ..., down to ...
MIN_SHRINK = 0.5  # ... just above this fraction of the group's absmax


def add_to_hessian(xtx: torch.Tensor, x: torch.Tensor) -> int:
    """Add ``X^T X`` of the inputs ``x`` (..., K) to ``xtx`` (K, K) float32 in place; returns the rows added."""
    rows = x.detach().reshape(-1, x.shape[-1]).to(xtx.dtype)
    if not bool(torch.isfinite(rows).all()):
        raise ValueError("GPTQ: non-finite values (NaN or Inf) in the calibration inputs")
    xtx.addmm_(rows.T, rows)
    return rows.shape[0]


def hessian(xtx: torch.Tensor, rows: int) -> torch.Tensor:
    """``H = 2/n X^T X`` from the accumulated ``X^T X`` of ``rows`` tokens."""
    if rows <= 0:
        raise ValueError("GPTQ: no calibration inputs reached the layer (0 tokens)")
    return xtx * (2.0 / rows)


def drop_dead_inputs(weight: torch.Tensor, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Copies of (W, H) with inputs that never fire (``H[i,i] == 0``) set to ``W[:, i] = 0``, ``H[i,i] = 1``."""
    dead = h.diagonal() == 0
    weight, h = weight.clone(), h.clone()
    weight[:, dead] = 0
    h[dead, dead] = 1
    return weight, h


def inverse_cholesky(h: torch.Tensor, damping: float) -> torch.Tensor:
    """Upper Cholesky factor U of ``(H + d I)^-1``, ``d = damping * mean(diag H)``, more damping on failure."""
    mean_diag = h.diagonal().mean()
    tried = []
    for attempt in range(DAMPING_RETRIES):
        fraction = damping * 10.0 ** attempt
        tried.append(f"{fraction:g}")
        damped = h + fraction * mean_diag * torch.eye(h.shape[0], dtype=h.dtype, device=h.device)
        lower, info = torch.linalg.cholesky_ex(damped)
        if int(info) == 0:
            upper, info = torch.linalg.cholesky_ex(torch.cholesky_inverse(lower), upper=True)
            if int(info) == 0 and bool(torch.isfinite(upper).all()):
                return upper
    raise ValueError(f"GPTQ: the damped Hessian is not positive definite (Cholesky failed with damping "
                     f"{', '.join(tried)} x its mean diagonal); calibrate on more tokens or raise gptq_damping")


def search_group_scales(weight: torch.Tensor, importance: torch.Tensor, group_size: int, qmax: int) -> torch.Tensor:
    """Scales (N, K/G) of ``weight`` (N, K): per row and group the ``p * absmax / qmax``, p in
    ``1 - i (1 - MIN_SHRINK) / SCALE_GRID`` (i = 0 .. SCALE_GRID - 1), minimising
    ``sum_k importance[k] (w_k - s q_k)^2`` over the group (ties keep the larger scale)."""
    n, k = weight.shape
    w = weight.float().reshape(n, k // group_size, group_size)
    weights = importance.float().reshape(1, k // group_size, group_size)
    absmax = w.abs().amax(dim=-1)
    best_scale, best_error = safe_scale(absmax, qmax), None
    for i in range(SCALE_GRID):
        scale = safe_scale(absmax * (1.0 - i * (1.0 - MIN_SHRINK) / SCALE_GRID), qmax)
        error = ((quantize(w, scale[..., None], -qmax - 1, qmax) * scale[..., None] - w) ** 2 * weights).sum(dim=-1)
        if best_error is None:
            best_error = error
            continue
        better = error < best_error
        best_scale, best_error = torch.where(better, scale, best_scale), torch.where(better, error, best_error)
    return best_scale


def gptq_quantize(weight: torch.Tensor, h: torch.Tensor, qmax: int, group_size: int, *,
                  scale: torch.Tensor | None = None, keep: torch.Tensor | None = None, damping: float = 0.01,
                  act_order: bool = True, block: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    """GPTQ of ``weight`` (N, K) with Hessian ``h`` (K, K): (q int8 (N, K), scale float32 (N, K/G)).

    ``scale``: fixed scales (N, K/G) (W8A8: the per-row scales, G = K), else each group's scale is
    searched (:func:`search_group_scales`) when the sweep reaches the group. ``keep``: (N, K) bool,
    False where the weight is pruned.
    """
    n, k = weight.shape
    if k % group_size or tuple(h.shape) != (k, k):
        raise ValueError(f"GPTQ: expected K={k} a multiple of group_size={group_size} and H of shape ({k}, {k}), "
                         f"got {tuple(h.shape)}")
    w, h = drop_dead_inputs(weight.detach().float(), h.float())
    order = torch.argsort(h.diagonal(), descending=True, stable=True) if act_order else torch.arange(k)
    order = order.to(w.device)
    groups = k // group_size
    known = scale is not None
    scale = torch.ones(n, groups, device=w.device) if scale is None else scale.float().clone()
    keep_swept = None if keep is None else keep.to(w.dtype)[:, order]
    h = h[order][:, order]
    u = inverse_cholesky(h, damping)
    q = _sweep(w[:, order], u, h.diagonal(), (order // group_size).tolist(), scale, [known] * groups, keep_swept,
               qmax, block)
    return q[:, torch.argsort(order)].to(torch.int8), scale


def _sweep(w, u, importance, group_of, scale, known, keep, qmax, block) -> torch.Tensor:
    """The lazy-batch sweep over the columns of ``w`` (in sweep order); fills ``scale`` in place."""
    q = torch.zeros_like(w)
    members = {}
    for position, group in enumerate(group_of):
        members.setdefault(group, []).append(position)
    for start in range(0, w.shape[1], block):
        end = min(start + block, w.shape[1])
        w_block, errors = w[:, start:end].clone(), torch.zeros_like(w[:, start:end])
        for i, column in enumerate(range(start, end)):
            group = group_of[column]
            if not known[group]:
                cols = torch.tensor(members[group], device=w.device)
                current = _current_weights(w, u, errors[:, :i], start, cols, keep)
                scale[:, group] = search_group_scales(current, importance[cols], len(cols), qmax)[:, 0]
                known[group] = True
            s = scale[:, group]
            q_col = quantize(w_block[:, i], s, -qmax - 1, qmax)
            if keep is not None:
                q_col = q_col * keep[:, column]
            q[:, column] = q_col
            errors[:, i] = (w_block[:, i] - q_col * s) / u[column, column]
            w_block[:, i:] -= errors[:, i, None] * u[column, column:end][None, :]
        w[:, end:] -= errors @ u[start:end, end:]
    return q


def _current_weights(w, u, errors, start, cols, keep) -> torch.Tensor:
    """Columns ``cols`` (none swept yet) as the block's updates so far left them, pruned ones zero."""
    current = w[:, cols] - errors @ u[start:start + errors.shape[1], cols]
    return current if keep is None else current * keep[:, cols]
