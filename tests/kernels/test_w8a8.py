"""Tests for kernels/w8a8.py against kernels.reference (CPU: Triton interpreter; GPU: marked ``gpu``).

Tolerances (||y - ref|| / ||ref||): the kernel computes the reference's integers exactly, so the
only differences are fp32 rounding order in the epilogue and the output cast: fp16 <= 1e-3; bf16
<= 1e-2 (Triton's interpreter casts fp32 -> bf16 by truncation, one bf16 ulp = 2^-8).
"""
from __future__ import annotations

import pytest
import torch

from compress_kernels import reference
from compress_kernels.w8a8 import (SMALL_LAYER_TILES, TileConfig, launch, pick_config, quantized_config, quantize_rows,
                          w8a8_matmul, w8a8_matmul_quantized)
from tests.kernels.helpers import random_int8_weight, rel_error

TOL = {torch.float16: 1e-3, torch.bfloat16: 1e-2}
DTYPES = (torch.float16, torch.bfloat16)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,k,n", [(1, 64, 48), (3, 96, 80), (17, 256, 96), (67, 128, 40)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_matches_reference(dtype, m, k, n, with_bias):
    x = torch.randn(m, k, device=DEVICE).to(dtype)
    w_q, w_scale = random_int8_weight(n, k, DEVICE)
    bias = torch.randn(n, device=DEVICE).to(dtype) if with_bias else None
    y = w8a8_matmul(x, w_q, w_scale, bias)
    ref = reference.w8a8_matmul_ref(x, w_q, w_scale, bias)
    assert y.shape == (m, n) and y.dtype == dtype
    assert rel_error(y, ref) <= TOL[dtype]


@pytest.mark.parametrize("dtype", DTYPES)
def test_quantized_integers_match_reference(dtype):
    x = torch.randn(9, 200, device=DEVICE).to(dtype) * 3
    x[2] = 0  # all-zero row: scale 1, integers 0
    xq, s_x = quantize_rows(x)
    ref_q, ref_s = reference.quantize_per_token(x)
    assert torch.equal(xq, ref_q)
    assert torch.equal(s_x, ref_s)


@pytest.mark.parametrize("k", [96, 1000, 5000])  # 5000 > 2048: three blocks per pass in the two-pass kernel
@pytest.mark.parametrize("static", [None, "scalar", "per_row"])
def test_one_pass_and_two_pass_quantization_agree(k, static):
    m = 3
    x = torch.randn(m, k, device=DEVICE).half() * 4
    x[1] = 0.0  # an all-zero row: scale 1, zeros
    x_scale = {None: None, "scalar": torch.tensor([0.05], device=DEVICE),
               "per_row": torch.tensor([0.03, 0.5, 0.07], device=DEVICE)}[static]
    one, two = quantize_rows(x, x_scale, one_pass=True), quantize_rows(x, x_scale, one_pass=False)
    assert torch.equal(one[0], two[0]) and torch.equal(one[1], two[1])
    ref_q, ref_s = reference.quantize_per_token(x, x_scale)
    assert torch.equal(one[0], ref_q) and torch.equal(one[1], ref_s.reshape(-1).expand(m))


def test_rounding_is_half_to_even():
    # absmax 127 -> scale exactly 1, so x / s_x = x and the ties below are exact
    x = torch.tensor([[127.0, 0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.49, -126.5]], device=DEVICE).half()
    xq, _ = quantize_rows(x)
    ref_q, _ = reference.quantize_per_token(x)
    assert xq.tolist() == [[127, 0, 2, 2, 0, -2, -2, 3, -126]]
    assert torch.equal(xq, ref_q)


@pytest.mark.parametrize("kind", ["scalar", "python_float", "per_row"])
def test_static_scale(kind):
    m, k, n = 5, 64, 32
    x = torch.randn(m, k, device=DEVICE).half() * 4  # some values clamp at the static scale
    w_q, w_scale = random_int8_weight(n, k, DEVICE)
    if kind == "scalar":
        x_scale = torch.tensor(0.02, device=DEVICE)
    elif kind == "python_float":
        x_scale = 0.02
    else:
        x_scale = torch.rand(m, device=DEVICE) * 0.05
        x_scale[1] = 0.0  # a zero static scale behaves as 1, never NaN
    xs = torch.as_tensor(x_scale, dtype=torch.float32, device=DEVICE)
    xq, s_x = quantize_rows(x, xs)
    ref_q, ref_s = reference.quantize_per_token(x, xs)
    assert torch.equal(xq, ref_q) and torch.equal(s_x, ref_s)
    y = w8a8_matmul(x, w_q, w_scale, x_scale=x_scale)
    assert rel_error(y, reference.w8a8_matmul_ref(x, w_q, w_scale, x_scale=xs)) <= TOL[torch.float16]


