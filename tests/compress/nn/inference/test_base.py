"""Tests for compress/nn/inference/base.py: the kernel branch's bound calls under the Triton interpreter
(bound once, rebound after a cast or a new buffer, never copied or pickled, equal to the compiled custom
ops) and the buffers converted to x's dtype."""
import pytest
import torch
from torch import nn

from compress.configs import W4A16Config, W8A8Config
from compress.nn.inference import W4A16Linear, W8A8Linear, kernels_run
from tests.compress.nn.inference.helpers import MAKERS, bound_calls


@pytest.mark.parametrize("kind", list(MAKERS))
def test_eager_forward_binds_once_and_equals_the_compiled_custom_op(kind, kernel_modules):
    torch.manual_seed(0)
    module = MAKERS[kind](nn.Linear(64, 64)).half()
    x = torch.randn(2, 3, 64, dtype=torch.float16)
    first = module(x)
    (call,) = [kept[2] for kept in bound_calls(module).values()]
    assert torch.equal(module(x), first) and [kept[2] for kept in bound_calls(module).values()] == [call]
    compiled = torch.compile(module, backend="aot_eager", fullgraph=True)
    assert torch.equal(compiled(x), first)  # the public launcher and its custom op, traced


@pytest.mark.parametrize("kind", ["w8a8", "w4a16", "w8a16", "w8a8-block", "bsr"])
def test_a_cast_drops_the_bound_call_and_another_input_dtype_binds_anew(kind, kernel_modules):
    torch.manual_seed(0)
    module = MAKERS[kind](nn.Linear(64, 64)).half()
    x = torch.randn(4, 64, dtype=torch.float16)
    y16 = module(x)
    y_bf16_input = module(x.bfloat16())  # fp16 buffers, bf16 input: bias (and BSR values) converted, bound anew
    assert [key for key, _, _ in bound_calls(module).values()] == [(torch.bfloat16, x.get_device())]
    module.bfloat16()
    assert not bound_calls(module) and not module.__dict__.get("_dtype_copies")  # dropped with the old tensors
    y = module(x.bfloat16())
    assert y.dtype == torch.bfloat16 and torch.equal(y, y_bf16_input)  # the same conversion, made by the cast
    torch.testing.assert_close(y.float(), y16.float(), atol=5e-2, rtol=5e-2)


def test_reassigned_bias_is_used_and_in_place_changes_are_seen(kernel_modules):
    torch.manual_seed(0)
    module = W4A16Linear.from_float(nn.Linear(64, 64), W4A16Config(32)).half()
    x = torch.randn(4, 64, dtype=torch.float16)
    before = module(x)
    module.bias = module.bias + 1  # a new tensor: rebound
    torch.testing.assert_close(module(x), before + 1, atol=1e-2, rtol=0)
    with torch.no_grad():
        module.bias.sub_(1)  # in place: the bound call holds this very tensor
    torch.testing.assert_close(module(x), before, atol=1e-2, rtol=0)


def test_a_bias_in_another_dtype_is_converted_once_and_refreshed_after_in_place_changes(kernel_modules):
    torch.manual_seed(0)
    module = W8A8Linear.from_float(nn.Linear(64, 64), W8A8Config())  # float32 bias, fp16 input
    x = torch.randn(4, 64, dtype=torch.float16)
    y = module(x)
    copy = module.__dict__["_dtype_copies"]["bias"][2]
    module(x)
    assert copy.dtype == torch.float16 and module.__dict__["_dtype_copies"]["bias"][2] is copy
    with torch.no_grad():
        module.bias.add_(1)
    torch.testing.assert_close(module(x), y + 1, atol=1e-2, rtol=0)
    assert module.__dict__["_dtype_copies"]["bias"][2] is not copy


def test_bound_calls_are_neither_copied_nor_pickled(kernel_modules):
    import copy
    import pickle

    module = MAKERS["bsr-w8a8"](nn.Linear(64, 64)).half()
    x = torch.randn(2, 64, dtype=torch.float16)
    y = module(x)
    assert bound_calls(module)
    clone = copy.deepcopy(module)
    assert not bound_calls(clone) and torch.equal(clone(x), y)
    restored = pickle.loads(pickle.dumps(module))
    assert not bound_calls(restored) and torch.equal(restored(x), y)


@pytest.mark.parametrize("kind", ["w8a8", "w4a16", "w8a16", "w8a8-block", "bsr"])
def test_bad_inputs_fail_clearly_on_the_kernel_branch(kind, kernel_modules):
    module = MAKERS[kind](nn.Linear(64, 64)).half()
    module(torch.randn(2, 64, dtype=torch.float16))
    with pytest.raises(ValueError, match=r"x: expected shape \(\.\.\., 64\)"):
        module(torch.randn(2, 32, dtype=torch.float16))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_kernels_run_on_cuda_fp16_bf16_inputs_only_as_the_forward_decides(dtype):
    assert kernels_run(torch.device("cuda"), dtype) is (dtype != torch.float32)
    assert kernels_run("cpu", dtype) is False
    module = W8A8Linear.from_float(nn.Linear(128, 64), W8A8Config())
    assert module._use_kernel(torch.zeros(1, 128, dtype=dtype)) is kernels_run("cpu", dtype)


@pytest.mark.parametrize("module, other", [(W8A8Linear, W4A16Config()), (W4A16Linear, W8A8Config())])
def test_a_module_refuses_a_config_of_another_scheme_and_defaults_to_its_own(module, other):
    with pytest.raises(TypeError, match=f"config: expected {module.config_class.__name__}, got {type(other).__name__}"):
        module(64, 32, config=other)
    assert module(64, 32).config == module.config_class()
