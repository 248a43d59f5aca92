"""Zero-padding of the last dimension by a Triton copy, for layers whose packed weight has more input channels.

W4A16 packs K up to a multiple of its group size and W8A16 up to its K rule, so ``x`` (..., K) enters
their kernels as (..., Kp) with zero channels appended::

    out[m, k] = x[m, k] for k < K,  0 for K <= k < Kp

``F.pad`` does the same, but as a torch operation it would keep a bound call's launches from being
recorded as a launch plan (:mod:`compress_kernels.common.plans`); this copy is a launch like the
matmul's, so the pad is replayed with it. One program per row and BLOCK columns.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from compress_kernels.common.launch import launch

BLOCK = 1024  # columns per program


@triton.jit
def _pad_columns_kernel(x_ptr, out_ptr, K, KP, stride_xm, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    values = tl.load(x_ptr + row * stride_xm + cols, mask=cols < K, other=0.0)
    tl.store(out_ptr + row * KP + cols, values, mask=cols < KP)


def pad_columns(x: torch.Tensor, padded: int) -> torch.Tensor:
    """``x`` (..., K) with zero channels appended up to ``padded`` >= K, as a new contiguous tensor
    (``x`` itself when K == padded). The last dimension of ``x`` must be contiguous."""
    k = x.shape[-1]
    if padded == k:
        return x
    if padded < k or x.stride(-1) != 1:
        raise ValueError(f"pad_columns: expected K <= {padded} and a contiguous last dimension, got shape "
                         f"{tuple(x.shape)} and strides {tuple(x.stride())}")
    x2 = x.reshape(-1, k)
    out = torch.empty((x2.shape[0], padded), dtype=x.dtype, device=x.device)
    if x2.shape[0]:
        launch(_pad_columns_kernel, (x2.shape[0], triton.cdiv(padded, BLOCK)), x2, out, k, padded, x2.stride(0),
               BLOCK=BLOCK, num_warps=4)
    return out.reshape(*x.shape[:-1], padded)
