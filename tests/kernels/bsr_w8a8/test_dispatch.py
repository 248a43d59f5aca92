"""The DDS + W8A8 dispatch table (compress_kernels/bsr_w8a8/dispatch.py): rows checked on the shapes they name.

Off CUDA the device facts are an H100's (132 SMs), so these picks are the H100's."""
import torch

from compress_kernels.bsr.dispatch import DENSE, DENSIFY_MIN_M
from compress_kernels.bsr_w8a8.dispatch import cached_pick, pick

CPU = torch.device("cpu")


def test_large_m_on_dense_enough_layers_goes_dense():
    blocks = (4096 // 32) ** 2
    assert pick(DENSIFY_MIN_M, 4096, 4096, blocks // 2, CPU) == DENSE
    assert pick(DENSIFY_MIN_M, 4096, 4096, blocks // 4, CPU) != DENSE  # 75% sparse: the block kernel


def test_buckets():
    nnz = 128 * 64  # 4096x4096 at 50%: 128 block rows of 64 stored blocks
    assert [pickw(m, 4096, 4096, nnz).block_m for m in (1, 16, 17, 32, 33, 256, 257)] == [16, 16, 32, 32, 64, 64, 128]
    assert pickw(1, 4096, 4096, nnz).split == 8  # few long block rows: shared by 8 programs
    assert pickw(16, 8192, 8192, 256 * 128).split == 4
    assert pickw(1, 4096, 4096, 128 * 12).split == 1  # short rows (90%): no split
    assert pickw(1, 28672, 8192, 896 * 128).split == 1  # many block rows fill the GPU already
    assert pickw(64, 4096, 4096, nnz).split == 4 and pickw(64, 8192, 8192, 256 * 128).split == 1
    assert pickw(64, 1152, 384, 36 * 6).block_m == 16  # MiniLM-size layers: 16-row tiles
    assert pickw(512, 1152, 384, 36 * 6).block_m == 64 and pickw(512, 4096, 4096, nnz).block_m == 128
    assert pickw(2048, 1024, 1024, 32 * 8).block_m == 128  # enough programs with 128-row tiles (75% sparse)


def pickw(m, n, k, nnz):
    return pick(m, n, k, nnz, CPU)


def test_the_cached_pick_is_the_pick_remembered():
    for m, n, k, nnz in ((1, 4096, 4096, 8192), (64, 576, 1536, 432), (4096, 1024, 1024, 1024)):
        assert cached_pick(m, n, k, nnz, CPU) == pick(m, n, k, nnz, CPU)
