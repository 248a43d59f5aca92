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


def test_block_scales_per_token_and_128_channels():
    x = torch.zeros(2, 300)
    x[0, 0], x[0, 130], x[0, 299] = 254.0, -1.27, 0.5  # blocks of channels 0-127, 128-255, 256-299 (partial)
    xq, s_x = reference.quantize_act_blocks_ref(x)
    expected = torch.stack([torch.tensor([254.0, 1.27, 0.5]) / torch.full((3,), 127.0), torch.ones(3)])
    assert torch.equal(s_x, expected)  # IEEE float32 division; a zero block: scale 1
    assert xq[0, 0] == 127 and xq[0, 130] == -127 and xq[0, 299] == 127 and (xq[1] == 0).all()
    assert torch.equal(reference.dequantize_act_blocks(xq, s_x)[0, [0, 299]], torch.tensor([254.0, 0.5]))


def test_block_quantization_clamps_symmetrically_and_rounds_half_to_even():
    x = torch.tensor([[127.0, -127.0, 2.5, -3.5, 0.5]])  # scale 1
    xq, s_x = reference.quantize_act_blocks_ref(x)
    assert s_x.item() == 1.0 and xq.tolist() == [[127, -127, 2, -4, 0]]


def test_weight_blocks_one_scale_per_128_by_128():
    w = torch.zeros(130, 129)
    w[0, 0], w[129, 0], w[5, 128] = 12.7, -25.4, 1.27  # blocks (0, 0), (1, 0), (0, 1)
    w_q, s_w = reference.quantize_weight_blocks_ref(w)
    assert s_w.shape == (2, 2) and torch.allclose(s_w, torch.tensor([[0.1, 0.01], [0.2, 1.0]]))
    assert w_q[0, 0] == 127 and w_q[129, 0] == -127 and w_q[5, 128] == 127
    assert torch.allclose(reference.dequantize_weight_blocks(w_q, s_w), w)


def test_block_matmul_rescales_each_k_block():
    """Two K blocks with different scales: y = sum_kb int_sum_kb * s_x[kb] * s_w[kb]."""
    xq = torch.ones(1, 256, dtype=torch.int8)
    s_x = torch.tensor([[0.5, 2.0]])
    w_q = torch.ones(2, 256, dtype=torch.int8)
    w_q[1, 128:] = -1
    s_w = torch.tensor([[1.0, 0.25]])
    y = reference.w8a8_block_matmul_quantized_ref(xq, s_x, w_q, s_w, out_dtype=torch.float32)
    assert y.tolist() == [[128 * 0.5 + 128 * 0.5, 128 * 0.5 - 128 * 0.5]]
    yq, s_y = reference.w8a8_block_matmul_quantized_ref(xq, s_x, w_q, s_w, bias=torch.tensor([0.0, 1.0]),
                                                        out_dtype=torch.int8, act_dtype=torch.float16)
    assert s_y.shape == (1, 1) and torch.allclose(s_y, torch.tensor([[128 / 127]]))
    assert yq.tolist() == [[127, 1]]


def test_block_non_finite_block_has_a_nan_scale_and_zero_integers():
    x = torch.randn(1, 256)
    x[0, 3] = float("inf")
    xq, s_x = reference.quantize_act_blocks_ref(x)
    assert torch.isnan(s_x[0, 0]) and torch.isfinite(s_x[0, 1]) and (xq[0, :128] == 0).all()
