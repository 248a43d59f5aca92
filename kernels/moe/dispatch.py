"""The grouped MoE kernels' table: BLOCK_M and the tiles of each projection, from the shapes alone.

Read :func:`pick` top to bottom. It depends on the scheme, the number of (token, slot) pairs P = T k, the
experts E, the hidden size H, the intermediate size I and the weights' scale groups, never on the ids
(so a shape launches the same kernels every time and a CUDA graph can capture it). Remembered per
argument tuple (:func:`cached_pick`).

The rows an expert gets are unknown until the router runs; the table sizes BLOCK_M for the mean over
the experts that can be hit, ``rows = ceil(P / min(P, E))`` (decode: 1-2 rows per expert; a 512-token
prefill of a top-2 8-expert layer: 128).

* BLOCK_M: W4A16 with at most ``FMA_MAX_ROWS`` rows per expert: 1, the one-row CUDA-core kernel
  (:mod:`compress_kernels.moe.w4a16_fma`; the dense W4A16 table's M = 1 path, H200 8192x28672 61 us against
  115 us for the 16-row tiles at M = 16), with the down projection split as that path splits
  (:func:`compress_kernels.w4a16.dispatch.fma_split_k`) and gate/up 32 columns wide when 64 would give fewer
  than ``FMA_MIN_PROGRAMS`` programs (it reads the weights once per row, so two rows already lose to a
  16-row tile: H200 Mixtral layer, 8 tokens, 513 us against 374 us). Otherwise 16 rows up to 16 (the
  smallest tensor-core tile; each program reads its expert's weight tile once for all its rows), 32 up to
  32, 64 up to 64, then 128 for W4A16 and W8A8 (fewer weight re-reads: Mixtral layer, 512 tokens, W4A16
  1,608 us against 1,808 us with 64 rows; the 2048x7168 layer within 2%), 64 for W8A16.
* gate/up: ``block_n`` gate columns (and the same up columns) per program, so the SwiGLU of a column
  pair happens in the epilogue; no K split (the activation needs the whole sum). Programs:
  blocks x I / block_n (Mixtral decode, 2 experts hit: 2 x 14336 / 64 = 448).
* down: ``block_n`` hidden columns per program and a K split so that at least ``MIN_PROGRAMS_PER_SM``
  programs per SM stream weights when few experts are hit (Mixtral decode: 2 experts x 4096 / 64 x 4
  splits = 512 programs); the fp32 partials are summed by the top-k combine kernel, which reads them anyway.
  W4A16 16-row plane tiles of the down projection run 2 warps (Mixtral layer, 64 tokens: 494 us against
  553 us with 4).
* BLOCK_M 64 / 128: an expert's last block, when it holds at most ``SHORT_ROWS`` (16) pairs, runs 16-row
  tiles, so a few rows past a multiple of BLOCK_M do not cost a whole block of MMAs (H200, bf16, random
  top-2 routing over 8 experts. W4A16, Mixtral layer: 512 tokens 1,784 -> 1,534 us, 2,048 tokens 5,308 ->
  5,216; the 2048x7168 layer at 512 534 -> 425; BLOCK_M 64 at 256 tokens 1,358 -> 1,267; 32-row short
  tiles were 3-4% better at 1,024-2,048 tokens and 2-3% worse at 512, where the target is. W8A8 at 512
  tokens: Mixtral layer 869 -> 660-682 us, 2048x7168 288 -> 216; W8A16 (BLOCK_M 64): 1,648 -> 1,601-1,626,
  422 -> 396-400).
* W4A16 K tiles stay inside one scale group (``block_k`` divides G, or G = K); with 128-deep tiles at
  16 rows the packed words go into the dot as 8 nibble planes (:mod:`compress_kernels.w4a16.tiled`), 4
  pipeline stages on both projections (H200, bf16: the 2048x7168 layer 1.5-2.6% faster than 3 stages at
  8-64 tokens, Mixtral's 4096x14336 within 1%).

W4A16 rows are from ``scripts/tune/moe.py`` on an H200 (Mixtral 4096x14336 and 2048x7168 layers, 8 / 64 /
512 tokens); the W8A8 and W8A16 rows are still the dense tables' picks for the rows per expert.
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import triton

from compress_kernels.common.device import sm_count
from compress_kernels.w4a16.dispatch import FMA_MIN_PROGRAMS, fma_split_k

SCHEMES = ("w4a16", "w8a8", "w8a16")
MIN_PROGRAMS_PER_SM = 2  # down projection: split K until the hit experts' tiles give this many programs per SM
MIN_SPLIT_TILES = 4  # ... while each split keeps at least this many K tiles
MAX_SPLIT = 16
FMA_MAX_ROWS = 1  # W4A16: up to this many rows per expert (Mixtral, top-2 of 8: up to 4 tokens), one row per program
SHORT_ROWS = 16  # at BLOCK_M 64 and 128: the tile rows of an expert's last block when it holds that few pairs


class ProjectionTiles(NamedTuple):
    """Tiles of one grouped projection (gate/up or down)."""

    block_n: int
    block_k: int
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 3
    scale_after_dot: bool = False  # W4A16, grouped W8A16: scale the fp32 product (else dequantize before the dot)
    planes: bool = False  # W4A16: the K tile as 8 nibble planes (needs block_k 128)
    short_rows: int = 0  # a block with at most this many pairs (an expert's last) runs tiles of this many rows


class MoeConfig(NamedTuple):
    """BLOCK_M (the routing's padding) and the tiles of the two projections."""

    block_m: int
    gate_up: ProjectionTiles
    down: ProjectionTiles


def rows_per_expert(num_pairs: int, num_experts: int) -> int:
    """The mean rows of an expert that is hit, if the pairs spread over as many experts as they can."""
    return -(-num_pairs // max(1, min(num_pairs, num_experts)))


def block_m_for(scheme: str, rows: int) -> int:
    if scheme == "w4a16" and rows <= FMA_MAX_ROWS:
        return 1
    if rows <= 16:
        return 16
    if rows <= 32:
        return 32
    return 128 if scheme != "w8a16" and rows > 64 else 64


def down_split(num_pairs: int, num_experts: int, block_m: int, hidden: int, k: int, tiles: ProjectionTiles,
               sms: int) -> int:
    """K splits of the down projection: the smallest power of two giving ``MIN_PROGRAMS_PER_SM`` programs
    per SM over the blocks the pairs fill, each split keeping ``MIN_SPLIT_TILES`` K tiles."""
    hit = max(1, min(num_pairs, num_experts))
    blocks = hit * triton.cdiv(rows_per_expert(num_pairs, num_experts), block_m)
    programs = blocks * triton.cdiv(hidden, tiles.block_n)
    split = 1
    while (programs * split < MIN_PROGRAMS_PER_SM * sms and split < MAX_SPLIT
           and k >= 2 * split * MIN_SPLIT_TILES * tiles.block_k):
        split *= 2
    return split


def short_tile_rows(tiles: ProjectionTiles, block_m: int) -> int:
    """The kernels' SHORT_ROWS: ``tiles.short_rows`` where it is below BLOCK_M, else BLOCK_M (no short tiles)."""
    return tiles.short_rows if 0 < tiles.short_rows < block_m else block_m


def _w4a16_tile_k(group_size: int, k: int) -> int:
    """The deepest K tile inside one scale group, at most 128."""
    return 128 if group_size == k else min(128, group_size)


def _w4a16_tiles(block_m: int, group_size: int, k: int, block_n: int, warps_16: int = 4) -> ProjectionTiles:
    tile_k = _w4a16_tile_k(group_size, k)
    if block_m == 16 and tile_k == 128:  # decode: nibble planes straight into the dot (dense 2-16 rows: 1.3-1.6x)
        return ProjectionTiles(block_n, 128, num_warps=warps_16, num_stages=4, planes=True)
    if block_m <= 32:  # exact integer operands, the fp32 product scaled once per tile (dense 17-64 rows)
        return ProjectionTiles(block_n, tile_k, num_warps=4, num_stages=4, scale_after_dot=True)
    # more rows: the tile dequantized to x's dtype before the dot, the accumulator stays in the tensor cores
    return ProjectionTiles(block_n, min(64, tile_k), num_warps=4, num_stages=3)


def _int8_tiles(scheme: str, block_m: int, grouped: bool, block_n: int) -> ProjectionTiles:
    if scheme == "w8a8":
        return ProjectionTiles(block_n, 128, num_warps=8 if block_m == 128 else 4, num_stages=3 if block_m > 32 else 4)
    # W8A16: the int8 tile converted to x's dtype in registers; grouped scales (128) once per K tile
    block_k = 128 if block_m <= 32 or grouped else 64
    return ProjectionTiles(block_n, block_k, num_warps=4, num_stages=3 if block_m > 32 else 4,
                           scale_after_dot=grouped and block_m <= 32)


def pick(scheme: str, num_pairs: int, num_experts: int, hidden: int, gate_up_k: int, down_k: int, gate_up_group: int,
         down_group: int, device, block_m: int | None = None) -> MoeConfig:
    """Tiles for ``scheme`` on P = ``num_pairs`` pairs over E experts, H = ``hidden``; ``*_k``: the K of each
    projection's weight (padded: gate/up's covers H, down's I); ``*_group``: its scale group (W4A16: G, its K
    for per-channel scales; W8A16: 128 with group scales, else 0; W8A8: 0). ``block_m``: the table's tiles
    for that BLOCK_M instead of its own choice (the sweep, ``scripts/tune/moe.py``)."""
    if scheme not in SCHEMES:
        raise ValueError(f"scheme: expected one of {SCHEMES}, got {scheme!r}")
    if block_m is None:
        block_m = block_m_for(scheme, rows_per_expert(num_pairs, num_experts))
    elif block_m not in (1, 16, 32, 64, 128) or (block_m == 1 and scheme != "w4a16"):
        raise ValueError(f"block_m: expected 16, 32, 64 or 128 (or 1 for w4a16), got {block_m}")
    wide = 128 if block_m >= 64 else 64  # down columns per program; gate/up takes half (it holds 2 accumulators)
    if block_m == 1:  # W4A16, one row per program: the dense one-row kernel's tiles
        gate_up = ProjectionTiles(64, _w4a16_tile_k(gate_up_group, gate_up_k), num_stages=3)
        if num_pairs * triton.cdiv(down_k, 64) < FMA_MIN_PROGRAMS:
            gate_up = gate_up._replace(block_n=32)
        down = ProjectionTiles(64, _w4a16_tile_k(down_group, down_k), num_stages=3)
        return MoeConfig(1, gate_up, down._replace(split_k=fma_split_k(num_pairs, hidden, down_k, down)))
    if scheme == "w4a16":
        gate_up = _w4a16_tiles(block_m, gate_up_group, gate_up_k, 64)
        down = _w4a16_tiles(block_m, down_group, down_k, wide, warps_16=2)
    else:
        gate_up = _int8_tiles(scheme, block_m, gate_up_group != 0, 64)
        down = _int8_tiles(scheme, block_m, down_group != 0, wide)
    short = SHORT_ROWS if block_m >= 64 else 0
    split = down_split(num_pairs, num_experts, block_m, hidden, down_k, down, sm_count(device))
    return MoeConfig(block_m, gate_up._replace(short_rows=short), down._replace(split_k=split, short_rows=short))


@functools.lru_cache(maxsize=1024)
def _cached(scheme, num_pairs, num_experts, hidden, gate_up_k, down_k, gate_up_group, down_group, device) -> MoeConfig:
    return pick(scheme, num_pairs, num_experts, hidden, gate_up_k, down_k, gate_up_group, down_group, device)


def cached_pick(scheme: str, num_pairs: int, num_experts: int, hidden: int, gate_up_k: int, down_k: int,
                gate_up_group: int, down_group: int, device) -> MoeConfig:
    """:func:`pick`, remembered per argument tuple."""
    return _cached(scheme, num_pairs, num_experts, hidden, gate_up_k, down_k, gate_up_group, down_group, str(device))
