"""Tests for compress/nn/inference/w4a16.py: W4A16Linear against the float layer and its own dequantized
weight, and K padded to the group size."""
import torch

from compress.configs import W4A16Config
from compress.nn.inference import W4A16Linear, to_float
from tests.compress.nn.inference.helpers import linear_layer, sqnr_db


def test_w4a16_matches_the_float_layer_and_its_own_dequantized_weight():
    linear = linear_layer()
    x = torch.randn(10, 128)
    module = W4A16Linear.from_float(linear, W4A16Config(32))
    assert module.qweight.shape == (16, 64) and module.scales.shape == (4, 64)
    assert sqnr_db(linear(x), module(x)) > 18  # 4-bit g32 on Gaussian weights: ~21 dB
    torch.testing.assert_close(module(x), to_float(module)(x), atol=1e-5, rtol=1e-5)


def test_w4a16_pads_k_that_is_not_a_multiple_of_the_group():
    linear = linear_layer(k=100)
    x = torch.randn(3, 100)
    module = W4A16Linear.from_float(linear, W4A16Config(64))
    assert module.padded_in_features == 128 and "padded_in_features=128" in repr(module)
    torch.testing.assert_close(module(x), to_float(module)(x), atol=1e-5, rtol=1e-5)
    per_channel = W4A16Linear.from_float(linear, W4A16Config(None))
    assert per_channel.group_size == 104 and sqnr_db(linear(x), per_channel(x)) > 10
