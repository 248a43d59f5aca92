"""Block-scaled W8A8's dispatch table: which kernel and tiles run for (M, N, K) on a device.

Read :func:`pick` top to bottom: the first row that matches decides. The table depends on shapes only
(never on values), so a call is the same every time and can be captured in a CUDA graph on its first
run; there is no autotuning. It is remembered per argument tuple (:func:`cached_pick`, what the
launchers call). Every config has BLOCK_K = 128, the scale block, so each K step does one rescale.

The rows start from what W8A8 (per channel) measured on an H100 (``docs/kernels.md``) and from the
register budget of the block-scaled step (an fp32 running sum and an int32 product live together);
``python -m scripts.tune.w8a8_block`` timed them on an H100 (figures in the rows' comments); a row
changes when a measurement shows a neighbour faster.

Paths (``TileConfig.path``):

* ``tiled``: the quantize pass (float x), then :mod:`compress_kernels.w8a8_block.gemm`, pointer-loaded
  tiles, split-K summed by the last split in the kernel;
* ``tma``: the quantize pass, then :mod:`compress_kernels.w8a8_block.tma` (large M).

An int8 output (the next layer's 1 x 128 format) needs BLOCK_N = 128: a tile then owns its scales.
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import triton

from compress_kernels.common.device import sm_count
from compress_kernels.common.splitk import split_k_for
from compress_kernels.reference import SCALE_BLOCK

SMALL_M = 16  # up to here: 16-row tiles after the quantize pass, split-K
MID_M = 64  # up to here: 32-row tiles after the quantize pass, split-K
LARGE_M = 256  # up to here: 64-row tiles after the quantize pass, split-K; above, TMA tiles unsplit
PICK_CACHE_SIZE = 4096  # argument tuples remembered by cached_pick (a model has a few shapes per M)


class TileConfig(NamedTuple):
    """Launch parameters: tile sizes, K split, tile order group, Triton's warps / stages, the path."""

    block_m: int
    block_n: int
    block_k: int = SCALE_BLOCK
    split_k: int = 1
    group_m: int = 8
    num_warps: int = 4
    num_stages: int = 3
    path: str = "tiled"  # "tiled" or "tma" (see the module docstring)


TMA_TILE = TileConfig(128, 128, num_warps=4, num_stages=3, path="tma")  # 3 x 32 KB stages of int8 tiles
TMA_HALF_TILE = TileConfig(64, 128, num_warps=4, num_stages=3, path="tma")  # when 128-row tiles are too few
TMA_MIN_TILES_PER_SM = 3  # 128-row TMA tiles per SM below which the rows are split into 64-row tiles
POINTER_TILE = TileConfig(128, 128, num_warps=8, num_stages=3)  # large M where TMA cannot describe the operands


def pick(m: int, n: int, k: int, device, int8_out: bool = False, tma_ok: bool = True) -> TileConfig:
    """The kernel and tiles for int8 x (M, K) times w_q (N, K) on ``device`` (a float x is quantized by
    the quantize pass first).

    ``int8_out``: the output is written as int8 + 1 x 128 scales (128-wide tiles); ``tma_ok``: TMA
    descriptors can describe both int8 operands."""
    sms = sm_count(device)
    wide = SCALE_BLOCK if int8_out else 64
    # 1-16 rows: 16-row tiles (the smallest tensor-core tile), 64 columns (twice the programs of
    # 128), K split to a program per SM: the weight stream is the work. x comes from the quantize
    # pass: quantizing it in the kernel instead (each column tile again) was slower in every cell of
    # the H100 sweep, 4096x11008 M = 1 23.8 -> 44.5 us, 8192x28672 M = 16 100.4 -> 117.1
    if m <= SMALL_M:
        cfg = TileConfig(16, wide, num_warps=4, num_stages=4)
        return cfg._replace(split_k=split_k_for(m, n, k, cfg, sms))
    # 17-64 rows: 32-row tiles, split-K (H100, M = 64: 8192x28672 147.1 us, 1.23x cuBLAS)
    if m <= MID_M:
        cfg = TileConfig(32, SCALE_BLOCK, num_warps=4, num_stages=4)
        return cfg._replace(split_k=split_k_for(m, n, k, cfg, sms))
    # 65-256 rows: the quantize pass, then 64 x 128 tiles split to a program per SM
    if m <= LARGE_M:
        cfg = TileConfig(64, SCALE_BLOCK, num_warps=4, num_stages=4)
        return cfg._replace(split_k=split_k_for(m, n, k, cfg, sms))
    # More rows: 128 x 128 TMA tiles, one warp group, 3 stages, unsplit (H100, M = 2048, against 8 warps:
    # 11008x4096 292.4 -> 259.8 us, 8192x28672 1354.4 -> 1181.6; faster in 9 of 10 cells at M = 2048 and
    # 8192, 2% slower at 4096x4096 M = 2048; Triton's warp specialization of the 8-warp loop gained 0-4%).
    # Fewer than 3 such tiles per SM: 64-row tiles (M = 512: 4096x11008 83.5 -> 63.8 us, 11008x4096
    # 89.9 -> 65.0; 2% behind at 8192x8192, whose 256 tiles are just under the line). Pointer tiles when
    # TMA cannot run
    if not tma_ok:
        return POINTER_TILE
    if triton.cdiv(m, TMA_TILE.block_m) * triton.cdiv(n, TMA_TILE.block_n) < TMA_MIN_TILES_PER_SM * sms:
        return TMA_HALF_TILE
    return TMA_TILE


@functools.lru_cache(maxsize=PICK_CACHE_SIZE)
def cached_pick(m: int, n: int, k: int, device, int8_out: bool = False, tma_ok: bool = True) -> TileConfig:
    """:func:`pick`, remembered per argument tuple (``device`` as a tensor's, with its index)."""
    return pick(m, n, k, device, int8_out=int8_out, tma_ok=tma_ok)
