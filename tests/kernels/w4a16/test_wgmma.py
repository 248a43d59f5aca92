"""W4A16's swapped nibble pairs on wgmma (compress_kernels/w4a16/wgmma.py): the x permutation, 16-bit
scales read in pairs, split-K, and configs the kernel cannot take refused. CPU: the Triton
interpreter; GPU: marked ``gpu``. Tolerances: ``W4A16_TOL`` (tests/kernels/helpers.py).
"""
from __future__ import annotations

import pytest
import torch

from compress_kernels import reference
from compress_kernels.w4a16.dispatch import TileConfig, pick
from compress_kernels.w4a16.op import launch, w4a16_matmul
from compress_kernels.w4a16.wgmma import permute_pairs
from tests.kernels.helpers import DEVICE, DTYPES, W4A16_TOL, check_w4a16_config, random_int4_weight, rel_error



@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "m,k,g,cfg",
    [
        (1, 256, 128, TileConfig(16, 32, 128, split_k=2, path="wgmma")),  # split summed in the kernel
        (5, 384, 128, TileConfig(16, 64, 128, split_k=1, path="wgmma")),  # N wraps (80 outputs)
        (20, 512, 128, TileConfig(16, 32, 128, split_k=3, path="wgmma")),  # two token tiles, uneven split
        (40, 256, 256, TileConfig(32, 16, 128, split_k=1, path="wgmma")),  # per channel (G = K)
        (64, 384, 128, TileConfig(64, 32, 128, split_k=2, path="wgmma")),  # split summed by a second launch
    ],
)
def test_wgmma_planes_match_reference(dtype, m, k, g, cfg):
    check_w4a16_config(dtype, m, k, 80, g, cfg, W4A16_TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,sliced", [(80, False), (80, True), (81, False)])
def test_wgmma_reads_16_bit_scales_in_pairs_or_converts_them(dtype, n, sliced):
    """16-bit scales are read as int32 pairs when the layout allows (even N, even row stride and offset);
    a slice starting at an odd element, or an odd N, takes the fp32 copy instead: same result."""
    m, k, g = 5, 256, 128
    x = torch.randn(m, k, device=DEVICE).to(dtype)
    qweight, _, scales = random_int4_weight(k, n + sliced, g, scale_dtype=dtype, device=DEVICE)
    qweight, scales = (qweight[:, 1:], scales[:, 1:]) if sliced else (qweight, scales)
    bias = torch.randn(n, device=DEVICE).to(dtype)
    y = launch(x, qweight, scales, g, bias, config=TileConfig(16, 32, 128, split_k=2, path="wgmma"))
    assert rel_error(y, reference.w4a16_matmul_ref(x, qweight, scales, g, bias)) <= W4A16_TOL[dtype]


def test_permute_pairs_puts_each_nibble_pair_side_by_side():
    x = torch.arange(3 * 256, dtype=torch.float32, device=DEVICE).reshape(3, 256).to(torch.float16)
    xp = permute_pairs(x)
    for kt in (0, 128):
        for p in range(4):  # pair p: columns 8r + 2p + e, r = 0..15, e = 0, 1, in (r, e) order
            expected = torch.stack([x[:, kt + 2 * p: kt + 128: 8], x[:, kt + 2 * p + 1: kt + 128: 8]], dim=-1)
            assert torch.equal(xp[:, kt + 32 * p: kt + 32 * p + 32], expected.reshape(3, 32))


@pytest.mark.parametrize("k,g", [(264, 264), (256, 64)])
def test_wgmma_path_refuses_tiles_across_scale_groups(k, g):
    x = torch.randn(2, k, device=DEVICE).half()
    qweight, _, scales = random_int4_weight(k, 32, g, device=DEVICE)
    with pytest.raises(ValueError, match="wgmma path needs block_k = 128"):
        launch(x, qweight, scales, g, config=TileConfig(16, 32, 128, path="wgmma"))


def test_wgmma_path_refuses_scales_after_the_dot():
    x = torch.randn(2, 256, device=DEVICE).half()
    qweight, _, scales = random_int4_weight(256, 32, 128, device=DEVICE)
    with pytest.raises(ValueError, match="scale_after_dot False"):
        launch(x, qweight, scales, 128, config=TileConfig(16, 32, 128, scale_after_dot=True, path="wgmma"))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m", [17, 32, 64, 200])
def test_gpu_wgmma_pairs_full_size(dtype, m):
    k, n, g = 4096, 4096 + 64, 128  # N a multiple of 64 only: the wrapped-column path for 128-wide tiles
    x = torch.randn(m, k, device="cuda").to(dtype)
    qweight, _, scales = random_int4_weight(k, n, g, device="cuda")
    bias = torch.randn(n, device="cuda").to(dtype)
    ref = reference.w4a16_matmul_ref(x, qweight, scales, g, bias)
    for block_m, block_n, split in ((32, 64, 1), (64, 128, 3), (128, 128, 4)):  # 3 splits: a ragged last one
        cfg = TileConfig(block_m, block_n, 128, split_k=split, path="wgmma")
        assert rel_error(launch(x, qweight, scales, g, bias, config=cfg), ref) <= W4A16_TOL[dtype]


@pytest.mark.gpu
def test_gpu_wgmma_default_path_in_a_cuda_graph():
    k, n, m = 4096, 8192, 64
    qweight, _, scales = random_int4_weight(k, n, 128, device="cuda")
    assert pick(m, n, k, 128, 4, "cuda").path == "wgmma"
    static_x = torch.randn(m, k, device="cuda").half()
    w4a16_matmul(static_x, qweight, scales, 128)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_y = w4a16_matmul(static_x, qweight, scales, 128)
    static_x.copy_(torch.randn(m, k, device="cuda").half())
    graph.replay()
    torch.testing.assert_close(static_y, w4a16_matmul(static_x, qweight, scales, 128), rtol=0, atol=0)
    assert rel_error(static_y, reference.w4a16_matmul_ref(static_x, qweight, scales, 128)) <= W4A16_TOL[torch.float16]
