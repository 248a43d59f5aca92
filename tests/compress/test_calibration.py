"""GPTQ's stages (compress/calibration.py): which layers share one, the inputs each stage sees, the early stop."""
import copy

import pytest
import torch
from torch import nn

import compress
from compress import calibration
from compress.configs import W4A16Config
from compress.nn.qat import compressed_layers


class Block(nn.Module):
    """A transformer block's linear layers: q, k, v on one input, o, then gate and up on one input, down."""

    def __init__(self, width=64):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.q, self.k, self.v, self.o = (nn.Linear(width, width) for _ in range(4))
        self.gate, self.up = nn.Linear(width, 2 * width), nn.Linear(width, 2 * width)
        self.down = nn.Linear(2 * width, width)

    def forward(self, x):
        h = self.norm(x)
        attention = torch.softmax(self.q(h) @ self.k(h).T / 8, dim=-1) @ self.v(h)
        x = x + self.o(attention)
        h = self.norm(x)
        return x + self.down(torch.relu(self.gate(h)) * self.up(h))


class Stack(nn.Module):
    def __init__(self, blocks=2):
        super().__init__()
        torch.manual_seed(0)
        self.blocks = nn.ModuleList(Block() for _ in range(blocks))
        self.head = nn.Linear(64, 8)
        self.head_calls = 0

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        self.head_calls += 1
        return self.head(x)


def _batches(count=3):
    generator = torch.Generator().manual_seed(1)
    return [torch.randn(16, 64, generator=generator) for _ in range(count)]


def _prepared(model, plan=None):
    return compress.prepare(model, plan or {"blocks.*": W4A16Config(32, algorithm="gptq")})


def test_stages_are_the_roles_of_the_blocks_in_the_order_of_the_forward():
    """Layers on one input share a stage (q, k, v; gate, up), and a role's layers of every block too."""
    model = _prepared(Stack())
    layers = calibration.gptq_layers(model)
    stages = calibration.gptq_stages(model, layers, lambda m: m(_batches(1)[0]))
    roles = [["q", "k", "v"], ["o"], ["gate", "up"], ["down"]]
    assert stages == [[f"blocks.{i}.{name}" for i in range(2) for name in role] for role in roles]


@pytest.mark.parametrize("name, role", [
    ("model.layers.3.self_attn.q_proj", "model.layers.*.self_attn.q_proj"), ("0.fc", "*.fc"),
    ("blocks.12.mlp.0", "blocks.*.mlp.0"), ("lm_head", "lm_head"), ("h10.attn", "h10.attn"),
])
def test_layer_role_stars_the_block_indices(name, role):
    assert calibration.layer_role(name) == role


def test_layers_outside_repeated_blocks_are_stages_of_their_own():
    torch.manual_seed(0)
    model = compress.prepare(nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64)),
                             W4A16Config(32, algorithm="gptq"))
    layers = calibration.gptq_layers(model)
    assert calibration.gptq_stages(model, layers, lambda m: m(_batches(1)[0])) == [["0"], ["2"]]


def test_one_stage_when_a_layer_runs_twice_or_not_at_all():
    model = _prepared(Stack())
    layers = calibration.gptq_layers(model)
    twice = calibration.gptq_stages(model, layers, lambda m: (m(_batches(1)[0]), m.blocks[0].o(_batches(1)[0])))
    assert twice == [list(layers)]
    first_block_only = calibration.gptq_stages(model, layers, lambda m: m.blocks[0](_batches(1)[0]))
    assert first_block_only == [list(layers)]


def _hessian_of(x):
    x = x.reshape(-1, x.shape[-1])
    return x.T @ x


