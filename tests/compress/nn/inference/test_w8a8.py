"""Tests for compress/nn/inference/w8a8.py: W8A8Linear against the float layer, its static scale, and
int8 inputs handed over by a linked norm (W8A8Linear and BSRW8A8Linear) on the bound quantized GEMM."""
import pytest
import torch
from torch import nn

from compress.configs import W8A8Config
from compress.nn.inference import W8A8Linear
from tests.compress.nn.inference.helpers import MAKERS, bound_calls, linear_layer, sqnr_db


def test_w8a8_matches_the_float_layer_closely():
    linear = linear_layer()
    x = torch.randn(10, 128)
    module = W8A8Linear.from_float(linear, W8A8Config())
    assert module.w_q.dtype == torch.int8 and module.w_scale.dtype == torch.float32
    assert sqnr_db(linear(x), module(x)) > 35  # 8-bit x 8-bit on Gaussian data: ~40 dB


def test_static_w8a8_needs_a_scale():
    with pytest.raises(ValueError, match="calibrate first"):
        W8A8Linear.from_float(linear_layer(), W8A8Config(activation="static"))
    module = W8A8Linear.from_float(linear_layer(), W8A8Config(activation="static"), act_scale=torch.tensor(0.02))
    assert module.act_scale.item() == pytest.approx(0.02) and "static" in repr(module)


@pytest.mark.parametrize("kind", ["w8a8", "bsr-w8a8"])
def test_handed_over_int8_inputs_run_the_bound_quantized_gemm(kind, kernel_modules):
    from compress_kernels.reference import quantize_per_token

    torch.manual_seed(0)
    module = MAKERS[kind](nn.Linear(64, 64)).half()
    x = torch.randn(2, 3, 64, dtype=torch.float16)
    xq, s_x = quantize_per_token(x.reshape(-1, 64))
    y = module._matmul_quantized(x, xq, s_x)
    assert torch.equal(module._matmul_quantized(x, xq, s_x), y) and len(bound_calls(module)) == 1
    torch.testing.assert_close(y, module(x), atol=2e-2, rtol=2e-2)
