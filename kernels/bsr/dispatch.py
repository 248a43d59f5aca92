"""The DDS dispatch table (fp16/bf16 blocks, :func:`pick`), from (M, N, K, stored blocks, device) to the
kernel and tiles that run, and what the DDS + W8A8 table (:mod:`compress_kernels.bsr_w8a8.dispatch`)
shares with it: :class:`BsrConfig`, the large-M dense path (:func:`densifies`) and the size thresholds.

Read the table top to bottom: the first row that matches decides. Each row says why, with the figure
measured on an H100 or H200 (us per call, the kernel benchmark's method; ``docs/kernels.md``). The
table depends on shapes and the number of stored blocks only (never on index values), so a call is the
same every time and can be captured in a CUDA graph. Being a pure function of its arguments, it is
remembered per argument tuple (:func:`cached_pick`: what the launchers call).

Kernels (``BsrConfig.kernel``):

* ``dense``: the weight written out dense (:mod:`compress_kernels.bsr.densify`), then cuBLAS (fp16)
  or the dense W8A8 kernels (int8);
* ``gemv``: :mod:`compress_kernels.bsr.gemv`, one token row per program on CUDA cores (DDS only);
* ``gemm``: :mod:`compress_kernels.bsr.gemm` (DDS) or :mod:`compress_kernels.bsr_w8a8.gemm`, tensor-core
  tiles over gathered blocks, a block row optionally shared by ``split`` programs;
* ``tiles``: :mod:`compress_kernels.bsr.tile_gemm` (DDS), for weights pruned in tiles of ``tile_rows`` block
  rows (``BlockSparseConfig(tile_rows=R)``): tensor-core tiles 32 R outputs wide.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import triton

from compress_kernels.common.device import sm_count, tma_capable
from compress_kernels.reference import BSR_BLOCK

DENSIFY_MIN_M = 2048  # from this many rows of x, on layers keeping at least
DENSIFY_MIN_DENSITY = 0.4  # this share of their blocks, the weight goes dense
MAX_GRID_Y = 65535  # CUDA's limit on the second grid dimension (block columns of the densify pass)
SMALL_LAYER = 2**20  # N * K at most this (1024x1024, BERT-small / MiniLM layers): the small-layer rows
SPLIT_MIN_BLOCKS_PER_ROW = 24  # M <= 64: share block rows at least this long among programs
SPLIT_MAX_BLOCK_ROWS_M64 = 128  # 16 < M <= 64: ... when there are at most this many block rows
SMALL_SPLIT_MIN_BLOCKS_PER_ROW = 20  # small layers, 16 < M <= 64: share block rows this long
GEMV_TWO_ROWS_MAX_BYTES = 16 * 2**20  # M = 2: the one-row kernel while the stored blocks take at most this
GEMV_FOUR_ROWS_MAX_BYTES = 4 * 2**20  # M = 3-4: ... at most this
GEMV_PREFETCH_BYTES = 8192  # one-row kernel: bytes of each block row's stored blocks prefetched into L2 ...
PREFETCH_MAX_WEIGHTS = 128 * 2**20  # ... on layers of at most this many weights (N * K)
TILES_MIN_M = 64  # tiled weights: the tile kernel from this many rows on (exclusive) ...
TILES_WIDE_MIN_M = 32  # ... or from this many on layers with a tile per SM
TILES_LONG_K = 4096  # ... with 8 warps from this K, at 2-4 programs per SM
TILES_MAX_WIDE_N = 128  # ... and 128-row tiles up to this many outputs wide
PICK_CACHE_SIZE = 4096  # argument tuples remembered by the cached picks (a model has a few shapes per M)


@dataclass(frozen=True)
class BsrConfig:
    """Launch parameters: which kernel, tile sizes and Triton's warps / pipelining depth."""

    kernel: str  # "dense", "gemv", "gemm" or "tiles"
    block_m: int  # rows of x per program (1 for gemv)
    block_n: int  # outputs per program: 8, 16 or 32 of one block row (32 tile_rows for "tiles")
    group: int  # stored blocks gathered per step (K-tile width 32 * group)
    num_warps: int
    num_stages: int
    split: int = 1  # programs sharing one block row's stored blocks (the last one to finish reduces; gemm, int4 gemv)
    prefetch: int = 0  # gemv: bytes of each block row's stored blocks prefetched into L2 (common.prefetch)


DENSE = BsrConfig("dense", 0, 0, 0, 0, 0)


