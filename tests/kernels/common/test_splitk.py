"""Split-K (compress_kernels/common/splitk.py): the split rule, the ticket counters of the one-launch
split-K kernels (eager buffers, capture slices, graph replays) and the two ways of summing the splits."""
from __future__ import annotations

import pytest
import torch

from compress_kernels.common import splitk as _splitk
from compress_kernels.w4a16.dispatch import TileConfig
from compress_kernels.w4a16.op import launch
from compress_kernels.w8a8.dispatch import TileConfig as W8Config
from compress_kernels.w8a8.op import launch as w8a8_launch
from tests.kernels.helpers import DEVICE, random_int4_weight, random_int8_weight


@pytest.fixture
def small_pool(monkeypatch):
    """A fresh 256-counter pool registry, restored after the test."""
    monkeypatch.setattr(_splitk, "CAPTURE_POOL", 256)
    monkeypatch.setattr(_splitk, "_CAPTURE_POOLS", {})
    monkeypatch.setattr(_splitk, "_RETIRED_POOLS", [])


def test_capture_slices_are_zeroed_aligned_and_disjoint(small_pool):
    cpu = torch.device("cpu")
    _splitk._refill_capture_pool(cpu)
    pool = _splitk._CAPTURE_POOLS[0][0]
    first = _splitk._captured_counters(cpu, 40)
    second = _splitk._captured_counters(cpu, 8)
    assert first.numel() == 40 and second.numel() == 8 and not first.any() and not second.any()
    assert first.data_ptr() == pool.data_ptr()
    assert second.data_ptr() == pool.data_ptr() + 64 * 4  # 40 rounded up to 32-counter (128-byte) slices
    first.fill_(1)
    assert not second.any()  # no overlap


def test_capture_falls_back_to_a_fresh_buffer_when_the_pool_is_short(small_pool):
    cpu = torch.device("cpu")
    assert _splitk._captured_counters(cpu, 8).numel() == 8  # no pool yet: a buffer of its own
    _splitk._refill_capture_pool(cpu)
    pool = _splitk._CAPTURE_POOLS[0][0]
    _splitk._captured_counters(cpu, 200)
    spill = _splitk._captured_counters(cpu, 100)  # 224 + 100 > 256
    assert spill.numel() == 100 and not spill.any()
    assert not (pool.data_ptr() <= spill.data_ptr() < pool.data_ptr() + pool.numel() * 4)


def test_refill_retires_a_pool_past_half_and_keeps_it_alive(small_pool):
    cpu = torch.device("cpu")
    _splitk._refill_capture_pool(cpu)
    pool = _splitk._CAPTURE_POOLS[0][0]
    _splitk._captured_counters(cpu, 100)
    _splitk._refill_capture_pool(cpu)
    assert _splitk._CAPTURE_POOLS[0][0] is pool  # 128 of 256 used: still room
    _splitk._captured_counters(cpu, 32)
    _splitk._refill_capture_pool(cpu)
    assert _splitk._CAPTURE_POOLS[0][0] is not pool and _splitk._RETIRED_POOLS == [pool]
    assert _splitk._CAPTURE_POOLS[0][1] == 0


@pytest.mark.gpu
def test_gpu_graphs_of_one_split_launch_use_their_own_counters():
    """Two graphs of the same split-K launch, replayed in turn and between eager calls, stay right."""
    k, n, g = 4096, 512, 128
    qweight, _, scales = random_int4_weight(k, n, g, device="cuda")
    cfg = TileConfig(1, 64, 128, split_k=16, path="fma")
    xs = [torch.randn(1, k, device="cuda").half() for _ in range(2)]
    launch(xs[0], qweight, scales, g, None, config=cfg)  # compile, and create the capture pool
    graphs, outs = [], []
    for x in xs:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outs.append(launch(x, qweight, scales, g, None, config=cfg))
        graphs.append(graph)
    for _ in range(3):
        for x, graph, out in zip(xs, graphs, outs):
            x.copy_(torch.randn_like(x))
            graph.replay()
            eager = launch(x, qweight, scales, g, None, config=cfg)
            torch.testing.assert_close(out, eager, rtol=0, atol=0)
    torch.cuda.synchronize()
    pool, used = _splitk._CAPTURE_POOLS[torch.cuda.current_device()]
    assert used >= 2 * 8 and not pool.any()  # the slices handed out are back at zero after replays


def test_long_lived_counters_are_zeroed_int32(small_pool):
    counters = _splitk._outside_graph_pools(300, torch.device("cpu"))
    assert counters.dtype == torch.int32 and counters.numel() == 300 and not counters.any()


