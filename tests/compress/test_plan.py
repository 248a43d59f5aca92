"""Tests for compress/plan.py: plan forms, exclusions, errors, and prepare -> convert agreement."""
import dataclasses
import logging

import pytest
import torch
from torch import nn

import compress
from compress import BlockSparseConfig, Plan, W4A16Config, W8A8BlockConfig, W8A8Config, W8A16Config
from compress.nn.inference import (BSRLinear, BSRW4A16Linear, BSRW8A8Linear, W4A16Linear, W8A8BlockLinear, W8A8Linear,
                                   W8A16Linear)
from compress.nn.qat import CompressedLinear
import compress.calibration as calibration_module
import compress.plan as plan_module
from compress.nn.qat import compressed_layers
from compress.plan import prune_one_shot


class Tiny(nn.Module):
    """Embedding -> norm -> two linears -> classifier head (left dense by default)."""

    def __init__(self, hidden=64, ffn=96, classes=3):
        super().__init__()
        self.embeddings = nn.Embedding(50, hidden)
        self.norm = nn.LayerNorm(hidden)
        self.up = nn.Linear(hidden, ffn)
        self.down = nn.Linear(ffn, hidden)
        self.classifier = nn.Linear(hidden, classes)

    def forward(self, ids):
        h = self.norm(self.embeddings(ids))
        h = h + self.down(torch.relu(self.up(h)))
        return self.classifier(h)


def _model(seed=0):
    torch.manual_seed(seed)
    return Tiny()


def _ids(seed=1):
    torch.manual_seed(seed)
    return torch.randint(0, 50, (4, 7))


def test_plan_forms_select_the_same_layers():
    forms = [W8A8Config(), [W8A8Config()], {"*": W8A8Config()}, Plan({"*": [W8A8Config()]})]
    for form in forms:
        model = compress.prepare(_model(), form)
        assert set(compressed_layers(model)) == {"up", "down"}  # classifier and embeddings stay dense


def test_patterns_first_match_wins_and_exclude_can_be_changed():
    model = compress.prepare(_model(), {"up": W4A16Config(32), "*": W8A8Config()})
    layers = compressed_layers(model)
    assert isinstance(layers["up"].quant_config, W4A16Config) and isinstance(layers["down"].quant_config, W8A8Config)
    model = compress.prepare(_model(), Plan({"*": W8A8Config()}, exclude=()))
    assert "classifier" in compressed_layers(model)


def test_a_linear_tied_to_an_embedding_stays_dense_with_a_log_line(caplog):
    class TiedOutput(nn.Module):  # Whisper's proj_out: the output layer shares the decoder's embedding table
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(100, 64)
            self.body = nn.Linear(64, 64)
            self.proj_out = nn.Linear(64, 100, bias=False)
            self.proj_out.weight = self.embed.weight

    model = TiedOutput()
    table = model.embed.weight.detach().clone()
    with caplog.at_level(logging.INFO, logger="compress.plan"):
        compress.prepare(model, Plan({"*": BlockSparseConfig(0.5)}, exclude=()))
    assert set(compressed_layers(model)) == {"body"} and isinstance(model.proj_out, nn.Linear)
    assert "plan: proj_out left dense: its weight is the embedding embed's (tied)" in caplog.text
    compress.convert(model)
    assert model.proj_out.weight is model.embed.weight and torch.equal(model.embed.weight, table)


def test_a_plan_matching_nothing_lists_conv1d_among_the_linear_layers():
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=1, n_head=2))
    with pytest.raises(ValueError) as error:
        compress.prepare(model, {"nothing.*": W8A8Config()})
    message = str(error.value)
    assert ("the model's linear layers (nn.Linear, Conv1D) are ['transformer.h.0.attn.c_attn', "
            "'transformer.h.0.attn.c_proj', 'transformer.h.0.mlp.c_fc', 'transformer.h.0.mlp.c_proj', 'lm_head']"
            in message)
    assert "other types" not in message