def densifies(m: int, n: int, k: int, nnz: int) -> bool:
    """Whether a block-sparse launcher writes the weight out dense and runs a dense GEMM instead: at
    large M the block kernels run at about a third of a dense GEMM's rate (their 32-wide output tiles
    re-read every gathered x tile once per block row), so layers keeping >= 40% of their blocks go
    dense from M = 2048 (never for K beyond MAX_GRID_Y block columns, which the densify grid cannot hold)."""
    if k // BSR_BLOCK > MAX_GRID_Y:
        return False
    return m >= DENSIFY_MIN_M and nnz >= DENSIFY_MIN_DENSITY * (n // BSR_BLOCK) * (k // BSR_BLOCK)


def gemv_serves(m: int, stored_bytes: int) -> bool:
    """Whether the one-row kernel serves ``m`` rows of a layer whose stored blocks take ``stored_bytes``.

    Each row's programs read the stored blocks again, from L2 only while they fit there with room to
    spare: on an H100 the one-row kernel was the faster at M = 2 up to 16 MiB of blocks and at M = 3-4
    up to 4 MiB; beyond, the 16-row tiles were, by up to 3.3x (8192x28672 at 50%, M = 4: 327.7 vs 99.5 us)."""
    if m <= 1:
        return True
    limit = GEMV_TWO_ROWS_MAX_BYTES if m <= 2 else (GEMV_FOUR_ROWS_MAX_BYTES if m <= 4 else -1)
    return stored_bytes <= limit


def pick(m: int, n: int, k: int, nnz: int, device, can_prefetch: bool, tile_rows: int = 1) -> BsrConfig:
    """The DDS kernel and tiles for x (M, K) times the (N, K) weight with ``nnz`` stored 32x32 blocks on
    ``device``; ``can_prefetch``: the values can be bulk-prefetched
    (:func:`compress_kernels.common.prefetch.prefetch_allowed`); ``tile_rows``: the weight's block rows hold
    the same columns in tiles of that many (:func:`compress_kernels.bsr.indices.tile_rows_of`)."""
    few_programs = 2 * sm_count(device)  # about two programs per SM
    block_rows = n // BSR_BLOCK
    blocks_per_row = nnz / block_rows
    # Tiled weights past 64 rows on a GPU with TMA (from 33 rows on layers of a tile per SM): outputs 32 R wide,
    # each x tile read once per R block rows. H200, R = 4, 50%: faster than the free-block rows on every layer
    # from 576x576 and every M > 64 (4096x11008 at M = 256 1.12x against 0.44x cuBLAS; SmolLM2's 576x1536 at
    # M = 1,024 0.83x against 0.60x), within 4% on 576x192; at M = 64 only with a tile per SM (8192x28672 1.77x
    # against 1.04x; 8192x8192, 64 tiles: 0.91x against 0.97x). 128-row tiles once they give every SM a program,
    # else 64; 4 warps, 8 stages, but 8 warps on long K loops with 2-4 programs per SM (4096x4096 at M = 2,048
    # 1.34x against 1.24x; 8192x28672 at M = 256 1.50x against 1.24x; with K = 576 8 warps lost: 0.79x / 1.01x).
    # Tiles wider than 128 outputs (R = 8) always take 64 rows: 128 x 256 fp32 accumulators spill on 4 warps
    # (4096x4096 at M = 2,048: 0.21x cuBLAS) and ran 1.08-1.20x on 8 warps against 64 rows' 1.27-1.38x
    tiles = triton.cdiv(block_rows, tile_rows)
    if tile_rows > 1 and tma_capable(device) and (
            m > TILES_MIN_M or (m > TILES_WIDE_MIN_M and tiles >= sm_count(device))):
        programs = tiles * triton.cdiv(m, 128)
        if m <= TILES_MIN_M or programs < sm_count(device) or tile_rows * BSR_BLOCK > TILES_MAX_WIDE_N:
            return BsrConfig("tiles", 64, tile_rows * BSR_BLOCK, 1, 4, 8)
        warps = 8 if k >= TILES_LONG_K and few_programs <= programs <= 2 * few_programs else 4
        return BsrConfig("tiles", 128, tile_rows * BSR_BLOCK, 1, warps, 8)
    # From 2048 rows on layers keeping >= 40% of their blocks: dense weight, cuBLAS
    if densifies(m, n, k, nnz):
        return DENSE
    # One row, and 2-4 while the stored blocks stay in L2: memory bound. 8 outputs per program keeps
    # >= 4 programs per SM streaming; 16 blocks per step cover a whole 90%-sparse row in one step. Up
    # to 128 Mi weights the first 8 KB of each block row are prefetched into L2 (M = 1: 1-5% faster
    # from 4096x4096 to 8192x8192; 3% slower on 8192x28672 at 50%)
    if gemv_serves(m, nnz * BSR_BLOCK * BSR_BLOCK * 2):  # 16-bit values
        prefetch = GEMV_PREFETCH_BYTES if n * k <= PREFETCH_MAX_WEIGHTS and can_prefetch else 0
        return BsrConfig("gemv", 1, 8, 16, 4, 3, prefetch=prefetch)
    # Up to 16 rows, long block rows (>= 24 blocks) and at most ~2 programs per SM of them: 4 programs
    # share each block row (90%, M = 16: 11008x4096 12.1 -> 9.6 us; 8192x8192 at 50%, 256 block rows:
    # 35.0 vs 36.8); with more block rows the SMs are busy anyway (50%: 8192x28672 109.6 -> 103.0 unsplit)
    if m <= 16:
        if blocks_per_row >= SPLIT_MIN_BLOCKS_PER_ROW and block_rows <= few_programs:
            return BsrConfig("gemm", 16, 32, 4, 4, 3, split=4)
        return BsrConfig("gemm", 16, 32, 8, 4, 3)
    # Small layers at 17-64 rows or past 256: their own tiles (see small_layer_tile)
    if n * k <= SMALL_LAYER and (m <= 64 or m > 256):
        return small_layer_tile(m, block_rows, blocks_per_row, few_programs)
    # 17-64 rows: few long block rows shared by 4 programs (M = 64: 4096x4096 at 50% 19.8 -> 16.1 us,
    # 11008x4096 at 50% 42.6 -> 30.7); else more blocks per step when programs are few, fewer when many
    if m <= 64:
        block_m = 64 if m > 32 else 32
        if blocks_per_row >= SPLIT_MIN_BLOCKS_PER_ROW and block_rows <= SPLIT_MAX_BLOCK_ROWS_M64:
            return BsrConfig("gemm", block_m, 32, 4, 4, 3, split=4)
        programs = block_rows * triton.cdiv(m, block_m)
        return BsrConfig("gemm", block_m, 32, 8 if programs <= few_programs else 4, 4, 4)
    # 65-256 rows: 128-row tiles when they give ~2 programs per SM, else 64
    if m <= 256:
        if block_rows * triton.cdiv(m, 128) >= few_programs:
            return BsrConfig("gemm", 128, 32, 2, 4, 3)
        return BsrConfig("gemm", 64, 32, 4, 4, 3)
    # More rows (layers not densified): 256-row tiles, 2 blocks per step
    return BsrConfig("gemm", 256, 32, 2, 4, 3)


@functools.lru_cache(maxsize=PICK_CACHE_SIZE)
def cached_pick(m: int, n: int, k: int, nnz: int, device, can_prefetch: bool, tile_rows: int = 1) -> BsrConfig:
    """:func:`pick`, remembered per argument tuple (``device`` as a tensor's, with its index)."""
    return pick(m, n, k, nnz, device, can_prefetch, tile_rows)


def small_layer_tile(m: int, block_rows: int, blocks_per_row: float, few_programs: int) -> BsrConfig:
    """DDS on layers of at most ``SMALL_LAYER`` weights (few block rows) at 16 < M <= 64 or M > 256.

    Such a layer has too few block rows to give every SM a program with the large-layer tiles, so the
    tiles shrink until there are enough programs (tuned with L2-resident weights, as a MiniLM-size
    model runs, 50% blocks). At 16 < M <= 64: 16-row tiles (384x1152 at M = 64: 7.1 -> 6.6 us), and
    block rows of >= ``SMALL_SPLIT_MIN_BLOCKS_PER_ROW`` blocks shared by 4 programs (1536x384: 10.3 ->
    8.3 us). At M > 256: the largest of 256, 128 and 64 rows giving ``few_programs`` programs, else 64
    (1536x384 at M = 512: 23.1 -> 13.8 us).
    """
    if m <= 64:
        if blocks_per_row >= SMALL_SPLIT_MIN_BLOCKS_PER_ROW:
            return BsrConfig("gemm", 32, 32, 4, 4, 3, split=4)
        return BsrConfig("gemm", 16, 32, 8, 4, 3)
    for block_m in (256, 128):
        if block_rows * triton.cdiv(m, block_m) >= few_programs:
            return BsrConfig("gemm", block_m, 32, 2, 4, 3)
    return BsrConfig("gemm", 64, 32, 4, 4, 3)
