"""W8A16 at large M (compress_kernels/w8a16/dequant.py): the dequantize pass gives the reference's weight
rounded once to the activation dtype, and the cuBLAS product the reference's output. CPU: the Triton
interpreter; GPU: marked ``gpu``."""
from __future__ import annotations

import pytest
import torch

from compress_kernels import reference
from compress_kernels.common.checks import interpreting
from compress_kernels.w8a16.dequant import dequantize
from compress_kernels.w8a16.dispatch import GROUP_SIZE, TileConfig
from compress_kernels.w8a16.op import launch
from tests.kernels.helpers import DEVICE, DTYPES, W8A16_TOL, random_w8a16_weight, rel_error

DEQUANT = TileConfig(0, 0, 0, path="dequant")


@pytest.mark.parametrize("dtype", [torch.float32, *DTYPES])
@pytest.mark.parametrize("n,k,grouped", [(40, 256, True), (33, 136, False), (7, 8, False)])  # tails in N and K
def test_dequantize_gives_the_reference_weight(dtype, n, k, grouped):
    w_q, w_scale = random_w8a16_weight(n, k, grouped, device=DEVICE)
    w = dequantize(w_q, w_scale, GROUP_SIZE, dtype)
    assert w.shape == (n, k) and w.dtype == dtype and w.is_contiguous()
    expected = reference.dequantize_int8(w_q, w_scale)
    if dtype == torch.bfloat16 and interpreting():  # the interpreter truncates fp32 -> bf16: within 1 ulp
        assert ((w.float() - expected).abs() <= expected.abs() * 2**-7).all()
    else:
        assert torch.equal(w, expected.to(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("grouped,with_bias", [(False, True), (True, False), (True, True)])
def test_dequant_path_matches_reference(dtype, grouped, with_bias):
    m, k, n = 9, 256, 72
    x = torch.randn(m, k, device=DEVICE).to(dtype)
    w_q, w_scale = random_w8a16_weight(n, k, grouped, scale_dtype=dtype, device=DEVICE)
    bias = torch.randn(n, device=DEVICE) if with_bias else None
    y = launch(x, w_q, w_scale, bias, config=DEQUANT)
    assert y.shape == (m, n) and y.dtype == dtype
    assert rel_error(y, reference.w8a16_matmul_ref(x, w_q, w_scale, bias)) <= W8A16_TOL[dtype]


def test_zero_rows_and_zero_scales_give_zeros():
    x = torch.randn(6, 128, device=DEVICE).half()
    x[2] = 0
    w_q, w_scale = random_w8a16_weight(16, 128, False, device=DEVICE)
    w_scale[5] = 0.0
    y = launch(x, w_q, w_scale, config=DEQUANT)
    assert torch.isfinite(y).all() and (y[2] == 0).all() and (y[:, 5] == 0).all()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("grouped", [False, True])
def test_gpu_dequant_full_size(dtype, grouped):
    m, k, n = 2048, 4096, 11008
    x = torch.randn(m, k, device="cuda").to(dtype)
    w_q, w_scale = random_w8a16_weight(n, k, grouped, device="cuda")
    y = launch(x, w_q, w_scale, config=DEQUANT)
    assert rel_error(y, reference.w8a16_matmul_ref(x, w_q, w_scale)) <= W8A16_TOL[dtype]
