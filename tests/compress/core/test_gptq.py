"""Tests for compress/core/gptq.py (and its glue in compress/calibration.py): known solutions, an independent
column-by-column reference, error against round-to-nearest, the kernels' integer and scale contract
of the exported modules, sparsity, and GPTQ end to end on a tiny Llama."""
import dataclasses

import pytest
import torch
from torch import nn

import compress
from compress import W4A16Config, W8A8Config
from compress._kernels import reference
from compress.core.gptq import (
    MIN_SHRINK,
    SCALE_GRID,
    add_to_hessian,
    gptq_quantize,
    hessian,
    inverse_cholesky,
    search_group_scales,
)
from compress.core.quant import (
    INT4_QMAX,
    INT8_QMAX,
    dequantize_groupwise,
    dequantize_per_channel,
    per_channel_scale,
    quantize_groupwise,
    quantize_per_channel,
    safe_scale,
    unpack_int4,
)
from compress.core.sparsity import block_mask, expand_mask
from compress.nn.inference import is_inference_module
from compress.calibration import run_hessian_passes
from compress.nn.qat import compressed_layers


def _hessian(x):
    xtx = torch.zeros(x.shape[-1], x.shape[-1])
    return hessian(xtx, add_to_hessian(xtx, x))


def _correlated(n=512, k=256, seed=0, n_out=32):
    """Inputs whose channels are mixed (a non-diagonal Hessian), and a weight (n_out, k)."""
    generator = torch.Generator().manual_seed(seed)
    mixing = torch.randn(k, k, generator=generator) / k ** 0.5 + 0.1 * torch.eye(k)
    return torch.randn(n, k, generator=generator) @ mixing, torch.randn(n_out, k, generator=generator)


def _output_error(x, w, w_q):
    return (x @ w.T - x @ w_q.T).norm().item()


def _rtn_int4(w, group_size):
    return dequantize_groupwise(*quantize_groupwise(w, group_size), group_size)


def _hadamard(k):
    h = torch.ones(1, 1)
    while h.shape[0] < k:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)])
    return h


