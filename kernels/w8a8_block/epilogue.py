"""The end of a block-scaled W8A8 tile: bias, float rounding, GELU, and a float or int8 output; split-K sums.

For a (BLOCK_M, BLOCK_N) tile ``acc`` of fp32 sums (``reference.w8a8_block_matmul_quantized_ref``)::

    y  = acc (+ bias[n])                                   fp32
    float output:  out = rd(y), or rd(gelu(rd(y)))          rd: rounded to the output dtype
    int8 output:   v = rd(y), or rd(gelu(rd(y)))            rd: rounded to the activation dtype
                   s_y[m, nb] = max_{n in block nb} |v[m, n]| / 127,  yq = rint(clamp(v / s_y, -127, 127))

The int8 output is the next layer's input format (1 x 128 blocks), so an int8 tile must span exactly
one 128-column block (BLOCK_N = 128) and owns its scales: it writes ``yq`` and ``s_y[:, pid_n]``.
Columns past N hold 0 (masked weight loads, masked bias), so they never raise a block's absmax.

Split-K (:func:`store_partial`, :func:`sum_partials`): each split stores its fp32 tile into a
(SPLIT_K, M, N) workspace and takes a ticket from the tile's counter; the split drawing the last ticket
sums the partials in split order, runs the epilogue above on the sum and zeroes the counter (the
scheme of :mod:`compress_kernels.common.splitk`, whose counters it uses). One launch, deterministic.
"""
from __future__ import annotations

import triton
import triton.language as tl

from compress_kernels.w8a8_block.blocks import gelu_exact, quantize_rows_sym, round_through, row_block_scales


@triton.jit
def store_output(
    acc, offs_m, offs_n, pid_n, M, N, bias_ptr, out_ptr, sy_ptr, stride_om, stride_sym, stride_syk,
    HAS_BIAS: tl.constexpr, GELU: tl.constexpr, OUT_INT8: tl.constexpr, ACT_BF16: tl.constexpr,
):
    """Write the tile ``acc`` (BM, BN) fp32 at rows ``offs_m`` and columns ``offs_n`` (module docstring)."""
    m_ok = offs_m < M
    n_ok = offs_n < N
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    mask = m_ok[:, None] & n_ok[None, :]
    out_ptrs = out_ptr + offs_m[:, None].to(tl.int64) * stride_om + offs_n[None, :]
    if OUT_INT8:
        v = round_through(acc, ACT_BF16)
        if GELU:
            v = round_through(gelu_exact(v), ACT_BF16)
        scale = row_block_scales(v)  # (BM,): the tile is one 128-column block
        tl.store(out_ptrs, quantize_rows_sym(v, scale), mask=mask)
        tl.store(sy_ptr + offs_m.to(tl.int64) * stride_sym + pid_n * stride_syk, scale, mask=m_ok)
    else:
        if GELU:
            acc = gelu_exact(round_through(acc, ACT_BF16))
        tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def store_partial(acc, ws_ptr, cnt_ptr, offs_m, offs_n, M, N, tile_id, pid_k):
    """Store this split's fp32 tile into ``ws`` (SPLIT_K, M, N); returns the ticket drawn from counter
    ``tile_id`` (SPLIT_K - 1 for the last split to arrive)."""
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    ws = ws_ptr + offs_m[:, None].to(tl.int64) * N + offs_n[None, :]
    tl.store(ws + pid_k.to(tl.int64) * M * N, acc, mask=mask)
    tl.debug_barrier()  # every thread's partial is written before the ticket is taken
    return tl.atomic_add(cnt_ptr + tile_id, 1, sem="acq_rel", scope="gpu")


@triton.jit
def sum_partials(ws_ptr, offs_m, offs_n, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 SPLIT_K: tl.constexpr):
    """The tile's SPLIT_K partials summed in split order (fp32)."""
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    ws = ws_ptr + offs_m[:, None].to(tl.int64) * N + offs_n[None, :]
    total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for s in tl.static_range(SPLIT_K):  # unrolled: the loads are in flight together
        total += tl.load(ws + s * M * N, mask=mask, other=0.0, cache_modifier=".cg")
    return total