def test_a_plan_matching_nothing_names_the_matrix_layers_of_other_types():
    class Transposed(nn.Module):  # a matrix layer of a type plans do not target
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.randn(64, 32))

        def forward(self, x):
            return x @ self.weight

    model = nn.Sequential(Transposed(), Transposed(), nn.Linear(32, 8))
    with pytest.raises(ValueError) as error:
        compress.prepare(model, {"nothing.*": W8A8Config()})
    message = str(error.value)
    assert "the model's linear layers (nn.Linear, Conv1D) are ['2']" in message
    assert "other types, which plans do not target: Transposed x2 (e.g. '0')" in message


def test_prepare_composes_pruning_and_quantization():
    model = compress.prepare(_model(), BlockSparseConfig(0.5))
    compress.prepare(model, W8A8Config())
    layer = compressed_layers(model)["up"]
    assert layer.sparse_config is not None and layer.quant_config is not None


def test_composed_prepares_log_each_line_once(caplog):
    """Pruning then quantization (two callbacks' setup): each call says what it gave, and the share of the
    matrix weights is logged when layers were swapped in, not again when configs were only added."""
    caplog.set_level(logging.INFO, logger="compress.plan")
    model = compress.prepare(_model(), BlockSparseConfig(0.5))
    compress.prepare(model, W8A8Config())
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("prepare:")]
    assert len(lines) == len(set(lines)) == 3, lines
    assert lines[0].startswith("prepare: BlockSparseConfig on 2 layers and 0 experts blocks (2 set up for "
                               "compression, 0 already prepared;")
    assert lines[1].startswith("prepare: prepared layers hold ")
    assert lines[2].startswith("prepare: W8A8Config on 2 layers and 0 experts blocks (0 set up for "
                               "compression, 2 already prepared;")


@pytest.mark.parametrize("plan, error, fragment", [
    ("int8", TypeError, "a config, a list of configs"),
    ({"*": "int8"}, TypeError, "W8A8Config"),
    ({"*": []}, ValueError, "at least one config"),
    ([W8A8Config(), W4A16Config()], ValueError, "at most one quantization config"),
    ({"nothing.*": W8A8Config()}, ValueError, "matched no eligible linear layer"),
    (lambda: Plan({"*": W8A8Config()}, exclude="lm_head"), TypeError, "list of str patterns"),
    (lambda: Plan({3: W8A8Config()}), TypeError, "str patterns"),
])
def test_bad_plans_get_clear_errors(plan, error, fragment):
    with pytest.raises(error, match=fragment):
        compress.prepare(_model(), plan() if callable(plan) else plan)


def test_convert_without_prepared_layers_is_refused():
    with pytest.raises(ValueError, match="no prepared layers"):
        compress.convert(_model())


