"""W8A8's int8 tensor-core GEMM with pointer-loaded tiles (compress_kernels/w8a8/gemm.py): split-K
summed by a second launch or in the kernel, masked K tails. CPU: the Triton interpreter.
"""
from __future__ import annotations

import pytest
import torch

from compress_kernels import reference
from compress_kernels.w8a8.dispatch import TileConfig
from compress_kernels.w8a8.op import launch
from tests.kernels.helpers import DEVICE, W8A8_TOL, random_int8_weight, rel_error



@pytest.mark.parametrize("k", [256, 200])  # 200: K not a multiple of BLOCK_K * SPLIT_K (masked tails)
def test_split_k_path(k):
    m, n = 3, 40
    x = torch.randn(m, k, device=DEVICE).half()
    w_q, w_scale = random_int8_weight(n, k, DEVICE)
    bias = torch.randn(n, device=DEVICE)  # fp32 bias is allowed too
    cfg = TileConfig(16, 32, 32, split_k=4)
    y = launch(x, w_q, w_scale, bias, config=cfg)
    assert rel_error(y, reference.w8a8_matmul_ref(x, w_q, w_scale, bias)) <= W8A8_TOL[torch.float16]


@pytest.mark.parametrize("cfg", [TileConfig(16, 32, 32, split_k=3), TileConfig(32, 32, 32, split_k=3)],
                         ids=["in-kernel", "second-launch"])
def test_split_k_with_bias_matches_reference(cfg):
    """16-row tiles sum their splits in the kernel, wider ones in a second launch that adds the bias."""
    m, k, n = 5, 192, 96
    x = torch.randn(m, k, device=DEVICE).half()
    w_q, w_scale = random_int8_weight(n, k, DEVICE)
    bias = torch.randn(n, device=DEVICE).half()
    y = launch(x, w_q, w_scale, bias, config=cfg)
    assert rel_error(y, reference.w8a8_matmul_ref(x, w_q, w_scale, bias)) <= W8A8_TOL[torch.float16]
