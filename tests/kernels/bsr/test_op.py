"""DDS's public launchers (compress_kernels/bsr/op.py) against ``compress_kernels.reference.bsr_matmul_ref``.

On the CPU the Triton kernels run in the interpreter (tests/conftest.py sets TRITON_INTERPRET=1) on
small shapes; GPU-marked tests run full sizes, torch.compile(fullgraph=True) and CUDA-graph replay.
Weights are random, block sparse with an exact share of absent 32x32 blocks; outputs are compared
with the fp32-accumulated reference to the output dtype's rounding.
"""
import pytest
import torch

import compress_kernels as kernels
from compress_kernels.reference import bsr_matmul_ref
from tests.kernels.helpers import BSR_BLOCK, DEVICE, block_sparse_dense, bsr_parts

TOL = {torch.float16: dict(atol=2e-2, rtol=1e-2), torch.bfloat16: dict(atol=1e-1, rtol=2e-2)}


def check_against_reference(x, crow, col, values, n, bias=None):
    y = kernels.bsr_matmul_parts(x, crow, col, values, n, bias)
    ref = bsr_matmul_ref(x, crow, col, values, n, bias)
    assert y.shape == ref.shape and y.dtype == x.dtype
    assert torch.isfinite(y).all()
    torch.testing.assert_close(y, ref, **TOL[x.dtype])
    return y


@pytest.mark.parametrize("k,n", [(32, 32), (64, 96), (128, 64), (256, 160), (96, 256)])
@pytest.mark.parametrize("m", [1, 3, 17, 40])
@pytest.mark.parametrize("sparsity", [0.0, 0.5, 0.9, 1.0])
def test_matches_reference_fp16(k, n, m, sparsity):
    w = block_sparse_dense(n, k, sparsity, torch.float16, seed=k * n + m)
    x = torch.randn(m, k, device=DEVICE).half()
    check_against_reference(x, *bsr_parts(w), n)


@pytest.mark.parametrize("m", [1, 17])
@pytest.mark.parametrize("bias_dtype", [None, torch.bfloat16, torch.float32])
def test_bf16_and_bias(m, bias_dtype):
    n, k = 96, 128
    w = block_sparse_dense(n, k, 0.5, torch.bfloat16)
    x = torch.randn(m, k, device=DEVICE).bfloat16()
    bias = None if bias_dtype is None else torch.randn(n, device=DEVICE).to(bias_dtype)
    check_against_reference(x, *bsr_parts(w), n, bias)


@pytest.mark.parametrize("m", [1, 40])
def test_empty_block_rows_give_bias(m):
    n, k = 128, 64
    w = block_sparse_dense(n, k, 0.3, torch.float16, empty_rows=(0, 2))
    bias = torch.randn(n, device=DEVICE).half()
    x = torch.randn(m, k, device=DEVICE).half()
    y = check_against_reference(x, *bsr_parts(w), n, bias)
    for r in (0, 2):
        rows = slice(r * BSR_BLOCK, (r + 1) * BSR_BLOCK)
        assert torch.equal(y[:, rows], bias[rows].expand(m, BSR_BLOCK))


def test_all_absent_is_zero_without_bias():
    n, k = 64, 64
    crow, col, values = bsr_parts(block_sparse_dense(n, k, 1.0, torch.float16))
    assert values.shape[0] == 0
    y = kernels.bsr_matmul_parts(torch.randn(5, k, device=DEVICE).half(), crow, col, values, n)
    assert torch.equal(y, torch.zeros_like(y))


def test_leading_dims_and_non_contiguous_input():
    n, k = 64, 96
    w = block_sparse_dense(n, k, 0.5, torch.float16)
    x3 = torch.randn(2, 3, k, device=DEVICE).half()
    y3 = check_against_reference(x3, *bsr_parts(w), n)
    assert y3.shape == (2, 3, n)
    x_t = torch.randn(k, 7, device=DEVICE).half().T  # (7, K) with column stride 7
    check_against_reference(x_t, *bsr_parts(w), n)


