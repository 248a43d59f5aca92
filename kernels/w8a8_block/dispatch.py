"""Block-scaled W8A8's dispatch table: which kernel and tiles run for (M, N, K) on a device.

Read :func:`pick` top to bottom: the first row that matches decides. The table depends on shapes only
(never on values), so a call is the same every time and can be captured in a CUDA graph on its first
run; there is no autotuning. It is remembered per argument tuple (:func:`cached_pick`, what the
launchers call). Every config has BLOCK_K = 128, the scale block, so each K step does one rescale.

The rows start from what W8A8 (per channel) measured on an H100 (``docs/kernels.md``) and from the
register budget of the block-scaled step (an fp32 running sum and an int32 product live together);
they are not timed on a GPU yet. A row changes when a measurement shows a neighbour faster, its
comment then carrying the figure.

Paths (``TileConfig.path``):

* ``tiled``: :mod:`compress_kernels.w8a8_block.gemm`, pointer-loaded tiles, split-K summed by the
  last split in the kernel; with ``quantize_x`` the kernel quantizes float x's tiles itself (no
  quantize launch: small M), else the quantize pass runs first;
* ``tma``: the quantize pass, then :mod:`compress_kernels.w8a8_block.tma` (large M).

An int8 output (the next layer's 1 x 128 format) needs BLOCK_N = 128: a tile then owns its scales.
"""
from __future__ import annotations

import functools
from typing import NamedTuple

from compress_kernels.common.device import sm_count
from compress_kernels.common.splitk import split_k_for
from compress_kernels.reference import SCALE_BLOCK

SMALL_M = 16  # up to here: 16-row tiles, x quantized in the kernel
MID_M = 64  # up to here: 32-row tiles, x quantized in the kernel
LARGE_M = 256  # up to here: 64-row tiles after the quantize pass, split-K; above, 128 x 128 unsplit
PICK_CACHE_SIZE = 4096  # argument tuples remembered by cached_pick (a model has a few shapes per M)


class TileConfig(NamedTuple):
    """Launch parameters: tile sizes, K split, tile order group, Triton's warps / stages, the path and
    whether the tiled kernel quantizes float x itself (``quantize_x``)."""

    block_m: int
    block_n: int
    block_k: int = SCALE_BLOCK
    split_k: int = 1
    group_m: int = 8
    num_warps: int = 4
    num_stages: int = 3
    path: str = "tiled"  # "tiled" or "tma" (see the module docstring)
    quantize_x: bool = False


TMA_TILE = TileConfig(128, 128, num_warps=8, num_stages=4, path="tma")  # 4 x 32 KB stages of int8 tiles
POINTER_TILE = TileConfig(128, 128, num_warps=8, num_stages=3)  # large M where TMA cannot describe the operands


def pick(m: int, n: int, k: int, device, quantized: bool = False, int8_out: bool = False,
         tma_ok: bool = True) -> TileConfig:
    """The kernel and tiles for x (M, K) times w_q (N, K) on ``device``.

    ``quantized``: x comes as int8 + scales (no in-kernel quantization); ``int8_out``: the output is
    written as int8 + 1 x 128 scales (128-wide tiles); ``tma_ok``: TMA descriptors can describe both
    int8 operands."""
    sms = sm_count(device)
    wide = SCALE_BLOCK if int8_out else 64
    # 1-16 rows: 16-row tiles (the smallest tensor-core tile), 64 columns (twice the programs of
    # 128), x quantized in the kernel (W8A8 found the quantize launch the largest cost at small M),
    # K split to a program per SM: the weight stream is the work
    if m <= SMALL_M:
        cfg = TileConfig(16, wide, num_warps=4, num_stages=4, quantize_x=not quantized)
        return cfg._replace(split_k=split_k_for(m, n, k, cfg, sms))
    # 17-64 rows: 32-row tiles, still quantized in the kernel, split-K
    if m <= MID_M:
        cfg = TileConfig(32, SCALE_BLOCK, num_warps=4, num_stages=4, quantize_x=not quantized)
        return cfg._replace(split_k=split_k_for(m, n, k, cfg, sms))
    # 65-256 rows: the quantize pass, then 64 x 128 tiles split to a program per SM
    if m <= LARGE_M:
        cfg = TileConfig(64, SCALE_BLOCK, num_warps=4, num_stages=4)
        return cfg._replace(split_k=split_k_for(m, n, k, cfg, sms))
    # More rows: 128 x 128 TMA tiles, 8 warps, unsplit (the fp32 sum and the int32 step product
    # together fill 128 registers a thread; 128 x 256 would spill); pointer tiles when TMA cannot run
    return TMA_TILE if tma_ok else POINTER_TILE


@functools.lru_cache(maxsize=PICK_CACHE_SIZE)
def cached_pick(m: int, n: int, k: int, device, quantized: bool = False, int8_out: bool = False,
                tma_ok: bool = True) -> TileConfig:
    """:func:`pick`, remembered per argument tuple (``device`` as a tensor's, with its index)."""
    return pick(m, n, k, device, quantized=quantized, int8_out=int8_out, tma_ok=tma_ok)
