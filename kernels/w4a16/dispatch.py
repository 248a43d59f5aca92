"""W4A16's dispatch table: which kernel and tiles run for (M, N, K, group size, scale dtype) on a device.

Read :func:`pick` top to bottom: the first row that matches decides. Each row says why, with the
figure measured on an H100 (us per call, the kernel benchmark's method; ``docs/kernels.md``). The
table depends on shapes and dtypes only, so a call is the same every time and can be captured in a
CUDA graph on its first run; there is no autotuning. Being a pure function of its arguments, it is
remembered per argument tuple (:func:`cached_pick`, what the launcher calls). A K tile never crosses
a scale group (BLOCK_K divides G, or G = K).

Paths (``TileConfig.path``):

* ``wholek``: :mod:`compress_kernels.w4a16.wholek`, one token row per program holding its whole K strip;
* ``fma``: :mod:`compress_kernels.w4a16.fma`, one token row per program on CUDA cores, K split;
* ``tiled``: :mod:`compress_kernels.w4a16.tiled`, tensor-core tiles (as 8 nibble planes with
  ``planes``), split-K;
* ``wgmma``: :mod:`compress_kernels.w4a16.wgmma`, the weight as the register operand of wgmma;
* ``dequant``: :mod:`compress_kernels.w4a16.dequant`, dequantize the weight, then cuBLAS.
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import triton

from compress_kernels.common.device import sm_count
from compress_kernels.common.splitk import split_k_for

SMALL_LAYER = 4 * 2**20  # N * K at most this (MiniLM's 384 / 1536): the layer sits in L2
WHOLEK_MAX_M = 2  # rows taking the whole K strip on layers of at most WHOLEK_MAX_WEIGHTS weights ...
WHOLEK_MAX_WEIGHTS = 16 * 2**20
WHOLEK_MAX_PICK_K = 4096  # ... with K at most this
PLANES_MAX_M = 16  # up to here the 16-row tiles; on small layers the whole K strip
FMA_MIN_WEIGHTS = 4 * 2**20  # M = 1 on layers this large: the CUDA-core kernel
SHORT_K = 512  # small layers with K at most this: no split-K at M <= 64
WIDE_N = 8192  # from here on the nibble-plane tiles are 128 wide
WGMMA_MAX_M = 256  # above PLANES_MAX_M and up to here, on large layers: the swapped nibble pairs ...
WGMMA_MIN_WEIGHTS = 32 * 2**20  # ... and above 32 rows only on layers this large
DEQUANT_MIN_M = 128  # from here on, dequantize once and let cuBLAS run the fp16 GEMM
PAIR_TILE = 128  # K tile of the swapped nibble pairs: 16 packed words, 4 nibble pairs of 32 channels
FMA_MIN_PROGRAMS = 512  # the one-row kernel's K split: programs to reach (measured, see fma_split_k) ...
FMA_MAX_SPLIT_CHANNELS = 1536  # ... and the most K channels one split may span
PICK_CACHE_SIZE = 4096  # argument tuples remembered by cached_pick (a model has a few shapes per M)


class TileConfig(NamedTuple):
    """Launch parameters of a W4A16 path (see the module docstring)."""

    block_m: int
    block_n: int
    block_k: int
    split_k: int = 1
    group_m: int = 8
    num_warps: int = 4
    num_stages: int = 3
    scale_after_dot: bool = False  # tiled: scale the tile's fp32 product (else dequantize before the dot)
    path: str = "tiled"  # "wholek", "fma", "tiled", "wgmma" or "dequant"
    prefetch_scale: bool = False  # tiled: load the next K tile's scale row one iteration ahead
    planes: bool = False  # tiled: the K tile as 8 nibble planes (packed words straight into the dot operand)


def pick(m: int, n: int, k: int, group_size: int, scale_bytes: int, device) -> TileConfig:
    """The W4A16 kernel and tiles for x (M, K) times the packed (K/8, N) weight with G = ``group_size``
    and ``scale_bytes``-byte scales (4: fp32, 2: fp16 / bf16) on ``device``."""
    sms = sm_count(device)
    weights = n * k
    tile_k = 128 if group_size == k else min(128, group_size)  # the deepest K tile inside a scale group
    # 17-256 rows of a large layer (above 32 rows only from 32 Mi weights), 128-deep tiles inside a
    # scale group: the weight as wgmma's register operand (M = 64: 4096x11008 29.7 vs 43.7 us tiled;
    # 4096x4096 stays tiled, 17.6 vs 16.1)
    if wgmma_serves(m, n, k, group_size):
        return wgmma_tile(m, n, k, sms)
    # 1-2 rows on layers up to 16 Mi weights with K <= 4096, and up to 16 rows on small layers: the
    # whole K strip per program, one DRAM trip, no split (M = 1: 1024x1024 5.3 -> 3.0 us, 4096x4096
    # 8.6 -> 7.6; 1024x1024 M = 8: 6.0 -> 4.0)
    if wholek_serves(m, n, k):
        return wholek_tile(m, k)
    # From 128 rows: dequantize once, then cuBLAS in fp16
    if m >= DEQUANT_MIN_M:
        return TileConfig(0, 0, 0, path="dequant")
    # One row of a layer of >= 4 Mi weights: CUDA-core FMAs over K splits (2.2-3.0x cuBLAS fp16;
    # at 1024x1024 the tiles were faster)
    if m <= 1 and weights >= FMA_MIN_WEIGHTS:
        cfg = TileConfig(1, 64, tile_k, num_warps=4, num_stages=3, path="fma")
        return cfg._replace(split_k=fma_split_k(m, n, k, cfg))
    # Small layers with short K (MiniLM's 384-wide inputs) up to 64 rows: few K steps, so no split-K,
    # whose reduce launch costs more than it buys (H200, M = 64: 384x384 5.6 -> 4.4 us, 384x1536 6.5 -> 4.9)
    if m <= 64 and k <= SHORT_K and weights <= SMALL_LAYER:
        return TileConfig(16, 64, tile_k, num_warps=4, num_stages=3, scale_after_dot=True)
    # 2-16 rows with 128-deep K tiles: 8 nibble planes, 2 warps (1.3-1.6x the plain tiles); 128 wide
    # from N = 8192 (8192x8192, M = 16: 23.0 vs 25.3 us); 64-wide tiles and 16-bit scales load the next
    # scale row one K tile ahead (11008x4096: 21.3 -> 18.5 us; 16-bit scales, 8192x28672: 74.8 -> 69.2)
    if m <= PLANES_MAX_M and tile_k == 128:
        block_n = 128 if n >= WIDE_N else 64
        cfg = TileConfig(16, block_n, 128, num_warps=2, num_stages=3, scale_after_dot=True, planes=True,
                         prefetch_scale=block_n == 64 or scale_bytes == 2)
        return cfg._replace(split_k=balanced_split_k(m, n, k, cfg, sms))
    # 2-16 rows with 32- or 64-channel groups: plain 16-row tiles, the balanced split (>= 2 programs
    # per SM in near-full waves: 7-14% faster on 8192x28672 and 11008x4096)
    if m <= PLANES_MAX_M:
        cfg = TileConfig(16, 64, tile_k, num_warps=4, num_stages=4, scale_after_dot=True)
        return cfg._replace(split_k=balanced_split_k(m, n, k, cfg, sms))
    # 17-64 rows: 64x64 tiles, scales after the dot, split-K to a program per SM
    if m <= 64:
        cfg = TileConfig(64, 64, tile_k, num_warps=4, num_stages=4, scale_after_dot=True)
        return cfg._replace(split_k=split_k_for(m, n, k, cfg, sms))
    # 65-127 rows: 128x128 tiles, the weight dequantized before the dot, 8 warps
    cfg = TileConfig(128, 128, min(64, tile_k), num_warps=8, num_stages=4)
    return cfg._replace(split_k=split_k_for(m, n, k, cfg, sms))


@functools.lru_cache(maxsize=PICK_CACHE_SIZE)
def cached_pick(m: int, n: int, k: int, group_size: int, scale_bytes: int, device) -> TileConfig:
    """:func:`pick`, remembered per argument tuple (``device`` as a tensor's, with its index)."""
    return pick(m, n, k, group_size, scale_bytes, device)


def wgmma_serves(m: int, n: int, k: int, group_size: int) -> bool:
    """Whether :func:`pick` gives this call the swapped nibble pairs (:mod:`compress_kernels.w4a16.wgmma`)."""
    if not (PLANES_MAX_M < m <= WGMMA_MAX_M and n * k > SMALL_LAYER and wgmma_supports(k, group_size)):
        return False
    return m <= 32 or n * k >= WGMMA_MIN_WEIGHTS


def wgmma_supports(k: int, group_size: int) -> bool:
    """Whether the swapped nibble pairs can serve the layer: 128-deep K tiles inside one scale group."""
    return k % PAIR_TILE == 0 and group_size % PAIR_TILE == 0


def wgmma_tile(m: int, n: int, k: int, sms: int) -> TileConfig:
    """Swapped nibble pairs: 32, 64 or 128 token rows per tile (the wgmma's N side), 64 or 128 channels
    (its M side), one warp group, 3 stages, the balanced split. At 33-64 rows, layers with few outputs
    and long rows (N <= 4096, K > 8192) take 256 channels and two warp groups, which share each x tile
    (11008x4096 at M = 64: 36.2 -> 31.0 us)."""
    block_m, block_n = (32, 64) if m <= 32 else ((64, 128) if m <= 64 else (128, 128))
    warps = 4
    if 32 < m <= 64 and n <= 4096 and k > 8192:
        block_n, warps = 256, 8
    cfg = TileConfig(block_m, block_n, PAIR_TILE, num_warps=warps, num_stages=3, path="wgmma")
    return cfg._replace(split_k=balanced_split_k(m, n, k, cfg, sms))


def wholek_serves(m: int, n: int, k: int) -> bool:
    """Whether :func:`pick` gives this call the whole-K-strip kernel (:mod:`compress_kernels.w4a16.wholek`)."""
    if k > WHOLEK_MAX_PICK_K:
        return False
    return (m <= WHOLEK_MAX_M and n * k <= WHOLEK_MAX_WEIGHTS) or (m <= PLANES_MAX_M and n * k <= SMALL_LAYER)


def wholek_block_k(k: int) -> int:
    """The power-of-two tile depth that holds all of K (at least 64, so a warp's rows are filled)."""
    return max(64, triton.next_power_of_2(k))


def wholek_tile(m: int, k: int) -> TileConfig:
    """The whole-K-strip kernel's tile. M <= 2: 16 columns and 8 warps up to 2048-deep strips, 8 columns
    and 4 warps beyond (wider tiles or fewer warps at K = 4096 spill registers: 2-20x slower). More
    rows (small layers only): 32 columns and 4 warps up to 1024-deep strips, 16 beyond."""
    block_k = wholek_block_k(k)
    if m <= WHOLEK_MAX_M:
        block_n, warps = (16, 8) if block_k <= 2048 else (8, 4)
    else:
        block_n, warps = (32, 4) if block_k <= 1024 else (16, 4)
    return TileConfig(1, block_n, block_k, num_warps=warps, num_stages=1, path="wholek")


def balanced_split_k(m: int, n: int, k: int, cfg: TileConfig, sms: int) -> int:
    """Smallest power-of-two K split giving >= 2 programs per SM with whole waves >= 85% full.

    A wave here is one program per SM; a last, partly filled wave leaves SMs idle while the rest
    stream. Each split keeps at least two K tiles, so the pipeline has something to overlap."""
    tiles = triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n)
    k_tiles = triton.cdiv(k, cfg.block_k)
    best, best_fill, split = 1, 0.0, 1
    while split <= 16 and (split == 1 or k_tiles // split >= 2):
        programs = tiles * split
        fill = programs / (triton.cdiv(programs, sms) * sms)
        if programs >= 2 * sms and fill >= 0.85:
            return split
        if fill > best_fill:  # under one wave, fill grows with the split: the most programs win
            best, best_fill = split, fill
        split *= 2
    return best


def fma_split_k(m: int, n: int, k: int, cfg: TileConfig) -> int:
    """The one-row kernel's K split: the smallest power of two giving >= ``FMA_MIN_PROGRAMS`` programs,
    then doubled while a split spans more than ``FMA_MAX_SPLIT_CHANNELS`` of K; never under two K tiles
    per split, at most 32. Grid ``m x cdiv(n, block_n) x split``; the kernel loads one K tile ahead, so
    a program wants a run of tiles. H100, M = 1: 4096x4096 and 11008x4096 fastest at split 8 (512
    programs; 16 was 15% and 9% slower), 4096x12288 at 4 (768 programs), 4096x22016 at 4 (2 spans
    2048 channels: 3% slower)."""
    tiles = m * triton.cdiv(n, cfg.block_n)
    k_tiles = triton.cdiv(k, cfg.block_k)

    def can_double(split):
        return split < 32 and k_tiles // (split * 2) >= 2

    split = 1
    while tiles * split < FMA_MIN_PROGRAMS and can_double(split):
        split *= 2
    while triton.cdiv(k, split) > FMA_MAX_SPLIT_CHANNELS and can_double(split):
        split *= 2
    return split