def test_empty_batch_gives_empty_output():
    n, k = 64, 64
    parts = bsr_parts(block_sparse_dense(n, k, 0.5, torch.float16))
    y = kernels.bsr_matmul_parts(torch.randn(0, k, device=DEVICE).half(), *parts, n)
    assert y.shape == (0, n)


def test_int32_indices():
    n, k = 96, 64
    parts = bsr_parts(block_sparse_dense(n, k, 0.5, torch.float16), torch.int32)
    check_against_reference(torch.randn(17, k, device=DEVICE).half(), *parts, n)


@pytest.mark.parametrize("m", [1, 17])
def test_sparse_bsr_interop(m):
    n, k = 96, 128
    w = block_sparse_dense(n, k, 0.5, torch.float16)
    x = torch.randn(m, k, device=DEVICE).half()
    bias = torch.randn(n, device=DEVICE).half()
    y = kernels.bsr_matmul(x, w.to_sparse_bsr((BSR_BLOCK, BSR_BLOCK)), bias)
    dense = (x.float() @ w.float().T + bias.float()).to(torch.float16)
    torch.testing.assert_close(y, dense, **TOL[torch.float16])


def test_custom_op_fake_and_schema():
    n, k = 64, 64
    crow, col, values = bsr_parts(block_sparse_dense(n, k, 0.5, torch.float16, DEVICE))
    x = torch.randn(3, k, device=DEVICE).half()
    torch.library.opcheck(torch.ops.compress_kernels.bsr_matmul, (x, crow, col, values, n, None),
                          test_utils=("test_schema", "test_faketensor"))


