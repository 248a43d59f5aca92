"""Every Triton launch of the project goes through :func:`launch`, so that one call's launches can be recorded.

``launch(kernel, grid, *args, **meta)`` is ``kernel[grid](*args, **meta)``. Inside :func:`recording`, each
launch is also appended to the recorder as a :class:`Launch`: the compiled kernel Triton returned, the
grid as three ints, and the kernel's arguments bound to its parameters in order, defaults filled and
constexprs included (the values Triton's own launcher receives after its ``JITFunction.run``).
:mod:`compress_kernels.common.plans` turns a recorded call into a plan that later calls replay.

Inside :func:`compiling_for` a launch runs nothing: Triton compiles the kernel for a GPU target (e.g.
``GPUTarget("cuda", 90, 128)``, an H100 / H200) from the launch's arguments, bound and specialized as its
JIT would bind them (the same code, registers and spills as on the GPU), with Triton's own ``ptxas``, so
the kernels a call would launch on that GPU compile on a machine without one (the tests' check that a
change still compiles for the GPU; the call's host code runs as it would, on CPU tensors, and Triton's
JIT must not run under its interpreter).
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


def _compile_for(target, kernel, args: tuple, meta: dict):
    """Triton's compile of ``kernel`` for ``target`` as its JIT launch would compile it there: the JIT's own
    argument binding and specialization (integers equal to 1 or divisible by 16, pointers aligned to 16 bytes:
    the hints that let loads vectorize) and constexprs, from ``args`` and ``meta``."""
    from triton.compiler import ASTSource, make_backend
    from triton.compiler import compile as triton_compile
    from triton.runtime.jit import create_function_from_signature

    backend = make_backend(target)
    bound, specialization, options = create_function_from_signature(kernel.signature, kernel.params, backend)(
        *args, **meta)
    options, signature, constexprs, attrs = kernel._pack_args(backend, meta, bound, specialization, options)
    return triton_compile(ASTSource(kernel, signature, constexprs, attrs), target=target, options=options.__dict__)


def launch(kernel, grid, *args, **meta):
    """``kernel[grid](*args, **meta)`` (Triton's JIT launch), recorded while :func:`recording` is active;
    inside :func:`compiling_for`, only compiled for its target."""
    target = getattr(_state, "compile_target", None)
    if target is not None:
        compiled = _compile_for(target, kernel, args, meta)
        _state.compiled.append((kernel.fn.__name__, compiled))
        return compiled
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


def compiling() -> bool:
    """True inside :func:`compiling_for` on this thread (launches compile, nothing runs: CPU tensors do)."""
    return getattr(_state, "compile_target", None) is not None


@contextmanager
def compiling_for(target):
    """Inside the block every :func:`launch` on this thread compiles its kernel for ``target`` (a Triton
    ``GPUTarget``) instead of running it; yields the list of (kernel name, compiled kernel) it fills."""
    outer = getattr(_state, "compile_target", None), getattr(_state, "compiled", None)
    _state.compile_target, _state.compiled = target, []
    try:
        yield _state.compiled
    finally:
        _state.compile_target, _state.compiled = outer
