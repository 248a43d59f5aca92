"""DDS + W4A16 one-row kernel (compress_kernels/bsr_w4a16/gemv.py): every output width and blocks per step
against the reference, every output written, configs it cannot take refused. CPU: the Triton interpreter.
"""
import pytest
import torch

from compress_kernels.bsr.dispatch import BsrConfig
from compress_kernels.bsr_w4a16.gemv import launch_gemv
from compress_kernels.reference import bsr_w4a16_matmul_ref
from tests.kernels.helpers import DEVICE, int4_block_sparse


@pytest.mark.parametrize("config", [BsrConfig("gemv", 1, bn, g, 4, 2) for bn in (8, 16, 32) for g in (1, 2, 8)],
                         ids=str)
@pytest.mark.parametrize("m", [1, 3])
def test_every_config_matches_reference(config, m):
    n, k = 96, 320  # block rows of 10 blocks: steps of 8 end part-full
    parts, scales, _, _ = int4_block_sparse(n, k, 0.3, 32, empty_rows=(1,), full_rows=(2,))
    x = torch.randn(m, k, device=DEVICE).half()
    bias = torch.randn(n, device=DEVICE)
    y = torch.full((m, n), float("nan"), device=DEVICE, dtype=torch.float16)  # poison: every entry must be written
    launch_gemv(x, *parts, scales, bias, y, config)
    torch.testing.assert_close(y, bsr_w4a16_matmul_ref(x, *parts, scales, n, bias), rtol=2**-10, atol=2**-14)


@pytest.mark.parametrize("split,group", [(2, 2), (3, 2), (4, 1), (8, 4)])  # (8, 4): shares past the row's end
def test_a_block_row_shared_by_several_programs(split, group):
    n, k = 96, 320  # block rows of 10 blocks, one empty, one full
    parts, scales, _, _ = int4_block_sparse(n, k, 0.3, 32, empty_rows=(1,), full_rows=(2,))
    x = torch.randn(2, k, device=DEVICE).half()
    bias = torch.randn(n, device=DEVICE)
    y = torch.full((2, n), float("nan"), device=DEVICE, dtype=torch.float16)
    launch_gemv(x, *parts, scales, bias, y, BsrConfig("gemv", 1, 16, group, 4, 2, split=split))
    torch.testing.assert_close(y, bsr_w4a16_matmul_ref(x, *parts, scales, n, bias), rtol=2**-10, atol=2**-14)
    launch_gemv(x, *parts, scales, bias, y2 := torch.empty_like(y), BsrConfig("gemv", 1, 16, group, 4, 2, split=split))
    assert torch.equal(y, y2)  # the counters were left zeroed and the partials summed in split order


def test_strided_rows_of_x():
    """A row stride larger than K (a column slice of a wider tensor) is read as such."""
    n, k = 64, 128
    parts, scales, _, _ = int4_block_sparse(n, k, 0.5, 128)
    wide = torch.randn(2, 2 * k, device=DEVICE).half()
    x = wide[:, k:]
    y = torch.empty(2, n, device=DEVICE, dtype=torch.float16)
    launch_gemv(x, *parts, scales, None, y, BsrConfig("gemv", 1, 8, 8, 4, 3))
    torch.testing.assert_close(y, bsr_w4a16_matmul_ref(x, *parts, scales, n), rtol=2**-10, atol=2**-14)


@pytest.mark.parametrize("config", [BsrConfig("gemm", 16, 32, 4, 4, 3), BsrConfig("gemv", 1, 4, 8, 4, 3),
                                    BsrConfig("gemv", 1, 8, 8, 4, 3, prefetch=8192)], ids=str)
def test_configs_it_cannot_take_are_refused(config):
    parts, scales, _, _ = int4_block_sparse(32, 32, 0.0)
    with pytest.raises(ValueError, match="expected a 'gemv' BsrConfig"):
        launch_gemv(torch.zeros(1, 32, device=DEVICE).half(), *parts, scales, None,
                    torch.empty(1, 32, device=DEVICE).half(), config)
