"""W8A16's dispatch table (compress_kernels/w8a16/dispatch.py): rows checked on the shapes they name.

Off CUDA the device facts are an H100's (132 SMs), so these picks are the H100's."""
from __future__ import annotations

import pytest
import torch

import compress_kernels.w8a16.dispatch as dispatch
from compress_kernels.w8a16.dispatch import DEQUANT_MIN_M, GROUP_SIZE, cached_pick, gemv_tile, pick

CPU = torch.device("cpu")


def test_one_row_takes_the_one_row_kernel():
    for n, k, block_k in ((4096, 4096, 1024), (4096, 11008, 1024), (11008, 4096, 1024), (28672, 8192, 512),
                          (22016, 4096, 512)):  # wider than GEMV_WIDE_N: 512-deep steps
        cfg = pick(1, n, k, False, CPU)
        assert cfg.path == "gemv" and cfg.block_n == 4 and cfg.block_k == block_k and cfg.split_k == 1
        assert cfg.num_warps == 2
    assert all(pick(m, 1024, 1024, False, CPU).path == "gemv" for m in (2, 4))  # small layers up to 4 rows
    assert pick(5, 1024, 1024, False, CPU).path == "tiled" and pick(2, 4096, 4096, False, CPU).path == "tiled"


@pytest.mark.parametrize("n,k", [(4096, 4096), (11008, 4096), (8192, 8192), (4096, 11008), (28672, 8192),
                                 (22016, 4096), (384, 1152)])
def test_fast_dram_gives_layers_from_8192_outputs_8_per_program_and_512_deep_steps(n, k):
    h100 = gemv_tile(1, n, k, False, 132)
    h200 = gemv_tile(1, n, k, False, 132, fast=True)
    if n >= 8192:
        assert (h200.block_n, h200.block_k, h200.num_warps, h200.split_k) == (8, 512, 2, 1)
        assert h100.block_n == 4
    else:
        assert h200 == h100
    assert gemv_tile(1, n, k, True, 132, fast=True) == gemv_tile(1, n, k, True, 132)  # grouped scales: one row


def test_pick_reads_the_device_dram(monkeypatch):
    monkeypatch.setattr(dispatch, "fast_dram", lambda device: True)  # an H200's HBM3e
    assert pick(1, 28672, 8192, False, CPU) == gemv_tile(1, 28672, 8192, False, 132, fast=True)
    assert pick(1, 28672, 8192, False, CPU).block_n == 8
    monkeypatch.setattr(dispatch, "fast_dram", lambda device: False)
    assert pick(1, 28672, 8192, False, CPU).block_n == 4


def test_small_layers_split_k_with_shorter_tiles():
    cfg = pick(1, 1024, 1024, False, CPU)  # 256 programs unsplit: 512-deep tiles in 2 splits
    assert (cfg.block_k, cfg.split_k) == (512, 2) and 256 * cfg.split_k >= 2 * 132
    cfg = pick(1, 384, 384, False, CPU)  # MiniLM: as many splits as 128-deep tiles allow
    assert cfg.block_k == 128 and cfg.split_k == 2


def test_grouped_one_row_steps_one_group_at_a_time():
    for n, k in ((4096, 4096), (28672, 8192), (1024, 1024)):
        cfg = pick(1, n, k, True, CPU)
        assert cfg.path == "gemv" and GROUP_SIZE % cfg.block_k == 0 and cfg.block_n == 32
    assert pick(1, 4096, 4096, True, CPU).split_k == 8  # 128 tiles: split to 4 programs per SM
    assert pick(1, 11008, 4096, True, CPU).split_k == 2  # 344 tiles
    assert pick(1, 28672, 8192, True, CPU).split_k == 1  # 896 tiles


def test_tensor_core_tiles_by_rows():
    for m, shape in ((2, (16, 32, 128)), (16, (16, 32, 128)), (17, (64, 128, 64)), (64, (64, 128, 64)),
                     (65, (128, 128, 64)), (DEQUANT_MIN_M - 1, (128, 128, 64))):
        cfg = pick(m, 4096, 4096, False, CPU)
        assert cfg.path == "tiled" and (cfg.block_m, cfg.block_n, cfg.block_k) == shape and not cfg.scale_after_dot
    assert pick(16, 4096, 4096, False, CPU).split_k == 4  # 128 tiles: split to 2 programs per SM
    assert pick(16, 11008, 4096, False, CPU).split_k == 1  # 344 tiles
    assert pick(300, 4096, 4096, False, CPU).split_k == 1  # from 257 rows unsplit, 8 warps
    assert pick(300, 4096, 4096, False, CPU).num_warps == 8
    cfg = pick(256, 4096, 4096, False, CPU)  # 2 x 32 tiles split to a program per SM, 4 warps
    assert cfg.split_k == 4 and cfg.num_warps == 4


def test_from_dequant_min_m_rows_the_weight_is_dequantized_for_cublas():
    for grouped in (False, True):
        assert pick(DEQUANT_MIN_M, 4096, 4096, grouped, CPU).path == "dequant"
        assert pick(8192, 576, 1536, grouped, CPU).path == "dequant"


def test_grouped_scales_after_the_dot_up_to_64_rows():
    assert pick(16, 4096, 4096, True, CPU).scale_after_dot and pick(64, 4096, 4096, True, CPU).scale_after_dot
    assert not pick(65, 4096, 4096, True, CPU).scale_after_dot


@pytest.mark.parametrize("m", [1, 2, 4, 16, 17, 64, 256, 2048])
def test_every_pick_is_a_config_its_launcher_takes(m):
    for n, k, grouped in ((4096, 4096, True), (384, 1536, False), (28672, 8192, True), (1000, 4104, False)):
        cfg = pick(m, n, k, grouped, CPU)
        assert cfg.path in ("gemv", "tiled", "dequant") and cfg.split_k >= 1
        if cfg.path == "dequant":
            continue
        assert not grouped or GROUP_SIZE % cfg.block_k == 0
        if cfg.path == "tiled":
            assert cfg.block_m >= 16 and cfg.block_n >= 32  # the dot's operands fill an mma (a wgmma from 64)


def test_gemv_split_stays_within_the_k_tiles():
    cfg = gemv_tile(1, 64, 256, False, 132)  # far too few programs: split as far as 128-deep tiles allow
    assert (cfg.block_k, cfg.split_k) == (128, 2)


def test_the_cached_pick_is_the_pick_remembered():
    for m, n, k, grouped in ((1, 4096, 4096, False), (16, 11008, 4096, True), (300, 576, 640, False)):
        assert cached_pick(m, n, k, grouped, CPU) == pick(m, n, k, grouped, CPU)
    hits = cached_pick.cache_info().hits
    cached_pick(1, 4096, 4096, False, CPU)
    assert cached_pick.cache_info().hits == hits + 1
