"""DDS one-row kernel (compress_kernels/bsr/gemv.py): every output width and blocks per step against the
reference, every output written; the L2 prefetch refused where it cannot run. CPU: the Triton interpreter.
"""
import pytest
import torch

from compress_kernels.bsr.dispatch import BsrConfig
from compress_kernels.bsr.gemv import launch_gemv
from compress_kernels.reference import bsr_matmul_ref
from tests.kernels.helpers import DEVICE, block_sparse_dense, bsr_parts

TOL = {torch.float16: dict(atol=2e-2, rtol=1e-2), torch.bfloat16: dict(atol=1e-1, rtol=2e-2)}


@pytest.mark.parametrize("config", [BsrConfig("gemv", 1, bn, g, 4, 2) for bn in (8, 16, 32) for g in (1, 2, 4)],
                         ids=str)
@pytest.mark.parametrize("m", [1, 3])
def test_every_config_matches_reference(config, m):
    n, k = 96, 160
    crow, col, values = bsr_parts(block_sparse_dense(n, k, 0.6, torch.float16, empty_rows=(1,)))
    x = torch.randn(m, k, device=DEVICE).half()
    bias = torch.randn(n, device=DEVICE)
    y = torch.full((m, n), float("nan"), device=DEVICE, dtype=torch.float16)  # poison: every entry must be written
    launch_gemv(x, crow, col, values, bias, y, config)
    torch.testing.assert_close(y, bsr_matmul_ref(x, crow, col, values, n, bias), **TOL[torch.float16])


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter cannot run the prefetch")
def test_prefetch_is_refused_where_it_cannot_run():
    n, k = 64, 64
    crow, col, values = bsr_parts(block_sparse_dense(n, k, 0.5, torch.float16))
    x = torch.randn(1, k).half()
    with pytest.raises(ValueError, match="prefetch=8192 needs values a 16-byte aligned contiguous CUDA tensor"):
        launch_gemv(x, crow, col, values, None, torch.empty(1, n).half(),
                    BsrConfig("gemv", 1, 8, 16, 4, 3, prefetch=8192))