@pytest.mark.gpu
def test_gpu_split_k_counters_survive_torch_compile_cuda_graph_trees(monkeypatch):
    """torch.compile(mode="reduce-overhead") warms up with the thread's allocations routed to its graph
    pool: counters first made there would be refused as live pool tensors; the helper thread avoids it."""
    from compress_kernels import w4a16_matmul

    monkeypatch.setattr(_splitk, "_COUNTERS", {})  # so the first counters are made inside the warm-up
    monkeypatch.setattr(_splitk, "_CAPTURE_POOLS", {})
    k, n, g = 4096, 8192, 128  # M = 1 on 32 Mi weights: the one-row kernel, K split, counters
    qweight, _, scales = random_int4_weight(k, n, g, device="cuda")
    compiled = torch.compile(lambda x: w4a16_matmul(x, qweight, scales, g), mode="reduce-overhead", fullgraph=True)
    for _ in range(4):
        x = torch.randn(1, k, device="cuda").half()
        y = compiled(x).clone()
        torch.testing.assert_close(y, w4a16_matmul(x, qweight, scales, g), rtol=0, atol=0)
    assert _splitk._COUNTERS  # the eager path made its counters, outside the graph pool


def test_reduces_in_kernel_only_for_short_tiles():
    assert _splitk.reduces_in_kernel(4, 16) and not _splitk.reduces_in_kernel(4, 64)
    assert not _splitk.reduces_in_kernel(1, 16)  # nothing to reduce


def test_tiled_split_launch_grid_and_buffers():
    y = torch.empty(40, 200)
    grid, in_kernel, partials, counters = _splitk.tiled_split_launch(y, 40, 200, 16, 64, 1)
    assert grid == (3 * 4, 1) and not in_kernel and partials is y and counters is y  # not split: write y
    grid, in_kernel, partials, counters = _splitk.tiled_split_launch(y, 40, 200, 16, 64, 4)
    assert grid == (12, 4) and in_kernel and partials.shape == (4, 40, 200) and partials.dtype == torch.float32
    assert counters.dtype == torch.int32 and counters.numel() >= 12 and not counters[:12].any()
    grid, in_kernel, partials, counters = _splitk.tiled_split_launch(y, 40, 200, 64, 64, 2)
    assert grid == (4, 2) and not in_kernel and partials.shape == (2, 40, 200) and counters is y  # second launch


@pytest.mark.gpu
def test_gpu_split_workspace_is_one_scratch_per_stream_grown_by_doubling(monkeypatch):
    monkeypatch.setattr(_splitk, "_WORKSPACES", {})
    monkeypatch.setattr(_splitk, "_RETIRED_WORKSPACES", [])
    device = torch.device("cuda")
    first, again = _splitk.split_workspace(device, 2, 4, 8), _splitk.split_workspace(device, 4, 2, 8)
    assert first.shape == (2, 4, 8) and first.dtype == torch.float32 and again.data_ptr() == first.data_ptr()
    grown = _splitk.split_workspace(device, 2, 4, 9)  # 72 > 64 floats: a new scratch of 128
    assert grown.untyped_storage().nbytes() == 128 * 4
    assert _splitk._RETIRED_WORKSPACES[0].data_ptr() == first.data_ptr()  # kept alive for launches in flight
    with torch.cuda.stream(torch.cuda.Stream()):
        other = _splitk.split_workspace(device, 2, 4, 8)
    assert other.untyped_storage().data_ptr() != grown.untyped_storage().data_ptr()  # one scratch per stream


@pytest.mark.parametrize("kind", ["w4a16", "w8a8"])
def test_in_kernel_and_second_launch_reduce_give_the_same_bits(kind, monkeypatch):
    """The last split's in-kernel sum and the separate reduce pass add the same partials in the same
    order: with the in-kernel sum switched off (IN_KERNEL_MAX_ROWS = 0) the output is bit-identical."""
    device = DEVICE
    m, k, n = 5, 192, 96
    x = torch.randn(m, k, device=device).half()
    bias = torch.randn(n, device=device).half()
    if kind == "w4a16":
        qweight, _, scales = random_int4_weight(k, n, 32, device=device)
        run = lambda: launch(x, qweight, scales, 32, bias, TileConfig(16, 32, 32, split_k=3, scale_after_dot=True))  # noqa: E731
    else:
        w_q, w_scale = random_int8_weight(n, k, device=device)
        run = lambda: w8a8_launch(x, w_q, w_scale, bias, None, W8Config(16, 32, 32, split_k=3))  # noqa: E731
    in_kernel = run()
    monkeypatch.setattr(_splitk, "IN_KERNEL_MAX_ROWS", 0)
    assert torch.equal(run(), in_kernel)


def test_split_k_for_gives_a_program_per_sm():
    cfg = W8Config(32, 64, 256)
    assert _splitk.split_k_for(64, 4096, 4096, cfg, 132) == 2  # 2 x 64 = 128 tiles: one split more
    assert _splitk.split_k_for(64, 4096, 4096, cfg, 128) == 1  # already a tile per SM
    assert _splitk.split_k_for(1, 64, 512, cfg, 132) == 2  # never more splits than the 2 K tiles
    assert _splitk.split_k_for(1, 64, 2**20, cfg, 10**6) == 16  # at most 16
