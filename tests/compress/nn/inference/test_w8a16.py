"""Tests for compress/nn/inference/w8a16.py: W8A16Linear against the float layer and its own dequantized
weight, and K padded to 8 or to the group."""
import pytest
import torch

from compress.configs import W8A16Config
from compress.nn.inference import W8A16Linear, to_float
from tests.compress.nn.inference.helpers import linear_layer, sqnr_db


@pytest.mark.parametrize("group_size, scale_shape", [(None, (64,)), (128, (64, 1))])
def test_w8a16_matches_the_float_layer_and_its_own_dequantized_weight(group_size, scale_shape):
    linear = linear_layer()
    x = torch.randn(10, 128)
    module = W8A16Linear.from_float(linear, W8A16Config(group_size))
    assert module.w_q.shape == (64, 128) and module.w_q.dtype == torch.int8 and module.w_scale.shape == scale_shape
    assert sqnr_db(linear(x), module(x)) > 38  # 8-bit weights, fp activations on Gaussian data: ~40 dB
    torch.testing.assert_close(module(x), to_float(module)(x), atol=1e-5, rtol=1e-5)
    expected_scale = linear.weight.detach().abs().amax(dim=1) / 127
    torch.testing.assert_close(module.w_scale.reshape(-1), expected_scale, rtol=0, atol=0)


def test_w8a16_pads_k_to_8_or_to_the_group():
    linear = linear_layer(k=100)
    x = torch.randn(3, 100)
    for config, padded in ((W8A16Config(), 104), (W8A16Config(128), 128)):
        module = W8A16Linear.from_float(linear, config)
        assert module.padded_in_features == padded and f"padded_in_features={padded}" in repr(module)
        assert (module.w_q[:, 100:] == 0).all() and module.dequantized_weight().shape == (64, 100)
        torch.testing.assert_close(module(x), to_float(module)(x), atol=1e-5, rtol=1e-5)
        assert sqnr_db(linear(x), module(x)) > 35
