"""W4A16's public launcher (compress_kernels/w4a16/op.py) against compress_kernels.reference.

CPU: the Triton interpreter; GPU: marked ``gpu``. Tolerances: ``W4A16_TOL`` (tests/kernels/helpers.py).
"""
from __future__ import annotations

import pytest
import torch

from compress_kernels import reference
from compress_kernels.w4a16.dispatch import TileConfig, pick
from compress_kernels.w4a16.op import launch, w4a16_matmul
from tests.kernels.helpers import DEVICE, DTYPES, W4A16_TOL, pack_int4, random_int4_weight, rel_error



@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,k,n", [(1, 128, 48), (3, 256, 96), (17, 128, 80), (67, 256, 40)])
@pytest.mark.parametrize("group_size", [32, 64, 128, "K"])
def test_matches_reference(dtype, m, k, n, group_size):
    g = k if group_size == "K" else group_size
    x = torch.randn(m, k, device=DEVICE).to(dtype)
    qweight, _, scales = random_int4_weight(k, n, g, device=DEVICE)
    bias = torch.randn(n, device=DEVICE).to(dtype) if m % 2 else None  # odd M with bias, even without
    y = w4a16_matmul(x, qweight, scales, g, bias)
    ref = reference.w4a16_matmul_ref(x, qweight, scales, g, bias)
    assert y.shape == (m, n) and y.dtype == dtype
    assert rel_error(y, ref) <= W4A16_TOL[dtype]


def test_per_channel_group_with_k_not_a_tile_multiple():
    m, k, n = 3, 200, 24  # G = K = 200: BLOCK_K does not divide K, tails are masked
    x = torch.randn(m, k, device=DEVICE).half()
    qweight, _, scales = random_int4_weight(k, n, k, device=DEVICE)
    for cfg in (None, TileConfig(16, 32, 64, split_k=2, scale_after_dot=True), TileConfig(16, 32, 64, split_k=2),
                TileConfig(0, 0, 0, path="dequant"), TileConfig(1, 32, 64, split_k=2, path="fma")):
        y = launch(x, qweight, scales, k, config=cfg)
        assert rel_error(y, reference.w4a16_matmul_ref(x, qweight, scales, k)) <= W4A16_TOL[torch.float16]


@pytest.mark.parametrize("m,cfg", [(1, TileConfig(1, 16, 32, split_k=2, path="fma")), (1, None), (4, None)])
@pytest.mark.parametrize("first", [0, 1])  # -8 in the even or the odd nibble positions: both ends everywhere
def test_extreme_nibbles_and_zero_groups(m, cfg, first):
    k, n = 64, 16
    q = torch.full((k, n), 7, dtype=torch.int8)
    q[first::2] = -8  # the two ends of the int4 range, alternating
    qweight = pack_int4(q).to(DEVICE)
    scales = torch.ones(2, n, device=DEVICE)
    scales[1] = 0.0  # an all-zero group contributes nothing, and nothing becomes NaN
    x = torch.arange(1, k + 1, device=DEVICE).half().expand(m, k)  # distinct x per channel: catches a swap
    y = launch(x, qweight, scales, 32, config=cfg)
    expected = x[:, :32].float() @ q[:32].float().to(DEVICE)
    assert torch.isfinite(y).all()
    assert torch.equal(y.float(), expected)


def test_empty_and_batched_inputs():
    qweight, _, scales = random_int4_weight(64, 24, 32, device=DEVICE)
    assert w4a16_matmul(torch.empty(0, 64, device=DEVICE).half(), qweight, scales, 32).shape == (0, 24)
    x = torch.randn(2, 3, 64, device=DEVICE).bfloat16()
    y = w4a16_matmul(x, qweight, scales, 32)
    assert y.shape == (2, 3, 24)
    ref = reference.w4a16_matmul_ref(x.reshape(6, 64), qweight, scales, 32).reshape(2, 3, 24)
    assert rel_error(y, ref) <= W4A16_TOL[torch.bfloat16]


@pytest.mark.parametrize("dtype", DTYPES)
def test_default_planes_with_16_bit_scales_match_reference(dtype):
    """16-bit scales make the launcher load each scale row one K tile ahead (any tile width)."""
    m, k, n, g = 6, 640, 8192, 128  # 8192 outputs: 128-wide tiles, which do not prefetch with fp32 scales
    assert pick(m, n, k, g, 2, DEVICE).planes and not pick(m, n, k, g, 4, DEVICE).prefetch_scale
    x = torch.randn(m, k, device=DEVICE).to(dtype)
    qweight, _, scales = random_int4_weight(k, n, g, scale_dtype=dtype, device=DEVICE)
    y = w4a16_matmul(x, qweight, scales, g)
    assert rel_error(y, reference.w4a16_matmul_ref(x, qweight, scales, g)) <= W4A16_TOL[dtype]