def test_each_stage_sees_the_earlier_stages_quantized(monkeypatch):
    """The Hessian handed to a later layer is that of its inputs with every earlier layer on its grid."""
    model = _prepared(Stack(blocks=1))
    seen = {}
    real = calibration.gptq_layer

    def gptq_layer(layer, xtx, tokens):
        seen[layer] = xtx.clone()
        return real(layer, xtx, tokens)

    monkeypatch.setattr(calibration, "gptq_layer", gptq_layer)
    batches = _batches()
    calibration.run_hessian_passes(model, batches)
    block = model.blocks[0]
    inputs = []
    handle = block.down.register_forward_pre_hook(lambda module, args: inputs.append(args[0]))
    with torch.no_grad():
        for x in batches:
            model(x)
    handle.remove()
    assert all(layer.weight_quantized for layer in compressed_layers(model).values())
    torch.testing.assert_close(seen[block.down], _hessian_of(torch.cat(inputs)), rtol=1e-5, atol=1e-3)
    # a float pass through the block gives a different Hessian for `down`: the check above can fail
    float_block = Stack(blocks=1).blocks[0]
    float_inputs = []
    float_block.down.register_forward_pre_hook(lambda module, args: float_inputs.append(args[0]))
    with torch.no_grad():
        for x in batches:
            float_block(x)
    assert not torch.allclose(seen[block.down], _hessian_of(torch.cat(float_inputs)), rtol=1e-3, atol=1e-2)


@pytest.mark.parametrize("as_callable", [False, True])
def test_a_pass_stops_at_its_stage_unless_the_batches_are_a_callable(as_callable):
    model = _prepared(Stack())
    batches = _batches()
    data = (lambda m: [m(x) for x in batches]) if as_callable else batches
    results = calibration.run_hessian_passes(model, data)
    assert len(results) == 14
    # one forward of the first batch records the order (a callable runs all of them), then one pass per
    # stage (4 roles), each stopped before the head unless the batches are a callable
    assert model.head_calls == (5 * len(batches) if as_callable else 1)


