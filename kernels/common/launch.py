"""Every Triton launch of the project goes through :func:`launch`, so that one call's launches can be recorded.

``launch(kernel, grid, *args, **meta)`` is ``kernel[grid](*args, **meta)``. Inside :func:`recording`, each
launch is also appended to the recorder as a :class:`Launch`: the compiled kernel Triton returned, the
grid as three ints, and the kernel's arguments bound to its parameters in order, defaults filled and
constexprs included (the values Triton's own launcher receives after its ``JITFunction.run``).
:mod:`compress_kernels.common.plans` turns a recorded call into a plan that later calls replay.
"""
from __future__ import annotations

import inspect
import threading
from contextlib import contextmanager
from typing import NamedTuple

_state = threading.local()  # .launches: the list being recorded on this thread, or absent


class Launch(NamedTuple):
    """One recorded launch. ``compiled``: Triton's compiled kernel (None where there is none, e.g. under
    the interpreter); ``grid``: (x, y, z) ints, or None when the grid was not a tuple of ints; ``args``:
    every parameter's value in the kernel's parameter order."""

    compiled: object
    grid: tuple | None
    args: tuple


def _grid3(grid) -> tuple | None:
    if not isinstance(grid, tuple) or not 1 <= len(grid) <= 3 or not all(type(g) is int for g in grid):
        return None
    return grid + (1,) * (3 - len(grid))


def _bound_args(kernel, args: tuple, meta: dict) -> tuple:
    """``args`` and the parameters among ``meta`` bound to ``kernel``'s signature, defaults applied."""
    signature = inspect.signature(kernel.fn)
    params = {name: value for name, value in meta.items() if name in signature.parameters}
    bound = signature.bind(*args, **params)
    bound.apply_defaults()
    return tuple(bound.arguments.values())


def launch(kernel, grid, *args, **meta):
    """``kernel[grid](*args, **meta)`` (Triton's JIT launch), recorded while :func:`recording` is active."""
    compiled = kernel[grid](*args, **meta)
    launches = getattr(_state, "launches", None)
    if launches is not None:
        launches.append(Launch(compiled, _grid3(grid), _bound_args(kernel, args, meta)))
    return compiled


@contextmanager
def recording():
    """Collect the :class:`Launch` of every :func:`launch` on this thread inside the block (a list)."""
    outer = getattr(_state, "launches", None)
    _state.launches = launches = []
    try:
        yield launches
    finally:
        _state.launches = outer
        if outer is not None:
            outer.extend(launches)
