"""W8A8's dispatch table (compress_kernels/w8a8/dispatch.py): rows checked on the shapes they name.

Off CUDA the device facts are an H100's (132 SMs), so these picks are the H100's."""
from __future__ import annotations

import torch

import compress_kernels.w8a8.dispatch as dispatch
from compress_kernels.w8a8.dispatch import (POINTER_TILE, SMALL_LAYER_TILES, TMA_TILE, TileConfig, cached_pick,
                                            gemv_tile, pick, small_layer_tile)

CPU = torch.device("cpu")


def test_one_row_takes_the_one_row_kernel_unsplit():
    for n, k, block_k in ((4096, 4096, 1024), (4096, 11008, 1024), (384, 384, 512), (1152, 384, 512), (1024, 100, 128),
                          (28672, 8192, 512), (22016, 4096, 512)):  # wider than GEMV_WIDE_N: 512-deep steps
        cfg = pick(1, n, k, CPU)
        assert cfg.path == "gemv" and cfg.split_k == 1 and cfg.block_n == 8 and cfg.block_k == block_k
    assert not any(pick(m, 4096, 4096, CPU).path == "gemv" for m in (2, 16))
    assert all(pick(m, 1024, 1024, CPU).path == "gemv" for m in (2, 4))  # small layers up to 4 rows
    assert pick(5, 1024, 1024, CPU).path == "tiled"


def test_sixteen_row_tiles_are_narrow_up_to_64_mi_weights_and_unsplit():
    for m in (2, 8, 16):
        assert pick(m, 4096, 4096, CPU).block_n == 32 and pick(m, 4096, 11008, CPU).block_n == 32
        assert pick(m, 8192, 8192, CPU).block_n == 32  # 64 Mi weights: still narrow
        assert pick(m, 28672, 8192, CPU).block_n == 64  # 8192x28672: the 64-wide tile
        assert pick(m, 28672, 8192, CPU).split_k == 1 and pick(m, 4096, 4096, CPU).split_k == 1


def test_quantized_input_never_takes_the_one_row_kernel():
    assert pick(1, 4096, 4096, CPU, quantized=True) == pick(16, 4096, 4096, CPU)
    for m, n, k in ((1, 4096, 4096), (1, 384, 384), (16, 4096, 4096), (64, 1536, 384)):
        cfg = pick(m, n, k, CPU, quantized=True)
        assert cfg.path == "tiled" and cfg.block_m >= 16


def test_middle_rows_split_k_to_a_program_per_sm():
    cfg = pick(64, 4096, 4096, CPU)  # 2 x 64 tiles of 32x64: 128 < 132 programs, so 2 splits
    assert (cfg.block_m, cfg.block_n, cfg.block_k, cfg.split_k) == (32, 64, 256, 2)
    cfg = pick(256, 4096, 4096, CPU)  # 2 x 32 tiles of 128x128: 4 splits
    assert (cfg.block_m, cfg.block_n, cfg.num_warps, cfg.split_k) == (128, 128, 8, 4)


def test_large_m_takes_tma_tiles_or_the_pointer_tiles():
    assert pick(4096, 4096, 4096, CPU) == TMA_TILE
    assert pick(4096, 4096, 4096, CPU, tma_ok=False) == POINTER_TILE  # operands TMA cannot describe
    cfg = pick(257, 1024, 8192, CPU)  # 3 x 4 TMA tiles would need a K split: the pointer tiles, split
    assert cfg.path == "tiled" and (cfg.block_m, cfg.block_n) == (256, 128) and cfg.split_k > 1


def test_small_layers_take_a_filling_tile_without_split_k():
    for m, n, k in [(64, 384, 384), (256, 1536, 384), (2048, 384, 1536), (2048, 1536, 384)]:
        cfg = pick(m, n, k, CPU)
        assert cfg in SMALL_LAYER_TILES and cfg.split_k == 1
    assert pick(64, 384, 1536, CPU).split_k > 1  # M <= 64 with K >= 1024: split-K measured faster
    assert small_layer_tile(4096, 1536, 132) == SMALL_LAYER_TILES[0]
    assert small_layer_tile(17, 384, 132) == SMALL_LAYER_TILES[-1]  # none fills the GPU: the smallest


def test_the_sm_count_sizes_the_tiles():
    assert small_layer_tile(256, 1536, 132) == SMALL_LAYER_TILES[3]  # 8 x 24 tiles of 32x64 for 132 SMs
    assert small_layer_tile(256, 1536, 24) == SMALL_LAYER_TILES[0]  # a small GPU fills with the largest


def test_fast_dram_walks_layers_wider_than_8192_in_512_deep_steps():
    for n, k in ((11008, 4096), (14336, 4096), (12288, 4096)):
        assert gemv_tile(n, k, fast=True).block_k == 512 and gemv_tile(n, k).block_k == 1024
    for n, k in ((8192, 8192), (4096, 11008), (28672, 8192)):
        assert gemv_tile(n, k, fast=True) == gemv_tile(n, k)


def test_pick_reads_the_device_dram(monkeypatch):
    monkeypatch.setattr(dispatch, "fast_dram", lambda device: True)  # an H200's HBM3e
    assert pick(1, 11008, 4096, CPU).block_k == 512
    monkeypatch.setattr(dispatch, "fast_dram", lambda device: False)
    assert pick(1, 11008, 4096, CPU).block_k == 1024


def test_gemv_tile_rounds_short_k_up_to_a_power_of_two():
    assert gemv_tile(4096, 100) == TileConfig(1, 8, 128, path="gemv")
    assert gemv_tile(4096, 10).block_k == 32


def test_the_cached_pick_is_the_pick_remembered():
    for m, n, k, quantized, tma_ok in ((1, 4096, 4096, False, True), (1, 576, 576, True, True),
                                       (1024, 4096, 4096, False, False)):
        assert cached_pick(m, n, k, CPU, quantized, tma_ok) == pick(m, n, k, CPU, quantized=quantized, tma_ok=tma_ok)
    hits = cached_pick.cache_info().hits
    cached_pick(1, 4096, 4096, CPU, False, True)
    assert cached_pick.cache_info().hits == hits + 1
