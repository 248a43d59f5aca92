"""W8A16's tensor-core tiles (compress_kernels/w8a16/tiled.py): per-channel and grouped scales (after the
dot and before it), K splits summed in the kernel and by a second launch, wrapped rows and columns, a
masked K tail. CPU: the Triton interpreter; GPU: marked ``gpu``. Tolerances: ``W8A16_TOL``.
"""
from __future__ import annotations

import pytest
import torch

from compress_kernels import reference
from compress_kernels.w8a16.dispatch import TileConfig
from compress_kernels.w8a16.op import launch
from tests.kernels.helpers import DEVICE, DTYPES, W8A16_TOL, check_w8a16_config, random_w8a16_weight, rel_error


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "m,k,n,grouped,cfg",
    [
        (5, 200, 40, False, TileConfig(16, 32, 64, split_k=2)),  # K tail masked, N wrapped, split in the kernel
        (33, 256, 64, False, TileConfig(32, 32, 64, split_k=3)),  # 32-token tiles: a second launch reduces
        (6, 256, 48, True, TileConfig(16, 16, 64, split_k=2, scale_after_dot=True)),
        (20, 256, 32, True, TileConfig(16, 32, 128)),  # grouped, the weight tile dequantized before the dot
    ],
)
def test_matches_reference(dtype, m, k, n, grouped, cfg):
    check_w8a16_config(dtype, m, k, n, grouped, cfg, W8A16_TOL[dtype])


def test_grouped_scales_after_the_dot_are_exact_before_the_output_cast():
    """Scaling the fp32 product of exact integer operands loses only fp32 rounding; dequantizing first
    rounds each weight to fp16 (2^-11) as well."""
    x = torch.randn(4, 256, device=DEVICE).half()
    w_q, w_scale = random_w8a16_weight(32, 256, True, device=DEVICE)
    ref = reference.w8a16_matmul_ref(x, w_q, w_scale)
    after = launch(x, w_q, w_scale, config=TileConfig(16, 32, 64, scale_after_dot=True))
    before = launch(x, w_q, w_scale, config=TileConfig(16, 32, 64))
    assert rel_error(after, ref) <= 1e-3 and rel_error(before, ref) <= W8A16_TOL[torch.float16]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("grouped", [False, True])
@pytest.mark.parametrize(
    "m,cfg",
    [(16, TileConfig(16, 64, 128, split_k=4, num_stages=4)), (16, TileConfig(16, 128, 128, split_k=2)),
     (64, TileConfig(64, 128, 64, split_k=2, num_warps=8)), (300, TileConfig(128, 128, 64, num_warps=8)),
     (2048, TileConfig(128, 256, 64, num_warps=8, num_stages=3))],
)
def test_gpu_tiles(dtype, grouped, m, cfg):
    k, n = 4096, 4096 + 64  # N a multiple of 64 only: the wrapped-column path for wider tiles
    x = torch.randn(m, k, device="cuda").to(dtype)
    w_q, w_scale = random_w8a16_weight(n, k, grouped, device="cuda")
    bias = torch.randn(n, device="cuda").to(dtype)
    ref = reference.w8a16_matmul_ref(x, w_q, w_scale, bias)
    tol = {torch.float16: 2e-3, torch.bfloat16: 8e-3}[dtype]
    for variant in (cfg, cfg._replace(scale_after_dot=not cfg.scale_after_dot)) if grouped else (cfg,):
        y = launch(x, w_q, w_scale, bias, config=variant)
        assert rel_error(y, ref) <= tol, variant
        assert torch.equal(launch(x, w_q, w_scale, bias, config=variant), y)  # deterministic split-K
