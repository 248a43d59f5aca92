"""W4A16's dispatch table (compress_kernels/w4a16/dispatch.py): rows checked on the shapes they name.

Off CUDA the device facts are an H100's (132 SMs), so these picks are the H100's."""
from __future__ import annotations

import pytest
import torch

from compress_kernels.w4a16.dispatch import TileConfig, balanced_split_k, cached_pick, fma_split_k, pick, wholek_block_k
from compress_kernels.w4a16.wholek import WHOLEK_MAX_K

CPU = torch.device("cpu")


def pick4(m, n, k, g):
    """The pick with fp32 scales (4 bytes each)."""
    return pick(m, n, k, g, 4, CPU)


def test_one_row_of_a_big_layer_takes_the_cuda_core_kernel():
    for n, k in ((11008, 4096), (8192, 8192), (28672, 8192)):
        cfg = pick4(1, n, k, 128)
        assert cfg.path == "fma" and cfg.block_m == 1 and cfg.block_k == 128 and cfg.split_k > 1
    assert pick4(1, 11008, 4096, 32).block_k == 32  # a K tile never crosses a scale group


def test_buckets_by_rows():
    assert pick4(256, 4096, 4096, 128).path == "dequant"  # from M = 128 on: dequantize + cuBLAS
    assert pick4(4096, 4096, 4096, 128).path == "dequant"
    assert pick4(64, 4096, 4096, 128).path == "tiled" and pick4(2, 8192, 8192, 128).planes
    for m, n, k, g in ((3, 2048, 4096, 128), (3, 4096, 4096, 128), (16, 28672, 8192, 128), (16, 4096, 4096, 4096)):
        cfg = pick4(m, n, k, g)  # 128-deep K tiles: the nibble planes
        assert cfg.path == "tiled" and cfg.planes and cfg.block_k == 128
        assert cfg.block_n == (128 if n >= 8192 else 64) and cfg.prefetch_scale == (cfg.block_n == 64)
    assert not pick4(16, 4096, 4096, 64).planes and not pick4(17, 4096, 4096, 128).planes
    cfg = pick4(100, 4096, 4096, 128)  # 65-127 rows of a 16 Mi layer: dequantize before the dot
    assert (cfg.block_m, cfg.block_n, cfg.block_k, cfg.num_warps, cfg.scale_after_dot) == (128, 128, 64, 8, False)


def test_16_bit_scales_load_every_plane_tile_scale_row_ahead():
    assert not pick(6, 8192, 640, 128, 4, CPU).prefetch_scale  # 128-wide tiles with fp32 scales: not ahead
    cfg = pick(6, 8192, 640, 128, 2, CPU)
    assert cfg.planes and cfg.block_n == 128 and cfg.prefetch_scale
    assert not pick(64, 4096, 4096, 128, 2, CPU).prefetch_scale  # only the nibble-plane tiles


def test_pick4_gives_few_rows_the_whole_k_strip():
    for m, n, k, g in ((1, 1024, 1024, 128), (2, 4096, 4096, 32), (1, 1152, 384, 384), (2, 384, 1536, 64)):
        cfg = pick4(m, n, k, g)
        assert cfg.path == "wholek" and cfg.split_k == 1 and k <= cfg.block_k <= 2 * k
        assert (cfg.block_n, cfg.num_warps) == ((16, 8) if cfg.block_k <= 2048 else (8, 4))
    for m, n, k in ((3, 1024, 1024), (16, 1536, 384), (8, 384, 1536)):  # small layers up to 16 rows
        cfg = pick4(m, n, k, 128)
        assert cfg.path == "wholek" and cfg.num_warps == 4 and cfg.block_n == (32 if cfg.block_k <= 1024 else 16)
    assert pick4(3, 4096, 4096, 128).path == "tiled"  # a third row of a larger layer: the tensor-core tiles
    assert pick4(17, 1024, 1024, 128).path == "tiled"
    assert pick4(1, 11008, 4096, 128).path == "fma"  # more than 16 Mi weights
    assert pick4(1, 8192, 8192, 128).path == "fma"  # K past 4096


