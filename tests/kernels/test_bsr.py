"""Tests of the DDS block-sparse kernel (kernels/bsr.py) against ``kernels.reference.bsr_matmul_ref``.

On the CPU the Triton kernels run in the interpreter (tests/conftest.py sets TRITON_INTERPRET=1) on
small shapes; GPU-marked tests run full sizes, torch.compile(fullgraph=True) and CUDA-graph replay.
Weights are random, block sparse with an exact share of absent 32x32 blocks; outputs are compared
with the fp32-accumulated reference to the output dtype's rounding.
"""

import pytest
import torch

import compress_kernels as kernels
from compress_kernels.bsr import SMALL_LAYER, BsrConfig, choose_config, gemv_serves, launch_bsr
from compress_kernels.reference import bsr_matmul_ref

BLOCK = 32
TOL = {torch.float16: dict(atol=2e-2, rtol=1e-2), torch.bfloat16: dict(atol=1e-1, rtol=2e-2)}
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def block_sparse_dense(n, k, sparsity, dtype, device=DEVICE, empty_rows=(), seed=0):
    """Dense (n, k) weight with round(sparsity * blocks) absent 32x32 blocks (and whole empty block rows)."""
    gen = torch.Generator().manual_seed(seed)
    rows, cols = n // BLOCK, k // BLOCK
    keep = torch.ones(rows * cols)
    keep[torch.randperm(rows * cols, generator=gen)[: round(sparsity * rows * cols)]] = 0
    keep = keep.reshape(rows, cols)
    for r in empty_rows:
        keep[r] = 0
    mask = keep.repeat_interleave(BLOCK, 0).repeat_interleave(BLOCK, 1)
    w = torch.randn(n, k, generator=gen) * mask / k**0.5
    return w.to(device=device, dtype=dtype)


def parts(w_dense, index_dtype=torch.int64):
    """BSR parts as the inference module keeps them: plain dense tensors (clones).

    Tensors returned straight by ``.values()`` of a sparse tensor trip Dynamo's automatic-dynamic
    bookkeeping (IndexError in torch/_dynamo/pgo.py, torch 2.13), so the module stores copies.
    """
    bsr = w_dense.to_sparse_bsr((BLOCK, BLOCK))
    return (bsr.crow_indices().to(index_dtype).clone(), bsr.col_indices().to(index_dtype).clone(),
            bsr.values().clone())


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
    check_against_reference(x, *parts(w), n)


@pytest.mark.parametrize("m", [1, 17])
@pytest.mark.parametrize("bias_dtype", [None, torch.bfloat16, torch.float32])
def test_bf16_and_bias(m, bias_dtype):
    n, k = 96, 128
    w = block_sparse_dense(n, k, 0.5, torch.bfloat16)
    x = torch.randn(m, k, device=DEVICE).bfloat16()
    bias = None if bias_dtype is None else torch.randn(n, device=DEVICE).to(bias_dtype)
    check_against_reference(x, *parts(w), n, bias)


@pytest.mark.parametrize("m", [1, 40])
def test_empty_block_rows_give_bias(m):
    n, k = 128, 64
    w = block_sparse_dense(n, k, 0.3, torch.float16, empty_rows=(0, 2))
    bias = torch.randn(n, device=DEVICE).half()
    x = torch.randn(m, k, device=DEVICE).half()
    y = check_against_reference(x, *parts(w), n, bias)
    for r in (0, 2):
        assert torch.equal(y[:, r * BLOCK:(r + 1) * BLOCK], bias[r * BLOCK:(r + 1) * BLOCK].expand(m, BLOCK))


def test_all_absent_is_zero_without_bias():
    n, k = 64, 64
    crow, col, values = parts(block_sparse_dense(n, k, 1.0, torch.float16))
    assert values.shape[0] == 0
    y = kernels.bsr_matmul_parts(torch.randn(5, k, device=DEVICE).half(), crow, col, values, n)
    assert torch.equal(y, torch.zeros_like(y))


