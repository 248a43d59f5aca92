"""What the tests of compress/nn/inference/ share: the SQNR measure, a seeded float layer, one maker per
module kind, and the bound calls a module keeps."""
import torch
from torch import nn

from compress.configs import W4A16Config, W8A8BlockConfig, W8A8Config, W8A16Config
from compress.core.sparsity import block_mask
from compress.nn.inference import (BSRLinear, BSRW4A16Linear, BSRW8A8Linear, W4A16Linear, W8A8BlockLinear, W8A8Linear,
                                   W8A16Linear)


def sqnr_db(reference: torch.Tensor, approx: torch.Tensor) -> float:
    """``20 log10(|ref| / |ref - approx|)`` over the whole tensor."""
    reference, approx = reference.detach().float(), approx.detach().float()
    noise = (reference - approx).norm()
    return float(20 * torch.log10(reference.norm() / noise.clamp_min(1e-12)))


def linear_layer(n=64, k=128, seed=0):
    torch.manual_seed(seed)
    return nn.Linear(k, n)


MAKERS = {
    "w8a8": lambda linear: W8A8Linear.from_float(linear, W8A8Config()),
    "w8a8-static": lambda linear: W8A8Linear.from_float(linear, W8A8Config("static"), act_scale=torch.tensor(0.03)),
    "w4a16": lambda linear: W4A16Linear.from_float(linear, W4A16Config(32)),
    "w8a16": lambda linear: W8A16Linear.from_float(linear, W8A16Config()),
    "w8a8-block": lambda linear: W8A8BlockLinear.from_float(linear, W8A8BlockConfig()),
    "bsr": lambda linear: BSRLinear.from_float(linear),
    "bsr-w8a8": lambda linear: BSRW8A8Linear.from_float(linear, mask=block_mask(linear.weight, 0.5)),
    "bsr-w4a16": lambda linear: BSRW4A16Linear.from_float(linear, W4A16Config(32), mask=block_mask(linear.weight, 0.5)),
}


def every_variant(group_size: int) -> dict:
    """:data:`MAKERS` with W4A16 (dense and block-sparse) in groups of ``group_size``, plus per-channel W4A16
    and grouped W8A16."""
    return {**MAKERS, "w4a16": lambda linear: W4A16Linear.from_float(linear, W4A16Config(group_size)),
            "bsr-w4a16": lambda linear: BSRW4A16Linear.from_float(linear, W4A16Config(group_size),
                                                                  mask=block_mask(linear.weight, 0.5)),
            "w4a16-per-channel": lambda linear: W4A16Linear.from_float(linear, W4A16Config(None)),
            "w8a16-g128": lambda linear: W8A16Linear.from_float(linear, W8A16Config(128))}


def bound_calls(module) -> dict:
    return module.__dict__.get("_bound_calls", {})