def _prepared_and_trained(plan, static=False):
    """Prepare, prune, calibrate, take a few AdamW steps with fake quant on; return the model."""
    model = compress.prepare(_model(), plan)
    layers = compressed_layers(model)
    prune_one_shot(model)
    if static:
        compress.calibration.calibrate(model, [_ids(5), _ids(6)])
    for layer in layers.values():
        if layer.quant_config is not None:
            layer.enable_fake_quant(True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for step in range(3):
        optimizer.zero_grad()
        model(_ids(step)).pow(2).mean().backward()
        optimizer.step()
        for layer in layers.values():
            layer.apply_mask_()
    return model


@pytest.mark.parametrize("plan, module_type", [
    (W8A8Config(), W8A8Linear),
    (W8A8Config(learnable_scale=True), W8A8Linear),
    (W4A16Config(32), W4A16Linear),
    (W4A16Config(None, learnable_scale=True), W4A16Linear),
    (BlockSparseConfig(0.5), BSRLinear),
    ([BlockSparseConfig(0.5), W8A8Config()], BSRW8A8Linear),
    ([BlockSparseConfig(0.5), W4A16Config(64)], BSRW4A16Linear),
    ([BlockSparseConfig(0.5), W4A16Config(32, learnable_scale=True)], BSRW4A16Linear),
    (W8A16Config(), W8A16Linear),
    (W8A16Config(128), W8A16Linear),  # K = 64 and 96 padded to one group of 128
    (W8A16Config(learnable_scale=True), W8A16Linear),
    (W8A16Config(128, learnable_scale=True), W8A16Linear),
    ([BlockSparseConfig(0.5), W8A16Config()], W8A16Linear),
    (W8A8BlockConfig(), W8A8BlockLinear),  # K = 64 and 96: one partial 128-channel block
    (W8A8BlockConfig(learnable_scale=True), W8A8BlockLinear),
    ([BlockSparseConfig(0.5), W8A8BlockConfig()], W8A8BlockLinear),
])
def test_prepare_convert_agreement(plan, module_type):
    model = _prepared_and_trained(plan)
    ids = _ids(9)
    with torch.no_grad():
        qat_out = model(ids)
        compress.convert(model)
        exported_out = model(ids)
    assert isinstance(model.up, module_type) and isinstance(model.down, module_type)
    assert type(model.classifier) is nn.Linear
    # the same function: agreement to fp16 rounding (here fp32 reassociation only)
    torch.testing.assert_close(exported_out, qat_out, atol=1e-3, rtol=1e-3)


def test_sparse_w8a8_export_stores_only_the_kept_blocks_as_int8():
    model = _prepared_and_trained([BlockSparseConfig(0.5), W8A8Config()])
    layers = compressed_layers(model)
    masks = {name: layer.mask.clone() for name, layer in layers.items()}
    dense = {name: W8A8Linear.from_float(layer, layer.quant_config, weight=layer.masked_weight().detach())
             for name, layer in layers.items()}
    compress.convert(model)
    for name, mask in masks.items():
        module = getattr(model, name)
        assert isinstance(module, BSRW8A8Linear) and module.values.dtype == torch.int8
        assert module.nnz == int(mask.sum()) < mask.numel()
        weight = module.dequantized_weight()
        assert (weight[~compress.core.sparsity.expand_mask(mask, tuple(weight.shape))] == 0).all()
        assert torch.equal(weight, dense[name].dequantized_weight())  # the int8 weight W8A8Linear would hold
        x = torch.randn(5, module.in_features)
        assert torch.equal(module(x), dense[name](x))


def test_prepare_with_fake_quant_trains_the_function_convert_exports():
    model = compress.prepare(_model(), {"up": W4A16Config(32), "down": W8A8Config()}, fake_quant=True)
    assert model.up.fake_quant_enabled and model.down.fake_quant_enabled
    assert not compress.prepare(_model(), W8A8Config()).down.fake_quant_enabled  # the default: off
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for step in range(3):
        model(_ids(step)).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    ids = _ids(9)
    with torch.no_grad():
        trained = model(ids)
        compress.convert(model)
        torch.testing.assert_close(model(ids), trained, atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize("plan, fake_quant, error, fragment", [
    (BlockSparseConfig(0.5), True, ValueError, "needs a quantization config"),
    (W8A8Config(), "yes", TypeError, "fake_quant: expected a bool"),
])
def test_prepare_fake_quant_errors(plan, fake_quant, error, fragment):
    with pytest.raises(error, match=fragment):
        compress.prepare(_model(), plan, fake_quant=fake_quant)


def test_static_w8a8_agreement_and_missing_calibration():
    model = _prepared_and_trained(W8A8Config(activation="static"), static=True)
    ids = _ids(9)
    with torch.no_grad():
        qat_out = model(ids)
        compress.convert(model)
        torch.testing.assert_close(model(ids), qat_out, atol=1e-3, rtol=1e-3)
    assert model.up.act_scale.item() > 0
    with pytest.raises(ValueError, match="calibration_data"):
        compress.convert(_model(), W8A8Config(activation="static"))


def test_post_training_path_with_smoothquant_and_static_scales():
    model = _model()
    ids = _ids(9)
    with torch.no_grad():
        float_out = model(ids)
        compress.convert(model, W8A8Config(activation="static", smoothquant_alpha=0.5),
                         calibration_data=[_ids(3), _ids(4)])
        out = model(ids)
    assert isinstance(model.up, W8A8Linear) and model.up.config.static
    rel = (out - float_out).norm() / float_out.norm()
    assert rel < 0.05


def test_bsr_shape_not_multiple_of_32_is_left_dense_with_a_logged_reason(caplog):
    model = nn.Sequential(nn.Linear(64, 40), nn.ReLU(), nn.Linear(40, 64))
    with caplog.at_level(logging.WARNING, logger="compress.plan"):
        compress.convert(model, BlockSparseConfig(0.5))
    assert type(model[0]) is nn.Linear and "left dense" in caplog.text
    zero_blocks = model[0].weight.reshape(40, 2, 32).abs().sum(dim=2) == 0
    assert zero_blocks.any()


@pytest.mark.parametrize("plan", [W8A8Config(), W4A16Config(32), [BlockSparseConfig(0.5), W8A8Config()],
                                  BlockSparseConfig(0.5), W8A16Config(), W8A16Config(128), W8A8BlockConfig()])
def test_prepare_convert_agreement_in_fp16(plan):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 96), nn.ReLU(), nn.Linear(96, 64))
    compress.prepare(model, plan)
    prune_one_shot(model)
    for layer in compressed_layers(model).values():
        if layer.quant_config is not None:
            layer.enable_fake_quant(True)
    model.half()
    x = torch.randn(5, 64).half()
    with torch.no_grad():
        qat_out = model(x)
        compress.convert(model)
        exported_out = model(x)
    assert exported_out.dtype == torch.float16
    torch.testing.assert_close(exported_out, qat_out, atol=2e-3, rtol=2e-3)  # fp16 rounding


