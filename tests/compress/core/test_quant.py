"""Tests for compress/core/quant.py: round trips, int4 packing, zero groups, STE and LSQ gradients."""
import pytest
import torch

from compress._kernels import reference
from compress.core import quant


def test_pack_unpack_round_trip_covers_the_int4_range():
    torch.manual_seed(0)
    q = torch.randint(-8, 8, (64, 24), dtype=torch.int8)
    q[0, :] = -8
    q[1, :] = 7
    q[2:10, 0] = torch.tensor([-8, 7, -1, 0, 1, -7, 6, -8], dtype=torch.int8)
    packed = quant.pack_int4(q)
    assert packed.dtype == torch.int32 and packed.shape == (8, 24)
    assert torch.equal(quant.unpack_int4(packed), q)


def test_pack_layout_matches_the_design_formula():
    q = torch.tensor([[-8], [7], [-1], [0], [1], [2], [3], [-2]], dtype=torch.int8)  # (K=8, N=1)
    expected = 0
    for k in range(8):
        expected |= (int(q[k, 0]) & 0xF) << (4 * k)
    expected = expected - (1 << 32) if expected >= 1 << 31 else expected  # as a signed int32
    assert quant.pack_int4(q).item() == expected


def test_pack_rejects_out_of_range_and_bad_shapes():
    with pytest.raises(ValueError, match=r"\[-8, 7\]"):
        quant.pack_int4(torch.full((8, 2), 8, dtype=torch.int8))
    with pytest.raises(ValueError, match="multiple of 8"):
        quant.pack_int4(torch.zeros(12, 2, dtype=torch.int8))


def test_groupwise_round_trip_error_is_at_most_half_a_step():
    torch.manual_seed(1)
    w = torch.randn(16, 128)
    q, scale = quant.quantize_groupwise(w, 32)
    assert q.min() >= -8 and q.max() <= 7 and scale.shape == (16, 4)
    err = (quant.dequantize_groupwise(q, scale, 32) - w).abs()
    assert (err <= scale.repeat_interleave(32, dim=1) / 2 + 1e-6).all()


def test_int8_groups_use_the_whole_int8_range_and_match_the_kernel_reference():
    """W8A16 with groups of 128: scales max|W[n, group]| / 127, q in [-128, 127], and the dequantized weight
    is the kernel reference's ``w_q * s_w[n, k // 128]``."""
    torch.manual_seed(5)
    w = torch.randn(8, 256)
    q, scale = quant.quantize_groupwise(w, 128, qmax=quant.INT8_QMAX)
    assert scale.shape == (8, 2) and (q.abs().reshape(8, 2, 128).amax(dim=2) == 127).all()
    torch.testing.assert_close(scale, w.abs().reshape(8, 2, 128).amax(dim=2) / 127, rtol=0, atol=0)
    deq = quant.dequantize_groupwise(q, scale, 128)
    assert torch.equal(deq, reference.dequantize_int8(q, scale))
    assert torch.equal(quant.fake_quantize_groupwise(w, 128, qmax=quant.INT8_QMAX), deq)
    assert ((deq - w).abs() <= scale.repeat_interleave(128, dim=1) / 2 + 1e-6).all()


def test_all_zero_group_and_row_give_zeros_not_nan():
    w = torch.randn(4, 64)
    w[1] = 0
    w[2, :32] = 0
    q4, s4 = quant.quantize_groupwise(w, 32)
    q8, s8 = quant.quantize_per_channel(w)
    for q, deq in ((q4, quant.dequantize_groupwise(q4, s4, 32)), (q8, quant.dequantize_per_channel(q8, s8))):
        assert torch.isfinite(deq).all()
        assert (q[1] == 0).all() and (deq[1] == 0).all()
    assert (q4[2, :32] == 0).all()
    x = torch.zeros(3, 16)
    assert torch.equal(quant.fake_quantize_per_token(x), x)


def test_per_channel_round_trip_and_extremes():
    torch.manual_seed(2)
    w = torch.randn(8, 40)
    w_q, scale = quant.quantize_per_channel(w)
    assert w_q.dtype == torch.int8 and (w_q.abs().amax(dim=1) == 127).all()
    err = (quant.dequantize_per_channel(w_q, scale) - w).abs()
    assert (err <= scale[:, None] / 2 + 1e-6).all()


def test_per_token_matches_the_kernel_reference():
    torch.manual_seed(3)
    x = torch.randn(5, 33)
    xq, s = quant.quantize_per_token(x)
    ref_q, ref_s = reference.quantize_per_token(x)
    assert torch.equal(xq, ref_q) and torch.equal(s, ref_s)
    assert torch.allclose(quant.dequantize_per_token(xq, s), x, atol=float(s.max()) / 2 + 1e-6)


def test_fake_quantize_equals_quantize_dequantize():
    torch.manual_seed(4)
    w = torch.randn(6, 64)
    q, scale = quant.quantize_groupwise(w, 32)
    assert torch.equal(quant.fake_quantize_groupwise(w, 32), quant.dequantize_groupwise(q, scale, 32))
    q8, s8 = quant.quantize_per_channel(w)
    assert torch.equal(quant.fake_quantize_per_channel(w), quant.dequantize_per_channel(q8, s8))


def test_round_half_to_even():
    scale = torch.tensor(1.0)
    values = torch.tensor([0.5, 1.5, 2.5, -0.5, -1.5])
    assert quant.quantize(values, scale, -8, 7).tolist() == [0.0, 2.0, 2.0, -0.0, -2.0]


def test_ste_passes_gradient_inside_range_and_blocks_clamped_values():
    x = torch.tensor([0.3, -1.2, 5.0, -20.0], requires_grad=True)
    out = quant.fake_quantize(x, torch.tensor(1.0), -8, 7)
    out.sum().backward()
    assert x.grad.tolist() == [1.0, 1.0, 1.0, 0.0]


def test_lsq_scale_gradient():
    x = torch.tensor([0.3, 1.6, 20.0])
    scale = torch.tensor(1.0, requires_grad=True)
    quant.fake_quantize(x, scale, -8, 7).sum().backward()
    # round(v) - v inside the range, qmax where clamped
    expected = (0.0 - 0.3) + (2.0 - 1.6) + 7.0
    assert scale.grad.item() == pytest.approx(expected, abs=1e-6)


def test_learnable_scale_forward_is_bit_exact_and_gradient_is_scaled():
    torch.manual_seed(5)
    w = torch.randn(4, 64)
    scale = quant.per_channel_scale(w).clone().requires_grad_(True)
    out = quant.fake_quantize_per_channel(w, scale)
    assert torch.equal(out, quant.fake_quantize_per_channel(w))
    out.sum().backward()
    assert scale.grad is not None and torch.isfinite(scale.grad).all()
