"""DDS + W8A8 tiles (compress_kernels/bsr_w8a8/gemm.py): other tile shapes, block rows shared by
programs (dequantized partials summed in the kernel), configs the kernel cannot take refused.
CPU: the Triton interpreter.
"""
import pytest
import torch

from compress_kernels import reference
from compress_kernels.bsr.dispatch import BsrConfig
from compress_kernels.bsr_w8a8.op import launch
from tests.kernels.helpers import DEVICE, int8_block_sparse, rel_error


def assert_same_output(y, ref):
    if y.dtype == torch.float16:
        assert torch.equal(y, ref)
    else:  # bf16: the interpreter truncates where the reference rounds
        torch.testing.assert_close(y.float(), ref.float(), rtol=2**-7, atol=0)


@pytest.mark.parametrize("config", [BsrConfig("gemm", 16, 16, 2, 4, 2), BsrConfig("gemm", 64, 32, 1, 4, 3)])
def test_other_tiles(config):
    n, k, m = 96, 160, 33
    parts, w_scale, _ = int8_block_sparse(n, k, 0.3)
    x = torch.randn(m, k, device=DEVICE).half()
    y = launch(x, *parts, w_scale, n, config=config)
    assert_same_output(y, reference.bsr_w8a8_matmul_ref(x, *parts, w_scale, n))


@pytest.mark.parametrize("split", [2, 3, 4])
@pytest.mark.parametrize("m", [1, 20])
def test_split_block_rows(split, m):
    """Shares of a block row sum dequantized fp32 partials (as the dense kernel's split-K): the
    reference's result up to fp32 rounding, the bias added once, empty block rows and shares give zeros."""
    n, k = 128, 512
    parts, w_scale, _ = int8_block_sparse(n, k, 0.3, empty_rows=(2,), seed=split)
    x = torch.randn(m, k, device=DEVICE).half()
    bias = torch.randn(n, device=DEVICE).half()
    y = launch(x, *parts, w_scale, n, bias, config=BsrConfig("gemm", 16, 32, 2, 4, 3, split=split))
    ref = reference.bsr_w8a8_matmul_ref(x, *parts, w_scale, n, bias)
    assert rel_error(y, ref) <= 1e-3
    assert torch.equal(y[:, 64:96], bias[64:96].expand(m, 32))  # block row 2 is empty: the bias alone
    again = launch(x, *parts, w_scale, n, bias, config=BsrConfig("gemm", 16, 32, 2, 4, 3, split=split))
    assert torch.equal(again, y)  # the counters were left zeroed: a second launch reduces the same way


def test_the_one_row_config_is_refused():
    parts, w_scale, _ = int8_block_sparse(32, 32, 0.0)
    with pytest.raises(ValueError, match="'gemm' BsrConfig"):
        launch(torch.zeros(1, 32, device=DEVICE).half(), *parts, w_scale, 32, config=BsrConfig("gemv", 1, 8, 16, 4, 3))
