"""DDS + W4A16 tiles (compress_kernels/bsr_w4a16/gemm.py): other tile shapes and blocks per step, block rows
shared by programs (fp32 partials summed in the kernel), configs the kernel cannot take refused.
CPU: the Triton interpreter.
"""
import pytest
import torch

from compress_kernels import reference
from compress_kernels.bsr.dispatch import BsrConfig
from compress_kernels.bsr_w4a16.op import launch
from tests.kernels.helpers import DEVICE, check_int4_block_row_shares, int4_block_sparse, rel_error


@pytest.mark.parametrize("config", [BsrConfig("gemm", 16, 16, 2, 4, 2), BsrConfig("gemm", 32, 32, 1, 4, 3),
                                    BsrConfig("gemm", 64, 32, 8, 4, 3)], ids=str)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_other_tiles(config, dtype):
    n, k, m = 96, 160, 33
    parts, scales, _, _ = int4_block_sparse(n, k, 0.3, 32, empty_rows=(0,))
    x = torch.randn(m, k, device=DEVICE).to(dtype)
    y = launch(x, *parts, scales, n, config=config)
    ref = reference.bsr_w4a16_matmul_ref(x, *parts, scales, n)
    assert rel_error(y, ref) <= {torch.float16: 1e-3, torch.bfloat16: 1e-2}[dtype]
    assert torch.equal(y[:, :32], torch.zeros_like(y[:, :32]))  # block row 0 is empty


@pytest.mark.parametrize("split", [2, 3, 4])
@pytest.mark.parametrize("m", [1, 20])
def test_split_block_rows(split, m):
    """Shares of a block row sum fp32 partials: the reference's result up to fp32 rounding, the bias added
    once, empty block rows and shares give zeros; the counters are left zeroed for the next launch."""
    check_int4_block_row_shares(BsrConfig("gemm", 16, 32, 2, 4, 3, split=split), 128, 512, m, full_row=3, seed=split)


@pytest.mark.parametrize("config", [BsrConfig("gemv", 1, 8, 8, 4, 3), BsrConfig("gemm", 8, 32, 4, 4, 3),
                                    BsrConfig("gemm", 16, 8, 4, 4, 3)], ids=str)
def test_configs_it_cannot_take_are_refused(config):
    from compress_kernels.bsr_w4a16.gemm import launch_gemm

    parts, scales, _, _ = int4_block_sparse(32, 32, 0.0)
    with pytest.raises(ValueError, match="expected a 'gemm' BsrConfig"):
        launch_gemm(torch.zeros(1, 32, device=DEVICE).half(), *parts, scales, None,
                    torch.empty(1, 32, device=DEVICE).half(), config)


def test_a_kernel_the_op_does_not_have_is_refused():
    parts, scales, _, _ = int4_block_sparse(32, 32, 0.0)
    expected = r"config.kernel: expected one of \('gemv', 'planes', 'gemm', 'dequant'\), got 'dense'"
    with pytest.raises(ValueError, match=expected):
        launch(torch.zeros(1, 32, device=DEVICE).half(), *parts, scales, 32, config=BsrConfig("dense", 0, 0, 0, 0, 0))
