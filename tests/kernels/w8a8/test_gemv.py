"""W8A8's one-row kernel (compress_kernels/w8a8/gemv.py): the row quantized in the kernel gives the
reference's integers, and unsplit the output has the bits of the quantize pass + GEMM path.

CPU: the Triton interpreter; GPU: marked ``gpu``. Tolerances: ``W8A8_TOL`` (tests/kernels/helpers.py).
"""
from __future__ import annotations

import pytest
import torch

from compress_kernels import reference
from compress_kernels.common.splitk import tile_counters
from compress_kernels.w8a8.dispatch import TileConfig, gemv_tile
from compress_kernels.w8a8.op import launch
from tests.kernels.helpers import DEVICE, DTYPES, W8A8_TOL, random_int8_weight, rel_error

GEMV = TileConfig(1, 32, 32, path="gemv")
TILES = TileConfig(16, 32, 32)  # the quantize pass + GEMM path


def test_in_kernel_quantization_gives_the_references_integers():
    # with an identity-like weight (one 1 per output channel, scale 1) the output is xq * s_x itself
    m, k = 3, 32
    x = torch.randn(m, k, device=DEVICE).half() * 5
    ties = [127.0, 0.5, 1.5, 2.5, -0.5, -2.5]  # absmax 127 -> scale exactly 1: exact ties, half to even
    x[0, : len(ties)] = torch.tensor(ties, device=DEVICE).half()
    w_q = torch.eye(k, dtype=torch.int8, device=DEVICE)
    y = launch(x, w_q, torch.ones(k, device=DEVICE), config=GEMV)
    ref_q, ref_s = reference.quantize_per_token(x)
    assert torch.equal(y, (ref_q.float() * ref_s[:, None]).half())
    assert y[0, : len(ties)].tolist() == [127, 0, 2, 2, 0, -2]


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter's numpy overflows to inf, as intended
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("x_scale", [None, 1e-30, 1e30, 1e-40, 3.0])  # 1e-40: a subnormal fp32 scale
def test_extreme_scales_give_the_quantize_pass_integers(dtype, x_scale):
    """The float64 reciprocal the kernel quantizes with gives the quantize pass's integers at every
    magnitude; here from 1e-30 to 1e30 (bf16; fp16 saturates to inf, whose rows are NaN in both)."""
    x = (torch.randn(6, 64) * torch.logspace(-30, 30, 6)[:, None]).to(dtype).to(DEVICE)
    w_q, w_scale = random_int8_weight(16, 64, DEVICE)
    xs = None if x_scale is None else torch.tensor(x_scale, dtype=torch.float32, device=DEVICE)
    if x_scale is None and dtype == torch.float16:
        x = torch.nan_to_num(x, posinf=65504.0, neginf=-65504.0)  # dynamic scales need finite rows
    gemv = launch(x, w_q, w_scale, x_scale=xs, config=GEMV)
    torch.testing.assert_close(gemv, launch(x, w_q, w_scale, x_scale=xs, config=TILES), rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,k,n", [(1, 64, 48), (2, 200, 40), (1, 256, 96)])  # 200: masked K tail; 40, 48: wrapped N
@pytest.mark.parametrize("with_bias", [False, True])
def test_gemv_unsplit_has_the_two_launch_bits(dtype, m, k, n, with_bias):
    x = torch.randn(m, k, device=DEVICE).to(dtype) * 2
    w_q, w_scale = random_int8_weight(n, k, DEVICE)
    bias = torch.randn(n, device=DEVICE).to(dtype) if with_bias else None
    gemv = launch(x, w_q, w_scale, bias, config=GEMV)
    prepass = launch(x, w_q, w_scale, bias, config=TILES)
    assert gemv.dtype == dtype and torch.equal(gemv, prepass)
    assert rel_error(gemv, reference.w8a8_matmul_ref(x, w_q, w_scale, bias)) <= W8A8_TOL[dtype]


@pytest.mark.parametrize("split_k", [2, 3])
def test_gemv_split_k_reduces_in_the_kernel(split_k):
    m, k, n = 2, 200, 40
    x = torch.randn(m, k, device=DEVICE).half()
    w_q, w_scale = random_int8_weight(n, k, DEVICE)
    bias = torch.randn(n, device=DEVICE).half()
    cfg = GEMV._replace(split_k=split_k)
    first = launch(x, w_q, w_scale, bias, config=cfg)
    assert torch.equal(launch(x, w_q, w_scale, bias, config=cfg), first)  # deterministic
    assert rel_error(first, reference.w8a8_matmul_ref(x, w_q, w_scale, bias)) <= W8A8_TOL[torch.float16]
    assert not tile_counters(x.device, m * 2).any(), "every ticket counter is left at zero"


@pytest.mark.parametrize("kind", ["scalar", "per_row"])
def test_gemv_static_scale(kind):
    m, k, n = 2, 64, 32
    x = torch.randn(m, k, device=DEVICE).half() * 4  # some values clamp at the static scale
    w_q, w_scale = random_int8_weight(n, k, DEVICE)
    x_scale = torch.tensor(0.02, device=DEVICE) if kind == "scalar" else torch.tensor([0.03, 0.0], device=DEVICE)
    gemv = launch(x, w_q, w_scale, x_scale=x_scale, config=GEMV)
    assert torch.equal(gemv, launch(x, w_q, w_scale, x_scale=x_scale, config=TILES))


def test_gemv_zero_row_and_strided_x():
    x = torch.randn(64, 2, device=DEVICE).half().t()  # (2, 64), column-major
    x[1] = 0
    w_q, w_scale = random_int8_weight(24, 64, DEVICE)
    gemv = launch(x, w_q, w_scale, config=GEMV)
    assert torch.isfinite(gemv).all() and (gemv[1] == 0).all()
    assert torch.equal(gemv, launch(x, w_q, w_scale, config=TILES))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,k,n", [(1, 4096, 4096), (2, 11008, 4096), (1, 4096, 22016), (1, 1000, 384)])
def test_gpu_gemv(dtype, m, k, n):
    x = torch.randn(m, k, device="cuda").to(dtype) * 3
    w_q, w_scale = random_int8_weight(n, k, "cuda")
    bias = torch.randn(n, device="cuda").to(dtype)
    picked = launch(x, w_q, w_scale, bias, config=gemv_tile(n, k))  # 8 outputs, 512/1024-deep steps
    assert torch.equal(picked, launch(x, w_q, w_scale, bias, config=TileConfig(16, 64, 256)))
    split = launch(x, w_q, w_scale, bias, config=TileConfig(1, 64, 128, split_k=8, path="gemv"))
    tol = {torch.float16: 1e-3, torch.bfloat16: 4e-3}[dtype]
    assert rel_error(split, reference.w8a8_matmul_ref(x, w_q, w_scale, bias)) <= tol
