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


def test_the_tile_pattern_is_found_at_export_and_again_at_load(tmp_path):
    """A layer pruned with tile_rows=4 exports as BSRLinear with tile_rows 4 (what its forward hands the kernel);
    a loaded copy finds it again from its indices, and free blocks give 1."""
    import compress
    from torch import nn

    torch.manual_seed(0)
    model = compress.convert(nn.Sequential(nn.Linear(128, 256), nn.Linear(256, 64)),
                             {"0": BlockSparseConfig(0.5, tile_rows=4), "1": BlockSparseConfig(0.5)})
    assert model[0].tile_rows == 4 and model[1].tile_rows == 1
    compress.save_compressed(model, tmp_path / "model")
    loaded = compress.load_compressed(tmp_path / "model", model=nn.Sequential(nn.Linear(128, 256), nn.Linear(256, 64)))
    assert loaded[0].tile_rows == 4 and loaded[1].tile_rows == 1
    x = torch.randn(3, 128)
    torch.testing.assert_close(loaded(x), model(x))
