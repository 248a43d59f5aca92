"""The project's one timing harness: model evaluation, the kernel and decode benchmarks and the
kernel sweeps all time through these functions, so their figures mean the same thing.

Three ways to time work on a CUDA device:

* :func:`capture_graph` + :func:`replay_ms`: a list of calls captured once in a ``torch.cuda.CUDAGraph``
  (after warm-up calls on a side stream, as the ``torch.cuda.graphs`` docs ask), then the median of
  ``repeats`` replays, each between two CUDA events: no Python launch overhead, as deployed with
  CUDA graphs or ``torch.compile``. Used for models (``compress evaluate``) and decode steps.
* :func:`rotation_ms`: the kernel benchmark's method. Calls over R rotating input sets (chosen by
  the caller so the sets exceed L2) are captured in one graph, replayed under
  ``triton.testing.do_bench`` (median; L2 flushed before each replay), and the time divided by R.
  Work that cannot be captured is timed eagerly, call by call, and the result says so.
* :func:`median_ms` with ``graph=False``: eager calls, Python overhead included.

On the CPU every function times eager calls with ``time.perf_counter`` (there is nothing to capture).
All functions return milliseconds.
"""
from __future__ import annotations

import itertools
import logging
import statistics
import time
from typing import Any, Callable, Sequence

import torch

log = logging.getLogger(__name__)

GRAPH_WARMUP_MIN = 3  # warm-up calls before a capture, at least (the torch.cuda.graphs docs use 3)


def synchronize(device: torch.device) -> None:
    """Wait for ``device``'s queued work (a no-op on the CPU)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def event_ms(work: Callable[[], Any]) -> float:
    """Device milliseconds of ``work()`` on the current CUDA stream, between two CUDA events."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    work()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def host_ms(work: Callable[[], Any]) -> float:
    """Host milliseconds of ``work()`` (the CPU path: nothing runs asynchronously there)."""
    start = time.perf_counter()
    work()
    return (time.perf_counter() - start) * 1e3


@torch.no_grad()
def capture_graph(calls: Sequence[Callable[[], Any]], warmup: int = GRAPH_WARMUP_MIN):
    """``(graph, outputs)``: every call of ``calls``, in order, captured in one ``torch.cuda.CUDAGraph``.

    At least :data:`GRAPH_WARMUP_MIN` warm-up rounds (lazy init, Triton compilation and
    ``torch.compile`` happen there, not in the capture) run on a side stream first. ``graph.replay()``
    reruns the captured kernels on the same tensors and refills ``outputs`` in place.
    """
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(max(warmup, GRAPH_WARMUP_MIN)):
            for call in calls:
                call()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = [call() for call in calls]
    torch.cuda.synchronize()
    return graph, outputs


def replay_ms(graph, warmup: int, repeats: int) -> float:
    """Median milliseconds of ``graph.replay()`` over ``repeats`` timed replays after ``warmup``."""
    for _ in range(warmup):
        graph.replay()
    torch.cuda.synchronize()
    return statistics.median(event_ms(graph.replay) for _ in range(repeats))


def median_ms(work: Callable[[], Any], device: torch.device, warmup: int, repeats: int) -> float:
    """Median milliseconds of eager ``work()`` over ``repeats`` timed calls after ``warmup`` calls
    (CUDA events on a CUDA device, the host clock on the CPU)."""
    for _ in range(warmup):
        work()
    synchronize(device)
    timer = event_ms if torch.device(device).type == "cuda" else host_ms
    return statistics.median(timer(work) for _ in range(repeats))


def total_ms(work: Callable[[], Any], device: torch.device, count: int) -> float:
    """Milliseconds for ``count`` back-to-back calls of ``work()`` (a decode loop: steps queue freely)."""
    synchronize(device)
    if torch.device(device).type != "cuda":
        return host_ms(lambda: [work() for _ in range(count)])
    return event_ms(lambda: [work() for _ in range(count)])


def rotation_ms(calls: Sequence[Callable[[], Any]], use_graph: bool, warmup_ms: float, rep_ms: float,
                device: torch.device | None = None) -> tuple[float, bool]:
    """``(ms per call, graph used)`` over the rotation ``calls`` (one call per input set).

    With ``use_graph`` the whole rotation is one CUDA graph replayed under ``do_bench``; a capture
    that fails (some anchors cannot be captured) is logged and the calls are timed eagerly in turn.
    On the CPU (``device``, by default CUDA when there is one): the median of three host-timed rounds.
    """
    device = torch.device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type != "cuda":
        rotation = itertools.cycle(calls)
        return median_ms(lambda: next(rotation)(), device, warmup=1, repeats=3 * len(calls)), False
    from triton.testing import do_bench

    for call in calls:  # compilation and first-call work outside the timing and the capture
        call()
    torch.cuda.synchronize()
    if use_graph:
        try:
            graph, _ = capture_graph(calls, warmup=1)
            ms = do_bench(graph.replay, warmup=warmup_ms, rep=rep_ms, return_mode="median")
            return ms / len(calls), True
        except Exception as err:  # noqa: BLE001 - any capture failure: time these calls eagerly
            log.warning("CUDA graph capture failed (%s); timing eagerly", str(err).splitlines()[0][:120])
            torch.cuda.synchronize()
    state = {"i": 0}

    def next_call():
        calls[state["i"] % len(calls)]()
        state["i"] += 1

    return do_bench(next_call, warmup=warmup_ms, rep=rep_ms, return_mode="median"), False