def test_convert_with_gptq_in_stages_matches_a_float_layer_by_layer_reference():
    """Two stacked layers: the second layer's GPTQ Hessian comes from the first layer's GPTQ output."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64))
    batches = _batches()
    reference = _prepared(copy.deepcopy(model), W4A16Config(32, algorithm="gptq"))
    first = compressed_layers(reference)["0"]
    q, scale = calibration.gptq_layer(first, _hessian_of(torch.cat(batches)), 48)
    with torch.no_grad():
        hidden = torch.relu(reference[0](torch.cat(batches)))
    q2, scale2 = calibration.gptq_layer(compressed_layers(reference)["2"], _hessian_of(hidden), 48)
    results = calibration.run_hessian_passes(_prepared(model, W4A16Config(32, algorithm="gptq")), batches)
    assert torch.equal(results["0"][0], q) and torch.equal(results["2"][0], q2)
    torch.testing.assert_close(results["2"][1], scale2)


# ---- one-shot pruning on calibration inputs (OBS, activation scores) and degenerate calibration data ----
def _calibration(count=8, rows=64):
    generator = torch.Generator().manual_seed(2)
    scales = torch.logspace(-1, 1, 64)[torch.randperm(64, generator=generator)]
    return [torch.randn(rows, 64, generator=generator) * scales for _ in range(count)]


def _output_error(plan, batches):
    reference = Stack()
    model = compress.convert(copy.deepcopy(reference), plan, calibration_data=batches)
    test = _calibration(2)
    with torch.no_grad():
        return sum(float((model(x) - reference(x)).pow(2).mean()) for x in test)


def test_obs_one_shot_keeps_the_outputs_closer_than_magnitude_and_activation_scores():
    from compress.configs import BlockSparseConfig

    batches = _calibration()
    obs = _output_error({"blocks.*": BlockSparseConfig(0.5, algorithm="obs")}, batches)
    activation = _output_error({"blocks.*": BlockSparseConfig(0.5, score="activation")}, batches)
    magnitude = _output_error({"blocks.*": BlockSparseConfig(0.5)}, batches)
    assert obs < activation < magnitude


@pytest.mark.parametrize("quant, module", [("W8A8Config", "BSRW8A8Linear"), ("W4A16Config", "BSRW4A16Linear")])
def test_obs_then_gptq_of_the_survivors_exports_block_sparse_modules(quant, module):
    from compress import configs
    from compress.core.sparsity import expand_mask
    from compress.nn import inference

    config = getattr(configs, quant)(algorithm="gptq")
    plan = {"blocks.*": [configs.BlockSparseConfig(0.5, algorithm="obs"), config]}
    model = compress.prepare(Stack(), plan)
    layers = compressed_layers(model)
    results = calibration.run_hessian_passes(model, _calibration())
    assert set(results) == set(layers)
    for name, layer in layers.items():
        assert int((~layer.mask).sum()) == layer.mask.numel() // 2
        q = results[name][0]
        pruned = ~expand_mask(layer.mask, (layer.out_features, layer.in_features), 32)
        assert bool((q[:, :layer.in_features][pruned] == 0).all())
    compress.convert(model)
    assert isinstance(model.blocks[0].down, getattr(inference, module))


def test_obs_without_calibration_data_is_refused_and_leaves_the_model():
    from compress.configs import BlockSparseConfig

    model = Stack()
    before = copy.deepcopy(model.state_dict())
    with pytest.raises(ValueError, match=r"algorithm='obs'.*need calibration_data"):
        compress.convert(model, {"blocks.*": BlockSparseConfig(0.5, algorithm="obs")})
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


@pytest.mark.parametrize("batches, message", [
    ([], "expected at least one batch, got none"),
    ([torch.full((64, 64), float("nan"))], "non-finite values"),
    ([torch.full((64, 64), 1e30)], "non-finite values"),  # the block's LayerNorm turns it into NaN
    ([torch.zeros(64, 64)], "inputs were all zero"),
    ([torch.randn(64, 48)], r"shapes cannot be multiplied|mat1 and mat2|size"),
])
@pytest.mark.parametrize("config", ["obs", "activation", "gptq"])
def test_degenerate_calibration_data_is_refused_and_leaves_the_model(batches, message, config):
    from compress.configs import BlockSparseConfig

    plan = {"obs": BlockSparseConfig(0.5, algorithm="obs"), "activation": BlockSparseConfig(0.5, score="activation"),
            "gptq": W4A16Config(32, algorithm="gptq")}[config]
    model = Stack()
    before = copy.deepcopy(model.state_dict())
    with pytest.raises((ValueError, RuntimeError), match=message):
        compress.convert(model, {"blocks.*": plan}, calibration_data=batches)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_fewer_tokens_than_input_channels_are_named_in_a_warning(caplog):
    from compress.configs import BlockSparseConfig

    with caplog.at_level("WARNING", logger="compress.calibration"):
        compress.convert(Stack(), {"blocks.*": BlockSparseConfig(0.5, algorithm="obs")},
                         calibration_data=[torch.randn(1, 64)])
    assert "layer 'blocks.0.q' saw 1 calibration tokens, fewer than its 64 input channels" in caplog.text


@pytest.mark.parametrize("batches, message", [
    ([torch.zeros(64, 64)], "inputs were all zero"),
    ([torch.full((64, 64), float("nan"))], "NaN or Inf"),
])
def test_static_scales_refuse_degenerate_data_instead_of_a_scale_of_one(batches, message):
    from compress.configs import W8A8Config

    with pytest.raises(ValueError, match=f"layer 'blocks.0.q'.*{message}"):
        compress.convert(Stack(), {"blocks.*": W8A8Config(activation="static")}, calibration_data=batches)


def test_inputs_that_overflow_when_squared_are_named():
    xtx = torch.eye(64)
    xtx[3, 3] = float("inf")
    with pytest.raises(ValueError, match="overflow float32 when squared"):
        calibration.check_layer_inputs("q", xtx, 100)
