"""Bound calls (compress_kernels/common/bound.py and each op's ``bind_*``): the direct launch, the custom op
and the public function give the same bits; only x is checked per call, with clear errors.

CPU: the Triton interpreter on small shapes (tests/conftest.py); the same code runs on the GPU.
"""
from __future__ import annotations

import pytest
import torch

import compress_kernels as kernels
from compress_kernels import reference
from compress_kernels.common import bound
from compress_kernels.common.bound import launches_directly
from tests.kernels.helpers import (DEVICE, block_sparse_dense, bsr_parts, int4_block_sparse, int8_block_sparse,
                                   random_int4_weight)
from tests.kernels.helpers import random_int8_weight, random_w8a16_weight

K, N = 64, 96


def _w8a8(static: bool):
    w_q, w_scale = random_int8_weight(N, K, device=DEVICE)
    bias = torch.randn(N, device=DEVICE).half()
    x_scale = torch.tensor(0.02, device=DEVICE) if static else None
    return "w8a8_matmul", (w_q, w_scale, bias, x_scale), reference.w8a8_matmul_ref


def _w4a16():
    qweight, _, scales = random_int4_weight(K, N, 32, device=DEVICE)
    return "w4a16_matmul", (qweight, scales, 32, None), reference.w4a16_matmul_ref


def _w8a16():
    w_q, w_scale = random_w8a16_weight(N, K, False, device=DEVICE)
    return "w8a16_matmul", (w_q, w_scale, torch.randn(N, device=DEVICE).half()), reference.w8a16_matmul_ref


def _bsr():
    crow, col, values = bsr_parts(block_sparse_dense(N, K, 0.5, torch.float16, DEVICE))
    return "bsr_matmul_parts", (crow, col, values, N, torch.randn(N, device=DEVICE).half()), reference.bsr_matmul_ref


def _bsr_w8a8():
    (crow, col, values), w_scale, _ = int8_block_sparse(N, K, 0.5)
    return "bsr_w8a8_matmul_parts", (crow, col, values, w_scale, N, None, None), reference.bsr_w8a8_matmul_ref


def _bsr_w4a16():
    parts, scales, _, _ = int4_block_sparse(N, K, 0.5, 32)
    return "bsr_w4a16_matmul", (*parts, scales, N, torch.randn(N, device=DEVICE).half()), reference.bsr_w4a16_matmul_ref


OPS = {"w8a8": lambda: _w8a8(False), "w8a8-static": lambda: _w8a8(True), "w4a16": _w4a16, "w8a16": _w8a16,
       "bsr": _bsr, "bsr-w8a8": _bsr_w8a8, "bsr-w4a16": _bsr_w4a16}


@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("shape", [(1, K), (2, 3, K)])
def test_direct_launch_custom_op_and_public_function_agree(op, shape, monkeypatch):
    name, weights, ref = OPS[op]()
    x = torch.randn(*shape, device=DEVICE).half()
    call = getattr(kernels, f"bind_{name}")(x, *weights)
    assert launches_directly(x)
    direct = call(x)
    public = getattr(kernels, name)(x, *weights)
    monkeypatch.setattr(bound, "launches_directly", lambda t: False)  # the custom op path, as under torch.compile
    through_op = call(x)
    assert direct.shape == (*shape[:-1], N) and direct.dtype == torch.float16
    assert torch.equal(direct, through_op) and torch.equal(direct, public)
    torch.testing.assert_close(direct, ref(x, *weights), atol=2e-2, rtol=2e-2)


def test_one_binding_serves_any_number_of_tokens():
    name, weights, _ = OPS["w4a16"]()
    call = kernels.bind_w4a16_matmul(torch.randn(1, K, device=DEVICE).half(), *weights)
    for m in (0, 5):
        x = torch.randn(m, K, device=DEVICE).half()
        assert torch.equal(call(x), kernels.w4a16_matmul(x, *weights))


@pytest.mark.parametrize(
    "x,error,words",
    [
        (lambda: [1.0] * K, TypeError, "expected a torch.Tensor"),
        (lambda: torch.randn(2, K, device=DEVICE).bfloat16(), TypeError, "expected dtype torch.float16"),
        (lambda: torch.randn(2, K + 8, device=DEVICE).half(), ValueError, rf"expected shape \(\.\.\., {K}\)"),
        (lambda: torch.tensor(1.0, device=DEVICE).half(), ValueError, rf"expected shape \(\.\.\., {K}\)"),
        (lambda: torch.randn(2, K, device="meta").half(), ValueError, "expected device"),
    ],
)
def test_bad_inputs_are_refused_by_name(x, error, words):
    name, weights, _ = OPS["w8a8"]()
    call = kernels.bind_w8a8_matmul(torch.randn(2, K, device=DEVICE).half(), *weights)
    with pytest.raises(error, match=words):
        call(x())


