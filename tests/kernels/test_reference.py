"""Tests for compress_kernels/reference.py: the numerical contract itself, checked by hand-built values."""
from __future__ import annotations

import torch

from compress_kernels import reference
from tests.kernels.helpers import pack_int4


def test_unpack_known_packed_word():
    # channels 0..7 of one output column hold -8, 7, -1, 0, 1, -7, 3, -4
    values = [-8, 7, -1, 0, 1, -7, 3, -4]
    word = 0
    for j, v in enumerate(values):
        word |= (v & 0xF) << (4 * j)
    word -= 1 << 32 if word >= 1 << 31 else 0  # as a signed int32
    qweight = torch.tensor([[word]], dtype=torch.int32)
    assert reference.unpack_int4(qweight).flatten().tolist() == values


def test_pack_unpack_round_trip_covers_the_range():
    q = torch.arange(-8, 8, dtype=torch.int8).repeat(4).reshape(16, 4)  # (K=16, N=4), all 16 values
    assert torch.equal(reference.unpack_int4(pack_int4(q)), q)


def test_dequantize_applies_group_scales():
    q = torch.randint(-8, 8, (64, 3), dtype=torch.int8)
    scales = torch.tensor([[1.0, 2.0, 0.5], [0.25, 4.0, 0.0]])  # (K/G = 2, N = 3), G = 32
    w = reference.dequantize_int4(pack_int4(q), scales, 32)  # (N, K)
    expected = (q.float() * scales.repeat_interleave(32, dim=0)).T
    assert torch.equal(w, expected)


def test_quantize_per_token_zero_row_and_ties():
    x = torch.tensor([[0.0, 0.0, 0.0], [127.0, 2.5, -3.5]], dtype=torch.float16)
    xq, s_x = reference.quantize_per_token(x)
    assert s_x.tolist() == [1.0, 1.0]  # zero row: scale 1, not 0
    assert xq.tolist() == [[0, 0, 0], [127, 2, -4]]  # half to even
    assert torch.isfinite(s_x).all()


def test_quantize_per_token_static_scale_clamps():
    x = torch.tensor([[1.0, -1.0, 0.01]], dtype=torch.float16)
    xq, s_x = reference.quantize_per_token(x, torch.tensor(0.001))
    assert xq.tolist() == [[127, -128, 10]] and s_x.tolist() == [torch.tensor(0.001).item()]


def test_w8a8_ref_equals_float_computation_of_the_integers():
    x = torch.randn(5, 96, dtype=torch.float16)
    w_q = torch.randint(-127, 128, (7, 96), dtype=torch.int8)
    w_scale = torch.rand(7) * 0.01
    bias = torch.randn(7, dtype=torch.float16)
    xq, s_x = reference.quantize_per_token(x)
    acc = xq.double() @ w_q.double().T  # exact: every partial sum is an integer far below 2^53
    expected = (acc.float() * s_x[:, None] * w_scale[None, :] + bias.float()).half()
    assert torch.equal(reference.w8a8_matmul_ref(x, w_q, w_scale, bias), expected)


def test_w4a16_ref_matches_dense_linear():
    q = torch.randint(-8, 8, (64, 6), dtype=torch.int8)
    scales = torch.rand(2, 6)
    x = torch.randn(3, 64, dtype=torch.bfloat16)
    w = (q.float() * scales.repeat_interleave(32, dim=0)).T  # (N, K)
    expected = torch.nn.functional.linear(x.float(), w).bfloat16()
    assert torch.equal(reference.w4a16_matmul_ref(x, pack_int4(q), scales, 32), expected)


def test_w8a16_ref_applies_channel_and_group_scales():
    w_q = torch.randint(-128, 128, (6, 256), dtype=torch.int8)
    x = torch.randn(3, 256, dtype=torch.float16)
    bias = torch.randn(6)
    per_channel = torch.rand(6)
    assert torch.equal(reference.dequantize_int8(w_q, per_channel), w_q.float() * per_channel[:, None])
    groups = torch.tensor([[1.0, 0.5]]).repeat(6, 1)  # (N, K/128): the second half of K at half scale
    w = reference.dequantize_int8(w_q, groups)
    assert torch.equal(w[:, :128], w_q[:, :128].float()) and torch.equal(w[:, 128:], w_q[:, 128:].float() * 0.5)
    expected = (torch.nn.functional.linear(x.float(), w) + bias).half()
    assert torch.equal(reference.w8a16_matmul_ref(x, w_q, groups, bias), expected)
