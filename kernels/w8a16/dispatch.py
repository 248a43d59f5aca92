"""W8A16's dispatch table: which kernel and tiles run for (M, N, K, scale grouping) on a device.

Read :func:`pick` top to bottom: the first row that matches decides. The table depends on shapes only,
so a call is the same every time and can be captured in a CUDA graph on its first run; there is no
autotuning. Being a pure function of its arguments, it is remembered per argument tuple
(:func:`cached_pick`, what the launcher calls). ``python -m scripts.tune.w8a16`` times the pick and its
neighbours on the same path (one launch parameter changed) on a GPU.

The rows start from what the other ops measured on an H100 (``docs/kernels.md``): W8A8's one-row
kernel streams the same int8 bytes (8 outputs per program, 1024-deep K steps, 512 on layers wider
than 16896, no K split from 512 programs on 132 SMs) and W4A16's wgmma path the same
swapped tile shapes. Their W8A16 figures come from the kernel benchmark (``ours_w8a16*``); a row
changes when the sweep shows a neighbour faster, its comment then carrying the figure.

Paths (``TileConfig.path``):

* ``gemv``: :mod:`compress_kernels.w8a16.gemv`, one token row per program on CUDA cores, the int8
  weight converted in registers, split-K where the layer gives too few programs;
* ``tiled``: :mod:`compress_kernels.w8a16.tiled`, the weight tile converted to x's dtype in the loop
  and multiplied on tensor cores as the left operand of ``tl.dot`` (``y^T = W x^T``), split-K;
* ``dequant``: :mod:`compress_kernels.w8a16.dequant`, the weight dequantized once, then cuBLAS.
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import triton

from compress_kernels.common.device import fast_dram, sm_count
from compress_kernels.common.splitk import split_k_for
from compress_kernels.reference import W8A16_GROUP_SIZE as GROUP_SIZE  # input channels per grouped scale
SMALL_LAYER = 4 * 2**20  # N * K at most this (MiniLM's 384 / 1536): the layer sits in L2
GEMV_MAX_SMALL_M = 4  # small layers take the one-row kernel up to this many rows (W8A8's rule)
GEMV_WIDE_N = 264 * 64  # wider layers walk K in 512-deep steps in the one-row kernel (W8A8's rule)
GEMV_FAST_DRAM_MIN_N = 8192  # on HBM3e GPUs, layers with this many outputs take 8 per program, 512-deep steps
GEMV_MIN_PROGRAMS_PER_SM = 2  # the one-row kernel splits K until the grid has this many programs per SM ...
GEMV_GROUPED_PROGRAMS_PER_SM = 4  # ... (this many with grouped scales) ...
GEMV_MAX_SPLIT = 16  # ... at most this many splits, each of at least one K tile
GEMV_MIN_SPLIT_K_TILE = 128  # shortest K tile the one-row kernel shrinks to so that K can be split
SMALL_M = 16  # up to here: 16-token tiles of 32 channels, split-K to 2 programs per SM
MID_M = 64  # up to here: 64-token tiles of 128 channels
LARGE_M = 256  # up to here: 128 x 128 tiles, split-K to a program per SM; above, the same tiles unsplit
DEQUANT_MIN_M = 1024  # from here on, dequantize once and let cuBLAS run the fp16 GEMM
PICK_CACHE_SIZE = 4096  # argument tuples remembered by cached_pick (a model has a few shapes per M)


class TileConfig(NamedTuple):
    """Launch parameters of a W8A16 path (see the module docstring).

    ``block_m`` tokens by ``block_n`` output channels by ``block_k`` input channels per program and K
    step; ``group_m``: token tiles that share a weight tile in the grouped tile order (tiled only);
    ``scale_after_dot`` (tiled, grouped scales only): multiply each K tile's product by its scale row
    instead of dequantizing the weight tile before the dot. The ``dequant`` path takes no parameters."""

    block_m: int
    block_n: int
    block_k: int
    split_k: int = 1
    group_m: int = 8
    num_warps: int = 4
    num_stages: int = 3
    scale_after_dot: bool = False
    path: str = "tiled"


def pick(m: int, n: int, k: int, grouped: bool, device) -> TileConfig:
    """The W8A16 kernel and tiles for x (M, K) times w_q (N, K) on ``device``; ``grouped``: one scale
    per 128 input channels (else one per output channel)."""
    sms = sm_count(device)
    # One row, and up to 4 on small layers: the one-row kernel (W8A8 measured its one-row kernel
    # ahead of 16-row tiles there: 4096x4096 M = 1 11.7 -> 10.0 us; 1024x1024 M = 4 5.5 -> 4.5)
    if m == 1 or (m <= GEMV_MAX_SMALL_M and n * k <= SMALL_LAYER):
        return gemv_tile(m, n, k, grouped, sms, fast_dram(device))
    # From 1024 rows: the weight dequantized once (3 bytes moved per weight), then cuBLAS's fp16 GEMM
    # (H100, M = 2048: 0.77-0.84x cuBLAS against 0.53-0.57x for the tiles; at M = 512 the tiles were
    # ahead on 3 of 4 shapes, 4096x4096 42.2 vs 44.4 us)
    if m >= DEQUANT_MIN_M:
        return TileConfig(0, 0, 0, path="dequant")
    # 2-16 rows: 16 tokens x 32 channels, 128-deep K tiles, split-K to 2 programs per SM (H100, M = 16,
    # against 64 channels split to one per SM: 4096x11008 27.1 -> 22.6 us, 8192x28672 112.5 -> 99.4,
    # faster on all 4 shapes, either scale grouping); grouped scales multiply each tile's fp32 product
    # (16 x 32 multiplies per tile, against 128 x 32 for dequantizing the weight tile first)
    if m <= SMALL_M:
        cfg = TileConfig(16, 32, 128, num_warps=4, num_stages=4, scale_after_dot=grouped)
        return cfg._replace(split_k=split_k_for(m, n, k, cfg, 2 * sms))
    # 17-64 rows: 64 tokens x 128 channels (two warp groups), 64-deep K tiles, 3 stages (H100, M = 64,
    # against 4: faster on the 4 Llama-2 shapes, 8192x28672 164.4 -> 142.1 us, 4096x11008 45.8 -> 38.2; even on
    # the small ones)
    elif m <= MID_M:
        cfg = TileConfig(64, 128, 64, num_warps=8, num_stages=3, scale_after_dot=grouped)
    # 65-256 rows: 128 x 128 tiles, 4 warps, split-K; grouped scales dequantize the weight tile before
    # the dot, so every K tile accumulates into one wgmma accumulator. Not 8 warps: with a K split (and
    # in 256-row tiles even unsplit) the tiles gave wrong sums that changed from run to run on an H100
    # (Triton 3.6; rel. error 0.2-0.5 at 4096x4096 M = 256), right again with the inline-PTX int8
    # conversion replaced by a plain cast; 4 warps are right and as fast (31.9 vs 31.2 us)
    elif m <= LARGE_M:
        cfg = TileConfig(128, 128, 64, num_warps=4, num_stages=4)
    # 257-1023 rows: the same tiles with 8 warps, unsplit
    else:
        return TileConfig(128, 128, 64, num_warps=8, num_stages=4)
    return cfg._replace(split_k=split_k_for(m, n, k, cfg, sms))


@functools.lru_cache(maxsize=PICK_CACHE_SIZE)
def cached_pick(m: int, n: int, k: int, grouped: bool, device) -> TileConfig:
    """:func:`pick`, remembered per argument tuple (``device`` as a tensor's, with its index)."""
    return pick(m, n, k, grouped, device)


def gemv_tile(m: int, n: int, k: int, grouped: bool, sms: int, fast: bool = False) -> TileConfig:
    """The one-row kernel's tile: 4 outputs per program and 2 warps, K in 1024-deep steps (512 on layers
    wider than ``GEMV_WIDE_N``; on ``fast`` DRAM from ``GEMV_FAST_DRAM_MIN_N`` outputs, 8 outputs and
    512-deep steps); with grouped scales 32 outputs, one group per step; K rounded up to a power of two
    when shorter; then :func:`gemv_split_k`."""
    if grouped:  # 32 channels x one group per step (H100, against 8 channels: 4096x4096 18.8 -> 12.3 us,
        # 11008x4096 48.0 -> 26.9), split to 4 programs per SM (H100, against 2: 4096x11008 27.5 -> 24.6 us,
        # 11008x4096 26.1 -> 23.7, 8192x8192 35.7 -> 32.6; as fast on the other 2 shapes from 4096x4096)
        cfg = TileConfig(1, 32, gemv_block_k(k, GROUP_SIZE), num_warps=4, num_stages=1, path="gemv")
        return gemv_split_k(m, n, k, cfg, sms, GEMV_GROUPED_PROGRAMS_PER_SM)
    # 2 warps per program (H100, against 4: 4096x4096 11.4 -> 9.9 us, 11008x4096 25.1 -> 21.5; as fast
    # or faster on all 4 shapes measured); 4 outputs per program (H100, against 8: 4096x4096 9.9 -> 9.7 us,
    # 8192x28672 97.2 -> 94.8; 1-2.5% faster on all 5 shapes from 4096x4096)
    # On an H200 (fast DRAM) layers from 8192 outputs want 8 outputs per program and 512-deep steps (M = 1,
    # us: 8192x28672 79.3 -> 70.7, 4096x28672 42.6 -> 39.1, 4096x22016 34.0 -> 31.4, 4096x14336 23.5 -> 21.7,
    # 8192x8192 24.6 -> 22.7, 4096x11008 19.0 -> 18.9; best or within 1% of the best of 18 tiles on each)
    if fast and n >= GEMV_FAST_DRAM_MIN_N:
        cfg = TileConfig(1, 8, gemv_block_k(k, 512), num_warps=2, num_stages=1, path="gemv")
        return gemv_split_k(m, n, k, cfg, sms)
    deepest = 512 if n > GEMV_WIDE_N else 1024
    cfg = TileConfig(1, 4, gemv_block_k(k, deepest), num_warps=2, num_stages=1, path="gemv")
    return gemv_split_k(m, n, k, cfg, sms)


def gemv_block_k(k: int, deepest: int) -> int:
    """The one-row kernel's K step: ``deepest``, or K rounded up to a power of two (at least 32) when shorter."""
    return min(deepest, max(32, triton.next_power_of_2(k)))


def gemv_split_k(m: int, n: int, k: int, cfg: TileConfig, sms: int,
                 per_sm: int = GEMV_MIN_PROGRAMS_PER_SM) -> TileConfig:
    """``cfg`` with its K split: the smallest power of two giving ``per_sm`` programs per SM (at most
    ``GEMV_MAX_SPLIT``, never more splits than K tiles). On layers too small for that the K tile is halved
    first, down to ``GEMV_MIN_SPLIT_K_TILE``, so that there are K tiles to split."""
    programs = m * triton.cdiv(n, cfg.block_n)
    wanted = per_sm * sms
    block_k = cfg.block_k
    while programs * triton.cdiv(k, block_k) < wanted and block_k > GEMV_MIN_SPLIT_K_TILE:
        block_k //= 2
    k_tiles = triton.cdiv(k, block_k)
    split = 1
    while programs * split < wanted and split < GEMV_MAX_SPLIT and split * 2 <= k_tiles:
        split *= 2
    return cfg._replace(block_k=block_k, split_k=split)
