"""Second pass of the split-K matmuls: sum fp32 partial products, add the bias, cast to the output dtype.

At small M a matmul has too few output tiles to keep every SM streaming weights, so the launchers in
:mod:`kernels.w8a8` and :mod:`kernels.w4a16` can cut K into ``SPLIT_K`` slices. Each slice writes its
fp32 partial result ``partial[s, m, n]`` (already dequantized, so the slices add linearly) into a
workspace of shape (SPLIT_K, M, N); this kernel then computes

    y[m, n] = sum_s partial[s, m, n] (+ bias[n])     in fp32, cast to y's dtype.

Two passes instead of atomics keep the result deterministic (same bits on every run), which the
CUDA-graph replay tests rely on. The workspace is small at small M (SPLIT_K * M * N * 4 bytes).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _splitk_reduce_kernel(
    partial_ptr, bias_ptr, y_ptr,  # (SPLIT_K, M, N) fp32, (N,), (M, N) with row stride stride_ym
    MN, N, stride_ym, SPLIT_K,
    HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr,
):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < MN
    total = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in range(SPLIT_K):
        total += tl.load(partial_ptr + s * MN + offs, mask=mask, other=0.0)
    n = offs % N
    if HAS_BIAS:
        total += tl.load(bias_ptr + n, mask=mask, other=0.0).to(tl.float32)
    m = offs // N
    tl.store(y_ptr + m * stride_ym + n, total.to(y_ptr.dtype.element_ty), mask=mask)


def splitk_reduce(partial: torch.Tensor, bias: torch.Tensor | None, y: torch.Tensor) -> None:
    """Write ``partial.sum(0) (+ bias)`` into ``y`` (M, N); ``partial`` is contiguous (SPLIT_K, M, N) fp32."""
    split_k, m, n = partial.shape
    block = 1024
    grid = (triton.cdiv(m * n, block),)
    _splitk_reduce_kernel[grid](
        partial, bias if bias is not None else partial, y,
        m * n, n, y.stride(0), split_k,
        HAS_BIAS=bias is not None, BLOCK=block, num_warps=4,
    )
