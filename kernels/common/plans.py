"""Launch plans: a bound call's kernel launches recorded once per input layout, then replayed directly.

At decode sizes an eager call's time is host time: argument checks, the dispatch pick, workspace
allocation and, per launch, Triton's ``JITFunction.run`` (binding and specializing some 30 arguments,
a cache key), 80-260 us per linear call on an H100 where ``F.linear`` takes about 20. But a bound call
(:mod:`compress_kernels.common.bound`) is a pure function of its inputs' layout: for given input shapes,
strides and pointer residues (mod 16) on one device and stream, it makes the same launches every time,
the same compiled kernels, grids and arguments, except for the pointers into its inputs and its
output. So :class:`LaunchPlans` runs the first call with a layout normally while recording it
(:func:`compress_kernels.common.launch.recording`) and keeps a :class:`LaunchPlan`: per launch the
compiled kernel's launcher, its grid and its argument list, with the input and output pointers left
as slots (``data_ptr`` of input i, or of the output, plus the recorded offset). A later call with that
layout allocates its output and calls each launcher with the slots filled::

    out = torch.empty(out_shape);  for each launch: run(grid, stream, function, metadata, *args)

A recorded call becomes a plan only when replaying it is the same computation:

* every torch operation it ran was an allocation or a view (a ``TorchDispatchMode`` watches), so its
  launches are the whole computation (a copy of x, a cuBLAS matmul or a fill would be missed);
* every launch has a compiled kernel (not the interpreter's), a grid of ints, and arguments that are
  tensors, numbers, strings or None (a TMA descriptor holds its base address: not replayable);
* the output is a fresh contiguous tensor covering its storage, and no two inputs share memory (the key
  does not say how they overlap);
* the buffers it allocated and its launches read (workspaces, int8 activations, kept by the plan and
  reused by every replay) total at most ``MAX_PLAN_BYTES``: host time matters where work is small.

Otherwise the layout is remembered as not replayable and always runs normally. Reused workspaces are
safe because a plan belongs to one stream (in its key) and the split-K counters are left zeroed by
every kernel that draws them. No plan is made or used while a CUDA graph is being captured (graphs
keep their own counters, :mod:`compress_kernels.common.splitk`), nor while Triton launch hooks are set
(profilers), nor for inputs not on CUDA. A bound call keeps at most ``MAX_PLANS`` layouts (the oldest
is dropped).
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from triton import knobs

from compress_kernels.common.launch import Launch, recording

MAX_PLANS = 8  # layouts kept per bound call (decode has one or two: M = batch, and the prompt)
MAX_PLAN_BYTES = 1 << 20  # workspace a plan may keep alive
ALIGNMENT = 16  # Triton specializes pointer arguments on 16-byte alignment
_ALLOCATIONS = frozenset({"empty", "empty_strided", "empty_like", "new_empty", "new_empty_strided"})
_NOT_REPLAYABLE = None  # the plans-dict value of a layout that runs normally


class _WatchOps(TorchDispatchMode):
    """Records the tensors a call allocates and the name of any op that is neither an allocation nor a view."""

    def __init__(self):
        super().__init__()
        self.allocated: list[torch.Tensor] = []
        self.computed: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if name in _ALLOCATIONS:
            self.allocated.append(out)
        elif not (func.is_view or name.startswith("sym_") or name == "is_contiguous"):
            self.computed.append(name)
        return out


class _Step(NamedTuple):
    """One launch of a plan: Triton's launcher, grid, the kernel handle and metadata, the argument list
    with slots, and the slots: (argument position, source index (inputs, then the output), byte offset)."""

    run: Callable
    grid: tuple
    function: object
    metadata: object
    args: tuple
    slots: tuple


class LaunchPlan:
    """The launches of one recorded call, replayed with new input pointers and a new output (module docstring)."""

    __slots__ = ("steps", "out_shape", "out_dtype", "out_device", "kept")

    def __init__(self, steps: list[_Step], out: torch.Tensor, kept: list[torch.Tensor]):
        self.steps = steps
        self.out_shape, self.out_dtype, self.out_device = tuple(out.shape), out.dtype, out.device
        self.kept = kept  # every tensor the launches address (weights, counters, workspaces): alive with the plan

    def replay(self, inputs: tuple, stream: int) -> torch.Tensor:
        out = torch.empty(*self.out_shape, dtype=self.out_dtype, device=self.out_device)
        pointers = [t.data_ptr() for t in inputs]
        pointers.append(out.data_ptr())
        for run, (g0, g1, g2), function, metadata, args, slots in self.steps:
            if slots:
                args = list(args)
                for position, source, offset in slots:
                    args[position] = pointers[source] + offset
            run(g0, g1, g2, stream, function, metadata, None, None, None, *args)
        return out


def _storage(t: torch.Tensor) -> tuple[int, int]:
    """(address, bytes) of the storage under ``t``."""
    storage = t.untyped_storage()
    return storage.data_ptr(), storage.nbytes()


def _owner(t: torch.Tensor, sources: list[torch.Tensor]) -> int | None:
    """Index of the source whose storage holds ``t``, or None."""
    base = t.untyped_storage().data_ptr()
    for index, source in enumerate(sources):
        if source.untyped_storage().data_ptr() == base:
            return index
    return None


def _step(launch: Launch, sources: list[torch.Tensor], kept: dict) -> _Step | None:
    """A plan step for ``launch``; None when it cannot be replayed. Tensors in the storage of one of
    ``sources`` (the inputs and the output) become slots; other tensors (weights, split-K counters,
    workspaces the call allocated) are passed by address and kept alive (into ``kept``, by storage);
    plain values are passed as recorded."""
    compiled, grid = launch.compiled, launch.grid
    if grid is None or not all(hasattr(compiled, a) for a in ("run", "function", "packed_metadata")):
        return None
    args, slots = list(launch.args), []
    for position, value in enumerate(args):
        if isinstance(value, torch.Tensor):
            source = _owner(value, sources)
            if source is not None:
                slots.append((position, source, value.data_ptr() - sources[source].data_ptr()))
                continue
            kept[_storage(value)[0]] = value
            args[position] = value.data_ptr()
        elif not (value is None or isinstance(value, (bool, int, float, str))):
            return None
    run = compiled.run  # the property loads the binary if it was not yet
    return _Step(run, grid, compiled.function, compiled.packed_metadata, tuple(args), tuple(slots))


def build_plan(launches: list[Launch], inputs: tuple, out, watch: _WatchOps) -> LaunchPlan | None:
    """The plan of one recorded call (``inputs`` -> ``out``), or None when it is not replayable (module docstring)."""
    if watch.computed or not launches or not isinstance(out, torch.Tensor) or not out.is_contiguous():
        return None
    if out.storage_offset() or _storage(out)[1] != out.numel() * out.element_size():
        return None
    sources = [*inputs, out]
    if len({_storage(t)[0] for t in sources}) < len(sources):  # inputs sharing memory: their offsets may not recur
        return None
    kept: dict = {}
    steps = [_step(launch, sources, kept) for launch in launches]
    allocated = {_storage(t)[0] for t in watch.allocated if isinstance(t, torch.Tensor)}
    if None in steps or sum(_storage(t)[1] for base, t in kept.items() if base in allocated) > MAX_PLAN_BYTES:
        return None
    return LaunchPlan(steps, out, list(kept.values()))


def _hooks_set() -> bool:
    """True while a Triton launch hook is set (a ``HookChain`` with calls, or a plain callable)."""
    runtime = knobs.runtime
    for hook in (runtime.launch_enter_hook, runtime.launch_exit_hook):  # a loop, not any(): once per call
        if hook is not None and getattr(hook, "calls", True):
            return True
    return False


def _context(first: torch.Tensor) -> tuple | None:
    """(device index, raw stream) of the call where plans apply to inputs like ``first``; None for inputs not
    on CUDA, while a CUDA graph is being captured, and while Triton launch hooks are set."""
    if not first.is_cuda or torch._C._cuda_isCurrentStreamCapturing() or _hooks_set():
        return None
    device = torch._C._cuda_getDevice()
    return device, torch._C._cuda_getCurrentRawStream(device)


def _layout(inputs: tuple) -> tuple | None:
    """The plan key of ``inputs``: the context, then each input's dtype, device, shape, strides and address
    mod 16 (None: no plans here). A key seen before is an input the bound call has already checked."""
    context = _context(inputs[0])
    if context is None:
        return None
    key = list(context)
    for t in inputs:
        key += (t.dtype, t.get_device(), t.shape, t.stride(), t.data_ptr() % ALIGNMENT)
    return tuple(key)


class LaunchPlans:
    """``compute(*inputs)`` (a bound call's launches), replayed from a plan per input layout (module docstring)."""

    __slots__ = ("compute", "plans")

    def __init__(self, compute: Callable[..., torch.Tensor]):
        self.compute = compute
        self.plans: dict = {}

    def __call__(self, *inputs: torch.Tensor) -> torch.Tensor:
        key = _layout(inputs)
        if key is None:
            return self.compute(*inputs)
        plan = self.plans.get(key, False)
        if plan is False:
            return self._record(key, inputs)
        if plan is _NOT_REPLAYABLE:
            return self.compute(*inputs)
        return plan.replay(inputs, key[1])

    def replay_known(self, *inputs: torch.Tensor) -> torch.Tensor | None:
        """The replay for inputs of a layout already recorded as replayable, else None (nothing run). The
        caller's checks of its inputs can be skipped on a replay: the key holds all that they read."""
        key = _layout(inputs)
        plan = self.plans.get(key) if key is not None else None
        return plan.replay(inputs, key[1]) if plan else None

    def _record(self, key: tuple, inputs: tuple) -> torch.Tensor:
        watch = _WatchOps()
        with recording() as launches, watch:
            out = self.compute(*inputs)
        if len(self.plans) >= MAX_PLANS:
            del self.plans[next(iter(self.plans))]
        self.plans[key] = build_plan(launches, inputs, out, watch)
        return out
