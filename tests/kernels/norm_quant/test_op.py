"""LayerNorm / RMSNorm / GELU with per-token int8 output (compress_kernels/norm_quant/op.py and its kernels).

``y`` is compared with the reference within fp32 rounding (sums in another order; Triton's
interpreter casts fp32 -> bf16 by truncation), and ``xq`` / ``s_x`` must be exactly
``quantize_per_token`` of the ``y`` the kernel stored: that is what the W8A8 layer after it would
have computed from ``y``.
"""
import pytest
import torch

import compress_kernels as kernels
from compress_kernels import reference
from compress_kernels.norm_quant import MAX_ROW
from tests.kernels.helpers import DEVICE, rel_error

DTYPES = (torch.float16, torch.bfloat16)
TOL = {torch.float16: 1e-3, torch.bfloat16: 1e-2}


def assert_quantizes_its_output(y, xq, s_x, x_scale=None):
    expected_xq, expected_s = reference.quantize_per_token(y.reshape(-1, y.shape[-1]), x_scale)
    assert torch.equal(xq, expected_xq)
    assert torch.equal(s_x, expected_s)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 33), (7, 384), (2, 5, 200), (3, 1536)])
@pytest.mark.parametrize("affine", [True, False])
def test_layer_norm_quantize_matches_reference(dtype, shape, affine):
    gen = torch.Generator().manual_seed(shape[-1])
    x = (torch.randn(shape, generator=gen) * 4 + 1).to(dtype).to(DEVICE)
    k = shape[-1]
    weight = torch.randn(k, generator=gen).to(DEVICE) if affine else None
    bias = torch.randn(k, generator=gen).to(dtype).to(DEVICE) if affine else None
    y, xq, s_x = kernels.layer_norm_quantize(x, weight, bias, 1e-12)
    y_ref, _, _ = reference.layer_norm_quantize_ref(x, weight, bias, 1e-12)
    assert y.shape == x.shape and y.dtype == dtype
    assert xq.shape == (x.numel() // k, k) and xq.dtype == torch.int8
    assert rel_error(y, y_ref) <= TOL[dtype]
    assert_quantizes_its_output(y, xq, s_x)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 33), (7, 512), (2, 5, 200)])
def test_rms_norm_quantize_matches_reference(dtype, shape):
    gen = torch.Generator().manual_seed(shape[-1])
    x = (torch.randn(shape, generator=gen) * 4 + 1).to(dtype).to(DEVICE)
    weight = torch.randn(shape[-1], generator=gen).to(dtype).to(DEVICE)
    y, xq, s_x = kernels.rms_norm_quantize(x, weight, 1e-6)
    y_ref, _, _ = reference.rms_norm_quantize_ref(x, weight, 1e-6)
    assert y.shape == x.shape and y.dtype == dtype
    assert rel_error(y, y_ref) <= TOL[dtype]
    assert_quantizes_its_output(y, xq, s_x)


def test_rms_norm_quantize_needs_the_weight_in_x_dtype():
    x = torch.randn(2, 64).half().to(DEVICE)
    with pytest.raises(TypeError, match="weight: expected a tensor in x's dtype"):
        kernels.rms_norm_quantize(x, torch.ones(64, device=DEVICE))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 33), (4, 1536), (2, 3, 384)])
def test_gelu_quantize_matches_reference(dtype, shape):
    x = (torch.randn(shape, generator=torch.Generator().manual_seed(1)) * 3).to(dtype).to(DEVICE)
    y, xq, s_x = kernels.gelu_quantize(x)
    y_ref, _, _ = reference.gelu_quantize_ref(x)
    assert y.shape == x.shape and y.dtype == dtype
    assert rel_error(y, y_ref) <= TOL[dtype]
    assert_quantizes_its_output(y, xq, s_x)


def test_strided_rows_and_columns():
    base = torch.randn(6, 512).half().to(DEVICE)
    for x in (base[:, :384], base[:, ::2]):  # row stride 512; column stride 2 (copied first)
        y, xq, s_x = kernels.layer_norm_quantize(x, None, None, 1e-5)
        assert rel_error(y, reference.layer_norm_quantize_ref(x, None, None, 1e-5)[0]) <= 1e-3
        assert_quantizes_its_output(y, xq, s_x)
        y, xq, s_x = kernels.gelu_quantize(x)
        assert rel_error(y, reference.gelu_quantize_ref(x)[0]) <= 1e-3
        assert_quantizes_its_output(y, xq, s_x)


def test_static_scale_and_zero_rows():
    x = torch.randn(4, 64).half().to(DEVICE)
    x[1] = 0.0  # LayerNorm of a constant row is its bias: zero here, so scale 1 and xq 0
    scale = torch.tensor(0.02, device=DEVICE)
    for y, xq, s_x in (kernels.layer_norm_quantize(x, None, None, 1e-5, scale), kernels.gelu_quantize(x, scale)):
        assert_quantizes_its_output(y, xq, s_x, scale)
        assert torch.all(s_x == 0.02)
    y, xq, s_x = kernels.gelu_quantize(x)
    assert s_x[1] == 1.0 and not xq[1].any()


def test_no_rows():
    y, xq, s_x = kernels.layer_norm_quantize(torch.empty(0, 48, dtype=torch.float16, device=DEVICE))
    assert y.shape == (0, 48) and xq.shape == (0, 48) and s_x.shape == (0,)


def test_bad_inputs_are_refused():
    x = torch.randn(2, 64).half().to(DEVICE)
    with pytest.raises(TypeError, match="x: expected dtype"):
        kernels.gelu_quantize(x.float())
    with pytest.raises(ValueError, match=f"K <= {MAX_ROW}"):
        kernels.gelu_quantize(torch.zeros(1, MAX_ROW + 1, dtype=torch.float16, device=DEVICE))
    with pytest.raises(ValueError, match="weight: expected shape \\(64,\\)"):
        kernels.layer_norm_quantize(x, torch.ones(32, device=DEVICE))
    with pytest.raises(ValueError, match="one static scale"):
        kernels.gelu_quantize(x, torch.ones(2, device=DEVICE))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("m", "k"), [(64, 384), (2048, 384), (512, 1536), (16, 4096), (3, MAX_ROW)])
def test_gpu_full_size(dtype, m, k):
    x = (torch.randn(m, k, device="cuda") * 2).to(dtype)
    weight, bias = torch.randn(k, device="cuda").to(dtype), torch.randn(k, device="cuda").to(dtype)
    y, xq, s_x = kernels.layer_norm_quantize(x, weight, bias, 1e-12)
    assert rel_error(y, reference.layer_norm_quantize_ref(x, weight, bias, 1e-12)[0]) <= 4e-3
    assert_quantizes_its_output(y, xq, s_x)
    torch.testing.assert_close(y, torch.nn.functional.layer_norm(x, (k,), weight, bias, 1e-12), rtol=2e-2, atol=2e-2)
    y, xq, s_x = kernels.gelu_quantize(x)
    assert rel_error(y, torch.nn.functional.gelu(x)) <= 4e-3
    assert_quantizes_its_output(y, xq, s_x)
    y, xq, s_x = kernels.rms_norm_quantize(x, weight, 1e-6)
    assert rel_error(y, reference.rms_norm_quantize_ref(x, weight, 1e-6)[0]) <= 4e-3
    assert_quantizes_its_output(y, xq, s_x)
