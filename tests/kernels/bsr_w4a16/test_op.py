"""DDS + W4A16's public launcher (compress_kernels/bsr_w4a16/op.py) against ``compress_kernels.reference``.

The kernels multiply exact int4 values by x and scale each block's fp32 sum, where the reference
de-quantizes the weight to fp32 first: the same products up to fp32 rounding, so fp16 outputs are
within one fp16 ulp of the reference's (most are equal) and bf16 ones within one bf16 ulp (Triton's
interpreter casts fp32 -> bf16 by truncation, the reference rounds). The same weight is also checked
against the dense W4A16 kernel with its absent blocks zero. CPU: the Triton interpreter.
"""
import pytest
import torch

import compress_kernels as kernels
from compress_kernels import reference
from compress_kernels.bsr_w4a16 import op as bsr_w4a16_op
from compress_kernels.bsr_w4a16.dispatch import cached_pick
from compress_kernels.w4a16 import w4a16_matmul
from tests.kernels.helpers import DEVICE, W4A16_TOL, int4_block_sparse, rel_error

DTYPES = (torch.float16, torch.bfloat16)
N, K = 96, 256  # 3 block rows of 8 blocks: one empty, one full, one at the asked sparsity
GPU_TOL = {torch.float16: 1e-3, torch.bfloat16: 4e-3}  # the BSR-W8A8 GPU tests' bounds


def assert_same_output(y, ref):
    if y.dtype == torch.float16:  # fp32 sums in another order: at most one fp16 ulp apart
        torch.testing.assert_close(y, ref, rtol=2**-10, atol=2**-14)
    else:  # bf16: the interpreter truncates where the reference rounds
        torch.testing.assert_close(y.float(), ref.float(), rtol=2**-7, atol=2**-10)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m", [1, 3, 17, 64])
@pytest.mark.parametrize("group_size", [32, 128])
@pytest.mark.parametrize("sparsity", [0.0, 0.5, 0.9])
def test_matches_reference_and_the_dense_kernel(dtype, m, group_size, sparsity):
    parts, scales, qweight, dense_scales = int4_block_sparse(N, K, sparsity, group_size, empty_rows=(1,),
                                                            full_rows=(2,), seed=m)
    x = torch.randn(m, K, device=DEVICE).to(dtype)
    bias = torch.randn(N, device=DEVICE).to(dtype) if m % 2 else None
    y = kernels.bsr_w4a16_matmul(x, *parts, scales, N, bias)
    assert y.shape == (m, N) and y.dtype == dtype
    ref = reference.bsr_w4a16_matmul_ref(x, *parts, scales, N, bias)
    assert_same_output(y, ref)
    expected = torch.zeros_like(y[:, 32:64]) if bias is None else bias[32:64].expand(m, 32)
    assert torch.equal(y[:, 32:64], expected)  # block row 1 is empty: zeros, or the bias alone
    assert rel_error(y, w4a16_matmul(x, qweight, dense_scales, group_size, bias)) <= W4A16_TOL[dtype]


def test_the_dispatch_covers_both_kernels_on_these_shapes():
    nnz = 16
    assert {cached_pick(m, N, K, nnz, torch.device(DEVICE)).kernel for m in (1, 3, 17, 64)} == {"gemv", "gemm"}


def test_blocks_in_tiles_of_block_rows_reach_the_tile_kernel_past_64_rows(monkeypatch):
    """Past 64 rows the blocks are de-quantized for the DDS op, which gets the tile pattern (and runs the tile
    kernel); a pattern the indices do not hold is refused."""
    parts, scales, _, _ = int4_block_sparse(160, K, 0.5, 32, tile_rows=4)  # 5 block rows: a last tile of 1
    seen, real = [], bsr_w4a16_op.launch_dds

    def dds(*args):
        seen.append(args[-1])
        return real(*args)

    monkeypatch.setattr(bsr_w4a16_op, "launch_dds", dds)
    x = torch.randn(80, K, device=DEVICE).half()
    y = kernels.bsr_w4a16_matmul(x, *parts, scales, 160, None, 4)
    assert seen == [4]
    assert rel_error(y, reference.bsr_w4a16_matmul_ref(x, *parts, scales, 160)) <= GPU_TOL[torch.float16]  # fp16 blocks
    free, free_scales, _, _ = int4_block_sparse(160, K, 0.5, 32, seed=3)
    with pytest.raises(ValueError, match=r"tile_rows=4: expected every 4 block rows .*\(their pattern: tile_rows=1\)"):
        kernels.bsr_w4a16_matmul(x, *free, free_scales, 160, None, 4)


