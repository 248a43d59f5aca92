"""W8A8's dispatch table: which kernel and tiles run for (M, N, K) on a device.

Read :func:`pick` top to bottom: the first row that matches decides. Each row says why, with the
figure measured on an H100 (us per call, the kernel benchmark's method; ``docs/kernels.md``).
The table depends on shapes only (never on values), so a call is the same every time and can be
captured in a CUDA graph on its first run; there is no autotuning. Being a pure function of its
arguments, it is remembered per argument tuple (:func:`cached_pick`, what the launchers call).

Paths (``TileConfig.path``):

* ``gemv``: :mod:`compress_kernels.w8a8.gemv`, one token row per program on CUDA cores, the row
  quantized inside the kernel (one launch);
* ``tiled``: the per-token quantize pass (:func:`compress_kernels.common.quantize.quantize_rows`),
  then the int8 tensor-core GEMM of :mod:`compress_kernels.w8a8.gemm` (split-K when few tiles);
* ``tma``: the quantize pass, then the GEMM with TMA tile loads (:mod:`compress_kernels.w8a8.tma`).
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import triton

from compress_kernels.common.device import fast_dram, sm_count
from compress_kernels.common.splitk import split_k_for

SMALL_LAYER = 4 * 2**20  # N * K at most this (MiniLM's 384 / 1536): the layer sits in L2
NARROW_MAX_WEIGHTS = 64 * 2**20  # 2 <= M <= 16 up to this many weights: 32 outputs per program
GEMV_MAX_SMALL_M = 4  # small layers take the one-row kernel up to this many rows
GEMV_WIDE_N = 264 * 64  # wider layers walk K in 512-deep steps in the one-row kernel ...
GEMV_FAST_DRAM_WIDE_N = 8192  # ... wider than this on HBM3e GPUs
PICK_CACHE_SIZE = 4096  # argument tuples remembered by cached_pick (a model has a few shapes per M)


class TileConfig(NamedTuple):
    """Launch parameters: the path, tile sizes, K split, tile order group and Triton's warps / stages."""

    block_m: int
    block_n: int
    block_k: int
    split_k: int = 1
    group_m: int = 8
    num_warps: int = 4
    num_stages: int = 3
    path: str = "tiled"  # "gemv", "tiled" or "tma" (see the module docstring)


SMALL_M_TILE = TileConfig(16, 64, 256, num_warps=4, num_stages=5)
MID_M_TILE = TileConfig(32, 64, 256, num_warps=4, num_stages=4)
LARGE_M_TILE = TileConfig(128, 128, 128, num_warps=8, num_stages=4)
TMA_TILE = TileConfig(128, 256, 128, num_warps=8, num_stages=4, path="tma")  # 192 KB of shared memory
POINTER_TILE = TileConfig(256, 128, 128, num_warps=8, num_stages=3)  # M > 256 where TMA cannot run
SMALL_LAYER_TILES = (  # largest first; the first giving a tile per SM wins, else the last
    TileConfig(128, 128, 128, num_warps=8, num_stages=3),
    TileConfig(128, 64, 128, num_warps=8, num_stages=3),
    TileConfig(64, 64, 128, num_warps=4, num_stages=3),
    TileConfig(32, 64, 128, num_warps=4, num_stages=3),
)