def test_unknown_path_is_refused_with_the_known_ones():
    qweight, _, scales = random_int4_weight(64, 32, 32, device=DEVICE)
    with pytest.raises(ValueError,
                       match=r"expected one of \['dequant', 'wholek', 'fma', 'tiled', 'wgmma'\], got 'swap'"):
        launch(torch.randn(2, 64, device=DEVICE).half(), qweight, scales, 32,
               config=TileConfig(16, 32, 32, path="swap"))


def test_op_is_registered_with_fake():
    x = torch.empty(2, 3, 64, device="meta", dtype=torch.bfloat16)
    qweight = torch.empty(8, 24, dtype=torch.int32, device="meta")
    y = torch.ops.compress_kernels.w4a16_matmul(x, qweight, torch.empty(2, 24, device="meta"), 32, None)
    assert y.shape == (2, 3, 24) and y.dtype == torch.bfloat16


@pytest.mark.parametrize(
    "args,error,words",
    [
        (dict(x=torch.randn(2, 64)), TypeError, "x: expected dtype"),
        (dict(qweight=torch.zeros(8, 24, dtype=torch.int64)), TypeError, "qweight: expected dtype"),
        (dict(qweight=torch.zeros(4, 24, dtype=torch.int32)), ValueError, r"qweight: expected shape \(8, 24\)"),
        (dict(x=torch.randn(2, 60).half()), ValueError, "multiple of 8"),
        (dict(group_size=48), ValueError, "group_size: expected one of"),
        (dict(group_size=32.0), TypeError, "group_size: expected an int"),
        (dict(x=torch.randn(2, 96).half(), qweight=torch.zeros(12, 24, dtype=torch.int32), group_size=64),
         ValueError, "multiple of group_size"),
        (dict(scales=torch.ones(3, 24)), ValueError, r"scales: expected shape \(2, 24\)"),
        (dict(scales=torch.ones(2, 24, dtype=torch.float64)), TypeError, "scales: expected dtype"),
        (dict(bias=torch.zeros(25).half()), ValueError, r"bias: expected shape \(24,\)"),
        (dict(scales=torch.ones(2, 24, device="meta")), ValueError, "scales: expected device"),
    ],
)
def test_bad_inputs_raise(args, error, words):
    qweight, _, scales = random_int4_weight(64, 24, 32)
    call = dict(x=torch.randn(2, 64).half(), qweight=qweight, scales=scales, group_size=32, bias=None)
    call.update(args)
    call = {k: v.to(DEVICE) if isinstance(v, torch.Tensor) and v.device.type == "cpu" else v for k, v in call.items()}
    with pytest.raises(error, match=words):
        w4a16_matmul(**call)


def test_cpu_tensor_without_interpreter_raises(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    qweight, _, scales = random_int4_weight(64, 24, 32)
    with pytest.raises(ValueError, match="expected a CUDA tensor"):
        w4a16_matmul(torch.randn(2, 64).half(), qweight, scales, 32)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m", [1, 16, 32, 64, 2048])
@pytest.mark.parametrize("group_size", [32, 128])
def test_gpu_full_size(dtype, m, group_size):
    k = n = 4096
    x = torch.randn(m, k, device="cuda").to(dtype)
    qweight, _, scales = random_int4_weight(k, n, group_size, device="cuda")
    bias = torch.randn(n, device="cuda").to(dtype)
    y = w4a16_matmul(x, qweight, scales, group_size, bias)
    assert rel_error(y, reference.w4a16_matmul_ref(x, qweight, scales, group_size, bias)) <= W4A16_TOL[dtype]


@pytest.mark.gpu
def test_gpu_torch_compile_fullgraph():
    qweight, _, scales = random_int4_weight(512, 256, 128, device="cuda")

    def layer(x):
        return torch.relu(w4a16_matmul(x, qweight, scales, 128)) * 2  # exact in bf16, so compiled == eager

    compiled = torch.compile(layer, fullgraph=True)
    x = torch.randn(8, 512, device="cuda").bfloat16()
    torch.testing.assert_close(compiled(x), layer(x), rtol=0, atol=0)


@pytest.mark.gpu
def test_gpu_cuda_graph_replay():
    qweight, _, scales = random_int4_weight(1024, 512, 128, device="cuda")
    static_x = torch.randn(4, 1024, device="cuda").half()
    w4a16_matmul(static_x, qweight, scales, 128)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_y = w4a16_matmul(static_x, qweight, scales, 128)
    for _ in range(2):
        static_x.copy_(torch.randn(4, 1024, device="cuda").half())
        graph.replay()
        torch.testing.assert_close(static_y, w4a16_matmul(static_x, qweight, scales, 128), rtol=0, atol=0)