def test_zero_rows_give_zero_outputs():
    x = torch.randn(4, 64, device=DEVICE).half()
    x[1] = 0
    x[3] = 0
    w_q, w_scale = random_int8_weight(24, 64, DEVICE)
    y = w8a8_matmul(x, w_q, w_scale)
    assert torch.isfinite(y).all()
    assert (y[1] == 0).all() and (y[3] == 0).all()


def test_empty_and_batched_inputs():
    w_q, w_scale = random_int8_weight(24, 64, DEVICE)
    empty = w8a8_matmul(torch.empty(0, 64, device=DEVICE).half(), w_q, w_scale)
    assert empty.shape == (0, 24)
    x = torch.randn(2, 3, 64, device=DEVICE).half()
    y = w8a8_matmul(x, w_q, w_scale)
    assert y.shape == (2, 3, 24)
    assert rel_error(y, reference.w8a8_matmul_ref(x, w_q, w_scale)) <= TOL[torch.float16]


def test_strided_activation():
    w_q, w_scale = random_int8_weight(32, 64, DEVICE)
    x = torch.randn(64, 7, device=DEVICE).half().t()  # (7, 64), column-major
    y = w8a8_matmul(x, w_q, w_scale)
    assert rel_error(y, reference.w8a8_matmul_ref(x, w_q, w_scale)) <= TOL[torch.float16]


@pytest.mark.parametrize("k", [256, 200])  # 200: K not a multiple of BLOCK_K * SPLIT_K (masked tails)
def test_split_k_path(k):
    m, n = 3, 40
    x = torch.randn(m, k, device=DEVICE).half()
    w_q, w_scale = random_int8_weight(n, k, DEVICE)
    bias = torch.randn(n, device=DEVICE)  # fp32 bias is allowed too
    cfg = TileConfig(16, 32, 32, split_k=4)
    y = launch(x, w_q, w_scale, bias, config=cfg)
    assert rel_error(y, reference.w8a8_matmul_ref(x, w_q, w_scale, bias)) <= TOL[torch.float16]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,k,n,with_bias", [(5, 64, 48, True), (70, 160, 96, False), (33, 96, 40, True)])
def test_tma_tiles_equal_the_pointer_kernel(dtype, m, k, n, with_bias):
    x = torch.randn(m, k, device=DEVICE).to(dtype)  # M, N, K not tile multiples: the boxes zero-fill
    w_q, w_scale = random_int8_weight(n, k, DEVICE)
    bias = torch.randn(n, device=DEVICE).to(dtype) if with_bias else None
    cfg = TileConfig(32, 32, 64, num_warps=4, num_stages=3)
    plain = launch(x, w_q, w_scale, bias, config=cfg)
    tma = launch(x, w_q, w_scale, bias, config=cfg._replace(tma=True))
    assert torch.equal(tma, plain)  # the same exact integers and the same epilogue
    assert rel_error(tma, reference.w8a8_matmul_ref(x, w_q, w_scale, bias)) <= TOL[dtype]


def test_tma_falls_back_when_rows_are_not_16_byte_aligned():
    from compress_kernels.w8a8_tma import tma_ready

    m, k, n = 4, 72, 24  # K = 72: an int8 row stride of 72 bytes, not a multiple of 16
    x = torch.randn(m, k, device=DEVICE).half()
    w_q, w_scale = random_int8_weight(n, k, DEVICE)
    assert not tma_ready(torch.empty(m, k, dtype=torch.int8), w_q.cpu())
    y = launch(x, w_q, w_scale, config=TileConfig(16, 32, 64, tma=True))
    assert rel_error(y, reference.w8a8_matmul_ref(x, w_q, w_scale)) <= TOL[torch.float16]


