"""The per-token int8 quantize pass (compress_kernels/common/quantize.py) gives the reference's integers
and scales exactly: whole rows in one pass, longer rows in two, static scales, ties rounded to even.
CPU: the Triton interpreter; GPU: marked ``gpu``.
"""
from __future__ import annotations

import pytest
import torch

from compress_kernels import reference
from compress_kernels.common.quantize import ONE_PASS_MAX_K, quantize_rows, row_warps
from tests.kernels.helpers import DEVICE

DTYPES = (torch.float16, torch.bfloat16)


@pytest.mark.parametrize("dtype", DTYPES)
def test_quantized_integers_match_reference(dtype):
    x = torch.randn(9, 200, device=DEVICE).to(dtype) * 3
    x[2] = 0  # all-zero row: scale 1, integers 0
    xq, s_x = quantize_rows(x)
    ref_q, ref_s = reference.quantize_per_token(x)
    assert torch.equal(xq, ref_q)
    assert torch.equal(s_x, ref_s)


@pytest.mark.parametrize("k", [96, 1000, ONE_PASS_MAX_K + 904])  # the last: two passes of three 2048-wide blocks
@pytest.mark.parametrize("static", [None, "scalar", "per_row"])
def test_one_and_two_pass_rows_give_the_reference_integers(k, static):
    m = 3
    x = torch.randn(m, k, device=DEVICE).half() * 4
    x[1] = 0.0  # an all-zero row: scale 1, zeros
    x_scale = {None: None, "scalar": torch.tensor([0.05], device=DEVICE),
               "per_row": torch.tensor([0.03, 0.5, 0.07], device=DEVICE)}[static]
    xq, s_x = quantize_rows(x, x_scale)
    ref_q, ref_s = reference.quantize_per_token(x, x_scale)
    assert torch.equal(xq, ref_q) and torch.equal(s_x, ref_s.reshape(-1).expand(m))


def test_rounding_is_half_to_even():
    # absmax 127 -> scale exactly 1, so x / s_x = x and the ties below are exact
    x = torch.tensor([[127.0, 0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.49, -126.5]], device=DEVICE).half()
    xq, _ = quantize_rows(x)
    ref_q, _ = reference.quantize_per_token(x)
    assert xq.tolist() == [[127, 0, 2, 2, 0, -2, -2, 3, -126]]
    assert torch.equal(xq, ref_q)


def test_zero_static_scale_behaves_as_one():
    x = torch.randn(2, 64, device=DEVICE).half()
    xq, s_x = quantize_rows(x, torch.tensor([0.0, 0.02], device=DEVICE))
    ref_q, ref_s = reference.quantize_per_token(x, torch.tensor([0.0, 0.02], device=DEVICE))
    assert torch.equal(xq, ref_q) and torch.equal(s_x, ref_s) and s_x[0] == 1.0


def test_no_rows_and_row_warps():
    xq, s_x = quantize_rows(torch.empty(0, 64, device=DEVICE).half())
    assert xq.shape == (0, 64) and s_x.shape == (0,)
    assert [row_warps(b) for b in (64, 1024, 2048, 4096, 8192, 16384)] == [4, 4, 8, 8, 16, 16]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,k", [(1, 4096), (2048, 4096), (64, 11008)])
def test_gpu_full_size(dtype, m, k):
    x = torch.randn(m, k, device="cuda").to(dtype) * 3
    xq, s_x = quantize_rows(x)
    ref_q, ref_s = reference.quantize_per_token(x)
    assert torch.equal(xq, ref_q) and torch.equal(s_x, ref_s)