# ---- all or nothing ------------------------------------------------------------------------------
class Wide(nn.Module):
    """Six linears: three with K = 64 (``a*``) and three with K = 96 (``b*``)."""

    def __init__(self):
        super().__init__()
        self.a0, self.a1, self.a2 = nn.Linear(64, 96), nn.Linear(64, 96), nn.Linear(64, 96)
        self.b0, self.b1, self.b2 = nn.Linear(96, 64), nn.Linear(96, 64), nn.Linear(96, 64)


def _snapshot(model):
    """(module object at every name, state_dict values cloned, gradient hooks per parameter)."""
    return ({name: module for name, module in model.named_modules()},
            {key: value.clone() for key, value in model.state_dict().items()},
            {name: len(p._backward_hooks or {}) for name, p in model.named_parameters()})


def _assert_unchanged(model, before):
    modules, state, hooks = before
    after_modules, after_state, after_hooks = _snapshot(model)
    assert list(after_modules) == list(modules)
    assert all(after_modules[name] is module for name, module in modules.items())
    assert list(after_state) == list(state)
    assert all(torch.equal(after_state[key], value) for key, value in state.items())
    assert after_hooks == hooks


def test_prepare_conflicting_on_a_later_layer_leaves_the_model_as_it_was():
    torch.manual_seed(0)
    model = compress.prepare(Wide(), {"b*": W8A8Config()})
    before = _snapshot(model)
    configs_before = {n: (m.quant_config, m.sparse_config) for n, m in compressed_layers(model).items()}
    # a* are plain linears (swapped first), b* conflict: W4A16 on a W8A8 layer.
    with pytest.raises(ValueError, match=r"layer 'b0'.*at most one quantization config"):
        compress.prepare(model, [BlockSparseConfig(0.5), W4A16Config()])
    _assert_unchanged(model, before)
    assert {n: (m.quant_config, m.sparse_config) for n, m in compressed_layers(model).items()} == configs_before
    assert not any(isinstance(m, CompressedLinear) for n, m in model.named_modules() if n.startswith("a"))


def test_prepare_failing_while_building_a_later_layer_rolls_back(monkeypatch):
    """A failure inside the swap loop (after earlier layers were swapped and hooked) is undone."""
    torch.manual_seed(0)
    model = compress.prepare(Wide(), {"a0": BlockSparseConfig(0.5)})
    before = _snapshot(model)
    real = CompressedLinear.from_float

    def from_float(linear, configs):
        if linear.in_features == 96:
            raise ValueError("W4A16: group size 64 does not divide K = 96")
        return real(linear, configs)

    monkeypatch.setattr(CompressedLinear, "from_float", from_float)
    with pytest.raises(ValueError, match=r"prepare: layer 'b0' failed, model left unchanged: .*does not divide"):
        compress.prepare(model, [BlockSparseConfig(0.5), W8A8Config()])
    _assert_unchanged(model, before)
    layer = compressed_layers(model)["a0"]
    assert layer.quant_config is None and layer.sparse_config == BlockSparseConfig(0.5)
    assert "weight_scale" not in dict(layer.named_parameters()) and layer.observer is None


