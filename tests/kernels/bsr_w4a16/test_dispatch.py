"""The DDS + W4A16 dispatch table (compress_kernels/bsr_w4a16/dispatch.py): rows checked on the shapes they name.

Off CUDA the device facts are an H100's (132 SMs), so these picks are the H100's."""
import torch

from compress_kernels.bsr_w4a16.dispatch import DEQUANT, DEQUANT_MIN_M, cached_pick, pick, tile_pick

CPU = torch.device("cpu")


def pickw(m, n, k, nnz):
    return pick(m, n, k, nnz, CPU)


def test_one_row_kernel_at_one_row_and_a_few_rows_of_small_layers():
    nnz = 128 * 64  # 4096x4096 at 50%
    assert pickw(1, 4096, 4096, nnz).kernel == "gemv"
    assert pickw(1, 28672, 8192, 896 * 128).kernel == "gemv"  # any size at one row
    assert pickw(2, 4096, 4096, nnz).kernel == "planes"  # more rows of larger layers: the planes kernel
    assert pickw(4, 1024, 1024, 32 * 16).kernel == "gemv" and pickw(5, 1024, 1024, 32 * 16).kernel == "planes"


def test_one_row_tiles_and_split_follow_the_sweep():
    """The H200 sweep's best (K x N at M = 1): 4096x4096 50% split 4, 90% unsplit; 4096x14336 unsplit (448 block
    rows fill the GPU); 14336x4096 split 4 at 50% and 90% (224 / 45 blocks a row)."""
    cfg = pickw(1, 4096, 4096, 128 * 64)
    assert (cfg.kernel, cfg.block_n, cfg.group, cfg.split) == ("gemv", 32, 16, 4)
    assert pickw(1, 4096, 4096, 128 * 13).split == 1  # one step of 16 blocks per row: nothing to share
    assert pickw(1, 14336, 4096, 448 * 64).split == 1 and pickw(1, 14336, 4096, 448 * 13).split == 1
    assert pickw(1, 4096, 14336, 128 * 224).split == 4 and pickw(1, 4096, 14336, 128 * 45).split == 4
    assert pickw(2, 1024, 1024, 32 * 32).split == 2  # a small dense layer's two rows: 64 programs, 2 steps a row


def test_planes_rows_and_split_follow_the_sweep():
    """The H200 grid's best at M = 2-8 (K x N, 50%): 4 rows a program up to 4 rows, then 8; 32 outputs, 4 blocks
    a step, 2 warps, 2 stages; 8192x28672 split 2 (32 steps a row: 16 a share), 4096x22016 unsplit (688 block
    rows of 16 steps), 4096x11008 and 4096x12288 split 2 (344 / 384 block rows, 16 steps), 11008x4096 and
    4096x4096 split 4 (128 block rows); from 9 rows the int4 tiles."""
    for m, block_m in ((2, 4), (4, 4), (5, 8), (8, 8)):
        cfg = pickw(m, 28672, 8192, 896 * 128)
        assert (cfg.kernel, cfg.block_m, cfg.block_n, cfg.group, cfg.num_warps, cfg.num_stages, cfg.split) == \
            ("planes", block_m, 32, 4, 2, 2, 2)
    assert pickw(8, 22016, 4096, 688 * 64).split == 1 and pickw(2, 22016, 4096, 688 * 64).split == 1
    assert pickw(4, 11008, 4096, 344 * 64).split == 2 and pickw(8, 12288, 4096, 384 * 64).split == 2
    assert pickw(4, 4096, 11008, 128 * 172).split == 4 and pickw(4, 4096, 4096, 128 * 64).split == 4
    assert pickw(4, 4096, 4096, 128 * 2).split == 1  # rows of two blocks: one step, nothing to share
    assert pickw(4, 28672, 8192, 896 * 24).split == 1  # 896 block rows of 6 steps: enough programs, short shares
    assert pickw(9, 4096, 4096, 128 * 64).kernel == "gemm"


def test_tile_rows():
    nnz = 128 * 64
    assert [tile_pick(m, 4096, 4096, nnz, CPU).block_m for m in (8, 9, 16, 17, 32, 33, 64, 65, 2048)] == \
        [8, 16, 16, 32, 32, 64, 64, 64, 128]
    assert pickw(16, 4096, 4096, nnz).split == 4  # 128 long block rows: shared by 4
    assert pickw(16, 28672, 8192, 896 * 128).split == 1  # many block rows fill the GPU already
    assert pickw(16, 4096, 4096, 128 * 12).split == 1  # short rows (90%)
    assert pickw(64, 4096, 4096, nnz).split == 4 and pickw(64, 8192, 8192, 256 * 128).split == 1
    assert pickw(64, 1152, 384, 36 * 12).block_m == 16 and pickw(64, 1152, 384, 36 * 12).split == 1
    assert pickw(64, 1536, 1536, 48 * 48).split == 4  # few long block rows
    assert tile_pick(300, 1024, 1024, 32 * 16, CPU).block_m == 64  # too few 128-row tiles


def test_many_rows_take_the_dds_op_on_dequantized_blocks():
    for n, k, nnz in ((4096, 4096, 128 * 64), (576, 1536, 18 * 24)):
        assert pickw(DEQUANT_MIN_M + 1, n, k, nnz) == DEQUANT and pickw(8192, n, k, nnz) == DEQUANT
        assert pickw(DEQUANT_MIN_M, n, k, nnz) == tile_pick(DEQUANT_MIN_M, n, k, nnz, CPU)
        assert pickw(DEQUANT_MIN_M, n, k, nnz).kernel == "gemm"


def test_the_cached_pick_is_the_pick_remembered():
    for m, n, k, nnz in ((1, 4096, 4096, 8192), (64, 576, 1536, 432), (4096, 1024, 1024, 1024)):
        assert cached_pick(m, n, k, nnz, CPU) == pick(m, n, k, nnz, CPU)
