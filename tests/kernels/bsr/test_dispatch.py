"""The DDS dispatch table (compress_kernels/bsr/dispatch.py): rows checked on the shapes they name.

Off CUDA the device facts are an H100's (132 SMs), so these picks are the H100's."""
import pytest
import torch

from compress_kernels.bsr.dispatch import (DENSE, DENSIFY_MIN_M, GEMV_PREFETCH_BYTES, SMALL_LAYER, BsrConfig,
                                           cached_pick, densifies, gemv_serves, pick)

CPU = torch.device("cpu")


def choose(m, n, k, nnz=None, can_prefetch=False):
    """The DDS pick; ``nnz`` None: every block stored."""
    return pick(m, n, k, (n // 32) * (k // 32) if nnz is None else nnz, CPU, can_prefetch)


@pytest.mark.parametrize("k,n", [(1024, 1024), (4096, 4096), (11008, 4096), (8192, 28672)])
@pytest.mark.parametrize("m", [1, 4, 5, 16, 17, 64, 256, 2048, 8192])
@pytest.mark.parametrize("density", [None, 0.5, 0.1, 0.0])
def test_every_dds_pick_is_a_valid_config(m, k, n, density):
    nnz = None if density is None else int(density * (n // 32) * (k // 32))
    cfg = choose(m, n, k, nnz)
    if cfg.kernel == "dense":
        assert m >= DENSIFY_MIN_M and density in (None, 0.5)
        return
    assert cfg.kernel in ("gemv", "gemm")
    assert cfg.block_n in (8, 16, 32) and n % cfg.block_n == 0
    assert (cfg.block_m == 1) == (cfg.kernel == "gemv")
    assert cfg.kernel == "gemv" or cfg.block_m >= 16
    if n * k > SMALL_LAYER:  # small layers take smaller tiles for more programs (next test)
        assert cfg.kernel == "gemv" or cfg.block_m >= min(m, 64) // 2
    assert cfg.split >= 1 and (cfg.split == 1 or cfg.kernel == "gemm")


def test_one_row_kernel_serves_more_rows_only_while_the_blocks_stay_in_l2():
    def kernel(m, k, n, density):
        return choose(m, n, k, int(density * (n // 32) * (k // 32))).kernel

    assert all(kernel(1, k, n, 0.5) == "gemv" for k, n in ((1024, 1024), (8192, 28672)))
    assert kernel(2, 4096, 4096, 0.5) == "gemv" and kernel(3, 4096, 4096, 0.5) == "gemm"  # 16 MiB of blocks
    assert kernel(4, 4096, 4096, 0.1) == "gemv" and kernel(2, 8192, 8192, 0.1) == "gemv"  # 3.2 / 12.8 MiB
    assert kernel(3, 8192, 8192, 0.1) == "gemm" and kernel(2, 11008, 4096, 0.5) == "gemm"  # 12.8 / 43 MiB
    assert kernel(4, 1024, 1024, 1.0) == "gemv" and kernel(5, 1024, 1024, 0.1) == "gemm"
    assert choose(2, 8192, 8192) == choose(16, 8192, 8192)  # dense: the 16-row tiles' pick
    assert gemv_serves(2, 16 * 2**20) and not gemv_serves(2, 16 * 2**20 + 1) and not gemv_serves(5, 0)


@pytest.mark.parametrize(("k", "n", "m", "expected"), [
    (384, 1152, 64, BsrConfig("gemm", 16, 32, 8, 4, 3)),  # 36 block rows of 6 blocks: 16-row tiles
    (1536, 384, 64, BsrConfig("gemm", 32, 32, 4, 4, 3, split=4)),  # 12 block rows of 24 blocks: shared
    (384, 1152, 512, BsrConfig("gemm", 64, 32, 4, 4, 3)),  # 64-row tiles: 288 programs
    (1024, 1024, 2048, BsrConfig("gemm", 128, 32, 2, 4, 3)),  # 128-row tiles: 512 programs
    (384, 1536, 2048, BsrConfig("gemm", 256, 32, 2, 4, 3)),  # 256-row tiles already give 384
])
def test_dds_small_layers_take_tiles_that_fill_the_gpu(k, n, m, expected):
    share = 4 if m >= DENSIFY_MIN_M else 2  # 25% of the blocks from M = 2048 (50% would go dense), else 50%
    assert choose(m, n, k, (n // 32) * (k // 32) // share) == expected
    assert choose(m, 4096, 4096, 128 * 16).block_m >= 32  # a large layer (75% sparse) keeps its tiles


def test_dds_splits_only_long_block_rows():
    n = k = 8192
    block_rows, blocks_per_row = n // 32, k // 32
    long_rows = choose(16, n, k, block_rows * blocks_per_row // 2)  # 128 blocks per row
    mid_rows = choose(16, n, k, block_rows * blocks_per_row // 10)  # ~26 blocks per row
    short_rows = choose(16, 4096, 4096, 128 * 13)  # 4096x4096 at 90%: 13 blocks per row
    assert long_rows.split > 1 and mid_rows.split > 1 and short_rows.split == 1
    assert choose(16, n, k).split > 1  # every block stored
    many_rows = 28672  # 896 block rows: enough programs without splitting them
    assert choose(16, many_rows, 8192, (many_rows // 32) * (8192 // 32) // 2).split == 1
    # 16 < M <= 64: only few (<= 128) long block rows are shared
    assert choose(64, 4096, 4096, 128 * 64).split == 4 and choose(64, 4096, 11008, 128 * 34).split == 4
    assert choose(64, n, k, block_rows * blocks_per_row // 2).split == 1  # 256 block rows
    assert choose(64, 4096, 4096, 128 * 13).split == 1


def test_dds_one_row_pick_prefetches_where_it_can_and_the_tile_kernels_do_not():
    assert choose(1, 4096, 4096, 128 * 64, can_prefetch=True).prefetch == GEMV_PREFETCH_BYTES
    assert choose(2, 11008, 4096, 344 * 13, can_prefetch=True).prefetch == GEMV_PREFETCH_BYTES
    assert choose(1, 4096, 4096, 128 * 64, can_prefetch=False).prefetch == 0  # interpreter, unaligned values
    assert choose(1, 28672, 8192, 896 * 128, can_prefetch=True).prefetch == 0  # above PREFETCH_MAX_WEIGHTS
    for m in (16, 64, 256, 2048):
        assert choose(m, 4096, 4096, 128 * 64, can_prefetch=True).prefetch == 0


def test_densifies_only_large_m_on_dense_enough_layers():
    blocks = (4096 // 32) ** 2
    assert densifies(DENSIFY_MIN_M, 4096, 4096, blocks // 2)  # 50% of the blocks kept
    assert not densifies(DENSIFY_MIN_M - 1, 4096, 4096, blocks // 2)
    assert not densifies(8192, 4096, 4096, blocks // 4)  # 75% sparse: the block kernel is faster
    huge_k = 32 * 70000  # more block columns than a grid dimension holds: the block kernel
    assert not densifies(8192, 32, huge_k, 70000)
    assert choose(DENSIFY_MIN_M, 4096, 4096, blocks // 2) == DENSE


def test_the_sm_count_sizes_the_programs(monkeypatch):
    """About two programs per SM is the line between the tiles: a 1024x1024 layer at 75% sparsity and M = 2048
    (32 block rows) takes 128-row tiles on 132 SMs (512 programs; 256-row tiles would give 256) and 256-row
    tiles on a GPU of 16 SMs."""
    assert choose(2048, 1024, 1024, 32 * 8) == BsrConfig("gemm", 128, 32, 2, 4, 3)
    monkeypatch.setattr("compress_kernels.bsr.dispatch.sm_count", lambda device: 16)
    assert choose(2048, 1024, 1024, 32 * 8) == BsrConfig("gemm", 256, 32, 2, 4, 3)


def test_the_cached_pick_is_the_pick_remembered():
    for m, n, k, nnz in ((1, 4096, 4096, 8192), (64, 576, 1536, 432), (4096, 1024, 1024, 1024)):
        assert cached_pick(m, n, k, nnz, CPU, True) == pick(m, n, k, nnz, CPU, True)
    hits = cached_pick.cache_info().hits
    cached_pick(1, 4096, 4096, 8192, CPU, True)
    assert cached_pick.cache_info().hits == hits + 1
