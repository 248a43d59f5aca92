"""W8A16's public launcher (compress_kernels/w8a16/op.py) against compress_kernels.reference.

CPU: the Triton interpreter; GPU: marked ``gpu``. Tolerances: ``W8A16_TOL`` (tests/kernels/helpers.py).
"""
from __future__ import annotations

import pytest
import torch

from compress_kernels import reference
from compress_kernels.w8a16.dispatch import TileConfig, pick
from compress_kernels.w8a16.op import bind_w8a16_matmul, launch, w8a16_matmul
from tests.kernels.helpers import DEVICE, DTYPES, W8A16_TOL, random_w8a16_weight, rel_error

GPU_TOL = {torch.float16: 2e-3, torch.bfloat16: 8e-3}
PATHS = {"gemv": TileConfig(1, 8, 64, split_k=2, path="gemv"), "tiled": TileConfig(16, 32, 64, split_k=2)}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,k,n,grouped", [(1, 256, 48, False), (1, 256, 48, True), (3, 136, 40, False),
                                           (17, 256, 80, False), (17, 256, 80, True), (67, 128, 24, True)])
def test_matches_reference(dtype, m, k, n, grouped):
    x = torch.randn(m, k, device=DEVICE).to(dtype)
    w_q, w_scale = random_w8a16_weight(n, k, grouped, device=DEVICE)
    bias = torch.randn(n, device=DEVICE).to(dtype) if m % 2 else None  # odd M with bias, even without
    y = w8a16_matmul(x, w_q, w_scale, bias)
    assert y.shape == (m, n) and y.dtype == dtype
    assert rel_error(y, reference.w8a16_matmul_ref(x, w_q, w_scale, bias)) <= W8A16_TOL[dtype]


@pytest.mark.parametrize("m,k,n", [(1, 8, 1), (3, 8, 5), (7, 24, 1), (5, 40, 130), (1, 2056, 7)])
def test_tiny_and_odd_shapes(m, k, n):
    """K a multiple of 8 only (shorter than one tile, or a tile and a tail), N from 1, odd M: both paths."""
    x = torch.randn(m, k, device=DEVICE).half()
    w_q, w_scale = random_w8a16_weight(n, k, False, device=DEVICE)
    y = w8a16_matmul(x, w_q, w_scale)
    assert y.shape == (m, n) and rel_error(y, reference.w8a16_matmul_ref(x, w_q, w_scale)) <= W8A16_TOL[torch.float16]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("grouped", [False, True])
def test_extreme_weights_and_zero_scales_are_exact(path, grouped):
    """-128 and 127 in every byte position of a word, x in {-1, 0, 1}: every product and sum is an exact
    integer in fp32, so both paths give the exact sums rounded once to fp16; a zero scale gives zeros."""
    k, n = 256, 16
    w_q = torch.full((n, k), 127, dtype=torch.int8)
    w_q[:, 1::3] = -128
    x = (torch.arange(k) % 3 - 1).half().repeat(2, 1).to(DEVICE)  # distinct x per channel: catches a swap
    x[1] = x[1].flip(0)
    w_scale = torch.ones((n, 2) if grouped else (n,), device=DEVICE)
    w_scale[3] = 0.0  # an all-zero scale row: its outputs are 0, nothing becomes NaN
    y = launch(x, w_q.to(DEVICE), w_scale, config=PATHS[path])
    expected = x.double() @ (w_q.double().to(DEVICE) * (w_scale[:, :1] if grouped else w_scale[:, None])).T
    assert torch.equal(y, expected.half())


@pytest.mark.parametrize("path", PATHS)
def test_zero_rows_give_zero_outputs(path):
    x = torch.randn(4, 64, device=DEVICE).half()
    x[1] = 0
    x[3] = 0
    w_q, w_scale = random_w8a16_weight(24, 64, False, device=DEVICE)
    y = launch(x, w_q, w_scale, config=PATHS[path])
    assert torch.isfinite(y).all() and (y[[1, 3]] == 0).all()


def test_scales_in_the_activation_dtype():
    x = torch.randn(5, 256, device=DEVICE).bfloat16()
    for grouped in (False, True):
        w_q, w_scale = random_w8a16_weight(40, 256, grouped, scale_dtype=torch.bfloat16, device=DEVICE)
        y = w8a16_matmul(x, w_q, w_scale)
        assert rel_error(y, reference.w8a16_matmul_ref(x, w_q, w_scale)) <= W8A16_TOL[torch.bfloat16]


