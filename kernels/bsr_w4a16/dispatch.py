"""The DDS + W4A16 dispatch table (int4 blocks, :func:`pick`), from (M, N, K, stored blocks, device) to the
kernel and tiles that run, in :class:`compress_kernels.bsr.dispatch.BsrConfig` form:

* ``gemv``: :mod:`compress_kernels.bsr_w4a16.gemv`, one token row per program on CUDA cores;
* ``planes``: :mod:`compress_kernels.bsr_w4a16.planes`, 4 or 8 token rows per program on tensor cores, four
  blocks a dot as nibble planes, a block row optionally shared by ``split`` programs;
* ``gemm``: :mod:`compress_kernels.bsr_w4a16.gemm`, tensor-core tiles, one 32-deep dot per stored block,
  a block row optionally shared by ``split`` programs;
* ``dequant``: :mod:`compress_kernels.bsr_w4a16.dequant`, the blocks de-quantized once to x's dtype, then
  the DDS op with its own table (its tiles, or from 2048 rows on dense enough layers cuBLAS).

Read the table top to bottom: the first row that matches decides. The one-row rows come from
``python -m scripts.tune.bsr --int4`` on an H200 (M = 1; 4096x4096, 4096x14336, 14336x4096 at 50% and
90%), the planes rows from its grid (M = 2-16; 4096x4096, 4096x11008, 11008x4096, 8192x28672 at 50%); the
tile rows are still the DDS table's (:func:`compress_kernels.bsr.dispatch.pick`) with the int4 block's
bytes, and say which DDS figure they were taken from; past ``DEQUANT_MIN_M`` rows the DDS op takes over
on de-quantized blocks (:func:`tile_pick` is the table without that row). The table depends on shapes
and the number of stored blocks only, so a call is the same every time and can be captured in a CUDA
graph; :func:`cached_pick` remembers it per argument tuple (what the launchers call).
"""
from __future__ import annotations

import functools
import math

import triton

from compress_kernels.bsr.dispatch import (PICK_CACHE_SIZE, SMALL_LAYER, SMALL_SPLIT_MIN_BLOCKS_PER_ROW,
                                           SPLIT_MAX_BLOCK_ROWS_M64, SPLIT_MIN_BLOCKS_PER_ROW, BsrConfig, gemv_serves)
from compress_kernels.bsr_w4a16.planes import ROW_TILES
from compress_kernels.common.device import sm_count
from compress_kernels.reference import BSR_BLOCK

BLOCK_BYTES = BSR_BLOCK * BSR_BLOCK // 2 + BSR_BLOCK * 4  # one stored block: 512 bytes of int4, 32 fp32 scales


GEMV_BLOCK_N, GEMV_GROUP = 32, 16
SHARE_PROGRAMS_PER_SM = 3  # one-row and planes kernels: split the block rows until this many programs per SM
SHARE_MAX_SPLIT = 8
PLANES_MAX_M = 8  # the planes kernel's rows; 4 rows per program up to 4, then 8
PLANES_GROUP = 4
PLANES_STEPS_PER_SHARE = 16  # planes: block rows also split until each share walks at most this many steps ...
PLANES_MAX_SPLIT = 4  # ... into at most this many shares
# Past this many rows the blocks are de-quantized for the DDS op: there its tiles (or cuBLAS) beat the int4
# tiles, which unpack every block once per M tile and scale each block's dot on CUDA cores. H200, 50%,
# ``scripts.tune.bsr --int4``, us de-quantized / best int4 tiles: M = 128 576x3072 8.4 / 9.7, 1536x576 10.1 /
# 13.3, 4096x4096 27.6 / 34.4 (4096x11008 60.4 / 59.4, the one loss); M = 1024 16.9 / 22.3, 13.7 / 19.2,
# 115.4 / 115.4, 240.5 / 291.2; M = 2048 (DDS densifies 4096-wide layers) 108.2 / 212.2, 312.0 / 541.2
DEQUANT_MIN_M = 64
DEQUANT = BsrConfig("dequant", 0, 0, 0, 0, 0)


def row_split(programs: int, blocks_per_row: float, group: int, sms: int) -> int:
    """Programs sharing a block row in the one-row and planes kernels: the smallest power of two giving
    ``SHARE_PROGRAMS_PER_SM`` programs per SM, at most ``SHARE_MAX_SPLIT`` and no more shares than the mean
    block row has ``group`` steps, rounded up to a power of two (a 90% 4096-wide row in steps of 16 blocks:
    one step, no split)."""
    steps = max(1, math.ceil(blocks_per_row / group))
    split = 1
    while programs * split < SHARE_PROGRAMS_PER_SM * sms and split < min(SHARE_MAX_SPLIT, steps):
        split *= 2
    return split


def planes_split(programs: int, blocks_per_row: float, sms: int) -> int:
    """Programs sharing a block row in the planes kernel: :func:`row_split`'s count, doubled while a share
    would walk more than ``PLANES_STEPS_PER_SHARE`` steps, at most ``PLANES_MAX_SPLIT``."""
    steps = math.ceil(blocks_per_row / PLANES_GROUP)
    split = row_split(programs, blocks_per_row, PLANES_GROUP, sms)
    while split < PLANES_MAX_SPLIT and steps > PLANES_STEPS_PER_SHARE * split:
        split *= 2
    return min(split, PLANES_MAX_SPLIT)


