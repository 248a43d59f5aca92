"""The block quantizers (compress_kernels/w8a8_block/quantize.py, op_blocks.py) against compress_kernels.reference.

Both compute the reference's integers and scales exactly (IEEE division, round half to even), so the
comparisons are ``torch.equal``. CPU: the Triton interpreter; GPU: marked ``gpu``.
"""
from __future__ import annotations

import pytest
import torch

from compress_kernels import reference
from compress_kernels.w8a8_block.op_blocks import quantize_act_blocks, quantize_weight_blocks
from tests.kernels.helpers import DEVICE, DTYPES


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,k", [(1, 128), (3, 200), (2, 2100), (5, 64)])  # a tail block; > 16 blocks a row
def test_activation_blocks_match_reference(dtype, m, k):
    x = (torch.randn(m, k) * 3).to(dtype).to(DEVICE)
    xq, s_x = quantize_act_blocks(x)
    ref_q, ref_s = reference.quantize_act_blocks_ref(x)
    assert xq.shape == (m, k) and s_x.shape == (m, -(-k // 128))
    assert torch.equal(xq, ref_q) and torch.equal(s_x, ref_s)
    assert s_x.stride() == (1, m)  # the kernels' layout: one K block's scales contiguous


def test_activation_scales_are_per_block_and_zero_blocks_give_zeros():
    x = torch.randn(2, 384).half()
    x[0, 128:256] = 0  # one zero block
    x[1, :128] *= 100  # an outlier block does not change the others' scales
    xq, s_x = quantize_act_blocks(x.to(DEVICE))
    assert s_x[0, 1] == 1.0 and (xq[0, 128:256] == 0).all()
    blocks = x.float().abs().reshape(2, 3, 128).amax(-1) / 127
    assert torch.equal(s_x[1].cpu(), torch.where(blocks[1] == 0, 1.0, blocks[1]))
    assert xq.abs().max() <= 127


def test_activation_non_finite_block_gets_a_nan_scale_only_there():
    x = torch.randn(2, 256).half()
    x[0, 5] = float("inf")
    x[1, 200] = float("nan")
    xq, s_x = quantize_act_blocks(x.to(DEVICE))
    assert torch.isnan(s_x[0, 0]) and torch.isnan(s_x[1, 1])
    assert torch.isfinite(s_x[0, 1]) and torch.isfinite(s_x[1, 0])
    assert (xq[0, :128] == 0).all() and (xq[1, 128:] == 0).all()
    assert torch.equal(xq, reference.quantize_act_blocks_ref(x.to(DEVICE))[0])


def test_activation_strided_and_batched_inputs():
    x = torch.randn(130, 3, device=DEVICE).half().t()  # (3, 130), column-major
    assert all(torch.equal(a, b) for a, b in zip(quantize_act_blocks(x), reference.quantize_act_blocks_ref(x)))
    batched = torch.randn(2, 3, 128, device=DEVICE).half()
    xq, s_x = quantize_act_blocks(batched)
    assert xq.shape == (6, 128) and s_x.shape == (6, 1)


@pytest.mark.parametrize("dtype,n,k", [(torch.float16, 128, 128), (torch.bfloat16, 130, 200), (torch.float32, 64, 384)])
def test_weight_blocks_match_reference(dtype, n, k):
    w = (torch.randn(n, k) * 0.05).to(dtype)
    w[:64, :64] = 0  # part of a block only: its scale comes from the rest
    w_q, s_w = quantize_weight_blocks(w.to(DEVICE))
    ref_q, ref_s = reference.quantize_weight_blocks_ref(w.to(DEVICE))
    assert s_w.shape == (-(-n // 128), -(-k // 128))
    assert torch.equal(w_q, ref_q) and torch.equal(s_w, ref_s)


def test_weight_zero_block_has_scale_one():
    w = torch.randn(256, 128)
    w[128:] = 0
    w_q, s_w = quantize_weight_blocks(w.to(DEVICE))
    assert s_w[1, 0] == 1.0 and (w_q[128:] == 0).all()
    assert torch.allclose(reference.dequantize_weight_blocks(w_q, s_w).cpu(), w, atol=float(s_w[0, 0]) / 2)


def test_empty_activation_and_fake_shapes():
    xq, s_x = quantize_act_blocks(torch.empty(0, 256, device=DEVICE).half())
    assert xq.shape == (0, 256) and s_x.shape == (0, 2)
    xq, s_x = torch.ops.compress_kernels.quantize_act_blocks(torch.empty(4, 300, device="meta", dtype=torch.half))
    assert (xq.shape, xq.dtype, s_x.shape, s_x.stride()) == ((4, 300), torch.int8, (4, 3), (1, 4))
    w_q, s_w = torch.ops.compress_kernels.quantize_weight_blocks(torch.empty(200, 300, device="meta"))
    assert (w_q.shape, s_w.shape) == ((200, 300), (2, 3))


@pytest.mark.parametrize("call,error,words", [
    (lambda: quantize_act_blocks(torch.randn(2, 128)), TypeError, "x: expected dtype"),
    (lambda: quantize_act_blocks(torch.randn(2, 0, device=DEVICE).half()), ValueError, "K >= 1"),
    (lambda: quantize_weight_blocks(torch.randint(0, 3, (128, 128), dtype=torch.int8)), TypeError, "w: expected dtype"),
    (lambda: quantize_weight_blocks(torch.randn(2, 3, 4)), ValueError, "w: expected 2 dimensions"),
])
def test_bad_inputs_raise(call, error, words):
    with pytest.raises(error, match=words):
        call()


def test_cpu_tensor_without_interpreter_raises(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="expected a CUDA tensor"):
        quantize_act_blocks(torch.randn(2, 128).half())
    with pytest.raises(ValueError, match="expected a CUDA tensor"):
        quantize_weight_blocks(torch.randn(128, 128))