def test_empty_batched_and_strided_inputs():
    w_q, w_scale = random_w8a16_weight(24, 64, False, device=DEVICE)
    assert w8a16_matmul(torch.empty(0, 64, device=DEVICE).half(), w_q, w_scale).shape == (0, 24)
    x = torch.randn(2, 3, 64, device=DEVICE).half()
    y = w8a16_matmul(x, w_q, w_scale)
    assert y.shape == (2, 3, 24)
    assert rel_error(y, reference.w8a16_matmul_ref(x, w_q, w_scale)) <= W8A16_TOL[torch.float16]
    x_t = torch.randn(64, 5, device=DEVICE).half().t()  # (5, 64), column-major
    assert rel_error(w8a16_matmul(x_t, w_q, w_scale), reference.w8a16_matmul_ref(x_t, w_q, w_scale)) <= 2e-3


def test_bound_call_gives_the_ops_bits():
    x = torch.randn(3, 128, device=DEVICE).half()
    w_q, w_scale = random_w8a16_weight(40, 128, True, device=DEVICE)
    bias = torch.randn(40, device=DEVICE)  # float32 bias
    bound = bind_w8a16_matmul(x, w_q, w_scale, bias)
    assert torch.equal(bound(x), w8a16_matmul(x, w_q, w_scale, bias))
    with pytest.raises(ValueError, match=r"x: expected shape \(\.\.\., 128\)"):
        bound(torch.randn(3, 64, device=DEVICE).half())


def test_op_is_registered_with_fake():
    x = torch.empty(2, 3, 256, device="meta", dtype=torch.bfloat16)
    w_q = torch.empty(24, 256, dtype=torch.int8, device="meta")
    for w_scale in (torch.empty(24, device="meta"), torch.empty(24, 2, device="meta")):
        y = torch.ops.compress_kernels.w8a16_matmul(x, w_q, w_scale, None)
        assert y.shape == (2, 3, 24) and y.dtype == torch.bfloat16


@pytest.mark.parametrize(
    "args,error,words",
    [
        (dict(x=torch.randn(2, 128)), TypeError, "x: expected dtype"),
        (dict(w_q=torch.zeros(24, 128, dtype=torch.int16)), TypeError, "w_q: expected dtype"),
        (dict(w_q=torch.zeros(24, 64, dtype=torch.int8)), ValueError, r"w_q: expected shape \(24, 128\)"),
        (dict(w_q=torch.zeros(128, 24, dtype=torch.int8).t()), ValueError, "w_q: expected a contiguous"),
        (dict(w_q=lambda: torch.zeros(24 * 128 + 2, dtype=torch.int8, device=DEVICE)[2:].view(24, 128)), ValueError,
         "multiple of 4 bytes"),  # built where it runs: a copy to the GPU would start at offset 0
        (dict(x=torch.randn(2, 124).half(), w_q=torch.zeros(24, 124, dtype=torch.int8)), ValueError, "multiple of 8"),
        (dict(w_scale=torch.ones(23)), ValueError, r"w_scale: expected shape \(24,\) \(one scale per output channel\) "
                                                   r"or \(24, 1\) \(one per group of 128"),
        (dict(w_scale=torch.ones(24, dtype=torch.float64)), TypeError, "w_scale: expected dtype"),
        (dict(x=torch.randn(2, 136).half(), w_q=torch.zeros(24, 136, dtype=torch.int8), w_scale=torch.ones(24, 1)),
         ValueError, "group scales need K a multiple of 128, K = 136"),
        (dict(bias=torch.zeros(25).half()), ValueError, r"bias: expected shape \(24,\)"),
        (dict(w_scale=torch.ones(24, device="meta")), ValueError, "w_scale: expected device"),
    ],
)
def test_bad_inputs_raise(args, error, words):
    call = dict(x=torch.randn(2, 128).half(), w_q=torch.zeros(24, 128, dtype=torch.int8), w_scale=torch.ones(24),
                bias=None)
    call.update({k: v() if callable(v) else v for k, v in args.items()})
    call = {k: v.to(DEVICE) if isinstance(v, torch.Tensor) and v.device.type == "cpu" else v for k, v in call.items()}
    with pytest.raises(error, match=words):
        w8a16_matmul(**call)