def test_pick_config_buckets():
    small, large = pick_config(1, 4096, 4096), pick_config(4096, 4096, 4096)
    assert small.block_m <= 16 and small.split_k >= 1
    assert large.block_m >= 128 and large.split_k == 1 and large.tma  # TMA tile loads from M = 257


def test_pick_config_paths():
    for m in (1, 16, 64, 256, 4096):  # the fused path is opt-in only
        assert not pick_config(m, 4096, 4096).fused
    for m, n, k in [(64, 384, 384), (256, 1536, 384), (2048, 384, 1536), (2048, 1536, 384)]:
        cfg = pick_config(m, n, k)  # small layers: a filling tile, no split-K
        assert cfg in SMALL_LAYER_TILES and cfg.split_k == 1
    assert pick_config(64, 384, 1536).split_k > 1  # M <= 64 with K >= 1024: split-K measured faster


def test_sixteen_row_tiles_are_narrow_up_to_64_mi_weights():
    for m in (2, 8, 16):
        assert pick_config(m, 4096, 4096).block_n == 32 and pick_config(m, 4096, 11008).block_n == 32
        assert pick_config(m, 8192, 8192).block_n == 32  # 64 Mi weights: still narrow
        assert pick_config(m, 28672, 8192).block_n == 64  # 8192x28672: the 64-wide tile (1% faster there)
        assert pick_config(m, 28672, 8192).split_k == 1 and pick_config(m, 4096, 4096).split_k == 1
    assert quantized_config(1, 4096, 4096) == pick_config(16, 4096, 4096)  # quantized input: no one-row kernel


# ------------------------------------------------ fused path: one launch, same integers, same bits

FUSED_TILES = [TileConfig(16, 32, 32, fused=True), TileConfig(16, 32, 32, split_k=2, fused=True)]


def _fused_and_prepass(x, w_q, w_scale, bias=None, x_scale=None, cfg=FUSED_TILES[0]):
    fused = launch(x, w_q, w_scale, bias, x_scale, config=cfg)
    prepass = launch(x, w_q, w_scale, bias, x_scale, config=cfg._replace(fused=False))
    return fused, prepass


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,k,n", [(1, 64, 48), (5, 200, 40), (17, 96, 80)])  # 200: masked K tail
@pytest.mark.parametrize("cfg", FUSED_TILES, ids=["sk1", "sk2"])
def test_fused_equals_prepass_and_reference(dtype, m, k, n, cfg):
    x = torch.randn(m, k, device=DEVICE).to(dtype) * 2
    w_q, w_scale = random_int8_weight(n, k, DEVICE)
    bias = torch.randn(n, device=DEVICE).to(dtype)
    fused, prepass = _fused_and_prepass(x, w_q, w_scale, bias, cfg=cfg)
    assert fused.dtype == dtype and torch.equal(fused, prepass)
    assert rel_error(fused, reference.w8a8_matmul_ref(x, w_q, w_scale, bias)) <= TOL[dtype]


@pytest.mark.parametrize("cfg", [TileConfig(16, 32, 32, fused=True), TileConfig(1, 32, 32, gemv=True)],
                         ids=["fused", "gemv"])
def test_in_kernel_quantization_gives_the_references_integers(cfg):
    # with an identity-like weight (one 1 per output channel, scale 1) the output is xq * s_x itself
    m, k = 3, 32
    x = torch.randn(m, k, device=DEVICE).half() * 5
    ties = [127.0, 0.5, 1.5, 2.5, -0.5, -2.5]  # absmax 127 -> scale exactly 1: exact ties, half to even
    x[0, : len(ties)] = torch.tensor(ties, device=DEVICE).half()
    w_q = torch.eye(k, dtype=torch.int8, device=DEVICE)
    y = launch(x, w_q, torch.ones(k, device=DEVICE), config=cfg)
    ref_q, ref_s = reference.quantize_per_token(x)
    assert torch.equal(y, (ref_q.float() * ref_s[:, None]).half())
    assert y[0, : len(ties)].tolist() == [127, 0, 2, 2, 0, -2]