def test_binding_validates_every_argument():
    name, (w_q, w_scale, bias, _), _ = OPS["w8a8"]()
    x = torch.randn(2, K, device=DEVICE).half()
    with pytest.raises(ValueError, match=r"w_scale: expected shape \(96,\)"):
        kernels.bind_w8a8_matmul(x, w_q, w_scale[:-1], bias)
    with pytest.raises(ValueError, match="one static scale for every token"):
        kernels.bind_w8a8_matmul(x, w_q, w_scale, bias, torch.full((2,), 0.02, device=DEVICE))
    (crow, col, values), _, _ = int8_block_sparse(N, K, 0.5)
    with pytest.raises(TypeError, match="values: expected dtype"):
        kernels.bind_bsr_matmul_parts(x, crow, col, values, N)


def test_launches_directly_only_for_plain_eager_tensors_without_autograd():
    x = torch.randn(2, 4)
    assert launches_directly(x)
    w = torch.randn(2, 4, requires_grad=True)
    assert not launches_directly(w)
    with torch.no_grad():
        assert launches_directly(w)
    assert not launches_directly(torch.nn.Parameter(torch.randn(2, 4)))  # a subclass: the custom op serves it
    compiled = torch.compile(lambda t: t * (1 if launches_directly(t) else 2), backend="eager", fullgraph=True)
    assert torch.equal(compiled(x), x * 2)


def test_compiled_bound_call_goes_through_the_custom_op():
    name, weights, _ = OPS["w8a8"]()
    x = torch.randn(3, K, device=DEVICE).half()
    call = kernels.bind_w8a8_matmul(x, *weights)
    compiled = torch.compile(lambda t: call(t) * 2, backend="aot_eager", fullgraph=True)
    assert torch.equal(compiled(x), call(x) * 2)


@pytest.mark.parametrize("sparse", [False, True])
def test_quantized_bound_call_equals_the_public_launcher(sparse):
    x = torch.randn(3, K, device=DEVICE).half()
    xq, s_x = reference.quantize_per_token(x)
    if sparse:
        (crow, col, values), w_scale, _ = int8_block_sparse(N, K, 0.5)
        weights, public = (crow, col, values, w_scale, N, None, torch.float16), kernels.bsr_w8a8_matmul_quantized
        call = kernels.bind_bsr_w8a8_matmul_quantized(xq, s_x, *weights)
    else:
        w_q, w_scale = random_int8_weight(N, K, device=DEVICE)
        weights, public = (w_q, w_scale, None, torch.float16), kernels.w8a8_matmul_quantized
        call = kernels.bind_w8a8_matmul_quantized(xq, s_x, *weights)
    assert torch.equal(call(xq, s_x), public(xq, s_x, *weights))
    with pytest.raises(TypeError, match="xq: expected dtype torch.int8"):
        call(x, s_x)
    with pytest.raises(ValueError, match=rf"xq: expected shape \(M, {K}\)"):
        call(xq[:, :32], s_x)
    with pytest.raises(ValueError, match=r"s_x: expected shape \(3,\)"):
        call(xq, s_x[:2])


@pytest.mark.parametrize("op", ["w4a16", "w8a16"])
def test_a_padded_binding_takes_unpadded_inputs_on_either_path(op, monkeypatch):
    name, weights, _ = OPS[op]()
    x = torch.randn(3, K - 24, device=DEVICE).half()  # 40 channels, the op's K is 64
    padded = torch.nn.functional.pad(x, (0, 24))
    call = getattr(kernels, f"bind_{name}")(padded, *weights).padded_from(K - 24)
    expected = getattr(kernels, name)(padded, *weights)
    assert torch.equal(call(x), expected)
    monkeypatch.setattr(bound, "launches_directly", lambda t: False)  # the custom op path pads with F.pad
    assert torch.equal(call(x), expected)
    with pytest.raises(ValueError, match=rf"expected shape \(\.\.\., {K - 24}\)"):
        call(padded)
    with pytest.raises(ValueError, match="in_features: expected 1..64"):
        call.padded_from(K + 8)
