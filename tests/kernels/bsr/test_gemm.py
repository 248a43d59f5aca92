"""DDS tensor-core tiles (compress_kernels/bsr/gemm.py): every tile shape, blocks per step and split
against the reference, every output written, block rows shared by programs reduced in the kernel.
CPU: the Triton interpreter; GPU: marked ``gpu``.
"""
import pytest
import torch

from compress_kernels.bsr.dispatch import BsrConfig, pick
from compress_kernels.bsr.gemm import launch_gemm
from compress_kernels.common.splitk import tile_counters
from compress_kernels.reference import bsr_matmul_ref
from tests.kernels.helpers import DEVICE, block_sparse_dense, bsr_parts

TOL = {torch.float16: dict(atol=2e-2, rtol=1e-2), torch.bfloat16: dict(atol=1e-1, rtol=2e-2)}


@pytest.mark.parametrize(
    "config",
    [BsrConfig("gemm", bm, bn, g, 4, 2) for bm in (16, 32, 64) for bn in (16, 32) for g in (1, 2, 4)]
    + [BsrConfig("gemm", bm, 32, g, 4, 2, split=sp) for bm in (16, 64) for g in (1, 2) for sp in (2, 3)],
    ids=str,
)
def test_every_config_matches_reference(config):
    n, k, m = 96, 160, 5
    crow, col, values = bsr_parts(block_sparse_dense(n, k, 0.6, torch.float16, empty_rows=(1,)))
    x = torch.randn(m, k, device=DEVICE).half()
    bias = torch.randn(n, device=DEVICE)
    y = torch.full((m, n), float("nan"), device=DEVICE, dtype=torch.float16)  # poison: every entry must be written
    launch_gemm(x, crow, col, values, bias, y, config)
    torch.testing.assert_close(y, bsr_matmul_ref(x, crow, col, values, n, bias), **TOL[torch.float16])


def test_split_block_rows_reduce_in_kernel_and_leave_counters_zeroed():
    n, k, m = 64, 256, 20  # 8 block columns; block row 1 empty; up to 8 stored blocks over 4 shares
    crow, col, values = bsr_parts(block_sparse_dense(n, k, 0.3, torch.bfloat16, empty_rows=(1,)))
    x = torch.randn(m, k, device=DEVICE).bfloat16()
    bias = torch.randn(n, device=DEVICE).bfloat16()
    config = BsrConfig("gemm", 16, 32, 1, 4, 2, split=4)
    y = torch.full((m, n), float("nan"), device=DEVICE, dtype=torch.bfloat16)
    launch_gemm(x, crow, col, values, bias, y, config)
    torch.testing.assert_close(y, bsr_matmul_ref(x, crow, col, values, n, bias), **TOL[torch.bfloat16])
    assert not tile_counters(y.device, 4).any()  # every ticket counter back at zero
    again = torch.empty_like(y)
    launch_gemm(x, crow, col, values, bias, again, config)
    assert torch.equal(again, y)  # partials summed in share order: the same bits every time


def test_prefetch_is_refused():
    crow, col, values = bsr_parts(block_sparse_dense(32, 32, 0.0, torch.float16))
    with pytest.raises(ValueError, match="the tile kernel prefetches nothing"):
        launch_gemm(torch.zeros(16, 32, device=DEVICE).half(), crow, col, values, None,
                    torch.empty(16, 32, device=DEVICE).half(), BsrConfig("gemm", 16, 32, 1, 4, 3, prefetch=8192))


@pytest.mark.gpu
@pytest.mark.parametrize("m,sparsity", [(16, 0.9), (64, 0.5), (64, 0.9)])
def test_full_size_split_block_rows(m, sparsity):
    k, n = 4096, 4096
    w = block_sparse_dense(n, k, sparsity, torch.float16, seed=m)
    x = torch.randn(m, k, device="cuda").half()
    bias = torch.randn(n, device="cuda").half()
    crow, col, values = bsr_parts(w)
    base = pick(m, n, k, col.shape[0], "cuda", False)
    y = torch.empty(m, n, device="cuda", dtype=torch.float16)
    launch_gemm(x, crow, col, values, bias, y, BsrConfig("gemm", base.block_m, 32, base.group, base.num_warps,
                                                          base.num_stages, split=4))
    ref = (x.double() @ w.double().T + bias.double())
    assert ((y.double() - ref).norm() / ref.norm()).item() < 2e-3
