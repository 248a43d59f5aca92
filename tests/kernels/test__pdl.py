"""Programmatic dependent launch: when it is on, and (GPU) that chained PDL kernels read finished inputs."""
from __future__ import annotations

import pytest
import torch

from compress_kernels import _pdl
from compress_kernels import bsr, w4a16, w8a8
from tests.kernels.helpers import random_int4_weight


def test_mode_defaults_to_the_w8a8_pair_and_rejects_unknown_values(monkeypatch):
    monkeypatch.delenv("COMPRESS_KERNELS_PDL", raising=False)
    assert _pdl.pdl_mode() == "pair"
    monkeypatch.setenv("COMPRESS_KERNELS_PDL", "1")
    with pytest.raises(ValueError, match=r"COMPRESS_KERNELS_PDL: expected one of \['pair', 'all', '0'\], got '1'"):
        _pdl.pdl_mode()


@pytest.mark.parametrize("mode", ["pair", "all", "0"])
def test_never_on_cpu_or_under_the_interpreter(monkeypatch, mode):
    monkeypatch.setenv("COMPRESS_KERNELS_PDL", mode)
    assert not _pdl.pdl_enabled(torch.device("cpu"), pair=True)  # CUDA only
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert not _pdl.pdl_enabled(torch.device("cuda", 0), pair=True)


@pytest.mark.gpu
@pytest.mark.parametrize(("mode", "pair_on", "others_on"), [("pair", True, False), ("all", True, True), ("0", False, False)])
def test_gpu_modes_pick_the_kernels(monkeypatch, mode, pair_on, others_on):
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("PDL needs sm_90 or later")
    monkeypatch.setenv("COMPRESS_KERNELS_PDL", mode)
    device = torch.device("cuda", torch.cuda.current_device())
    assert _pdl.pdl_enabled(device, pair=True) is pair_on
    assert _pdl.pdl_enabled(device) is others_on


def test_launch_options_only_name_pdl_when_on():
    assert _pdl.launch_options(False) == {}
    assert _pdl.launch_options(True) == {"launch_pdl": True}


def _chain(layers, x):
    """Each layer's output is the next one's input: a PDL kernel reading before its wait would see stale data."""
    for layer in layers:
        x = layer(x)
    return x


def _decode_like_layers(k):
    """Every PDL path, with K = N so the layers chain: the W4A16 and W8A8 one-row kernels, the W8A8
    quantize + GEMM pair, the DDS gemv and gemm kernels (the latter split, so it reduces in-kernel) and
    W4A16's x permutation + nibble-pair GEMM (unsplit, and split with the sum in the kernel)."""
    qweight, _, scales = random_int4_weight(k, k, 128, device="cuda")
    w_q = torch.randint(-127, 128, (k, k), dtype=torch.int8, device="cuda")
    w_scale = torch.rand(k, device="cuda") * 1e-3 + 1e-4
    tiled = w8a8.TileConfig(16, 64, 256, split_k=1, num_warps=4, num_stages=5)
    dense = torch.randn(k, k, device="cuda") * 0.02
    dense *= (torch.rand(k // 32, k // 32, device="cuda") < 0.5).repeat_interleave(32, 0).repeat_interleave(32, 1)
    sparse = dense.half().to_sparse_bsr((32, 32))
    parts = (sparse.crow_indices(), sparse.col_indices(), sparse.values())
    split_gemm = bsr.BsrConfig("gemm", block_m=16, block_n=32, group=4, num_warps=4, num_stages=3, split=4)
    gemv = bsr.BsrConfig("gemv", block_m=1, block_n=32, group=4, num_warps=4, num_stages=3)
    pairs = w4a16.TileConfig(16, 64, 128, path="wgmma")
    return [
        lambda x: w4a16.w4a16_matmul(x, qweight, scales, 128) * 0.05,
        lambda x: w8a8.w8a8_matmul(x, w_q, w_scale),
        lambda x: w8a8.launch(x, w_q, w_scale, config=tiled),  # the pre-pass path, quantize then GEMM
        lambda x: _bsr(x, parts, k, gemv),
        lambda x: _bsr(x, parts, k, split_gemm),
        lambda x: w4a16.w4a16_matmul(x, qweight, scales, 128) * 0.05,
        lambda x: w4a16.launch(x, qweight, scales, 128, config=pairs) * 0.05,  # x permutation + pair GEMM
        lambda x: w4a16.launch(x, qweight, scales, 128, config=pairs._replace(split_k=2)) * 0.05,
    ]


def _bsr(x, parts, n, config):
    y = torch.empty((x.shape[0], n), dtype=x.dtype, device=x.device)
    bsr.launch_bsr(x, *parts, None, y, config)
    return y


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["pair", "all"])
def test_gpu_pdl_chain_matches_plain_launches_eager_and_in_a_graph(monkeypatch, mode):
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("PDL needs sm_90 or later")
    k = 4096
    layers = _decode_like_layers(k)
    x = torch.randn(1, k, device="cuda").half()
    monkeypatch.setenv("COMPRESS_KERNELS_PDL", "0")
    plain = _chain(layers, x)
    monkeypatch.setenv("COMPRESS_KERNELS_PDL", mode)
    assert _pdl.pdl_enabled(x.device, pair=True)
    for _ in range(3):
        torch.testing.assert_close(_chain(layers, x), plain, rtol=0, atol=0)
    static_x = x.clone()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_y = _chain(layers, static_x)
    for _ in range(3):
        graph.replay()
        torch.testing.assert_close(static_y, plain, rtol=0, atol=0)
    static_x.copy_(torch.randn_like(x))
    monkeypatch.setenv("COMPRESS_KERNELS_PDL", "0")
    expected = _chain(layers, static_x)
    graph.replay()
    torch.testing.assert_close(static_y, expected, rtol=0, atol=0)
