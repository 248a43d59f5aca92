"""Tests for compress/nn/inference/bsr_w4a16.py: BSRW4A16Linear holds and computes what W4A16Linear does on
the pruned weight (the integers and scales QAT fake-quantizes with), on the reference and the kernel branch."""
import pytest
import torch
from torch import nn

from compress._kernels import reference
from compress.configs import BlockSparseConfig, W4A16Config, W8A8Config
from compress.core.quant import pack_int4_blocks, unpack_int4_blocks
from compress.core.sparsity import block_mask, expand_mask
from compress.nn.inference import BSRW4A16Linear, W4A16Linear


def _layer_and_mask(n=96, k=128, sparsity=0.5, seed=0):
    torch.manual_seed(seed)
    linear = nn.Linear(k, n)
    mask = block_mask(linear.weight, sparsity)
    return linear, mask, linear.weight.detach() * expand_mask(mask, (n, k))


@pytest.mark.parametrize(("group_size", "k"), [(32, 128), (128, 256), (64, 128), (None, 128),
                                               (128, 96), (64, 160)])  # the last two: a short last group
def test_holds_and_computes_what_w4a16_does_on_the_pruned_weight(group_size, k):
    linear, mask, masked = _layer_and_mask(k=k)
    config = W4A16Config(group_size)
    dense = W4A16Linear.from_float(linear, config, weight=masked)
    sparse = BSRW4A16Linear.from_float(linear, config, BlockSparseConfig(0.5), weight=masked, mask=mask)
    assert sparse.nnz == int(mask.sum()) and sparse.values.shape == (sparse.nnz, 32, 4)
    assert sparse.values.dtype == torch.int32 and sparse.scales.shape == (sparse.nnz, 32)
    assert torch.equal(sparse.dequantized_weight(), dense.dequantized_weight())  # q * s, bit for bit
    x = torch.randn(4, k)
    torch.testing.assert_close(sparse(x), dense(x), atol=1e-5, rtol=1e-5)  # fp32 sums in another order


def test_the_tile_pattern_is_found_at_export_and_again_at_load(tmp_path, kernel_modules, monkeypatch):
    """Pruned in tiles of 4 block rows and quantized: the module finds tile_rows 4 and hands it to the op, which
    past 64 rows runs the tile kernel on the de-quantized blocks; a loaded copy finds it again, free blocks
    give 1."""
    import compress
    from compress_kernels.bsr_w4a16 import op as bsr_w4a16_op

    torch.manual_seed(0)
    plan = {"0": [BlockSparseConfig(0.5, tile_rows=4), W4A16Config(32)], "1": [BlockSparseConfig(0.5), W4A16Config(32)]}
    model = compress.convert(nn.Sequential(nn.Linear(128, 256), nn.Linear(256, 64)), plan)
    assert isinstance(model[0], BSRW4A16Linear) and (model[0].tile_rows, model[1].tile_rows) == (4, 1)
    compress.save_compressed(model, tmp_path / "model")
    loaded = compress.load_compressed(tmp_path / "model", model=nn.Sequential(nn.Linear(128, 256), nn.Linear(256, 64)))
    assert (loaded[0].tile_rows, loaded[1].tile_rows) == (4, 1)
    seen, real = [], bsr_w4a16_op.launch_dds
    monkeypatch.setattr(bsr_w4a16_op, "launch_dds", lambda *args: seen.append(args[-1]) or real(*args))
    layer = loaded[0].half()
    x = torch.randn(80, 128).half()
    y = layer(x)
    assert seen == [4]
    ref = reference.bsr_w4a16_matmul_ref(x, layer.crow_indices, layer.col_indices, layer.values, layer.scales, 256,
                                         layer.bias).float()
    assert (y.float() - ref).norm() / ref.norm() < 1e-3  # the blocks de-quantized to fp16 first


def test_learned_scales_and_kept_zero_blocks():
    """LSQ's (or GPTQ's) scales are the ones stored; a block the mask keeps is stored even when all zero, and
    without a mask only the non-zero blocks are."""
    linear, mask, masked = _layer_and_mask()
    masked[:32, :32] = 0
    mask[0, 0] = True
    scale = torch.rand(96, 4) * 0.01 + 0.001  # (N, K/G)
    sparse = BSRW4A16Linear.from_float(linear, W4A16Config(32), weight=masked, mask=mask, weight_scale=scale)
    assert sparse.nnz == int(mask.sum())
    dense = W4A16Linear.from_float(linear, W4A16Config(32), weight=masked, weight_scale=scale)
    assert torch.equal(sparse.dequantized_weight(), dense.dequantized_weight())
    assert BSRW4A16Linear.from_w4a16(dense).nnz == int(mask.sum()) - 1


def test_block_packing_round_trip_matches_the_dense_packing():
    q = torch.randint(-8, 8, (5, 32, 32), dtype=torch.int8)
    values = pack_int4_blocks(q)
    assert values.shape == (5, 32, 4) and values.dtype == torch.int32
    assert torch.equal(unpack_int4_blocks(values), q)
    with pytest.raises(ValueError, match="multiple of 8"):
        pack_int4_blocks(torch.zeros(2, 32, 30, dtype=torch.int8))


def test_cast_keeps_integers_and_scales_and_repr():
    linear, mask, masked = _layer_and_mask()
    half = BSRW4A16Linear.from_float(linear, W4A16Config(32), weight=masked, mask=mask).half()
    assert half.values.dtype == torch.int32 and half.scales.dtype == torch.float32
    assert half.bias.dtype == torch.float16 and half.weight.dtype == torch.float16
    assert half(torch.randn(2, 128, dtype=torch.float16)).dtype == torch.float16
    assert "nnz_blocks=6/12" in repr(half) and "group_size=32" in repr(half)


def test_bad_arguments():
    with pytest.raises(TypeError, match="expected W4A16Config, got W8A8Config"):
        BSRW4A16Linear(64, 64, config=W8A8Config())
    with pytest.raises(ValueError, match="multiples of 32"):
        BSRW4A16Linear(64, 40)
    with pytest.raises(ValueError, match="multiples of 32"):
        BSRW4A16Linear.from_w4a16(W4A16Linear.from_float(nn.Linear(40, 64), W4A16Config(32)))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("m", [1, 3, 17])
def test_kernel_branch_equals_the_reference_branch(dtype, m, kernel_modules):
    linear, mask, masked = _layer_and_mask(k=256)
    module = BSRW4A16Linear.from_float(linear, W4A16Config(128), weight=masked, mask=mask).to(dtype)
    x = torch.randn(m, 256).to(dtype)
    expected = reference.bsr_w4a16_matmul_ref(x, module.crow_indices, module.col_indices, module.values,
                                              module.scales, 96, module.bias)
    got = module(x)
    assert module.__dict__["_bound_calls"]  # the bound kernel call ran
    tol = {torch.float16: 2**-10, torch.bfloat16: 2**-7}[dtype]
    torch.testing.assert_close(got.float(), expected.float(), rtol=tol, atol=tol)