def test_compile_fullgraph_traces_launcher():
    n, k = 64, 96
    crow, col, values = bsr_parts(block_sparse_dense(n, k, 0.5, torch.float16, DEVICE))
    x = torch.randn(4, k, device=DEVICE).half()
    fn = torch.compile(lambda t: kernels.bsr_matmul_parts(t, crow, col, values, n) * 2,
                       fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(fn(x), bsr_matmul_ref(x, crow, col, values, n) * 2, **TOL[torch.float16])


def _good(n=64, k=64, m=2):
    crow, col, values = bsr_parts(block_sparse_dense(n, k, 0.5, torch.float16, DEVICE))
    return torch.randn(m, k, device=DEVICE).half(), crow, col, values, n


def test_dense_weight_is_refused():
    x, *_ = _good()
    with pytest.raises(ValueError, match="sparse_bsr"):
        kernels.bsr_matmul(x, torch.randn(64, 64, device=DEVICE).half())
    with pytest.raises(TypeError, match="torch.Tensor"):
        kernels.bsr_matmul(x, [[1.0]])


def test_wrong_blocksize_is_refused():
    x, *_ = _good()
    w = block_sparse_dense(64, 64, 0.5, torch.float16).to_sparse_bsr((16, 16))
    with pytest.raises(ValueError, match=r"blocksize \(32, 32\).*\(16, 16\)"):
        kernels.bsr_matmul(x, w)


def test_k_mismatch_is_refused():
    w = block_sparse_dense(64, 64, 0.5, torch.float16).to_sparse_bsr((32, 32))
    with pytest.raises(ValueError, match="last dimension 64"):
        kernels.bsr_matmul(torch.randn(2, 96, device=DEVICE).half(), w)


@pytest.mark.parametrize(
    "mutate, error, pattern",
    [
        (lambda a: {**a, "x": a["x"].float()}, TypeError, "dtype"),
        (lambda a: {**a, "x": torch.randn(2, 48, device=DEVICE).half()}, ValueError, "multiple of 32, got 48"),
        (lambda a: {**a, "out_features": 48}, ValueError, "multiple of 32, got 48"),
        (lambda a: {**a, "out_features": 64.0}, TypeError, "int"),
        (lambda a: {**a, "crow_indices": a["crow_indices"][:-1]}, ValueError, r"crow_indices: expected shape \(3,\)"),
        (lambda a: {**a, "crow_indices": a["crow_indices"].float()}, TypeError, "crow_indices"),
        (lambda a: {**a, "values": a["values"].bfloat16()}, TypeError, "values"),
        (lambda a: {**a, "values": a["values"][:, :16, :16].contiguous()}, ValueError, "values: expected shape"),
        (lambda a: {**a, "col_indices": a["col_indices"][:1]}, ValueError, "values: expected shape"),
        (lambda a: {**a, "values": a["values"].transpose(1, 2)}, ValueError, "contiguous"),
        (lambda a: {**a, "bias": torch.randn(32, device=DEVICE).half()}, ValueError, r"bias: expected shape \(64,\)"),
        (lambda a: {**a, "bias": torch.randn(64, device=DEVICE).double()}, TypeError, "bias"),
    ],
)
def test_bad_parts_are_refused(mutate, error, pattern):
    x, crow, col, values, n = _good()
    args = mutate(dict(x=x, crow_indices=crow, col_indices=col, values=values, out_features=n, bias=None))
    with pytest.raises(error, match=pattern):
        kernels.bsr_matmul_parts(**args)


def test_cpu_without_interpreter_is_refused(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    x, crow, col, values, n = _good()
    with pytest.raises(ValueError, match="CUDA"):
        kernels.bsr_matmul_parts(x.cpu(), crow.cpu(), col.cpu(), values.cpu(), n)


@pytest.mark.gpu
def test_device_mismatch_is_refused():
    x, crow, col, values, n = _good()
    with pytest.raises(ValueError, match="device"):
        kernels.bsr_matmul_parts(x, crow.cpu(), col, values, n)


@pytest.mark.gpu
@pytest.mark.parametrize("k,n", [(4096, 4096), (4096, 11008), (11008, 4096)])
@pytest.mark.parametrize("m", [1, 2, 16, 64, 333, 2048])
@pytest.mark.parametrize("sparsity", [0.5, 0.9])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_full_size_matches_reference(k, n, m, sparsity, dtype):
    w = block_sparse_dense(n, k, sparsity, dtype, seed=m)
    x = torch.randn(m, k, device="cuda").to(dtype)
    bias = torch.randn(n, device="cuda").to(dtype)
    crow, col, values = bsr_parts(w)
    y = kernels.bsr_matmul_parts(x, crow, col, values, n, bias)
    ref = (x.double() @ w.double().T + bias.double())
    rel = ((y.double() - ref).norm() / ref.norm()).item()
    assert rel < (2e-3 if dtype == torch.float16 else 1e-2), rel


@pytest.mark.gpu
def test_torch_compile_fullgraph_inductor():
    n, k = 1024, 2048
    crow, col, values = bsr_parts(block_sparse_dense(n, k, 0.75, torch.float16, device="cuda"))
    bias = torch.randn(n, device="cuda").half()

    def layer(t):
        return torch.relu(kernels.bsr_matmul_parts(t, crow, col, values, n, bias))

    compiled = torch.compile(layer, fullgraph=True)
    for m in (1, 64):
        x = torch.randn(m, k, device="cuda").half()
        torch.testing.assert_close(compiled(x), layer(x), atol=0, rtol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 16, 300])
def test_cuda_graph_capture_and_replay(m):
    n, k = 2048, 1024
    crow, col, values = bsr_parts(block_sparse_dense(n, k, 0.75, torch.float16, device="cuda"))
    x = torch.randn(m, k, device="cuda").half()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        kernels.bsr_matmul_parts(x, crow, col, values, n)  # warm-up: compile outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = kernels.bsr_matmul_parts(x, crow, col, values, n)
    for _ in range(2):
        x.copy_(torch.randn(m, k, device="cuda").half())
        y.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(y, bsr_matmul_ref(x, crow, col, values, n), **TOL[torch.float16])
