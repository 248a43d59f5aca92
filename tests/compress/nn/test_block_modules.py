"""Block-scaled W8A8 in compress: QAT fake quantization (compress/nn/qat.py), the inference module
W8A8BlockLinear (compress/nn/inference/w8a8_block.py), export (compress/plan.py), sibling fusion and the checkpoint.

On the CPU the inference module runs the kernels' reference (compress_kernels.reference), which the
kernel tests hold the Triton kernels to; the GPU test at the end runs the kernels."""
import pickle

import pytest
import torch
from torch import nn

import compress
from compress import BlockSparseConfig, W8A8BlockConfig, W8A8BlockLinear
from compress._kernels import reference
from compress.nn.fusion import fuse_siblings, unfuse_siblings
from compress.nn.qat import CompressedLinear
from compress.plan import export_module


def _layer(n=200, k=300, seed=0, configs=(W8A8BlockConfig(),)):
    torch.manual_seed(seed)
    linear = nn.Linear(k, n)
    return linear, CompressedLinear.from_float(linear, list(configs))


def test_from_float_holds_int8_blocks_and_their_scales():
    linear, _ = _layer()
    module = W8A8BlockLinear.from_float(linear)
    assert module.w_q.shape == (200, 300) and module.w_q.dtype == torch.int8
    assert module.w_scale.shape == (2, 3) and module.w_scale.dtype == torch.float32
    w_q, w_scale = reference.quantize_weight_blocks_ref(linear.weight.detach())
    assert torch.equal(module.w_q, w_q) and torch.equal(module.w_scale, w_scale)
    step = w_scale.repeat_interleave(128, 0).repeat_interleave(128, 1)[:200, :300]
    assert ((module.dequantized_weight() - linear.weight.detach()).abs() <= step / 2 + 1e-7).all()
    assert "128x128 weight blocks" in repr(module)


def test_forward_is_the_reference_and_close_to_the_float_layer():
    linear, _ = _layer()
    module = W8A8BlockLinear.from_float(linear)
    x = torch.randn(2, 5, 300)
    y = module(x)
    assert y.shape == (2, 5, 200)
    assert torch.equal(y, reference.w8a8_block_matmul_ref(x, module.w_q, module.w_scale, module.bias))
    ref = linear(x).detach()
    assert (y - ref).norm() / ref.norm() < 2e-2


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("learnable", [False, True])
def test_prepare_and_convert_compute_the_same_function(dtype, learnable):
    """The fake-quantized training layer and the exported module: same scales, integers and clamping;
    they agree to the rounding of the output dtype (the sum's fp32 order differs)."""
    _, layer = _layer(configs=[W8A8BlockConfig(learnable_scale=learnable)])
    layer.enable_fake_quant(True)
    if learnable:  # a few LSQ steps move the scales away from the absmax ones
        optimizer = torch.optim.SGD(layer.parameters(), lr=1e-3)
        for _ in range(3):
            optimizer.zero_grad()
            layer(torch.randn(8, 300)).pow(2).mean().backward()
            optimizer.step()
    layer = layer.to(dtype)
    exported = export_module("layer", layer)
    assert isinstance(exported, W8A8BlockLinear)
    if learnable:
        assert torch.equal(exported.w_scale, layer.weight_scale.detach().float())
    x = (torch.randn(6, 300) * 2).to(dtype)
    with torch.no_grad():
        qat, inference = layer(x), exported(x)
    assert qat.dtype == inference.dtype == dtype
    tol = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}[dtype]
    torch.testing.assert_close(inference.float(), qat.float(), rtol=tol, atol=tol * qat.float().abs().max().item())


def test_training_gradients_flow_and_masked_blocks_export_as_zeros():
    _, layer = _layer(n=128, k=256, configs=[BlockSparseConfig(0.5), W8A8BlockConfig(learnable_scale=True)])
    layer.enable_fake_quant(True)
    x = torch.randn(4, 256, requires_grad=True)
    layer(x).sum().backward()
    assert layer.weight.grad.abs().sum() > 0 and x.grad.abs().sum() > 0 and layer.weight_scale.grad is not None
    mask = torch.ones(4, 8, dtype=torch.bool)
    mask[:, :4] = False
    layer.set_mask(mask)
    exported = export_module("layer", layer)
    assert isinstance(exported, W8A8BlockLinear) and (exported.w_q[:, :128] == 0).all()


def test_convert_by_plan_and_the_checkpoint_round_trip(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(200, 256), nn.GELU(), nn.Linear(256, 72))
    compress.convert(model, W8A8BlockConfig())
    assert [type(m).__name__ for m in model] == ["W8A8BlockLinear", "GELU", "W8A8BlockLinear"]
    compress.save_compressed(model, tmp_path / "c")
    skeleton = nn.Sequential(nn.Linear(200, 256), nn.GELU(), nn.Linear(256, 72))
    loaded = compress.load_compressed(tmp_path / "c", model=skeleton)
    assert loaded[2].config == W8A8BlockConfig() and loaded[2].w_scale.shape == (1, 2)
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name
    x = torch.randn(3, 200)
    assert torch.equal(model(x), loaded(x))


def test_half_keeps_scales_float32_and_pickles_without_caches():
    linear, _ = _layer()
    module = W8A8BlockLinear.from_float(linear).half()
    assert module.w_scale.dtype == torch.float32 and module.bias.dtype == torch.float16
    clone = pickle.loads(pickle.dumps(module))
    assert torch.equal(clone.w_q, module.w_q)


def test_wrong_config_type_is_refused():
    with pytest.raises(TypeError, match="expected W8A8BlockConfig"):
        W8A8BlockLinear(128, 128, config=compress.W8A8Config())


def test_fused_siblings_give_the_members_outputs_and_split_back():
    torch.manual_seed(0)
    parent = nn.Module()
    parent.query, parent.key, parent.value = (W8A8BlockLinear.from_float(nn.Linear(200, 128)) for _ in range(3))
    x = torch.randn(4, 200)
    separate = [m(x) for m in (parent.query, parent.key, parent.value)]
    assert fuse_siblings(parent) == 1
    assert all(torch.equal(a, b) for a, b in zip(separate, (parent.query(x), parent.key(x), parent.value(x))))
    assert unfuse_siblings(parent) == 1 and torch.equal(parent.value(x), separate[2])
    parent.value = W8A8BlockLinear.from_float(nn.Linear(200, 100))  # N not a multiple of 128: left unfused
    assert fuse_siblings(parent) == 0


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gpu_module_matches_the_reference(dtype):
    linear, _ = _layer(n=1024, k=768)
    module = W8A8BlockLinear.from_float(linear).to("cuda", dtype)
    x = torch.randn(37, 768, device="cuda", dtype=dtype)
    ref = reference.w8a8_block_matmul_ref(x, module.w_q, module.w_scale, module.bias)
    y = module(x)
    assert (y.float() - ref.float()).norm() / ref.float().norm() < 1e-2
    assert torch.equal(y, module(x))  # the bound call, the second time
