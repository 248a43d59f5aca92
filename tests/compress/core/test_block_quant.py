"""Tests for compress/core/block_quant.py: block scales, round trips, fake quantization equal to the
kernels' integers, STE and LSQ gradients, zero and partial blocks, block maxima of row slices (FSDP2 shards)."""
import pytest
import torch

from compress._kernels import reference
from compress.core import block_quant as bq
from compress.core.quant import safe_scale


def test_weight_scales_per_128_by_128_block_with_partial_blocks():
    w = torch.zeros(130, 200)
    w[0, 0], w[129, 199], w[3, 150] = 12.7, -2.54, 1.27
    scale = bq.weight_block_scale(w)
    assert scale.shape == (2, 2)
    assert torch.allclose(scale, torch.tensor([[0.1, 0.01], [1.0, 0.02]]))  # a zero block: scale 1
    w_q, s = bq.quantize_weight_blocks(w)
    assert torch.equal(s, scale) and torch.allclose(bq.dequantize_weight_blocks(w_q, s), w)


@pytest.mark.parametrize("cuts", [(65,), (100, 128, 129), (0, 260)])
def test_block_maxima_of_row_slices_combine_to_the_whole_weights(cuts):
    """Each FSDP2 process takes the block maxima of its rows at their offset; their maximum is the whole's."""
    w = torch.randn(260, 200)
    bounds = [0, *cuts, 260]
    parts = [bq.weight_block_absmax(w[a:b], a, 260) for a, b in zip(bounds, bounds[1:])]
    assert torch.equal(torch.stack(parts).amax(dim=0), bq.weight_block_absmax(w))
    assert torch.equal(safe_scale(bq.weight_block_absmax(w), bq.QMAX), bq.weight_block_scale(w))
    with pytest.raises(ValueError, match="do not fit"):
        bq.weight_block_absmax(w[:10], 255, 260)


def test_weight_round_trip_error_is_half_a_step():
    torch.manual_seed(0)
    w = torch.randn(256, 384) * 0.02
    w_q, scale = bq.quantize_weight_blocks(w)
    error = (bq.dequantize_weight_blocks(w_q, scale) - w).abs()
    assert (error <= bq.expand_weight_scale(scale, 256, 384) / 2 + 1e-9).all()
    assert w_q.abs().max() <= 127


def test_given_weight_scale_is_used_and_clamps():
    w = torch.full((128, 128), 1.0)
    w_q, scale = bq.quantize_weight_blocks(w, torch.full((1, 1), 1e-3))
    assert (w_q == 127).all() and torch.equal(scale, torch.full((1, 1), 1e-3))


def test_fake_quantization_gives_the_kernels_integers():
    torch.manual_seed(1)
    x = torch.randn(3, 5, 300) * 4
    x[0, 0, :128] = 0
    fq = bq.fake_quantize_act_blocks(x)
    xq, s_x = reference.quantize_act_blocks_ref(x.reshape(15, 300))
    assert torch.equal(fq.reshape(15, 300), reference.dequantize_act_blocks(xq, s_x))
    w = torch.randn(200, 300) * 0.05
    assert torch.equal(bq.fake_quantize_weight_blocks(w), bq.dequantize_weight_blocks(*bq.quantize_weight_blocks(w)))


def test_straight_through_gradients():
    x = (torch.randn(2, 256) * 3).requires_grad_()
    bq.fake_quantize_act_blocks(x).sum().backward()
    assert torch.equal(x.grad, torch.ones_like(x))  # dynamic absmax scales: nothing is clamped
    w = torch.randn(128, 128, requires_grad=True)
    scale = torch.full((1, 1), float(w.detach().abs().max()) / 127 / 2, requires_grad=True)  # half the range
    out = bq.fake_quantize_weight_blocks(w, scale)
    out.sum().backward()
    clamped = torch.round((w.detach() / scale.detach()).abs()) > 127
    assert clamped.any() and (w.grad[clamped] == 0).all()
    assert torch.allclose(w.grad[~clamped], torch.ones(int((~clamped).sum())))
    assert scale.grad is not None and torch.isfinite(scale.grad).all()


def test_activation_blocks_round_trip():
    x = torch.randn(4, 200).half()
    xq, s_x = bq.quantize_act_blocks(x)
    assert s_x.shape == (4, 2) and xq.dtype == torch.int8
    error = (bq.dequantize_act_blocks(xq, s_x) - x.float()).abs()
    assert (error <= s_x.repeat_interleave(128, 1)[:, :200] / 2 + 1e-9).all()
