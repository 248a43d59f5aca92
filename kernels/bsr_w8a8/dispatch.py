"""The DDS + W8A8 dispatch table (int8 blocks, :func:`pick`), from (M, N, K, stored blocks, device) to the
kernel and tiles that run: the large-M dense path (:func:`compress_kernels.bsr.dispatch.densifies`, then
the dense W8A8 kernels) or the tensor-core tiles of :mod:`compress_kernels.bsr_w8a8.gemm` (no one-row
kernel: >= 16 rows per program), in :class:`compress_kernels.bsr.dispatch.BsrConfig` form.

Read the table top to bottom: the first row that matches decides; each row says why, with the figure
measured on an H100 (us per call; ``docs/kernels.md``). It depends on shapes and the number of stored
blocks only, so a call is the same every time and can be captured in a CUDA graph; :func:`cached_pick`
remembers it per argument tuple (what the launchers call).
"""
from __future__ import annotations

import functools

import triton

from compress_kernels.bsr.dispatch import (DENSE, PICK_CACHE_SIZE, SMALL_LAYER, SMALL_SPLIT_MIN_BLOCKS_PER_ROW,
                                           SPLIT_MAX_BLOCK_ROWS_M64, SPLIT_MIN_BLOCKS_PER_ROW, BsrConfig, densifies)
from compress_kernels.common.device import sm_count
from compress_kernels.reference import BSR_BLOCK

SPLIT_MAX_BLOCK_ROWS = 384  # M <= 16: block rows are shared up to this many of them
LONG_ROW_BLOCKS = 64  # rows this long get 8 shares at M <= 16 and 4 at M <= 64


def pick(m: int, n: int, k: int, nnz: int, device) -> BsrConfig:
    """The DDS + W8A8 kernel and tiles for x (M, K) times the int8 (N, K) weight with ``nnz`` stored
    blocks on ``device`` (the tensor-core tiles only: >= 16 rows per program)."""
    few_programs = 2 * sm_count(device)
    block_rows = n // BSR_BLOCK
    blocks_per_row = nnz / block_rows
    small_layer = n * k <= SMALL_LAYER
    # From 2048 rows on layers keeping >= 40% of their blocks: dense int8 weight, the W8A8 kernels
    if densifies(m, n, k, nnz):
        return DENSE
    # Up to 16 rows: 16-row tiles; up to 384 block rows of >= 24 blocks shared by 4 programs, by 8 when
    # that still gives <= 1024 programs and rows are >= 64 blocks long (4096x4096 at 50%, M = 1: 18.9 ->
    # 11.5 us); otherwise no split and 8 blocks (256 int8 columns) per step
    if m <= 16:
        if block_rows <= SPLIT_MAX_BLOCK_ROWS and blocks_per_row >= SPLIT_MIN_BLOCKS_PER_ROW:
            split = 8 if block_rows * 8 <= 1024 and blocks_per_row >= LONG_ROW_BLOCKS else 4
            return BsrConfig("gemm", 16, 32, 4, 4, 3, split=split)
        return BsrConfig("gemm", 16, 32, 8, 4, 3)
    # 17-64 rows: small layers (MiniLM) take 16-row tiles as the fp16 kernel; larger ones 32 or 64 rows,
    # 8 blocks per step, and a 4-way split for <= 128 block rows of >= 64 blocks (11008x4096 at 50%,
    # M = 64: 51.3 -> 31.1 us)
    if m <= 64:
        if small_layer:
            if blocks_per_row >= SMALL_SPLIT_MIN_BLOCKS_PER_ROW:
                return BsrConfig("gemm", 16, 32, 4, 4, 3, split=4)
            return BsrConfig("gemm", 16, 32, 8, 4, 3)
        block_m = 32 if m <= 32 else 64
        if block_rows <= SPLIT_MAX_BLOCK_ROWS_M64 and blocks_per_row >= LONG_ROW_BLOCKS:
            return BsrConfig("gemm", block_m, 32, 4, 4, 3, split=4)
        return BsrConfig("gemm", block_m, 32, 8, 4, 3)
    # 65-256 rows, and small layers while 128-row tiles would give fewer than ~2 programs per SM: 64-row
    # tiles (384x1152 at M = 512: 12.2 -> 11.6 us); else 128 (1024x1024 at M = 2048: 18.4 us, 20.9 with 64)
    if m <= 256 or (small_layer and block_rows * triton.cdiv(m, 128) < few_programs):
        return BsrConfig("gemm", 64, 32, 4, 4, 3)
    return BsrConfig("gemm", 128, 32, 4, 4, 3)


@functools.lru_cache(maxsize=PICK_CACHE_SIZE)
def cached_pick(m: int, n: int, k: int, nnz: int, device) -> BsrConfig:
    """:func:`pick`, remembered per argument tuple (``device`` as a tensor's, with its index)."""
    return pick(m, n, k, nnz, device)