def pick(m: int, n: int, k: int, device, quantized: bool = False, tma_ok: bool = True) -> TileConfig:
    """The W8A8 kernel and tiles for x (M, K) times w_q (N, K) on ``device``.

    ``quantized``: the input comes already quantized (``w8a8_matmul_quantized``), so the paths that
    quantize x themselves are out. ``tma_ok``: TMA descriptors can describe both int8 operands
    (:func:`compress_kernels.w8a8.tma.tma_ready`)."""
    sms = sm_count(device)
    small_layer = n * k <= SMALL_LAYER
    # Small layers past 16 rows: the largest tile that still gives every SM an output tile, no K
    # split; except M <= 64 with K >= 1024, where split-K is faster (1536x384, M = 64, H200: 9.3 vs 11.3 us)
    if small_layer and m > 16 and not (m <= 64 and k >= 1024):
        return small_layer_tile(m, n, sms)
    # One row, and up to 4 on small layers: the one-row kernel, K unsplit, no quantize launch
    # (H100, M = 1: 4096x4096 11.7 -> 10.0 us, 8192x28672 101.6 -> 97.2, 1024x1024 5.6 -> 3.9 against
    # the split one-row tiles; M = 4, 1024x1024: 5.5 -> 4.5; from M = 2 on larger layers it lost,
    # 4096x4096 M = 2: 14.0 vs 12.0). An already quantized input takes the 16-row tile instead.
    if m == 1 or (m <= GEMV_MAX_SMALL_M and small_layer):
        return small_m_tile(n, k) if quantized else gemv_tile(n, k, fast_dram(device))
    # 2-16 rows: the 16-row tile, no K split (slower at every shape measured, even summed in the kernel)
    if m <= 16:
        return small_m_tile(n, k)
    # 17-64 rows: 32x64x256 tiles split over K to a program per SM (8192x8192, M = 64: 35.1 us,
    # 64-row tiles 39.5)
    if m <= 64:
        return MID_M_TILE._replace(split_k=split_k_for(m, n, k, MID_M_TILE, sms))
    # 65-256 rows: 128x128x128, 8 warps (4096x4096, M = 256: 24.0 us, 128x256 tiles 35.7)
    if m <= 256:
        return LARGE_M_TILE._replace(split_k=split_k_for(m, n, k, LARGE_M_TILE, sms))
    # More rows: 128x256x128 tiles loaded by TMA, when they fill the GPU unsplit and TMA can describe
    # the operands (M = 2048 / 8192: 1.2-1.5x the pointer-loaded tiles); else 256x128 pointer tiles
    if tma_ok and split_k_for(m, n, k, TMA_TILE, sms) == 1:
        return TMA_TILE
    return POINTER_TILE._replace(split_k=split_k_for(m, n, k, POINTER_TILE, sms))


@functools.lru_cache(maxsize=PICK_CACHE_SIZE)
def cached_pick(m: int, n: int, k: int, device, quantized: bool = False, tma_ok: bool = True) -> TileConfig:
    """:func:`pick`, remembered per argument tuple (``device`` as a tensor's, with its index)."""
    return pick(m, n, k, device, quantized=quantized, tma_ok=tma_ok)


def small_layer_tile(m: int, n: int, sms: int) -> TileConfig:
    """Largest tile of ``SMALL_LAYER_TILES`` that still gives each of ``sms`` SMs an output tile (no split)."""
    for cfg in SMALL_LAYER_TILES:
        if triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n) >= sms:
            return cfg
    return SMALL_LAYER_TILES[-1]


def small_m_tile(n: int, k: int) -> TileConfig:
    """The 16-row tile at 2 <= M <= 16 (no split-K): 32 outputs per program on layers of at most
    ``NARROW_MAX_WEIGHTS`` weights, else 64. H100, M = 4, 8 and 16: the 32-wide tile (twice the
    programs) was 2-5% faster from 4096x4096 to 11008x4096, level on 8192x8192 and 1% slower on
    8192x28672."""
    if n * k <= NARROW_MAX_WEIGHTS:
        return SMALL_M_TILE._replace(block_n=32)
    return SMALL_M_TILE


def gemv_tile(n: int, k: int, fast: bool = False) -> TileConfig:
    """The one-row kernel without a K split: 8 outputs per program (N / 8 programs), K walked in
    1024-deep steps (512 on layers wider than ``GEMV_WIDE_N``, or ``GEMV_FAST_DRAM_WIDE_N`` on ``fast``
    DRAM; one step of K rounded up to a power of two when K is shorter). Unsplit, the output has the
    bits of the quantize pass + GEMM path.

    On an H200 the 512-deep steps win from 8192 outputs up (M = 1, us: 4096x14336 25.8 -> 23.0, 4096x11008
    20.7 -> 20.0) but not at 8192 (8192x8192 27.1 -> 32.2); the wider layers were 512-deep already."""
    deep = 512 if n > (GEMV_FAST_DRAM_WIDE_N if fast else GEMV_WIDE_N) else 1024
    return TileConfig(1, 8, min(deep, max(32, triton.next_power_of_2(k))), num_warps=4, num_stages=3, path="gemv")
