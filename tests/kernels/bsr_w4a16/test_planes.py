"""DDS + W4A16 as nibble planes (compress_kernels/bsr_w4a16/planes.py): rows per program, outputs, blocks per step
and shares of a block row against the reference, short last steps and empty block rows, configs the kernel
cannot take refused. CPU: the Triton interpreter.

Each block's dot has exact int4 operands and its fp32 sum is scaled after it, as in the reference's order up to
fp32 rounding: fp16 outputs within one fp16 ulp of the reference's.
"""
import pytest
import torch

from compress_kernels import reference
from compress_kernels.bsr.dispatch import BsrConfig
from compress_kernels.bsr_w4a16.op import launch
from compress_kernels.bsr_w4a16.planes import launch_planes
from tests.kernels.helpers import DEVICE, check_int4_block_row_shares, int4_block_sparse

N, K = 96, 640  # 3 block rows of 20 blocks: one empty, one full (5 steps of 4), one at 30%


@pytest.mark.parametrize(("config", "m"), [(BsrConfig("planes", 4, 32, 4, 2, 3), 1),
                                           (BsrConfig("planes", 4, 16, 8, 4, 3), 3),
                                           (BsrConfig("planes", 8, 32, 8, 2, 2), 7),
                                           (BsrConfig("planes", 16, 32, 4, 4, 3), 16),
                                           (BsrConfig("planes", 16, 16, 4, 2, 3), 33)], ids=str)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_matches_the_reference(config, m, dtype):
    parts, scales, _, _ = int4_block_sparse(N, K, 0.3, 32, empty_rows=(0,), full_rows=(1,), seed=m)
    x = torch.randn(m, K, device=DEVICE).to(dtype)
    bias = torch.randn(N, device=DEVICE).to(dtype) if m % 2 else None
    y = launch(x, *parts, scales, N, bias, config=config)
    ref = reference.bsr_w4a16_matmul_ref(x, *parts, scales, N, bias)
    if dtype == torch.float16:  # exact int4 operands, each block's sum scaled in fp32: one fp16 ulp at most
        torch.testing.assert_close(y, ref, rtol=2**-10, atol=2**-14)
    else:  # the interpreter truncates fp32 -> bf16 where the reference rounds
        torch.testing.assert_close(y.float(), ref.float(), rtol=2**-7, atol=2**-10)
    expected = torch.zeros_like(y[:, :32]) if bias is None else bias[:32].expand(m, 32)
    assert torch.equal(y[:, :32], expected)  # block row 0 is empty: zeros, or the bias alone


@pytest.mark.parametrize("split", [2, 3])
@pytest.mark.parametrize("m", [2, 9])
def test_split_block_rows(split, m):
    """Shares of a block row sum fp32 partials once, the bias added once; counters are left zeroed."""
    check_int4_block_row_shares(BsrConfig("planes", 16, 32, 4, 4, 3, split=split), N, K, m, full_row=0, seed=split)


@pytest.mark.parametrize("config", [BsrConfig("gemm", 16, 32, 4, 4, 3), BsrConfig("planes", 2, 32, 4, 4, 3),
                                    BsrConfig("planes", 16, 8, 4, 4, 3), BsrConfig("planes", 16, 32, 2, 4, 3)],
                         ids=str)
def test_configs_it_cannot_take_are_refused(config):
    parts, scales, _, _ = int4_block_sparse(32, 32, 0.0)
    with pytest.raises(ValueError, match="expected a 'planes' BsrConfig"):
        launch_planes(torch.zeros(1, 32, device=DEVICE).half(), *parts, scales, None,
                      torch.empty(1, 32, device=DEVICE).half(), config)
