"""DDS + W8A8's public launchers (compress_kernels/bsr_w8a8/op.py) against ``compress_kernels.reference``.

The kernel computes the reference's integers exactly and its epilogue does the same fp32 operations
in the same order, so fp16 outputs are compared bit for bit under the interpreter and within one fp16
ulp on a GPU (where the compiler contracts the bias add into an FMA: one to three outputs of a few
thousand, measured on an H100), and bf16 ones within one bf16 ulp (Triton's interpreter casts fp32 ->
bf16 by truncation, the reference rounds).
The integers are also checked against the dense W8A8 kernel on the same weight with zero blocks.
"""
import pytest
import torch

import compress_kernels as kernels
from compress_kernels import reference
from compress_kernels.bsr.dispatch import DENSIFY_MIN_M
from compress_kernels.w8a8 import w8a8_matmul
from tests.kernels.helpers import DEVICE, int8_block_sparse, rel_error

DTYPES = (torch.float16, torch.bfloat16)


def assert_same_output(y, ref):
    if y.dtype == torch.float16 and y.is_cuda:  # the GPU compiler may contract "* w_scale + bias" into an FMA,
        torch.testing.assert_close(y, ref, rtol=2**-10, atol=2**-24)  # which moves an output by one fp16 ulp
    elif y.dtype == torch.float16:
        assert torch.equal(y, ref)
    else:  # bf16: the interpreter truncates where the reference rounds
        torch.testing.assert_close(y.float(), ref.float(), rtol=2**-7, atol=0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("m", "k", "n"), [(1, 64, 32), (5, 96, 64), (17, 256, 96), (40, 128, 64), (70, 64, 128)])
@pytest.mark.parametrize("sparsity", [0.0, 0.5, 1.0])
@pytest.mark.parametrize("with_bias", [False, True])
def test_matches_reference(dtype, m, k, n, sparsity, with_bias):
    parts, w_scale, _ = int8_block_sparse(n, k, sparsity, seed=m)
    x = torch.randn(m, k, device=DEVICE).to(dtype)
    bias = torch.randn(n, device=DEVICE).to(dtype) if with_bias else None
    y = kernels.bsr_w8a8_matmul_parts(x, *parts, w_scale, n, bias)
    ref = reference.bsr_w8a8_matmul_ref(x, *parts, w_scale, n, bias)
    assert y.shape == (m, n) and y.dtype == dtype
    assert_same_output(y, ref)
    if sparsity == 1.0:
        expected = torch.zeros_like(y) if bias is None else bias.expand_as(y)
        assert torch.equal(y, expected)


def test_equals_dense_w8a8_on_the_same_weight_with_empty_block_rows():
    n, k, m = 128, 192, 9
    parts, w_scale, w_q = int8_block_sparse(n, k, 0.4, empty_rows=(1, 3))
    x = torch.randn(2, m, k, device=DEVICE).half()  # leading batch dimension
    x[0, 4] = 0  # an all-zero token: scale 1, output 0 (or the bias)
    y = kernels.bsr_w8a8_matmul_parts(x, *parts, w_scale, n)
    assert y.shape == (2, m, n)
    assert torch.equal(y, w8a8_matmul(x, w_q, w_scale))
    assert torch.equal(y[:, :, 32:64], torch.zeros_like(y[:, :, 32:64]))  # block row 1 is empty
    assert not y.isnan().any()


@pytest.mark.parametrize("kind", ["scalar", "per_row"])
def test_static_scale(kind):
    n, k, m = 64, 128, 6
    parts, w_scale, _ = int8_block_sparse(n, k, 0.5)
    x = torch.randn(m, k, device=DEVICE).half() * 4  # some values clamp at the static scale
    x_scale = torch.tensor(0.02, device=DEVICE) if kind == "scalar" else torch.rand(m, device=DEVICE) * 0.05 + 0.01
    y = kernels.bsr_w8a8_matmul_parts(x, *parts, w_scale, n, None, x_scale)
    assert_same_output(y, reference.bsr_w8a8_matmul_ref(x, *parts, w_scale, n, None, x_scale))


def test_custom_op_fake_and_schema():
    n, k = 64, 64
    parts, w_scale, _ = int8_block_sparse(n, k, 0.5)
    x = torch.randn(3, k, device=DEVICE).half()
    torch.library.opcheck(torch.ops.compress_kernels.bsr_w8a8_matmul, (x, *parts, w_scale, n, None, None),
                          test_utils=("test_schema", "test_faketensor"))


def test_compile_fullgraph_traces_launcher():
    n, k = 64, 96
    parts, w_scale, _ = int8_block_sparse(n, k, 0.5)
    x = torch.randn(4, k, device=DEVICE).half()
    fn = torch.compile(lambda t: kernels.bsr_w8a8_matmul_parts(t, *parts, w_scale, n) * 2, fullgraph=True,
                       backend="aot_eager")
    assert torch.equal(fn(x), reference.bsr_w8a8_matmul_ref(x, *parts, w_scale, n) * 2)


