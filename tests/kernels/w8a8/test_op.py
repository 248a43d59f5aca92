"""W8A8's public launchers (compress_kernels/w8a8/op.py) against compress_kernels.reference.

CPU: the Triton interpreter; GPU: marked ``gpu``. Tolerances: ``W8A8_TOL`` (tests/kernels/helpers.py).
"""
from __future__ import annotations

import pytest
import torch

from compress_kernels import reference
from compress_kernels.w8a8.dispatch import TileConfig, pick
from compress_kernels.w8a8.op import launch, w8a8_matmul, w8a8_matmul_quantized
from tests.kernels.helpers import DEVICE, DTYPES, W8A8_TOL, random_int8_weight, rel_error

GPU_TOL = {torch.float16: 1e-3, torch.bfloat16: 4e-3}


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
    assert rel_error(y, ref) <= W8A8_TOL[dtype]


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
    y = w8a8_matmul(x, w_q, w_scale, x_scale=x_scale)
    assert rel_error(y, reference.w8a8_matmul_ref(x, w_q, w_scale, x_scale=xs)) <= W8A8_TOL[torch.float16]


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
    assert rel_error(y, reference.w8a8_matmul_ref(x, w_q, w_scale)) <= W8A8_TOL[torch.float16]


def test_strided_activation():
    w_q, w_scale = random_int8_weight(32, 64, DEVICE)
    x = torch.randn(64, 7, device=DEVICE).half().t()  # (7, 64), column-major
    y = w8a8_matmul(x, w_q, w_scale)
    assert rel_error(y, reference.w8a8_matmul_ref(x, w_q, w_scale)) <= W8A8_TOL[torch.float16]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("k,n", [(192, 40), (100, 16)])  # K shorter than one step, N not a multiple of 8
def test_picked_one_row_kernel_has_the_two_launch_bits(dtype, k, n):
    x = torch.randn(1, k, device=DEVICE).to(dtype) * 3
    w_q, w_scale = random_int8_weight(n, k, DEVICE)
    bias = torch.randn(n, device=DEVICE).to(dtype)
    assert pick(1, n, k, DEVICE).path == "gemv"
    assert torch.equal(w8a8_matmul(x, w_q, w_scale, bias), launch(x, w_q, w_scale, bias, config=TileConfig(16, 32, 32)))


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
    assert rel_error(y, reference.w8a8_matmul_quantized_ref(xq, s_x, w_q, w_scale, bias, dtype)) <= W8A8_TOL[dtype]
    assert rel_error(y, reference.w8a8_matmul_ref(x, w_q, w_scale, bias)) <= W8A8_TOL[dtype]
    if pick(m, n, k, DEVICE).path != "gemv":
        assert torch.equal(y, w8a8_matmul(x, w_q, w_scale, bias))


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


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m", [1, 16, 64, 2048])
def test_gpu_full_size(dtype, m):
    k = n = 4096
    x = torch.randn(m, k, device="cuda").to(dtype)
    w_q, w_scale = random_int8_weight(n, k, "cuda")
    bias = torch.randn(n, device="cuda").to(dtype)
    y = w8a8_matmul(x, w_q, w_scale, bias)
    assert rel_error(y, reference.w8a8_matmul_ref(x, w_q, w_scale, bias)) <= GPU_TOL[dtype]


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


def test_unknown_path_is_refused_with_the_known_ones():
    x, w_q, w_scale = _operands()
    with pytest.raises(ValueError, match="config.path: expected one of"):
        launch(x, w_q, w_scale, config=TileConfig(16, 32, 32, path="fused"))