def test_configs_the_launcher_cannot_run_are_refused():
    x = torch.randn(2, 256, device=DEVICE).half()
    w_q, w_scale = random_w8a16_weight(32, 256, True, device=DEVICE)
    with pytest.raises(ValueError, match=r"config.path: expected one of \['gemv', 'tiled', 'dequant'\], got 'wgmma'"):
        launch(x, w_q, w_scale, config=TileConfig(16, 32, 32, path="wgmma"))
    with pytest.raises(ValueError, match="config.block_k: with group scales a K tile stays inside one group"):
        launch(x, w_q, w_scale, config=TileConfig(16, 32, 256))


def test_cpu_tensor_without_interpreter_raises(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    w_q, w_scale = random_w8a16_weight(24, 64, False)
    with pytest.raises(ValueError, match="expected a CUDA tensor"):
        w8a16_matmul(torch.randn(2, 64).half(), w_q, w_scale)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m", [1, 2, 5, 16, 33, 64, 300, 2048])
@pytest.mark.parametrize("grouped", [False, True])
def test_gpu_full_size(dtype, m, grouped):
    k = n = 4096
    x = torch.randn(m, k, device="cuda").to(dtype)
    w_q, w_scale = random_w8a16_weight(n, k, grouped, device="cuda")
    bias = torch.randn(n, device="cuda").to(dtype)
    y = w8a16_matmul(x, w_q, w_scale, bias)
    assert rel_error(y, reference.w8a16_matmul_ref(x, w_q, w_scale, bias)) <= GPU_TOL[dtype]


@pytest.mark.gpu
@pytest.mark.parametrize("m", [65, 128, 256, 257, 512, 1024])
@pytest.mark.parametrize("k,n", [(4096, 4096), (4096, 11008), (11008, 4096)])
def test_gpu_every_pick_from_65_rows(m, k, n):
    """The picks of the wide tiles (split and unsplit) and of the dequantize path on Llama-2-7B's shapes."""
    x = torch.randn(m, k, device="cuda").half()
    for grouped in (False, True):
        w_q, w_scale = random_w8a16_weight(n, k, grouped, device="cuda")
        y = w8a16_matmul(x, w_q, w_scale)
        assert rel_error(y, reference.w8a16_matmul_ref(x, w_q, w_scale)) <= GPU_TOL[torch.float16], (grouped, pick(
            m, n, k, grouped, x.device))


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 3, 7, 100])
@pytest.mark.parametrize("k,n", [(4104, 1000), (11008, 4096), (384, 1536)])  # K a multiple of 8 only, odd N
def test_gpu_awkward_shapes(m, k, n):
    x = torch.randn(m, k, device="cuda").half()
    w_q, w_scale = random_w8a16_weight(n, k, False, device="cuda")
    y = w8a16_matmul(x, w_q, w_scale)
    assert rel_error(y, reference.w8a16_matmul_ref(x, w_q, w_scale)) <= GPU_TOL[torch.float16]


@pytest.mark.gpu
@pytest.mark.parametrize("grouped", [False, True])
def test_gpu_torch_compile_fullgraph(grouped):
    w_q, w_scale = random_w8a16_weight(256, 512, grouped, device="cuda")

    def layer(x):
        return torch.relu(w8a16_matmul(x, w_q, w_scale)) * 2  # exact in bf16, so compiled == eager

    compiled = torch.compile(layer, fullgraph=True)
    for m in (1, 8):
        x = torch.randn(m, 512, device="cuda").bfloat16()
        torch.testing.assert_close(compiled(x), layer(x), rtol=0, atol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 4, 40])  # the one-row kernel and the tiles, both split over K
def test_gpu_cuda_graph_replay(m):
    w_q, w_scale = random_w8a16_weight(256, 1024, False, device="cuda")
    static_x = torch.randn(m, 1024, device="cuda").half()
    assert pick(m, 256, 1024, False, static_x.device).split_k > 1
    w8a16_matmul(static_x, w_q, w_scale)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_y = w8a16_matmul(static_x, w_q, w_scale)
    for _ in range(2):
        static_x.copy_(torch.randn(m, 1024, device="cuda").half())
        graph.replay()
        torch.testing.assert_close(static_y, w8a16_matmul(static_x, w_q, w_scale), rtol=0, atol=0)