def pick(m: int, n: int, k: int, nnz: int, device) -> BsrConfig:
    """The DDS + W4A16 kernel and tiles for x (M, K) times the int4 (N, K) weight with ``nnz`` stored
    32x32 blocks on ``device``."""
    if m > DEQUANT_MIN_M:
        return DEQUANT
    return tile_pick(m, n, k, nnz, device)


def tile_pick(m: int, n: int, k: int, nnz: int, device) -> BsrConfig:
    """The int4 kernels' own row of the table for these shapes (one-row kernel or tiles), whatever M."""
    sms = sm_count(device)
    few_programs = 2 * sms  # about two programs per SM
    block_rows = n // BSR_BLOCK
    blocks_per_row = nnz / block_rows
    # One row, and 2-4 rows of small layers while their stored blocks stay in L2 (DDS's rule on their
    # bytes): memory bound, one row per program on CUDA cores, 32 outputs and 16 blocks (512 channels) a
    # step, a block row shared by ``row_split`` programs when there are few (H200, M = 1, 50%: 4096x4096
    # 14.1 -> 8.9 us, 14336x4096 38.6 -> 15.5 us, 4096x14336 29.8 -> 15.9 us against 8 outputs and 8
    # blocks, unsplit)
    if m <= 1 or (n * k <= SMALL_LAYER and gemv_serves(m, nnz * BLOCK_BYTES)):
        return BsrConfig("gemv", 1, GEMV_BLOCK_N, GEMV_GROUP, 4, 3,
                         split=row_split(m * n // GEMV_BLOCK_N, blocks_per_row, GEMV_GROUP, sms))
    # 2-8 rows: the planes kernel, 4 (up to 4 rows) or 8 rows a program, 32 outputs, 4 blocks a step, 2 warps,
    # 2 stages, a block row shared by ``planes_split`` programs (H200, 50%, us at M = 2 / 4 / 8 against the
    # one-row kernel at M = 2 and the int4 tiles at 4 / 8: 8192x28672 86.3 / 116.6 / 117.7 -> 60.1 / 61.4 / 98.1;
    # 4096x11008 23.3 / 32.7 / 32.8 -> 16.7 / 17.1 / 23.6; 11008x4096 20.2 / 30.1 / 30.3 -> 17.5 / 18.1 / 25.1;
    # 4096x4096 11.2 / 15.5 / 15.6 -> 10.0 / 10.2 / 13.5). 2 stages against 3: 2-18% faster in 15 of 18 cells
    # of these and the decode layers, at most 2% slower in the others (4096x22016 34.0 / 34.2 / 45.2 -> 27.8 /
    # 28.3 / 40.6 with shares of up to 16 steps: 8 gave it 2 shares, 30.6 / 31.7 / 42.7; 8192x28672 at M = 8
    # is the one cell where 8 steps would win, 94.6). At 16 rows it ties the int4 tiles or loses: 192.6
    # against 119.9 us on 8192x28672
    if m <= PLANES_MAX_M:
        block_m = next(rows for rows in ROW_TILES if rows >= m)
        split = planes_split(triton.cdiv(m, block_m) * block_rows, blocks_per_row, sms)
        return BsrConfig("planes", block_m, BSR_BLOCK, PLANES_GROUP, 2, 2, split=split)
    # 9-16 rows: one 16-row tile reads each block once; long block rows (>= 24 blocks) shared by 4
    # programs while there are at most ~2 programs per SM of block rows (DDS: 90%, M = 16, 11008x4096
    # 12.1 -> 9.6 us)
    if m <= 16:
        if blocks_per_row >= SPLIT_MIN_BLOCKS_PER_ROW and block_rows <= few_programs:
            return BsrConfig("gemm", 16, 32, 4, 4, 3, split=4)
        return BsrConfig("gemm", 16, 32, 4, 4, 3)
    # 17-64 rows: small layers 16-row tiles, their long block rows shared by 4 (DDS: 1536x384, M = 64,
    # 10.3 -> 8.3 us); larger ones 32 or 64 rows, few long block rows shared by 4 (DDS: 4096x4096 at 50%,
    # M = 64, 19.8 -> 16.1 us)
    if m <= 64:
        if n * k <= SMALL_LAYER:
            split = 4 if blocks_per_row >= SMALL_SPLIT_MIN_BLOCKS_PER_ROW else 1
            return BsrConfig("gemm", 16, 32, 4, 4, 3, split=split)
        block_m = 64 if m > 32 else 32
        if blocks_per_row >= SPLIT_MIN_BLOCKS_PER_ROW and block_rows <= SPLIT_MAX_BLOCK_ROWS_M64:
            return BsrConfig("gemm", block_m, 32, 4, 4, 3, split=4)
        return BsrConfig("gemm", block_m, 32, 4, 4, 3)
    # More rows: 128-row tiles when they give ~2 programs per SM, else 64 (DDS's 65-256 row)
    if block_rows * triton.cdiv(m, 128) >= few_programs:
        return BsrConfig("gemm", 128, 32, 2, 4, 3)
    return BsrConfig("gemm", 64, 32, 4, 4, 3)


@functools.lru_cache(maxsize=PICK_CACHE_SIZE)
def cached_pick(m: int, n: int, k: int, nnz: int, device) -> BsrConfig:
    """:func:`pick`, remembered per argument tuple (``device`` as a tensor's, with its index)."""
    return pick(m, n, k, nnz, device)