def test_convert_failing_on_a_later_layer_leaves_the_model_as_it_was(monkeypatch):
    torch.manual_seed(0)
    model = compress.prepare(Wide(), {"a*": BlockSparseConfig(0.5), "b*": W8A8Config()})
    before = _snapshot(model)
    real = plan_module.export_module

    def export_module(name, layer):
        if name == "b1":
            raise RuntimeError("no kernel for this layer")
        return real(name, layer)

    monkeypatch.setattr(plan_module, "export_module", export_module)
    with pytest.raises(RuntimeError, match=r"convert: layer 'b1' failed.*no kernel"):
        compress.convert(model)
    # the a* weights were pruned one-shot before the failure; their values and masks are back too.
    _assert_unchanged(model, before)
    assert all(bool(m.mask.all()) for n, m in compressed_layers(model).items() if n.startswith("a"))


def test_convert_with_a_plan_and_missing_calibration_leaves_plain_linears():
    torch.manual_seed(0)
    model = Wide()
    before = _snapshot(model)
    with pytest.raises(ValueError, match="need calibration_data"):
        compress.convert(model, [BlockSparseConfig(0.5), W8A8Config(activation="static")])
    _assert_unchanged(model, before)
    assert not compressed_layers(model)


# ---- GPTQ ----------------------------------------------------------------------------------------
def _mlp(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(64, 96), nn.ReLU(), nn.Linear(96, 64), nn.ReLU(), nn.Linear(64, 64))


def _float_batches(seed=3, count=3):
    generator = torch.Generator().manual_seed(seed)
    mixing = torch.randn(64, 64, generator=generator) / 8 + 0.2 * torch.eye(64)
    return [torch.randn(16, 64, generator=generator) @ mixing for _ in range(count)]


def _nan_batches():
    batches = _float_batches()
    batches[1][3, 7] = float("nan")
    return batches


@pytest.mark.parametrize("data, error", [
    (None, r"3 layers with algorithm='gptq', algorithm='obs' or score='activation' \(e.g. '0'\) need calibration_data"),
    ([], "expected at least one batch, got none"),
    (lambda model: model[0](torch.randn(4, 64)), r"no calibration input reached layers \['2', '4'\]"),
    (_nan_batches(), r"layer '0': GPTQ: non-finite values"),
])
def test_gptq_refuses_missing_or_bad_calibration_data_and_leaves_the_model(data, error):
    model = _mlp()
    before = _snapshot(model)
    with pytest.raises(ValueError, match=error):
        compress.convert(model, W4A16Config(32, algorithm="gptq"), calibration_data=data)
    _assert_unchanged(model, before)
    assert not compressed_layers(model)


def _output_error(model, batches, reference):
    with torch.no_grad():
        return sum((model(x) - y).norm().item() for x, y in zip(batches, reference))


