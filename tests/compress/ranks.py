"""Running a test's function on 2 CPU processes (gloo) without letting a stuck process hang the suite.

``torch.multiprocessing.spawn(..., join=True)`` waits for ever. :func:`run_ranks` waits up to a deadline;
a rank still alive then is terminated (with a warning naming it), and the test goes on to read the
files the ranks write: a rank stopped before writing its file fails the test there, one stopped after
(a rare stall at interpreter exit, seen once in a full CPU run) does not. A rank that raises fails the
test at once with its traceback, as with ``spawn``.
"""
from __future__ import annotations

import time
import warnings
from typing import Callable

import torch.multiprocessing as mp

DEADLINE_S = 300.0  # the 2-process tests take 15-60 s on a loaded 2-core machine


def run_ranks(fn: Callable, args: tuple, nprocs: int = 2, deadline_s: float = DEADLINE_S) -> list[int]:
    """``fn(rank, *args)`` on ``nprocs`` spawned processes; returns the ranks terminated at the deadline."""
    context = mp.spawn(fn, args=args, nprocs=nprocs, join=False)
    give_up = time.monotonic() + deadline_s
    while not context.join(timeout=1.0):
        if time.monotonic() > give_up:
            stuck = [rank for rank, process in enumerate(context.processes) if process.is_alive()]
            for rank in stuck:
                context.processes[rank].terminate()
            warnings.warn(f"ranks {stuck} still running after {deadline_s:.0f} s: terminated", stacklevel=2)
            return stuck
    return []