@pytest.mark.parametrize("kind", ["scalar", "per_row"])
def test_fused_static_scale(kind):
    m, k, n = 5, 64, 32
    x = torch.randn(m, k, device=DEVICE).half() * 4  # some values clamp at the static scale
    w_q, w_scale = random_int8_weight(n, k, DEVICE)
    if kind == "scalar":
        x_scale = torch.tensor(0.02, device=DEVICE)
    else:
        x_scale = torch.rand(m, device=DEVICE) * 0.05
        x_scale[1] = 0.0  # behaves as 1, never NaN
    fused, prepass = _fused_and_prepass(x, w_q, w_scale, x_scale=x_scale)
    assert torch.equal(fused, prepass)
    assert rel_error(fused, reference.w8a8_matmul_ref(x, w_q, w_scale, x_scale=x_scale)) <= TOL[torch.float16]


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter's numpy overflows to inf, as intended
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("x_scale", [None, 1e-30, 1e30, 1e-40, 3.0])  # 1e-40: a subnormal fp32 scale
def test_fused_extreme_scales(dtype, x_scale):
    # magnitudes from 1e-30 to 1e30 (bf16; fp16 saturates to inf, which clamps like any huge value)
    x = (torch.randn(6, 64) * torch.logspace(-30, 30, 6)[:, None]).to(dtype).to(DEVICE)
    w_q, w_scale = random_int8_weight(16, 64, DEVICE)
    xs = None if x_scale is None else torch.tensor(x_scale, dtype=torch.float32, device=DEVICE)
    if x_scale is None and dtype == torch.float16:
        x = torch.nan_to_num(x, posinf=65504.0, neginf=-65504.0)  # dynamic scales need finite rows
    fused, prepass = _fused_and_prepass(x, w_q, w_scale, x_scale=xs)
    assert torch.equal(fused, prepass)


def test_fused_zero_rows_and_strided_x():
    x = torch.randn(64, 7, device=DEVICE).half().t()  # (7, 64), column-major
    x[2] = 0
    w_q, w_scale = random_int8_weight(24, 64, DEVICE)
    fused, prepass = _fused_and_prepass(x, w_q, w_scale)
    assert torch.isfinite(fused).all() and (fused[2] == 0).all()
    assert torch.equal(fused, prepass)


# ------------------------------------------------ gemv path: one row per program, in-kernel quantization

GEMV = TileConfig(1, 32, 32, gemv=True)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,k,n", [(1, 64, 48), (2, 200, 40), (1, 256, 96)])  # 200: masked K tail; 40, 48: wrapped N
@pytest.mark.parametrize("with_bias", [False, True])
def test_gemv_unsplit_has_the_two_launch_bits(dtype, m, k, n, with_bias):
    x = torch.randn(m, k, device=DEVICE).to(dtype) * 2
    w_q, w_scale = random_int8_weight(n, k, DEVICE)
    bias = torch.randn(n, device=DEVICE).to(dtype) if with_bias else None
    gemv = launch(x, w_q, w_scale, bias, config=GEMV)
    prepass = launch(x, w_q, w_scale, bias, config=TileConfig(16, 32, 32))
    assert gemv.dtype == dtype and torch.equal(gemv, prepass)
    assert rel_error(gemv, reference.w8a8_matmul_ref(x, w_q, w_scale, bias)) <= TOL[dtype]


@pytest.mark.parametrize("split_k", [2, 3])
def test_gemv_split_k_reduces_in_the_kernel(split_k):
    from compress_kernels._splitk import tile_counters

    m, k, n = 2, 200, 40
    x = torch.randn(m, k, device=DEVICE).half()
    w_q, w_scale = random_int8_weight(n, k, DEVICE)
    bias = torch.randn(n, device=DEVICE).half()
    cfg = GEMV._replace(split_k=split_k)
    first = launch(x, w_q, w_scale, bias, config=cfg)
    assert torch.equal(launch(x, w_q, w_scale, bias, config=cfg), first)  # deterministic
    assert rel_error(first, reference.w8a8_matmul_ref(x, w_q, w_scale, bias)) <= TOL[torch.float16]
    assert not tile_counters(x.device, m * 2).any(), "every ticket counter is left at zero"


