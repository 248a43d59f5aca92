"""DDS + W4A16 at many rows (compress_kernels/bsr_w4a16/dequant.py): the int4 blocks de-quantized once to x's
dtype, then the DDS op; against the reference, with bias in x's dtype or float32 and empty block rows.
CPU: the Triton interpreter, which truncates fp32 to bf16 where a GPU rounds to nearest (one bf16 step
allowed there).
"""
import pytest
import torch

from compress_kernels import reference
from compress_kernels.bsr_w4a16.dequant import dequantize_blocks
from compress_kernels.bsr_w4a16.dispatch import DEQUANT
from compress_kernels.bsr_w4a16.op import launch
from tests.kernels.helpers import DEVICE, int4_block_sparse, rel_error


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("scale_dtype", [torch.float32, torch.float16])
def test_blocks_are_the_reference_blocks_rounded_once(dtype, scale_dtype):
    parts, scales, _, _ = int4_block_sparse(96, 128, 0.4, 64, scale_dtype=scale_dtype)
    values = parts[2]
    blocks = dequantize_blocks(values, scales, dtype)
    assert blocks.dtype == dtype and blocks.shape == (values.shape[0], 32, 32)
    exact = reference.dequantize_int4_blocks(values, scales)
    if dtype == torch.float16:
        assert torch.equal(blocks, exact.to(dtype))
    else:  # within one bf16 step (Triton's interpreter truncates to bf16 where a GPU rounds to nearest)
        torch.testing.assert_close(blocks.float(), exact, rtol=2**-7, atol=0)


def test_no_stored_block_gives_an_empty_buffer():
    parts, scales, _, _ = int4_block_sparse(64, 64, 1.0)
    assert parts[2].shape[0] == 0 and dequantize_blocks(parts[2], scales, torch.float16).shape == (0, 32, 32)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("bias_dtype", [None, torch.float32, "x"])
def test_the_dds_op_on_dequantized_blocks_matches_the_reference(dtype, bias_dtype):
    n, k, m = 96, 160, 70
    parts, scales, _, _ = int4_block_sparse(n, k, 0.3, 32, empty_rows=(1,))
    x = torch.randn(m, k, device=DEVICE).to(dtype)
    bias = None if bias_dtype is None else torch.randn(n, device=DEVICE).to(dtype if bias_dtype == "x" else bias_dtype)
    y = launch(x, *parts, scales, n, bias, config=DEQUANT)
    ref = reference.bsr_w4a16_matmul_ref(x, *parts, scales, n, bias)
    assert y.dtype == dtype and y.shape == (m, n)
    assert rel_error(y, ref) <= {torch.float16: 2e-3, torch.bfloat16: 1e-2}[dtype]
    empty = torch.zeros(m, 32, device=DEVICE) if bias is None else bias[32:64].to(dtype).float().expand(m, 32)
    step = 2**-7 if dtype == torch.bfloat16 else 0  # the interpreter truncates to bf16 (module docstring)
    torch.testing.assert_close(y[:, 32:64].float(), empty, rtol=step, atol=0)  # block row 1 empty: 0 or the bias
