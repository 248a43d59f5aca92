"""Tests for compress/core/smoothquant.py: factors, folding into a norm only when that keeps the
model's function (pre-LN yes, post-LN residual no), buffers otherwise, and lower W8A8 error."""
import pytest
import torch
from torch import nn

import compress
from compress import W8A8Config
from compress.core.smoothquant import apply_smoothquant, find_input_norms, smoothing_factors
from compress.calibration import forward_batch
from compress.nn.qat import compressed_layers


class PreNorm(nn.Module):
    """The norm feeds only ``up`` (foldable); ``down`` reads a ReLU output (buffer)."""

    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(64)
        self.up = nn.Linear(64, 128)
        self.down = nn.Linear(128, 64)

    def forward(self, x):
        return x + self.down(torch.relu(self.up(self.norm(x))))


class PostNorm(nn.Module):
    """BERT-like: the norm output is also the residual, so folding would change the function."""

    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(64)
        self.up = nn.Linear(64, 64)

    def forward(self, x):
        h = self.norm(x)
        return h + self.up(h)


def _inputs(seed=0):
    torch.manual_seed(seed)
    x = torch.randn(16, 64)
    x[:, 5] *= 30
    return x


def _observed(model):
    torch.manual_seed(0)
    compress.prepare(model, W8A8Config(smoothquant_alpha=0.5))
    layers = compressed_layers(model)
    for layer in layers.values():
        layer.observe(True)
    with torch.no_grad():
        model(_inputs())
    for layer in layers.values():
        layer.observing = False
    return layers


def test_factors_formula_and_zero_channels():
    act = torch.tensor([4.0, 1.0, 0.0])
    w = torch.tensor([[1.0, 4.0, 2.0]])
    factors = smoothing_factors(act, [w], 0.5)
    assert factors.tolist() == pytest.approx([2.0, 0.5, 1.0])


def test_find_input_norms():
    torch.manual_seed(0)
    model = PreNorm()
    norms = find_input_norms(model, {"up": model.up, "down": model.down}, lambda m: m(_inputs()))
    assert norms == {"up": "norm"}


@pytest.mark.parametrize("model_cls, expected", [(PreNorm, {"up": "norm norm", "down": "buffer"}),
                                                  (PostNorm, {"up": "buffer"})])
def test_smoothing_keeps_the_float_function_and_goes_to_the_right_place(model_cls, expected):
    torch.manual_seed(0)
    model = model_cls()
    x = _inputs(1)
    with torch.no_grad():
        before = model(x)
    layers = _observed(model)
    placement = apply_smoothquant(model, layers, 0.5, lambda m: forward_batch(m, _inputs()))
    assert placement == expected
    with torch.no_grad():
        torch.testing.assert_close(model(x), before, atol=1e-4, rtol=1e-4)
    has_buffer = {name: layer.smoothing() is not None for name, layer in layers.items()}
    assert has_buffer == {name: where == "buffer" for name, where in expected.items()}


def test_smoothquant_reduces_w8a8_error_with_an_outlier_channel():
    torch.manual_seed(0)
    reference = PreNorm()
    with torch.no_grad():
        reference.norm.weight[5] = 40.0  # an outlier channel at the input of `up`
    x = _inputs(2)
    with torch.no_grad():
        expected = reference(x)
    errors = {}
    for alpha in (None, 0.5):
        model = PreNorm()
        model.load_state_dict(reference.state_dict())
        compress.convert(model, W8A8Config(smoothquant_alpha=alpha), calibration_data=[_inputs(3)])
        with torch.no_grad():
            errors[alpha] = (model(x) - expected).norm().item()
    assert errors[0.5] < errors[None]


def test_unobserved_layers_are_refused():
    model = compress.prepare(PreNorm(), W8A8Config())
    with pytest.raises(ValueError, match="calibrate first"):
        apply_smoothquant(model, compressed_layers(model), 0.5, lambda m: m(_inputs()))
