"""Tests for compress/nn/inference/bsr.py: BSRLinear is exact for a block-sparse weight."""
import torch

from compress.configs import BlockSparseConfig
from compress.core.sparsity import block_mask, expand_mask
from compress.nn.inference import BSRLinear
from tests.compress.nn.inference.helpers import linear_layer


def test_bsr_linear_is_exact_for_a_block_sparse_weight():
    linear = linear_layer()
    mask = block_mask(linear.weight, 0.5)
    with torch.no_grad():
        linear.weight.mul_(expand_mask(mask, linear.weight.shape))
    module = BSRLinear.from_float(linear, BlockSparseConfig(0.5), mask=mask)
    x = torch.randn(5, 128)
    assert module.nnz == 4 and "nnz_blocks=4/8" in repr(module)
    torch.testing.assert_close(module(x), linear(x), atol=1e-5, rtol=1e-5)
