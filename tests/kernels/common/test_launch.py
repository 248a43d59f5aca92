"""compress_kernels/common/launch.py: launches run the kernel and, while recording, are bound in parameter order."""
from __future__ import annotations

from compress_kernels.common.launch import Launch, launch, recording


class _Kernel:
    """Stands in for a JIT function: ``kernel[grid](...)`` notes the call and returns a compiled stand-in."""

    def __init__(self):
        self.calls = []
        self.compiled = object()

    @staticmethod
    def fn(x_ptr, n, SCALE=2.0, BLOCK=64):  # the kernel's parameters, with defaults
        raise AssertionError("never called")

    def __getitem__(self, grid):
        def call(*args, **meta):
            self.calls.append((grid, args, meta))
            return self.compiled
        return call


def test_launch_runs_the_kernel_and_returns_its_compiled_form():
    kernel = _Kernel()
    assert launch(kernel, (4,), "x", 10, BLOCK=32, num_warps=2) is kernel.compiled
    assert kernel.calls == [((4,), ("x", 10), {"BLOCK": 32, "num_warps": 2})]


def test_recording_binds_arguments_in_parameter_order_with_defaults_and_without_options():
    kernel = _Kernel()
    with recording() as launches:
        launch(kernel, (4, 2), "x", 10, BLOCK=32, num_warps=2, num_stages=3)
        launch(kernel, [4], "y", 5)
    assert launches == [Launch(kernel.compiled, (4, 2, 1), ("x", 10, 2.0, 32)),
                        Launch(kernel.compiled, None, ("y", 5, 2.0, 64))]  # a list grid is not replayable
    launch(kernel, (1,), "z", 1)  # outside: not recorded
    assert len(launches) == 2


def test_nested_recordings_reach_the_outer_one():
    kernel = _Kernel()
    with recording() as outer:
        launch(kernel, (1,), "a", 1)
        with recording() as inner:
            launch(kernel, (2,), "b", 2)
        assert [r.args[0] for r in inner] == ["b"]
    assert [r.args[0] for r in outer] == ["a", "b"]