@pytest.mark.parametrize("kind", ["scalar", "per_row"])
def test_gemv_static_scale(kind):
    m, k, n = 2, 64, 32
    x = torch.randn(m, k, device=DEVICE).half() * 4  # some values clamp at the static scale
    w_q, w_scale = random_int8_weight(n, k, DEVICE)
    x_scale = torch.tensor(0.02, device=DEVICE) if kind == "scalar" else torch.tensor([0.03, 0.0], device=DEVICE)
    gemv = launch(x, w_q, w_scale, x_scale=x_scale, config=GEMV)
    assert torch.equal(gemv, launch(x, w_q, w_scale, x_scale=x_scale, config=TileConfig(16, 32, 32)))


def test_gemv_zero_row_and_strided_x():
    x = torch.randn(64, 2, device=DEVICE).half().t()  # (2, 64), column-major
    x[1] = 0
    w_q, w_scale = random_int8_weight(24, 64, DEVICE)
    gemv = launch(x, w_q, w_scale, config=GEMV)
    assert torch.isfinite(gemv).all() and (gemv[1] == 0).all()
    assert torch.equal(gemv, launch(x, w_q, w_scale, config=TileConfig(16, 32, 32)))


def test_gemv_is_picked_unsplit_for_one_row():
    from compress_kernels.w8a8 import gemv_config

    for n, k, block_k in ((4096, 4096, 1024), (4096, 11008, 1024), (384, 384, 512), (1152, 384, 512), (1024, 100, 128),
                          (28672, 8192, 512), (22016, 4096, 512)):  # wider than GEMV_MAX_N: 512-deep steps
        cfg = pick_config(1, n, k)
        assert cfg.gemv and cfg.split_k == 1 and cfg.block_n == 8 and cfg.block_k == block_k
    assert not any(pick_config(m, 4096, 4096).gemv for m in (2, 16))
    assert all(pick_config(m, 1024, 1024).gemv for m in (2, 4)) and not pick_config(5, 1024, 1024).gemv  # small layers
    cfg = gemv_config(1, 4096, 4096)  # the split one-row tiles (sweeps and tests)
    assert cfg.gemv and (4096 // cfg.block_n) * cfg.split_k >= 640


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("k,n", [(192, 40), (100, 16)])  # K shorter than one step, N not a multiple of 8
def test_picked_one_row_kernel_has_the_two_launch_bits(dtype, k, n):
    x = torch.randn(1, k, device=DEVICE).to(dtype) * 3
    w_q, w_scale = random_int8_weight(n, k, DEVICE)
    bias = torch.randn(n, device=DEVICE).to(dtype)
    assert pick_config(1, n, k).gemv
    assert torch.equal(w8a8_matmul(x, w_q, w_scale, bias), launch(x, w_q, w_scale, bias, config=TileConfig(16, 32, 32)))


def test_op_is_registered_with_fake():
    x = torch.randn(2, 3, 64, device="meta", dtype=torch.float16)
    w_q = torch.empty(24, 64, dtype=torch.int8, device="meta")
    y = torch.ops.compress_kernels.w8a8_matmul(x, w_q, torch.empty(24, device="meta"), None, None)
    assert y.shape == (2, 3, 24) and y.dtype == torch.float16


def _operands():
    x = torch.randn(4, 64, device=DEVICE).half()
    w_q, w_scale = random_int8_weight(24, 64, DEVICE)
    return x, w_q, w_scale


@pytest.mark.parametrize(
    "change,error,words",
    [
        (lambda x, w, s: (x.float(), w, s, None, None), TypeError, "x: expected dtype"),
        (lambda x, w, s: (x, w.int(), s, None, None), TypeError, "w_q: expected dtype"),
        (lambda x, w, s: (x, w[:, :32], s, None, None), ValueError, "w_q: expected shape (24, 64)"),
        (lambda x, w, s: (x, w, s.half(), None, None), TypeError, "w_scale: expected dtype"),
        (lambda x, w, s: (x, w, s[:10], None, None), ValueError, "w_scale: expected shape (24,)"),
        (lambda x, w, s: (x, w, s, torch.zeros(23, dtype=x.dtype), None), ValueError, "bias: expected shape (24,)"),
        (lambda x, w, s: (x, w, s, torch.zeros(24, dtype=torch.int32), None), TypeError, "bias: expected dtype"),
        (lambda x, w, s: (x, w, s, None, torch.ones(3)), ValueError, "x_scale: expected a scalar or shape (4,)"),
        (lambda x, w, s: (x, w, s, None, torch.ones(4, dtype=torch.float64)), TypeError, "x_scale: expected dtype"),
        (lambda x, w, s: (x[:, :0], w[:, :0], s, None, None), ValueError, "K >= 1"),
        (lambda x, w, s: (x, w.to("meta"), s, None, None), ValueError, "w_q: expected device"),
    ],
)
def test_bad_inputs_raise(change, error, words):
    x, w_q, w_scale = _operands()
    args = change(x.cpu(), w_q.cpu(), w_scale.cpu())
    args = tuple(a.to(DEVICE) if isinstance(a, torch.Tensor) and a.device.type == "cpu" else a for a in args)
    with pytest.raises(error, match=words.replace("(", r"\(").replace(")", r"\)")):
        w8a8_matmul(*args)


def test_cpu_tensor_without_interpreter_raises(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    x, w_q, w_scale = _operands()
    with pytest.raises(ValueError, match="expected a CUDA tensor"):
        w8a8_matmul(x.cpu(), w_q.cpu(), w_scale.cpu())


# ----------------------------------------------------------------------------------------- GPU only


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m", [1, 16, 64, 2048])
def test_gpu_full_size(dtype, m):
    k = n = 4096
    x = torch.randn(m, k, device="cuda").to(dtype)
    w_q, w_scale = random_int8_weight(n, k, "cuda")
    bias = torch.randn(n, device="cuda").to(dtype)
    xq, s_x = quantize_rows(x)
    ref_q, ref_s = reference.quantize_per_token(x)
    assert torch.equal(xq, ref_q) and torch.equal(s_x, ref_s)
    y = w8a8_matmul(x, w_q, w_scale, bias)
    assert rel_error(y, reference.w8a8_matmul_ref(x, w_q, w_scale, bias)) <= {torch.float16: 1e-3, torch.bfloat16: 4e-3}[dtype]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,k,n", [(1, 64, 48), (17, 256, 96), (67, 384, 40)])
def test_quantized_input_equals_w8a8_matmul(dtype, m, k, n):
    """The GEMM from an already quantized x gives w8a8_matmul's output on that x (the same integers
    and epilogue; at M = 1 a 16-row tile instead of the one-row kernel)."""
    x = torch.randn(m, k, device=DEVICE).to(dtype)
    w_q, w_scale = random_int8_weight(n, k, DEVICE)
    bias = torch.randn(n, device=DEVICE).to(dtype)
    xq, s_x = reference.quantize_per_token(x)
    y = w8a8_matmul_quantized(xq, s_x, w_q, w_scale, bias, dtype)
    assert y.shape == (m, n) and y.dtype == dtype
    assert rel_error(y, reference.w8a8_matmul_quantized_ref(xq, s_x, w_q, w_scale, bias, dtype)) <= TOL[dtype]
    assert rel_error(y, reference.w8a8_matmul_ref(x, w_q, w_scale, bias)) <= TOL[dtype]
    if not pick_config(m, n, k).gemv:
        assert torch.equal(y, w8a8_matmul(x, w_q, w_scale, bias))


def test_quantized_config_never_quantizes_in_the_kernel():
    for m, n, k in ((1, 4096, 4096), (1, 384, 384), (16, 4096, 4096), (64, 1536, 384)):
        cfg = quantized_config(m, n, k)
        assert not cfg.gemv and not cfg.fused and cfg.block_m >= 16


@pytest.mark.parametrize(("xq", "s_x", "out_dtype", "error", "message"), [
    (torch.zeros(4, 64), torch.ones(4), torch.float16, TypeError, "xq: expected dtype"),
    (torch.zeros(4, 64, dtype=torch.int8), torch.ones(3), torch.float16, ValueError, "s_x: expected shape \\(4,\\)"),
    (torch.zeros(4, 64, dtype=torch.int8), torch.ones(4), torch.float32, TypeError, "out_dtype: expected"),
    (torch.zeros(4, 32, dtype=torch.int8), torch.ones(4), torch.float16, ValueError, "w_q: expected shape \\(8, 32\\)"),
])
def test_quantized_input_bad_arguments(xq, s_x, out_dtype, error, message):
    w_q, w_scale = random_int8_weight(8, 64, DEVICE)
    with pytest.raises(error, match=message):
        w8a8_matmul_quantized(xq.to(DEVICE), s_x.to(DEVICE), w_q, w_scale, None, out_dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,k,n", [(1, 4096, 4096), (16, 4096, 11008), (64, 8192, 8192), (64, 384, 1536), (7, 1536, 384)])
def test_gpu_fused_equals_prepass(dtype, m, k, n):
    x = torch.randn(m, k, device="cuda").to(dtype) * 3
    w_q, w_scale = random_int8_weight(n, k, "cuda")
    bias = torch.randn(n, device="cuda").to(dtype)
    cfg = pick_config(m, n, k)._replace(fused=True)
    fused, prepass = _fused_and_prepass(x, w_q, w_scale, bias, cfg=cfg)
    assert torch.equal(fused, prepass)
    assert rel_error(fused, reference.w8a8_matmul_ref(x, w_q, w_scale, bias)) <= {torch.float16: 1e-3, torch.bfloat16: 4e-3}[dtype]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,k,n", [(1, 4096, 4096), (2, 11008, 4096), (1, 4096, 22016), (1, 1000, 384)])
def test_gpu_gemv(dtype, m, k, n):
    from compress_kernels.w8a8 import gemv_config, row_gemv_config

    x = torch.randn(m, k, device="cuda").to(dtype) * 3
    w_q, w_scale = random_int8_weight(n, k, "cuda")
    bias = torch.randn(n, device="cuda").to(dtype)
    unsplit = launch(x, w_q, w_scale, bias, config=gemv_config(m, n, k)._replace(split_k=1))
    assert torch.equal(unsplit, launch(x, w_q, w_scale, bias, config=TileConfig(16, 64, 256)))
    picked = launch(x, w_q, w_scale, bias, config=row_gemv_config(n, k))  # 8 outputs, 512/1024-deep steps
    assert torch.equal(picked, unsplit)
    split = launch(x, w_q, w_scale, bias, config=gemv_config(m, n, k))
    tol = {torch.float16: 1e-3, torch.bfloat16: 4e-3}[dtype]
    assert rel_error(split, reference.w8a8_matmul_ref(x, w_q, w_scale, bias)) <= tol


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,k,n", [(2048, 4096, 4096), (300, 4096, 11008 + 16), (8192, 1024, 1024)])
@pytest.mark.parametrize("cfg", [TileConfig(128, 256, 128, num_warps=8, num_stages=3, tma=True),
                                 TileConfig(256, 128, 128, num_warps=8, num_stages=4, tma=True)])
def test_gpu_tma_tiles_equal_the_pointer_kernel(dtype, m, k, n, cfg):
    x = torch.randn(m, k, device="cuda").to(dtype)
    w_q, w_scale = random_int8_weight(n, k, "cuda")
    bias = torch.randn(n, device="cuda").to(dtype)
    tma = launch(x, w_q, w_scale, bias, config=cfg)
    assert torch.equal(tma, launch(x, w_q, w_scale, bias, config=cfg._replace(tma=False)))
    ref = reference.w8a8_matmul_ref(x, w_q, w_scale, bias)
    assert rel_error(tma, ref) <= {torch.float16: 1e-3, torch.bfloat16: 4e-3}[dtype]


@pytest.mark.gpu
def test_gpu_torch_compile_fullgraph():
    w_q, w_scale = random_int8_weight(256, 512, "cuda")
    bias = torch.randn(256, device="cuda").half()

    def layer(x):
        return torch.relu(w8a8_matmul(x, w_q, w_scale, bias)) * 2

    compiled = torch.compile(layer, fullgraph=True)
    x = torch.randn(8, 512, device="cuda").half()
    torch.testing.assert_close(compiled(x), layer(x), rtol=0, atol=0)


@pytest.mark.gpu
def test_gpu_cuda_graph_replay():
    w_q, w_scale = random_int8_weight(512, 1024, "cuda")
    static_x = torch.randn(4, 1024, device="cuda").half()
    w8a8_matmul(static_x, w_q, w_scale)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_y = w8a8_matmul(static_x, w_q, w_scale)
    for _ in range(2):
        static_x.copy_(torch.randn(4, 1024, device="cuda").half())
        graph.replay()
        torch.testing.assert_close(static_y, w8a8_matmul(static_x, w_q, w_scale), rtol=0, atol=0)