def test_rejects_float_values():
    parts, w_scale, _ = int8_block_sparse(32, 64, 0.0)
    crow, col, values = parts
    x = torch.randn(2, 64, device=DEVICE).half()
    with pytest.raises(TypeError, match=r"values: expected dtype .*int8.*got torch.float16"):
        kernels.bsr_w8a8_matmul_parts(x, crow, col, values.half(), w_scale, 32)


@pytest.mark.parametrize(("field", "bad", "message"), [
    ("w_scale", lambda s: s[:16], r"w_scale: expected shape \(32,\), got \(16,\)"),
    ("w_scale", lambda s: s.half(), r"w_scale: expected dtype"),
    ("x_scale", lambda s: torch.ones(3, device=DEVICE), r"x_scale: expected a scalar or shape \(2,\)"),
])
def test_rejects_bad_scales(field, bad, message):
    parts, w_scale, _ = int8_block_sparse(32, 64, 0.0)
    x = torch.randn(2, 64, device=DEVICE).half()
    kwargs = {"w_scale": w_scale, "x_scale": None}
    kwargs[field] = bad(w_scale)
    with pytest.raises((TypeError, ValueError), match=message):
        kernels.bsr_w8a8_matmul_parts(x, *parts, kwargs["w_scale"], 32, None, kwargs["x_scale"])


def test_rejects_k_not_a_multiple_of_32():
    parts, w_scale, _ = int8_block_sparse(32, 64, 0.0)
    with pytest.raises(ValueError, match="multiple of 32"):
        kernels.bsr_w8a8_matmul_parts(torch.randn(2, 48, device=DEVICE).half(), *parts, w_scale, 32)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("m", "sparsity"), [(5, 0.5), (40, 0.0), (DENSIFY_MIN_M, 0.5)])
def test_quantized_input_equals_parts(dtype, m, sparsity):
    """From an already quantized x: bsr_w8a8_matmul_parts' output on that x (the block kernel, or at
    large M the dense W8A8 GEMM on the densified weight)."""
    n, k = 64, 96
    parts, w_scale, _ = int8_block_sparse(n, k, sparsity, seed=m)
    x = torch.randn(m, k, device=DEVICE).to(dtype)
    bias = torch.randn(n, device=DEVICE).to(dtype)
    xq, s_x = reference.quantize_per_token(x)
    y = kernels.bsr_w8a8_matmul_quantized(xq, s_x, *parts, w_scale, n, bias, dtype)
    assert y.shape == (m, n) and y.dtype == dtype
    assert torch.equal(y, kernels.bsr_w8a8_matmul_parts(x, *parts, w_scale, n, bias))
    assert rel_error(y, reference.bsr_w8a8_matmul_quantized_ref(xq, s_x, *parts, w_scale, n, bias, dtype)) <= 1e-2


def test_quantized_input_rejects_mismatched_scales():
    parts, w_scale, _ = int8_block_sparse(64, 96, 0.5)
    xq = torch.zeros(4, 96, dtype=torch.int8, device=DEVICE)
    with pytest.raises(ValueError, match="s_x: expected shape \\(4,\\)"):
        kernels.bsr_w8a8_matmul_quantized(xq, torch.ones(5, device=DEVICE), *parts, w_scale, 64)
    with pytest.raises(ValueError, match="w_scale: expected shape \\(64,\\)"):
        kernels.bsr_w8a8_matmul_quantized(xq, torch.ones(4, device=DEVICE), *parts, w_scale[:32], 64)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m", [1, 16, 64, 300, 2048])
@pytest.mark.parametrize("sparsity", [0.5, 0.9])
def test_gpu_full_size_equals_dense_w8a8(dtype, m, sparsity):
    n, k = 4096, 4096
    parts, w_scale, w_q = int8_block_sparse(n, k, sparsity, seed=m)
    x = torch.randn(m, k, device="cuda").to(dtype)
    bias = torch.randn(n, device="cuda").to(dtype)
    y = kernels.bsr_w8a8_matmul_parts(x, *parts, w_scale, n, bias)
    # On the GPU the epilogue's multiply-adds may be fused (FMA) differently from PyTorch's or the dense
    # kernel's, and shared block rows add dequantized partials: equal up to fp32 / output rounding.
    tol = {torch.float16: 1e-3, torch.bfloat16: 4e-3}[dtype]
    assert rel_error(y, reference.bsr_w8a8_matmul_ref(x, *parts, w_scale, n, bias)) <= tol
    assert rel_error(y, w8a8_matmul(x, w_q, w_scale, bias)) <= tol


@pytest.mark.gpu
def test_gpu_cuda_graph_capture_and_replay():
    n, k, m = 1024, 2048, 64
    parts, w_scale, _ = int8_block_sparse(n, k, 0.5, device="cuda")
    x = torch.randn(m, k, device="cuda").half()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        kernels.bsr_w8a8_matmul_parts(x, *parts, w_scale, n)  # warm-up: compile outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = kernels.bsr_w8a8_matmul_parts(x, *parts, w_scale, n)
    for _ in range(2):
        x.copy_(torch.randn(m, k, device="cuda").half())
        graph.replay()
        assert torch.equal(y, reference.bsr_w8a8_matmul_ref(x, *parts, w_scale, n))