def _brute_force_scales(w, importance, group_size, qmax):
    """Per row and group, every grid scale tried one by one in float64; the first with the least error."""
    n, k = w.shape
    best = torch.zeros(n, k // group_size)
    for row in range(n):
        for group in range(k // group_size):
            cols = slice(group * group_size, (group + 1) * group_size)
            v, d = w[row, cols].double(), importance[cols].double()
            errors = []
            for i in range(SCALE_GRID):
                s = safe_scale(v.abs().amax().float() * (1.0 - i * (1.0 - MIN_SHRINK) / SCALE_GRID), qmax).double()
                q = torch.clamp(torch.round(v / s), -qmax - 1, qmax)
                errors.append((float((d * (v - q * s) ** 2).sum()), s))
            best[row, group] = min(errors, key=lambda e: e[0])[1]  # min keeps the first (largest) on ties
    return best


def test_searched_scales_are_the_grid_point_of_least_weighted_error():
    generator = torch.Generator().manual_seed(1)
    w = torch.randn(6, 64, generator=generator) * torch.rand(1, 64, generator=generator)
    importance = torch.rand(64, generator=generator) ** 4  # a few inputs matter most
    scale = search_group_scales(w, importance, 32, INT4_QMAX)
    torch.testing.assert_close(scale, _brute_force_scales(w, importance, 32, INT4_QMAX), rtol=1e-6, atol=0)
    absmax = w.reshape(6, 2, 32).abs().amax(-1)
    assert bool((scale <= absmax / INT4_QMAX * (1 + 1e-6)).all())
    assert bool((scale >= absmax / INT4_QMAX * MIN_SHRINK).all())
    assert bool((scale < absmax / INT4_QMAX * (1 - 1e-6)).any())  # clipping pays somewhere here


def test_searched_scales_never_lose_to_absmax_and_keep_zero_groups_at_one():
    w = torch.randn(8, 64)
    w[0, :32] = 0
    importance = torch.rand(64)
    scale = search_group_scales(w, importance, 32, INT4_QMAX)
    assert scale[0, 0] == 1.0

    def weighted_error(s):
        q = torch.clamp(torch.round(w.reshape(8, 2, 32) / s[..., None]), -8, 7)
        return ((q * s[..., None] - w.reshape(8, 2, 32)) ** 2 * importance.reshape(1, 2, 32)).sum(-1)
    assert bool((weighted_error(scale) <= weighted_error(quantize_groupwise(w, 32)[1]) + 1e-6).all())


@pytest.mark.parametrize("act_order", [False, True])
def test_orthogonal_inputs_give_round_to_nearest_on_the_searched_scales(act_order):
    """X with orthogonal columns: H is diagonal, so no error is spread and GPTQ rounds each weight to
    the nearest point of its group's scale, searched on the original weights."""
    k = 128
    generator = torch.Generator().manual_seed(2)
    column_scales = 2.0 ** torch.randint(-2, 3, (k,), generator=generator).float()  # X^T X exactly diagonal
    h = _hessian(_hadamard(k) * column_scales)
    assert torch.count_nonzero(h - torch.diag(h.diagonal())) == 0
    w = torch.randn(16, k, generator=generator)
    q, scale = gptq_quantize(w, h, INT4_QMAX, 32, act_order=act_order)
    assert torch.equal(scale, search_group_scales(w, h.diagonal(), 32, INT4_QMAX))
    assert torch.equal(q, quantize_groupwise(w, 32, scale)[0])
    q, scale = gptq_quantize(w, h, INT8_QMAX, k, scale=per_channel_scale(w)[:, None], act_order=act_order)
    assert torch.equal(q, quantize_per_channel(w)[0])


def _reference_gptq(w, h, group_size, qmax, damping=0.01, act_order=False):
    """GPTQ column by column in float64 with the inverse-Hessian downdate (OBQ's form, no Cholesky,
    no lazy batches); a group's scale searched on its current weights when the sweep first reaches it."""
    k = w.shape[1]
    importance = h.diagonal().clone()
    h = h.double() + damping * h.double().diagonal().mean() * torch.eye(k, dtype=torch.float64)
    order = torch.argsort(h.diagonal(), descending=True, stable=True) if act_order else torch.arange(k)
    h_inv, w = torch.linalg.inv(h[order][:, order]), w.double()[:, order]
    q, scale = torch.zeros_like(w), torch.zeros(w.shape[0], k // group_size)
    group_of = [int(c) // group_size for c in order]
    for j in range(k):
        group = group_of[j]
        if not scale[:, group].any():
            members = [p for p in range(k) if group_of[p] == group]
            current = w[:, members].float()
            scale[:, group] = search_group_scales(current, importance[order[members]], len(members), qmax)[:, 0]
        s = scale[:, group].double()
        q[:, j] = torch.clamp(torch.round(w[:, j] / s), -qmax - 1, qmax)
        w[:, j:] -= ((w[:, j] - q[:, j] * s) / h_inv[j, j])[:, None] * h_inv[j, j:][None, :]
        h_inv = h_inv - h_inv[:, j:j + 1] @ h_inv[j:j + 1, :] / h_inv[j, j]
    return q[:, torch.argsort(order)], scale


@pytest.mark.parametrize("group_size, act_order", [(32, False), (32, True), (64, True), (128, False)])
def test_lazy_batches_match_the_column_by_column_reference(group_size, act_order):
    x, w = _correlated(k=128, n_out=16)
    h = _hessian(x)
    q, scale = gptq_quantize(w, h, INT4_QMAX, group_size, act_order=act_order, block=48)  # groups straddle blocks
    q_ref, scale_ref = _reference_gptq(w, h, group_size, INT4_QMAX, act_order=act_order)
    assert (q.double() == q_ref).float().mean() > 0.995  # float32 vs float64: a rare tie may flip
    assert (torch.isclose(scale, scale_ref, rtol=1e-4, atol=0)).float().mean() > 0.99  # ... and so a grid point


@pytest.mark.parametrize("scheme", ["w4 g32", "w4 per channel", "w4 g32 act_order", "w8"])
def test_lower_output_error_than_round_to_nearest_on_correlated_inputs(scheme):
    x, w = _correlated()
    h = _hessian(x)
    if scheme == "w8":
        scale = per_channel_scale(w)
        q, _ = gptq_quantize(w, h, INT8_QMAX, w.shape[1], scale=scale[:, None])
        gptq, rtn = dequantize_per_channel(q, scale), dequantize_per_channel(*quantize_per_channel(w))
    else:
        group_size = 32 if "g32" in scheme else w.shape[1]
        q, scale = gptq_quantize(w, h, INT4_QMAX, group_size, act_order="act_order" in scheme)
        gptq, rtn = dequantize_groupwise(q, scale, group_size), _rtn_int4(w, group_size)
    assert _output_error(x, w, gptq) < 0.8 * _output_error(x, w, rtn)  # measured: 0.62-0.67


def test_dead_inputs_are_zeroed():
    x, w = _correlated(k=64)
    x[:, 5] = 0
    q, scale = gptq_quantize(w, _hessian(x), INT4_QMAX, 32)
    assert (q[:, 5] == 0).all() and (w[:, 5] != 0).all()


def test_damping_is_raised_until_cholesky_succeeds_then_refused():
    indefinite = torch.tensor([[1.0, 10.0], [10.0, 1.0]])  # eigenvalues 11 and -9: needs damping > 9
    upper = inverse_cholesky(indefinite, 0.01)
    assert torch.allclose(upper.T @ upper, torch.linalg.inv(indefinite + 10 * torch.eye(2)))
    with pytest.raises(ValueError, match=r"not positive definite.*0\.01, 0\.1, 1, 10.*gptq_damping"):
        inverse_cholesky(torch.tensor([[1.0, 100.0], [100.0, 1.0]]), 0.01)


def test_non_finite_or_missing_inputs_are_refused():
    xtx = torch.zeros(4, 4)
    with pytest.raises(ValueError, match="non-finite"):
        add_to_hessian(xtx, torch.tensor([[1.0, float("nan"), 0.0, 0.0]]))
    with pytest.raises(ValueError, match="0 tokens"):
        hessian(xtx, 0)


def test_pruned_weights_stay_zero_and_their_loss_is_compensated():
    """GPTQ from the dense weight with a fixed block mask: the pruned weights' loss is spread over the kept
    ones that come later in the sweep (how much depends on where the pruned blocks are)."""
    generator = torch.Generator().manual_seed(0)
    low_rank = torch.randn(512, 32, generator=generator) @ torch.randn(32, 128, generator=generator)
    x, w = low_rank + 0.3 * torch.randn(512, 128, generator=generator), torch.randn(64, 128, generator=generator)
    keep = expand_mask(block_mask(w, 0.5, 32, "magnitude"), tuple(w.shape), 32)
    rtn = _output_error(x, w, _rtn_int4(w * keep, 32))
    for act_order, bound in ((False, 0.5), (True, 0.9)):  # measured: 0.27 in natural order, 0.78 in activation order
        q, scale = gptq_quantize(w, _hessian(x), INT4_QMAX, 32, keep=keep, act_order=act_order)
        gptq = dequantize_groupwise(q, scale, 32)
        assert (gptq[~keep] == 0).all() and (gptq[keep] != 0).any()
        assert _output_error(x, w, gptq) < bound * rtn


# ---- the exported modules hold GPTQ's integers and scales (the kernels' contract) ------------------
def _layer_and_batches(k, n=24, seed=0):
    x, _ = _correlated(n=64, k=k, seed=seed)
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(k, n)), [x[:32], x[32:]]


@pytest.mark.parametrize("group_size", [32, 64, 128, None])
@pytest.mark.parametrize("act_order", [False, True])
@pytest.mark.parametrize("k", [256, 200])  # 200: K padded to the group size (and to 8 per channel)
def test_exported_w4a16_dequantizes_to_gptqs_weights_bit_for_bit(group_size, act_order, k):
    model, batches = _layer_and_batches(k)
    compress.prepare(model, W4A16Config(group_size, algorithm="gptq", gptq_act_order=act_order, gptq_block=64))
    q, scale = run_hessian_passes(model, batches)["0"]  # (N, Kp), (N, Kp/G)
    g = q.shape[1] if group_size is None else group_size
    gptq = dequantize_groupwise(q, scale, g)[:, :k]
    x = torch.cat(batches)
    with torch.no_grad():
        qat_out = model(x)  # fake quantization off: the float forward of GPTQ's weights
        compressed_layers(model)["0"].enable_fake_quant(True)
        assert torch.equal(model(x), qat_out)  # fake quantization gives GPTQ's weights back, bit for bit
        compress.convert(model)  # no calibration data needed: GPTQ already ran
        exported = model[0]
        assert torch.equal(unpack_int4(exported.qweight).T, q) and torch.equal(exported.scales.T, scale)
        assert torch.equal(exported.dequantized_weight(), gptq)
        dequantized = reference.dequantize_int4(exported.qweight, exported.scales, exported.group_size)
        assert torch.equal(dequantized[:, :k], gptq)
        torch.testing.assert_close(model(x), qat_out, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("act_order", [False, True])
def test_exported_w8a8_holds_gptqs_int8_weight_and_the_original_row_scales(act_order):
    model, batches = _layer_and_batches(96)
    original = model[0].weight.detach().clone()
    compress.prepare(model, W8A8Config(algorithm="gptq", gptq_act_order=act_order))
    q, scale = run_hessian_passes(model, batches)["0"]
    compress.convert(model)
    assert torch.equal(model[0].w_q, q) and torch.equal(model[0].w_scale, scale)
    assert torch.equal(scale, per_channel_scale(original))
    assert not torch.equal(q, quantize_per_channel(original)[0])  # GPTQ moved some of them


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("config", [W8A8Config(algorithm="gptq"), W4A16Config(32, algorithm="gptq")])
def test_half_precision_weights_still_export_gptqs_integers(dtype, config):
    """The layer's weight holds ``q * s`` rounded to its dtype; ``round(w / s)`` still gives back q
    (for int8 in bfloat16 the rounding moves w / s by less than 0.5)."""
    model, batches = _layer_and_batches(128)
    compress.prepare(model.to(dtype), config)
    q, scale = run_hessian_passes(model, [x.to(dtype) for x in batches])["0"]
    compress.convert(model)
    exported_q = model[0].w_q if isinstance(config, W8A8Config) else unpack_int4(model[0].qweight).T
    assert torch.equal(exported_q, q)


def test_learnable_scale_takes_gptqs_scales():
    model, batches = _layer_and_batches(128)
    compress.prepare(model, W4A16Config(32, learnable_scale=True, algorithm="gptq"))
    layer = compressed_layers(model)["0"]
    _, scale = run_hessian_passes(model, batches)["0"]
    assert isinstance(layer.weight_scale, nn.Parameter) and torch.equal(layer.weight_scale.detach(), scale)
    layer.enable_fake_quant(True)  # must not re-initialise the scale from the weight
    assert torch.equal(layer.weight_scale.detach(), scale)
    compress.convert(model)
    assert torch.equal(model[0].scales.T, scale)


# ---- end to end: a tiny Llama ------------------------------------------------------------------------
def _tiny_llama():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
                                      max_position_embeddings=64)
    return transformers.LlamaForCausalLM(config).eval()


def test_tiny_llama_gptq_is_closer_to_the_float_model_than_round_to_nearest():
    """A random-init model's loss is flat (log vocab) whatever the rounding: compare with the float model."""
    config = W4A16Config(32)
    generator = torch.Generator().manual_seed(1)
    batches = [{"input_ids": torch.randint(0, 128, (4, 32), generator=generator)} for _ in range(2)]

    def log_probs(model):
        with torch.no_grad():
            return torch.cat([model(**batch).logits for batch in batches]).log_softmax(-1)

    def converted(algorithm):
        if algorithm == "gptq in chunks":  # one decoder layer per call: later Hessians see earlier layers quantized
            model = _tiny_llama()
            for layer in range(2):
                compress.convert(model, {f"model.layers.{layer}.*": dataclasses.replace(config, algorithm="gptq")},
                                 calibration_data=batches)
            return model
        return compress.convert(_tiny_llama(), dataclasses.replace(config, algorithm=algorithm),
                                calibration_data=batches)

    reference_lp = log_probs(_tiny_llama())
    errors, kls = {}, {}
    for algorithm in ("rtn", "gptq", "gptq in chunks"):
        model = converted(algorithm)
        assert sum(map(is_inference_module, model.modules())) == 14  # 7 linears per layer, lm_head left dense
        lp = log_probs(model)
        assert torch.isfinite(lp).all()
        errors[algorithm] = ((lp.exp() - reference_lp.exp()).norm() / reference_lp.exp().norm()).item()
        kls[algorithm] = torch.nn.functional.kl_div(lp, reference_lp, log_target=True, reduction="batchmean").item()
    # measured: relative error of the probabilities 0.70x round-to-nearest's, KL 0.48x
    for gptq in ("gptq", "gptq in chunks"):
        assert errors[gptq] < 0.85 * errors["rtn"] and kls[gptq] < 0.75 * kls["rtn"]
