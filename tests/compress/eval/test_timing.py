"""Tests for compress/eval/timing.py: CPU timing paths, and graph capture on a GPU."""
import pytest
import torch

from compress.eval import timing


def test_median_ms_on_cpu_counts_every_call():
    calls = []
    ms = timing.median_ms(lambda: calls.append(1), torch.device("cpu"), warmup=2, repeats=5)
    assert len(calls) == 7 and ms >= 0


def test_total_ms_runs_count_calls():
    calls = []
    timing.total_ms(lambda: calls.append(1), torch.device("cpu"), count=4)
    assert len(calls) == 4


def test_rotation_ms_on_cpu_visits_every_set():
    seen = []
    calls = [lambda i=i: seen.append(i) for i in range(3)]
    ms, graphed = timing.rotation_ms(calls, use_graph=True, warmup_ms=1, rep_ms=1, device=torch.device("cpu"))
    assert not graphed and ms >= 0 and set(seen) == {0, 1, 2}


@pytest.mark.gpu
def test_capture_graph_replays_into_its_outputs():
    x = torch.randn(64, 64, device="cuda")
    graph, (y,) = timing.capture_graph([lambda: x @ x])
    x.copy_(torch.eye(64, device="cuda"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(y, torch.eye(64, device="cuda"))
    assert timing.replay_ms(graph, warmup=1, repeats=3) > 0


@pytest.mark.gpu
def test_rotation_ms_graphs_on_gpu():
    x = torch.randn(256, 256, device="cuda")
    ms, graphed = timing.rotation_ms([lambda: x @ x, lambda: x @ x], True, warmup_ms=5, rep_ms=10)
    assert graphed and ms > 0