@pytest.mark.parametrize("group_size", [64, None])
def test_other_group_sizes_and_scales_in_x_dtype(group_size):
    """G = 64 and one group per output channel; scales given in x's dtype (the kernel reads them as fp32)."""
    parts, scales, _, _ = int4_block_sparse(N, K, 0.5, group_size, scale_dtype=torch.float16)
    x = torch.randn(2, 5, K, device=DEVICE).half()  # leading batch dimension
    y = kernels.bsr_w4a16_matmul(x, *parts, scales, N)
    assert y.shape == (2, 5, N)
    assert_same_output(y, reference.bsr_w4a16_matmul_ref(x, *parts, scales, N))


def test_no_rows_and_no_blocks():
    parts, scales, _, _ = int4_block_sparse(N, K, 1.0)
    x = torch.randn(3, K, device=DEVICE).half()
    bias = torch.randn(N, device=DEVICE)
    assert torch.equal(kernels.bsr_w4a16_matmul(x, *parts, scales, N, bias), bias.half().expand(3, N))
    assert kernels.bsr_w4a16_matmul(x[:0], *parts, scales, N).shape == (0, N)


def test_custom_op_fake_and_schema():
    parts, scales, _, _ = int4_block_sparse(64, 64, 0.5)
    x = torch.randn(3, 64, device=DEVICE).half()
    torch.library.opcheck(torch.ops.compress_kernels.bsr_w4a16_matmul, (x, *parts, scales, 64, None),
                          test_utils=("test_schema", "test_faketensor"))


def test_compile_fullgraph_traces_launcher():
    parts, scales, _, _ = int4_block_sparse(64, 96, 0.5)
    x = torch.randn(4, 96, device=DEVICE).half()
    fn = torch.compile(lambda t: kernels.bsr_w4a16_matmul(t, *parts, scales, 64) * 2, fullgraph=True,
                       backend="aot_eager")
    assert torch.equal(fn(x), kernels.bsr_w4a16_matmul(x, *parts, scales, 64) * 2)


def _call(**changes):
    parts, scales, _, _ = int4_block_sparse(64, 128, 0.5)
    args = dict(x=torch.randn(2, 128, device=DEVICE).half(), crow=parts[0], col=parts[1], values=parts[2],
                scales=scales, out_features=64)
    args.update({name: change(args[name]) if callable(change) else change for name, change in changes.items()})
    return kernels.bsr_w4a16_matmul(args["x"], args["crow"], args["col"], args["values"], args["scales"],
                                    args["out_features"])


@pytest.mark.parametrize(("changes", "error", "message"), [
    ({"values": lambda v: torch.zeros(v.shape[0], 32, 32, dtype=torch.int8, device=DEVICE)}, TypeError,
     r"values: expected int4 blocks packed 8 to an int32, shape \(nnz, 32, 4\) int32, got int8"),
    ({"values": lambda v: v.float()}, TypeError, r"values: expected dtype in \(torch.int32\)"),
    ({"values": lambda v: v.reshape(-1, 16, 8).contiguous()}, ValueError,
     r"values: expected shape \(\d+, 32, 4\) \(nnz from col_indices, 32x32 int4 blocks, 8 per int32 along K\)"),
    ({"scales": lambda s: torch.ones(2, 64, device=DEVICE)}, ValueError,
     r"scales: expected shape \(\d+, 32\) .*the dense W4A16 \(K/G, N\) layout"),
    ({"scales": lambda s: s[:, :16]}, ValueError, r"scales: expected shape \(\d+, 32\), got \(\d+, 16\)"),
    ({"scales": lambda s: s.double()}, TypeError, r"scales: expected dtype in \(torch.float32, torch.float16\)"),
    ({"scales": lambda s: s.T.contiguous().T}, ValueError, "scales: expected a contiguous tensor"),
    ({"x": lambda x: x[:, :112]}, ValueError, "multiple of 32"),
    ({"x": lambda x: x.float()}, TypeError, r"x: expected dtype in \(torch.float16, torch.bfloat16\)"),
    ({"out_features": 48}, ValueError, "out_features: expected a positive multiple of 32"),
    ({"crow": lambda c: c[:-1]}, ValueError, r"crow_indices: expected shape \(3,\)"),
    ({"col": lambda c: torch.full_like(c, 7)}, ValueError, "col_indices"),  # block columns out of range
])
def test_bad_arguments_are_refused_by_name(changes, error, message):
    with pytest.raises(error, match=message):
        _call(**changes)