def test_leading_dims_and_non_contiguous_input():
    n, k = 64, 96
    w = block_sparse_dense(n, k, 0.5, torch.float16)
    x3 = torch.randn(2, 3, k, device=DEVICE).half()
    y3 = check_against_reference(x3, *parts(w), n)
    assert y3.shape == (2, 3, n)
    x_t = torch.randn(k, 7, device=DEVICE).half().T  # (7, K) with column stride 7
    check_against_reference(x_t, *parts(w), n)


def test_empty_batch_gives_empty_output():
    n, k = 64, 64
    y = kernels.bsr_matmul_parts(torch.randn(0, k, device=DEVICE).half(), *parts(block_sparse_dense(n, k, 0.5, torch.float16)), n)
    assert y.shape == (0, n)


def test_int32_indices():
    n, k = 96, 64
    check_against_reference(torch.randn(17, k, device=DEVICE).half(), *parts(block_sparse_dense(n, k, 0.5, torch.float16), torch.int32), n)


@pytest.mark.parametrize("m", [1, 17])
def test_sparse_bsr_interop(m):
    n, k = 96, 128
    w = block_sparse_dense(n, k, 0.5, torch.float16)
    x = torch.randn(m, k, device=DEVICE).half()
    bias = torch.randn(n, device=DEVICE).half()
    y = kernels.bsr_matmul(x, w.to_sparse_bsr((BLOCK, BLOCK)), bias)
    dense = (x.float() @ w.float().T + bias.float()).to(torch.float16)
    torch.testing.assert_close(y, dense, **TOL[torch.float16])


@pytest.mark.parametrize(
    "config",
    [BsrConfig("gemv", 1, bn, g, 4, 2) for bn in (8, 16, 32) for g in (1, 2, 4)]
    + [BsrConfig("gemm", bm, bn, g, 4, 2) for bm in (16, 32, 64) for bn in (16, 32) for g in (1, 2, 4)]
    + [BsrConfig("gemm", bm, 32, g, 4, 2, split=sp) for bm in (16, 64) for g in (1, 2) for sp in (2, 3)],
    ids=str,
)
def test_every_config_matches_reference(config):
    n, k, m = 96, 160, 5
    crow, col, values = parts(block_sparse_dense(n, k, 0.6, torch.float16, empty_rows=(1,)))
    x = torch.randn(m, k, device=DEVICE).half()
    bias = torch.randn(n, device=DEVICE)
    y = torch.full((m, n), float("nan"), device=DEVICE, dtype=torch.float16)  # poison: every entry must be written
    launch_bsr(x, crow, col, values, bias, y, config)
    torch.testing.assert_close(y, bsr_matmul_ref(x, crow, col, values, n, bias), **TOL[torch.float16])


def test_split_block_rows_reduce_in_kernel_and_leave_counters_zeroed():
    from compress_kernels._splitk import tile_counters

    n, k, m = 64, 256, 20  # 8 block columns; block row 1 empty; up to 8 stored blocks over 4 shares
    crow, col, values = parts(block_sparse_dense(n, k, 0.3, torch.bfloat16, empty_rows=(1,)))
    x = torch.randn(m, k, device=DEVICE).bfloat16()
    bias = torch.randn(n, device=DEVICE).bfloat16()
    config = BsrConfig("gemm", 16, 32, 1, 4, 2, split=4)
    y = torch.full((m, n), float("nan"), device=DEVICE, dtype=torch.bfloat16)
    launch_bsr(x, crow, col, values, bias, y, config)
    torch.testing.assert_close(y, bsr_matmul_ref(x, crow, col, values, n, bias), **TOL[torch.bfloat16])
    assert not tile_counters(y.device, 4).any()  # every ticket counter back at zero
    again = torch.empty_like(y)
    launch_bsr(x, crow, col, values, bias, again, config)
    assert torch.equal(again, y)  # partials summed in share order: the same bits every time


