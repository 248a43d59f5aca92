"""W4A16 from 128 rows on (compress_kernels/w4a16/dequant.py): the dequantize pass gives the reference's
weight, and the cuBLAS product the reference's output. CPU: the Triton interpreter.
"""
from __future__ import annotations

import pytest
import torch

from compress_kernels import reference
from compress_kernels.w4a16.dequant import dequantize
from compress_kernels.w4a16.dispatch import TileConfig
from compress_kernels.w4a16.op import launch
from tests.kernels.helpers import DEVICE, DTYPES, W4A16_TOL, random_int4_weight, rel_error



@pytest.mark.parametrize("k,g", [(192, 32), (256, 128), (200, 200)])  # G = K = 200: a masked tail
def test_dequantize_gives_the_reference_weight(k, g):
    n = 136  # not a multiple of the 128-wide tiles
    qweight, _, scales = random_int4_weight(k, n, g, device=DEVICE)
    w_t = dequantize(qweight, scales, g, torch.float32)
    assert torch.equal(w_t, reference.dequantize_int4(qweight, scales, g).T)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_bias", [False, True])
def test_dequant_path_matches_reference(dtype, with_bias):
    m, k, n, g = 5, 192, 64, 64
    x = torch.randn(m, k, device=DEVICE).to(dtype)
    qweight, _, scales = random_int4_weight(k, n, g, scale_dtype=dtype, device=DEVICE)
    bias = torch.randn(n, device=DEVICE) if with_bias else None
    y = launch(x, qweight, scales, g, bias, config=TileConfig(0, 0, 0, path="dequant"))
    assert rel_error(y, reference.w4a16_matmul_ref(x, qweight, scales, g, bias)) <= W4A16_TOL[dtype]