@pytest.mark.parametrize("plan", [
    W4A16Config(32), W8A8Config(), W8A8Config(smoothquant_alpha=0.5),
    [BlockSparseConfig(0.5), W8A8Config()], [BlockSparseConfig(0.5), W4A16Config(64)],
    W8A16Config(), W8A16Config(128), [BlockSparseConfig(0.5), W8A16Config()],
])
def test_gptq_beats_round_to_nearest_through_convert(plan):
    """Same plan with algorithm='gptq' and with 'rtn'; GPTQ runs after SmoothQuant and keeps pruned blocks zero."""
    batches = _float_batches()
    with torch.no_grad():
        reference = [_mlp()(x) for x in batches]
    configs = plan if isinstance(plan, list) else [plan]
    errors = {}
    for algorithm in ("rtn", "gptq"):
        model = compress.convert(_mlp(), [c if isinstance(c, BlockSparseConfig) else
                                          dataclasses.replace(c, algorithm=algorithm) for c in configs],
                                 calibration_data=batches)
        errors[algorithm] = _output_error(model, batches, reference)
        if isinstance(configs[0], BlockSparseConfig):
            for layer in (model[0], model[2], model[4]):
                weight = layer.dequantized_weight()
                blocks = weight.reshape(weight.shape[0] // 32, 32, -1, 32).abs().sum(dim=(1, 3))
                assert (blocks == 0).float().mean() == 0.5  # pruned blocks exact zeros, kept ones not
    # measured: 0.49 (W4A16 g32), 0.82-0.83 (W8A8), 0.36 (W8A16), 0.40 (W8A16 g128), 0.93-0.94 (sparse)
    assert errors["gptq"] < 0.97 * errors["rtn"]


def test_gptq_hessian_is_of_the_smoothed_inputs():
    model = compress.prepare(_mlp(), W8A8Config(algorithm="gptq"))
    layer = compressed_layers(model)["0"]
    factors = torch.linspace(0.5, 2.0, 64)
    layer.input_smoothing.mul_(factors)
    batches = _float_batches()
    stats = calibration_module.collect_hessians(model, {"0": layer}, lambda m: [m(x) for x in batches])
    x = torch.cat(batches) / factors
    torch.testing.assert_close(stats["0"][0], x.T @ x, rtol=1e-5, atol=1e-3)
    assert stats["0"][1] == 48


@pytest.mark.parametrize("fail_in", ["gptq", "export"])
@pytest.mark.parametrize("prepared", [False, True])
def test_convert_with_gptq_failing_on_a_later_layer_leaves_the_model_as_it_was(monkeypatch, fail_in, prepared):
    """Layer '0' holds GPTQ's weights (and scales) when layer '4' fails: everything is put back."""
    model = _mlp()
    config = W4A16Config(32, learnable_scale=True, algorithm="gptq")
    if prepared:
        compress.prepare(model, {"0": config, "2": W4A16Config(32, algorithm="gptq"), "4": config})
    before = _snapshot(model)
    layers = ["0", "2", "4"]
    if fail_in == "gptq":
        real = calibration_module.gptq_quantize

        def gptq_quantize(weight, *args, **kwargs):
            if weight.shape == (64, 64):
                raise ValueError("GPTQ: the damped Hessian is not positive definite")
            return real(weight, *args, **kwargs)

        monkeypatch.setattr(calibration_module, "gptq_quantize", gptq_quantize)
        error = r"calibration: layer '4': GPTQ: the damped Hessian is not positive definite"
    else:
        real = plan_module.export_module

        def export_module(name, layer):
            if name == "4":
                raise RuntimeError("no kernel for this layer")
            return real(name, layer)

        monkeypatch.setattr(plan_module, "export_module", export_module)
        error = r"convert: layer '4' failed.*no kernel"
    with pytest.raises((ValueError, RuntimeError), match=error):
        compress.convert(model, None if prepared else config, calibration_data=_float_batches())
    _assert_unchanged(model, before)
    if prepared:
        for name in layers:
            layer = compressed_layers(model)[name]
            assert not layer.weight_quantized and "weight_scale" not in layer._buffers
            assert isinstance(layer.weight_scale, nn.Parameter) == (name != "2")
    else:
        assert not compressed_layers(model)


@pytest.mark.parametrize("score", ["magnitude", "l2"])
def test_one_shot_tiles_export_block_rows_that_share_their_columns(score):
    """BlockSparseConfig(tile_rows=4) one-shot: each tile of 4 block rows of the exported BSR keeps the same
    block columns (the last, shorter tile of a 6-block-row layer too), at half of the tiles."""
    torch.manual_seed(0)
    model = compress.convert(nn.Sequential(nn.Linear(128, 192)), {"*": BlockSparseConfig(0.5, score=score,
                                                                                          tile_rows=4)})
    layer = model[0]
    assert isinstance(layer, BSRLinear)
    crow, col = layer.crow_indices.tolist(), layer.col_indices.tolist()
    rows = [col[crow[r]:crow[r + 1]] for r in range(6)]
    assert rows[0] == rows[1] == rows[2] == rows[3] and rows[4] == rows[5]
    assert len(rows[0]) + len(rows[4]) == 4  # 2 tiles x 4 block columns = 8 tiles, half of them kept
