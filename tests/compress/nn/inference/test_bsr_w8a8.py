"""Tests for compress/nn/inference/bsr_w8a8.py: BSRW8A8Linear holds and computes what W8A8Linear does
on the pruned weight."""
import pytest
import torch
from torch import nn

from compress.configs import BlockSparseConfig, W8A8Config
from compress.core.sparsity import block_mask, expand_mask
from compress.nn.inference import BSRW8A8Linear, W8A8Linear


@pytest.mark.parametrize("static", [False, True])
def test_bsr_w8a8_holds_and_computes_what_w8a8_does_on_the_pruned_weight(static):
    linear = nn.Linear(128, 96)
    mask = block_mask(linear.weight, 0.5)
    masked = linear.weight * expand_mask(mask, tuple(linear.weight.shape))
    config = W8A8Config("static") if static else W8A8Config()
    act_scale = torch.tensor(0.03) if static else None
    dense = W8A8Linear.from_float(linear, config, weight=masked, act_scale=act_scale)
    sparse = BSRW8A8Linear.from_float(linear, config, BlockSparseConfig(0.5), weight=masked, mask=mask,
                                      act_scale=act_scale)
    assert sparse.nnz == int(mask.sum()) == 6 and sparse.values.dtype == torch.int8
    assert torch.equal(sparse.dequantized_weight(), dense.dequantized_weight())
    x = torch.randn(4, 128)
    assert torch.equal(sparse(x), dense(x))
    half = sparse.half()
    assert half.values.dtype == torch.int8 and half.w_scale.dtype == torch.float32 and half.bias.dtype == torch.float16
    assert "nnz_blocks=6/12" in repr(sparse) and ("static" in repr(sparse)) == static