def test_bound_call_is_the_launcher_and_checks_only_x():
    parts, scales, _, _ = int4_block_sparse(64, 128, 0.5)
    x = torch.randn(3, 128, device=DEVICE).half()
    call = kernels.bind_bsr_w4a16_matmul(x, *parts, scales, 64)
    assert torch.equal(call(x), kernels.bsr_w4a16_matmul(x, *parts, scales, 64))
    with pytest.raises(TypeError, match="expected dtype torch.float16"):
        call(x.bfloat16())
    with pytest.raises(ValueError, match=r"scales: expected shape"):
        kernels.bind_bsr_w4a16_matmul(x, *parts, scales[1:], 64)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m", [1, 4, 8, 16, 64, 65, 128, 300, 2048])
@pytest.mark.parametrize("sparsity", [0.5, 0.9])
@pytest.mark.parametrize(("n", "k", "group_size"), [(4096, 4096, 32), (11008, 4096, 128)])
def test_gpu_full_size(dtype, m, sparsity, n, k, group_size):
    parts, scales, qweight, dense_scales = int4_block_sparse(n, k, sparsity, group_size, device="cuda", seed=m)
    x = torch.randn(m, k, device="cuda").to(dtype)
    bias = torch.randn(n, device="cuda").to(dtype)
    y = kernels.bsr_w4a16_matmul(x, *parts, scales, n, bias)
    # fp32 sums in the kernels' order against the reference's (and the dense kernel's, which may round the
    # de-quantized weight to x's dtype before a tensor-core product)
    assert rel_error(y, reference.bsr_w4a16_matmul_ref(x, *parts, scales, n, bias)) <= GPU_TOL[dtype]
    assert rel_error(y, w4a16_matmul(x, qweight, dense_scales, group_size, bias)) <= W4A16_TOL[dtype]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m", [65, 300, 2048])
def test_gpu_tiles_of_block_rows(dtype, m):
    """Blocks pruned in tiles of 4 block rows, past 64 rows: the tile kernel on the de-quantized blocks."""
    n, k = 4096, 4096
    parts, scales, _, _ = int4_block_sparse(n, k, 0.5, 128, device="cuda", seed=m, tile_rows=4)
    x = torch.randn(m, k, device="cuda").to(dtype)
    bias = torch.randn(n, device="cuda").to(dtype)
    y = kernels.bsr_w4a16_matmul(x, *parts, scales, n, bias, 4)
    assert rel_error(y, reference.bsr_w4a16_matmul_ref(x, *parts, scales, n, bias)) <= GPU_TOL[dtype]


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 16, 64, 512, 2048])  # 512, 2048: the DDS op on de-quantized blocks
def test_gpu_cuda_graph_capture_and_replay(m):
    n, k = 1024, 2048
    parts, scales, _, _ = int4_block_sparse(n, k, 0.5, 128, device="cuda")
    x = torch.randn(m, k, device="cuda").half()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        kernels.bsr_w4a16_matmul(x, *parts, scales, n)  # warm-up: compile outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = kernels.bsr_w4a16_matmul(x, *parts, scales, n, check_indices=False)
    for _ in range(2):
        x.copy_(torch.randn(m, k, device="cuda").half())
        graph.replay()
        assert torch.equal(y, kernels.bsr_w4a16_matmul(x, *parts, scales, n))


@pytest.mark.gpu
def test_gpu_compiles_with_inductor():
    n, k = 512, 1024
    parts, scales, _, _ = int4_block_sparse(n, k, 0.5, 32, device="cuda")
    x = torch.randn(8, k, device="cuda").half()
    fn = torch.compile(lambda t: kernels.bsr_w4a16_matmul(t, *parts, scales, n) + 1, fullgraph=True)
    assert torch.equal(fn(x), kernels.bsr_w4a16_matmul(x, *parts, scales, n) + 1)
