"""Block-scaled W8A8's dispatch table (compress_kernels/w8a8_block/dispatch.py): rows checked on the shapes they name.

Off CUDA the device facts are an H100's (132 SMs), so these picks are the H100's."""
from __future__ import annotations

import torch

from compress_kernels.w8a8_block.dispatch import POINTER_TILE, TMA_HALF_TILE, TMA_TILE, cached_pick, pick

CPU = torch.device("cpu")


def test_every_pick_steps_one_scale_block():
    for m in (1, 16, 17, 64, 65, 256, 257, 8192):
        for int8_out in (False, True):
            cfg = pick(m, 4096, 4096, CPU, int8_out=int8_out)
            assert cfg.block_k == 128, cfg
            assert not int8_out or cfg.block_n == 128, cfg


def test_small_m_splits_k():
    cfg = pick(1, 4096, 4096, CPU)  # 64 tiles of 16 x 64: split 4 ways to reach a program per SM
    assert (cfg.block_m, cfg.block_n, cfg.split_k, cfg.path) == (16, 64, 4, "tiled")
    assert pick(16, 28672, 8192, CPU).split_k == 1  # 448 tiles fill the GPU unsplit
    assert pick(8, 4096, 4096, CPU, int8_out=True).block_n == 128


def test_mid_m_tiles():
    cfg = pick(64, 4096, 4096, CPU)
    assert (cfg.block_m, cfg.block_n) == (32, 128) and cfg.split_k == 4
    cfg = pick(256, 4096, 4096, CPU)  # 64 x 128 tiles: 128 tiles, 2 splits
    assert (cfg.block_m, cfg.split_k) == (64, 2)


def test_large_m_takes_tma_tiles_or_the_pointer_tiles():
    assert pick(2048, 4096, 4096, CPU) == TMA_TILE and (TMA_TILE.block_m, TMA_TILE.num_warps) == (128, 4)
    assert pick(512, 4096, 4096, CPU) == TMA_HALF_TILE  # 128 tiles of 128 rows: 64-row tiles instead
    assert pick(512, 28672, 8192, CPU) == TMA_TILE  # 896 tiles fill the GPU
    assert pick(2048, 4096, 4096, CPU, tma_ok=False) == POINTER_TILE
    assert cached_pick(8192, 28672, 8192, CPU) is cached_pick(8192, 28672, 8192, CPU)
