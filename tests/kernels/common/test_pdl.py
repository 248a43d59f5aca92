"""Programmatic dependent launch: when it is on, and (GPU) that chained PDL kernels read finished inputs."""
from __future__ import annotations

import pytest
import torch

from compress_kernels.bsr.dispatch import BsrConfig
from compress_kernels.bsr.op import launch as bsr_launch
from compress_kernels.common import pdl as _pdl
from compress_kernels.w4a16.dispatch import TileConfig as W4Config
from compress_kernels.w4a16.op import launch as w4a16_launch
from compress_kernels.w4a16.op import w4a16_matmul
from compress_kernels.w8a8.dispatch import TileConfig as W8Config
from compress_kernels.w8a8.op import launch as w8a8_launch
from compress_kernels.w8a8.op import w8a8_matmul
from tests.kernels.helpers import random_int4_weight


@pytest.mark.parametrize("mode", ["1", "all"])
def test_mode_defaults_to_the_pairs_and_rejects_unknown_values(monkeypatch, mode):
    monkeypatch.delenv("COMPRESS_KERNELS_PDL", raising=False)
    assert _pdl.pdl_mode() == "pair"
    monkeypatch.setenv("COMPRESS_KERNELS_PDL", mode)
    with pytest.raises(ValueError, match=rf"COMPRESS_KERNELS_PDL: expected one of \['pair', '0'\], got '{mode}'"):
        _pdl.pdl_mode()


@pytest.mark.parametrize("mode", ["pair", "0"])
def test_never_on_cpu_or_under_the_interpreter(monkeypatch, mode):
    monkeypatch.setenv("COMPRESS_KERNELS_PDL", mode)
    assert not _pdl.pdl_enabled(torch.device("cpu"))  # CUDA only
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert not _pdl.pdl_enabled(torch.device("cuda", 0))


@pytest.mark.gpu
@pytest.mark.parametrize(("mode", "on"), [("pair", True), ("0", False)])
def test_gpu_modes_switch_the_pairs(monkeypatch, mode, on):
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("PDL needs sm_90 or later")
    monkeypatch.setenv("COMPRESS_KERNELS_PDL", mode)
    assert _pdl.pdl_enabled(torch.device("cuda", torch.cuda.current_device())) is on


def test_launch_options_only_name_pdl_when_on():
    assert _pdl.launch_options(False) == {}
    assert _pdl.launch_options(True) == {"launch_pdl": True}


def _chain(layers, x):
    """Each layer's output is the next one's input: a PDL kernel reading before its wait would see stale data."""
    for layer in layers:
        x = layer(x)
    return x


def _decode_like_layers(k):
    """Layers with K = N so they chain, the PDL pairs between kernels that start without PDL: the W4A16
    and W8A8 one-row kernels, the W8A8 quantize + GEMM pair, the DDS gemv and gemm kernels (the latter
    split, so it reduces in-kernel) and W4A16's x permutation + nibble-pair GEMM (unsplit, and split
    with the sum in the kernel)."""
    qweight, _, scales = random_int4_weight(k, k, 128, device="cuda")
    w_q = torch.randint(-127, 128, (k, k), dtype=torch.int8, device="cuda")
    w_scale = torch.rand(k, device="cuda") * 1e-3 + 1e-4
    tiled = W8Config(16, 64, 256, split_k=1, num_warps=4, num_stages=5)
    dense = torch.randn(k, k, device="cuda") * 0.02
    dense *= (torch.rand(k // 32, k // 32, device="cuda") < 0.5).repeat_interleave(32, 0).repeat_interleave(32, 1)
    sparse = dense.half().to_sparse_bsr((32, 32))
    parts = (sparse.crow_indices(), sparse.col_indices(), sparse.values())
    split_gemm = BsrConfig("gemm", block_m=16, block_n=32, group=4, num_warps=4, num_stages=3, split=4)
    gemv = BsrConfig("gemv", block_m=1, block_n=32, group=4, num_warps=4, num_stages=3)
    pairs = W4Config(16, 64, 128, path="wgmma")
    return [
        lambda x: w4a16_matmul(x, qweight, scales, 128) * 0.05,
        lambda x: w8a8_matmul(x, w_q, w_scale),
        lambda x: w8a8_launch(x, w_q, w_scale, config=tiled),  # the pre-pass path, quantize then GEMM
        lambda x: bsr_launch(x, *parts, k, config=gemv),
        lambda x: bsr_launch(x, *parts, k, config=split_gemm),
        lambda x: w4a16_matmul(x, qweight, scales, 128) * 0.05,
        lambda x: w4a16_launch(x, qweight, scales, 128, config=pairs) * 0.05,  # x permutation + pair GEMM
        lambda x: w4a16_launch(x, qweight, scales, 128, config=pairs._replace(split_k=2)) * 0.05,
    ]


@pytest.mark.gpu
def test_gpu_pdl_chain_matches_plain_launches_eager_and_in_a_graph(monkeypatch):
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("PDL needs sm_90 or later")
    k = 4096
    layers = _decode_like_layers(k)
    x = torch.randn(1, k, device="cuda").half()
    monkeypatch.setenv("COMPRESS_KERNELS_PDL", "0")
    plain = _chain(layers, x)
    monkeypatch.setenv("COMPRESS_KERNELS_PDL", "pair")
    assert _pdl.pdl_enabled(x.device)
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