@pytest.mark.parametrize("k,n", [(1024, 1024), (4096, 4096), (11008, 4096), (8192, 28672)])
@pytest.mark.parametrize("m", [1, 4, 5, 16, 17, 64, 256, 2048, 8192])
@pytest.mark.parametrize("density", [None, 0.5, 0.1, 0.0])
def test_choose_config_is_valid(m, k, n, density):
    nnz = None if density is None else int(density * (n // 32) * (k // 32))
    cfg = choose_config(m, n, k, nnz)
    assert cfg.kernel in ("gemv", "gemm")
    assert cfg.block_n in (8, 16, 32) and n % cfg.block_n == 0
    assert (cfg.block_m == 1) == (cfg.kernel == "gemv")
    assert cfg.kernel == "gemv" or cfg.block_m >= 16
    if n * k > SMALL_LAYER:  # small layers take smaller tiles for more programs (next test)
        assert cfg.kernel == "gemv" or cfg.block_m >= min(m, 64) // 2
    assert cfg.split >= 1 and (cfg.split == 1 or cfg.kernel == "gemm")


def test_one_row_kernel_serves_more_rows_only_while_the_blocks_stay_in_l2():
    def kernel(m, k, n, density):
        return choose_config(m, n, k, int(density * (n // 32) * (k // 32))).kernel

    assert all(kernel(1, k, n, 0.5) == "gemv" for k, n in ((1024, 1024), (8192, 28672)))
    assert kernel(2, 4096, 4096, 0.5) == "gemv" and kernel(3, 4096, 4096, 0.5) == "gemm"  # 16 MiB of blocks
    assert kernel(4, 4096, 4096, 0.1) == "gemv" and kernel(2, 8192, 8192, 0.1) == "gemv"  # 3.2 / 12.8 MiB
    assert kernel(3, 8192, 8192, 0.1) == "gemm" and kernel(2, 11008, 4096, 0.5) == "gemm"  # 12.8 / 43 MiB
    assert kernel(4, 1024, 1024, 1.0) == "gemv" and kernel(5, 1024, 1024, 0.1) == "gemm"
    assert choose_config(2, 8192, 8192) == choose_config(16, 8192, 8192)  # dense: the 16-row tiles' pick
    assert gemv_serves(2, 16 * 2**20) and not gemv_serves(2, 16 * 2**20 + 1) and not gemv_serves(5, 0)


@pytest.mark.parametrize(("k", "n", "m", "expected"), [
    (384, 1152, 64, BsrConfig("gemm", 16, 32, 8, 4, 3)),  # 36 block rows of 6 blocks: 16-row tiles
    (1536, 384, 64, BsrConfig("gemm", 32, 32, 4, 4, 3, split=4)),  # 12 block rows of 24 blocks: shared
    (384, 1152, 512, BsrConfig("gemm", 64, 32, 4, 4, 3)),  # 64-row tiles: 288 programs
    (1024, 1024, 2048, BsrConfig("gemm", 128, 32, 2, 4, 3)),  # 128-row tiles: 512 programs
    (384, 1536, 2048, BsrConfig("gemm", 256, 32, 2, 4, 3)),  # 256-row tiles already give 384
])
def test_choose_config_small_layers_take_tiles_that_fill_the_gpu(k, n, m, expected):
    nnz = (n // 32) * (k // 32) // 2  # 50% of the blocks
    assert choose_config(m, n, k, nnz) == expected
    assert choose_config(m, 4096, 4096, 128 * 64).block_m >= 32  # a large layer keeps its tiles


def test_choose_config_splits_only_long_block_rows():
    n = k = 8192
    block_rows, blocks_per_row = n // 32, k // 32
    long_rows = choose_config(16, n, k, block_rows * blocks_per_row // 2)  # 128 blocks per row
    mid_rows = choose_config(16, n, k, block_rows * blocks_per_row // 10)  # ~26 blocks per row
    short_rows = choose_config(16, 4096, 4096, 128 * 13)  # 4096x4096 at 90%: 13 blocks per row
    assert long_rows.split > 1 and mid_rows.split > 1 and short_rows.split == 1
    assert choose_config(16, n, k).split > 1  # no nnz given: treated as dense
    many_rows = 28672  # 896 block rows: enough programs without splitting them
    assert choose_config(16, many_rows, 8192, (many_rows // 32) * (8192 // 32) // 2).split == 1
    # 16 < M <= 64: only few (<= 128) long block rows are shared
    assert choose_config(64, 4096, 4096, 128 * 64).split == 4 and choose_config(64, 4096, 11008, 128 * 34).split == 4
    assert choose_config(64, n, k, block_rows * blocks_per_row // 2).split == 1  # 256 block rows
    assert choose_config(64, 4096, 4096, 128 * 13).split == 1


def test_custom_op_fake_and_schema():
    n, k = 64, 64
    crow, col, values = parts(block_sparse_dense(n, k, 0.5, torch.float16))
    x = torch.randn(3, k, device=DEVICE).half()
    torch.library.opcheck(torch.ops.compress_kernels.bsr_matmul, (x, crow, col, values, n, None),
                          test_utils=("test_schema", "test_faketensor"))


def test_compile_fullgraph_traces_launcher():
    n, k = 64, 96
    crow, col, values = parts(block_sparse_dense(n, k, 0.5, torch.float16))
    x = torch.randn(4, k, device=DEVICE).half()
    fn = torch.compile(lambda t: kernels.bsr_matmul_parts(t, crow, col, values, n) * 2, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(fn(x), bsr_matmul_ref(x, crow, col, values, n) * 2, **TOL[torch.float16])


# ---- bad input ---------------------------------------------------------------------------------

def _good(n=64, k=64, m=2):
    crow, col, values = parts(block_sparse_dense(n, k, 0.5, torch.float16))
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


# ---- GPU: full sizes, torch.compile, CUDA graphs ------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("k,n", [(4096, 4096), (4096, 11008), (11008, 4096)])
@pytest.mark.parametrize("m", [1, 2, 16, 64, 333, 2048])
@pytest.mark.parametrize("sparsity", [0.5, 0.9])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_full_size_matches_reference(k, n, m, sparsity, dtype):
    w = block_sparse_dense(n, k, sparsity, dtype, seed=m)
    x = torch.randn(m, k, device="cuda").to(dtype)
    bias = torch.randn(n, device="cuda").to(dtype)
    crow, col, values = parts(w)
    y = kernels.bsr_matmul_parts(x, crow, col, values, n, bias)
    ref = (x.double() @ w.double().T + bias.double())
    rel = ((y.double() - ref).norm() / ref.norm()).item()
    assert rel < (2e-3 if dtype == torch.float16 else 1e-2), rel


@pytest.mark.gpu
@pytest.mark.parametrize("m,sparsity", [(16, 0.9), (64, 0.5), (64, 0.9)])
def test_full_size_split_block_rows(m, sparsity):
    k, n = 4096, 4096
    w = block_sparse_dense(n, k, sparsity, torch.float16, seed=m)
    x = torch.randn(m, k, device="cuda").half()
    bias = torch.randn(n, device="cuda").half()
    crow, col, values = parts(w)
    base = choose_config(m, n, k)
    y = torch.empty(m, n, device="cuda", dtype=torch.float16)
    launch_bsr(x, crow, col, values, bias, y, BsrConfig("gemm", base.block_m, 32, base.group, base.num_warps,
                                                          base.num_stages, split=4))
    ref = (x.double() @ w.double().T + bias.double())
    assert ((y.double() - ref).norm() / ref.norm()).item() < 2e-3


@pytest.mark.gpu
def test_torch_compile_fullgraph_inductor():
    n, k = 1024, 2048
    crow, col, values = parts(block_sparse_dense(n, k, 0.75, torch.float16, device="cuda"))
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
    crow, col, values = parts(block_sparse_dense(n, k, 0.75, torch.float16, device="cuda"))
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