def test_pick4_gives_large_layers_the_swapped_nibble_pairs_from_17_to_256_rows():
    for m, n, k in ((17, 4096, 4096), (32, 4096, 4096), (33, 28672, 8192), (64, 11008, 4096), (256, 8192, 8192)):
        cfg = pick4(m, n, k, 128)
        assert cfg.path == "wgmma" and cfg.block_k == 128 and cfg.split_k >= 1
        assert cfg.block_m == (32 if m <= 32 else 64 if m <= 64 else 128)
    assert pick4(64, 4096, 11008, 128).block_n == 256 and pick4(64, 4096, 11008, 128).num_warps == 8
    assert pick4(64, 4096, 4096, 128).path == "tiled"  # 16 Mi weights: the 64-row tiled kernel above 32 rows
    assert pick4(256, 4096, 4096, 128).path == "dequant"
    assert pick4(257, 8192, 8192, 128).path == "dequant"
    assert pick4(64, 8192, 8192, 64).path == "tiled"  # 64-channel groups: a 128-deep tile would cross them
    assert pick4(64, 8192, 8192, 8192).path == "wgmma"  # per channel
    assert pick4(32, 1024, 1024, 128).path == "tiled"  # small layers keep their own tiles


@pytest.mark.parametrize("k,n,g", [(384, 384, 128), (384, 1536, 128), (384, 1536, 384), (256, 1024, 32)])
def test_small_layers_take_no_split_k(k, n, g):
    for m in (1, 16):
        assert pick4(m, n, k, g).path == "wholek" and pick4(m, n, k, g).split_k == 1
    for m in (17, 64):
        cfg = pick4(m, n, k, g)
        assert cfg.path == "tiled" and cfg.split_k == 1 and cfg.block_k <= min(g, 128) and k % cfg.block_k == 0
    assert pick4(64, 384, 1536, 128).split_k > 1  # K = 1536: many K steps, split-K still pays


def test_balanced_split_fills_whole_waves():
    cfg = TileConfig(16, 64, 128)
    for k, n in [(4096, 4096), (11008, 4096), (8192, 8192), (8192, 28672)]:
        split = balanced_split_k(1, n, k, cfg, 132)
        programs = (n // 64) * split
        assert programs >= 264 and programs / (-(-programs // 132) * 132) >= 0.85
        assert (k // 128) // split >= 2  # every split keeps two K tiles to pipeline
    assert balanced_split_k(1, 1024, 1024, cfg, 132) == 4  # under one wave: as many programs as K allows


def test_fma_split_rule():
    cfg = TileConfig(1, 64, 128, path="fma")
    measured_best = {(4096, 4096): 8, (11008, 4096): 8, (4096, 12288): 4, (4096, 22016): 4}  # H100, M = 1
    for (k, n), best in measured_best.items():
        assert fma_split_k(1, n, k, cfg) == best
    for k, n in [(4096, 11008), (8192, 8192), (8192, 28672)]:
        split = fma_split_k(1, n, k, cfg)
        assert (n // 64) * split >= 512 and k // split <= 1536 and (k // 128) // split >= 2
    assert fma_split_k(1, 1024, 1024, cfg) == 4  # two K tiles per split at least
    assert fma_split_k(2, 28672, 8192, cfg) == 8  # K spans still capped with two rows


def test_wholek_block_k_holds_k():
    assert [wholek_block_k(k) for k in (8, 64, 384, 1024, 1032)] == [64, 64, 512, 1024, 2048]
    assert wholek_block_k(WHOLEK_MAX_K) == WHOLEK_MAX_K


@pytest.mark.parametrize("m", [1, 2, 16, 17, 64, 127, 128])
def test_every_pick_is_a_config_its_launcher_takes(m):
    for n, k, g in ((4096, 4096, 128), (384, 1536, 64), (28672, 8192, 8192)):
        cfg = pick4(m, n, k, g)
        assert cfg.path in ("wholek", "fma", "tiled", "wgmma", "dequant")
        if cfg.path != "dequant":
            assert g % cfg.block_k == 0 or g == k or cfg.path == "wholek"


def test_the_cached_pick_is_the_pick_remembered():
    for m, n, k, g, scale_bytes in ((1, 4096, 4096, 128, 4), (16, 11008, 4096, 64, 2), (300, 576, 640, 128, 4)):
        assert cached_pick(m, n, k, g, scale_bytes, CPU) == pick(m, n, k, g, scale_bytes, CPU)
    hits = cached_pick.cache_info().hits
    cached_pick(1, 4096, 4096, 128, 4, CPU)
    assert cached_pick.cache_info().hits == hits + 1
