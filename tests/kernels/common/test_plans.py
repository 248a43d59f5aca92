"""compress_kernels/common/plans.py: a recorded call replays as the same computation, or is not replayed.

CPU: stand-in kernels that read and write float32 memory by address (ctypes), so a replay's pointer
slots, offsets and kept workspaces are checked by the values they produce; ``_context`` is patched to
admit CPU tensors. The GPU tests replay the project's own ops against their normal launches.
"""
from __future__ import annotations

import ctypes
import inspect

import pytest
import torch

from compress_kernels.common import plans
from compress_kernels.common.launch import launch
from compress_kernels.common.plans import LaunchPlan, LaunchPlans


def _floats(address: int, n: int):
    return (ctypes.c_float * n).from_address(address)


class _Compiled:
    """A compiled kernel's stand-in: ``run`` takes Triton's launcher arguments and runs ``body`` on addresses."""

    def __init__(self, body):
        self.body, self.function, self.packed_metadata, self.launches = body, "function", "metadata", 0

    def run(self, g0, g1, g2, stream, function, metadata, launch_metadata, enter_hook, exit_hook, *args):
        assert (function, metadata) == ("function", "metadata")
        assert (launch_metadata, enter_hook, exit_hook) == (None, None, None)
        self.launches += 1
        self.body(*[a.data_ptr() if isinstance(a, torch.Tensor) else a for a in args])


class _Kernel:
    """A JIT function's stand-in: ``kernel[grid](*args, **meta)`` binds and runs its compiled stand-in."""

    def __init__(self, body, compiled=True):
        self.fn, self.compiled = body, _Compiled(body) if compiled else None

    def __getitem__(self, grid):
        def call(*args, **meta):
            signature = inspect.signature(self.fn)
            bound = signature.bind(*args, **{k: v for k, v in meta.items() if k in signature.parameters})
            bound.apply_defaults()
            self.fn(*[a.data_ptr() if isinstance(a, torch.Tensor) else a for a in bound.arguments.values()])
            return self.compiled
        return call


def _scale(x_ptr, ws_ptr, n, FACTOR=2.0):
    x, ws = _floats(x_ptr, n), _floats(ws_ptr, n)
    for i in range(n):
        ws[i] = FACTOR * x[i]


def _add(ws_ptr, w_ptr, y_ptr, n):
    ws, w, y = _floats(ws_ptr, n), _floats(w_ptr, n), _floats(y_ptr, n)
    for i in range(n):
        y[i] = ws[i] + w[i]


SCALE, ADD = _Kernel(_scale), _Kernel(_add)


class _Counted:
    """``y = FACTOR * x[skip:] + w`` in two launches through a workspace; counts its normal runs."""

    def __init__(self, n: int, skip: int = 0, extra=None, scale=SCALE):
        self.w = torch.arange(n - skip, dtype=torch.float32)
        self.skip, self.extra, self.scale, self.runs = skip, extra, scale, 0

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        self.runs += 1
        if self.extra is not None:
            self.extra(x)
        n = x.numel() - self.skip
        ws = torch.empty(n)
        y = torch.empty(n)
        launch(self.scale, (1,), x[self.skip:], ws, n, FACTOR=3.0)
        launch(ADD, (1,), ws, self.w, y, n)
        return y

    def expected(self, x):
        return 3.0 * x[self.skip:] + self.w


@pytest.fixture
def cpu_plans(monkeypatch):
    monkeypatch.setattr(plans, "_context", lambda first: (0, 0))


def test_replays_compute_with_new_inputs_into_fresh_outputs_and_kept_workspaces(cpu_plans):
    compute = _Counted(8)
    calls = LaunchPlans(compute)
    x1, x2, x3 = (torch.randn(8) for _ in range(3))
    y1 = calls(x1)
    (plan,) = calls.plans.values()
    assert isinstance(plan, LaunchPlan)
    launches = SCALE.compiled.launches
    y2, y3 = calls(x2), calls(x3)
    assert compute.runs == 1  # recorded once, replayed twice
    assert SCALE.compiled.launches == launches + 2
    for x, y in ((x1, y1), (x2, y2), (x3, y3)):
        torch.testing.assert_close(y, compute.expected(x), rtol=0, atol=0)
    assert len({y1.data_ptr(), y2.data_ptr(), y3.data_ptr()}) == 3
    x4 = torch.randn(8)
    torch.testing.assert_close(calls.replay_known(x4), compute.expected(x4), rtol=0, atol=0)
    assert calls.replay_known(torch.randn(9)) is None and compute.runs == 1  # unknown layout: nothing run
    assert any(t.data_ptr() == compute.w.data_ptr() for t in plan.kept)  # weights stay alive with the plan


def test_views_into_inputs_become_offsets_from_the_input(cpu_plans):
    compute = _Counted(9, skip=1)  # the first launch reads x[1:]
    calls = LaunchPlans(compute)
    first, second = torch.randn(20), torch.randn(20)
    x1, x2 = first[3:12], second[7:16]  # 12 and 28 bytes into their storages: the same residue mod 16
    calls(x1)
    y2 = calls(x2)
    assert compute.runs == 1
    torch.testing.assert_close(y2, compute.expected(x2), rtol=0, atol=0)
    calls(second[4:13])  # another residue: another layout, recorded
    assert compute.runs == 2 and len(calls.plans) == 2


def test_a_torch_computation_inside_the_call_keeps_the_layout_running_normally(cpu_plans):
    compute = _Counted(8, extra=lambda x: x * 2)  # an op the launches would not redo
    calls = LaunchPlans(compute)
    for _ in range(3):
        x = torch.randn(8)
        torch.testing.assert_close(calls(x), compute.expected(x), rtol=0, atol=0)
    assert compute.runs == 3 and list(calls.plans.values()) == [None]


def test_launches_without_a_compiled_kernel_are_not_replayed(cpu_plans):
    compute = _Counted(8, scale=_Kernel(_scale, compiled=False))  # as under Triton's interpreter
    calls = LaunchPlans(compute)
    calls(torch.randn(8))
    calls(torch.randn(8))
    assert compute.runs == 2 and list(calls.plans.values()) == [None]


def test_arguments_other_than_tensors_and_plain_values_are_not_replayed(cpu_plans):
    def body(x_ptr, ws_ptr, n, descriptor, FACTOR=2.0):
        _scale(x_ptr, ws_ptr, n, FACTOR)

    kernel, w = _Kernel(body), torch.zeros(4)

    def compute(x):  # passes an object standing for a TMA descriptor, which holds an address of its own
        ws, y = torch.empty(4), torch.empty(4)
        launch(kernel, (1,), x, ws, 4, object())
        launch(ADD, (1,), ws, w, y, 4)
        return y

    calls = LaunchPlans(compute)
    x = torch.randn(4)
    torch.testing.assert_close(calls(x), 2 * x, rtol=0, atol=0)
    assert list(calls.plans.values()) == [None]


def test_workspaces_over_the_cap_are_not_kept_but_weights_do_not_count(cpu_plans, monkeypatch):
    monkeypatch.setattr(plans, "MAX_PLAN_BYTES", 8 * 4)  # a workspace of 8 floats fits, 9 do not
    small, large = LaunchPlans(_Counted(8)), LaunchPlans(_Counted(9))
    small(torch.randn(8))
    large(torch.randn(9))
    assert isinstance(next(iter(small.plans.values())), LaunchPlan)
    assert list(large.plans.values()) == [None]


def test_the_output_must_be_a_fresh_contiguous_tensor(cpu_plans):
    def strided(x):
        y = torch.empty(2 * x.numel())
        launch(ADD, (1,), x, x, y, x.numel())
        return y[::2]
    calls = LaunchPlans(strided)
    calls(torch.randn(4))
    assert list(calls.plans.values()) == [None]


def test_inputs_sharing_memory_are_not_replayed(cpu_plans):
    def compute(a, b):
        y = torch.empty(4)
        launch(ADD, (1,), a, b, y, 4)
        return y

    calls = LaunchPlans(compute)
    buffer = torch.randn(8)
    torch.testing.assert_close(calls(buffer[:4], buffer[4:]), buffer[:4] + buffer[4:], rtol=0, atol=0)
    assert list(calls.plans.values()) == [None]  # the next call's a and b need not be 16 bytes apart


def test_the_oldest_layout_is_dropped_past_the_limit(cpu_plans, monkeypatch):
    monkeypatch.setattr(plans, "MAX_PLANS", 2)
    compute = _Counted(4)
    calls = LaunchPlans(compute)
    for shape in ((4,), (1, 4), (2, 2)):
        calls(torch.randn(shape))
    assert [key[4] for key in calls.plans] == [(1, 4), (2, 2)]  # context, dtype, device, then the shape


def test_without_a_plan_context_every_call_runs_normally():
    compute = _Counted(4)
    calls = LaunchPlans(compute)  # CPU tensors: no plans
    for _ in range(2):
        calls(torch.randn(4))
    assert compute.runs == 2 and not calls.plans


# --- GPU: the project's ops and inference modules replayed against their normal launches ------------------

def _gpu_ops():
    from tests.kernels.common.test_bound import OPS  # the bound-call tests' weights (built on the GPU there)

    return OPS


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["w8a8", "w8a8-static", "w4a16", "w8a16", "bsr", "bsr-w8a8", "bsr-w4a16"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gpu_replays_give_the_normal_launches_bits(op, dtype):
    import compress_kernels as kernels

    name, weights, _ = _gpu_ops()[op]()
    weights = tuple(w.to(dtype) if isinstance(w, torch.Tensor) and w.dtype == torch.float16 else w for w in weights)
    x = torch.randn(1, 64, device="cuda").to(dtype)
    call = getattr(kernels, f"bind_{name}")(x, *weights)
    for m in (1, 3, 16):
        for _ in range(3):  # the first call records, the others replay
            x = torch.randn(m, 64, device="cuda").to(dtype)
            assert torch.equal(call(x), call.plans.compute(x))
    replayable = [key[4] for key, plan in call.plans.plans.items() if isinstance(plan, LaunchPlan)]
    assert replayable == [(1, 64), (3, 64), (16, 64)]


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["w8a8", "w8a8-static", "w4a16", "w8a16", "w8a8-block", "dds50", "dds50-w8a8",
                                  "dds50-w4a16"])
def test_gpu_modules_replay_what_the_public_launcher_computes(kind):
    from scripts.bench.host_overhead import MODULES, public_call

    torch.manual_seed(0)
    module = MODULES[kind](torch.nn.Linear(576, 1536, bias=True).cuda()).half()
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(1, 1, 576, device="cuda").half()
            assert torch.equal(module(x), public_call(module, x)())
    plans_made = [plan for _, _, call in module._bound_calls.values() for plan in call.plans.plans.values()]
    assert plans_made and all(isinstance(plan, LaunchPlan) for plan in plans_made)


@pytest.mark.gpu
def test_gpu_split_k_launches_of_a_large_layer_are_replayed():  # their partials live in the shared scratch
    import compress_kernels as kernels
    from tests.kernels.helpers import random_int4_weight

    qweight, _, scales = random_int4_weight(4096, 11008, 128, device="cuda")
    x = torch.randn(8, 4096, device="cuda").half()
    call = kernels.bind_w4a16_matmul(x, qweight, scales, 128, None)
    for _ in range(2):
        x = torch.randn(8, 4096, device="cuda").half()
        assert torch.equal(call(x), call.plans.compute(x))
    assert [type(plan) for plan in call.plans.plans.values()] == [LaunchPlan]


@pytest.mark.gpu
def test_gpu_graph_capture_launches_normally_and_replays_right():
    import compress_kernels as kernels

    name, weights, _ = _gpu_ops()["w8a16"]()
    x = torch.randn(2, 64, device="cuda").half()
    call = kernels.bind_w8a16_matmul(x, *weights)
    call(x)  # records the eager plan
    keys = list(call.plans.plans)
    static_x = torch.randn(2, 64, device="cuda").half()
    graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        call(static_x)  # warm-up on the capture stream (a layout of its own: another stream)
        with torch.cuda.graph(graph, stream=stream):
            static_y = call(static_x)
    torch.cuda.current_stream().wait_stream(stream)
    assert list(call.plans.plans)[: len(keys)] == keys and len(call.plans.plans) == len(keys) + 1
    for _ in range(2):
        static_x.copy_(torch.randn(2, 64, device="cuda").half())
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(static_y, call.plans.compute(static_x))
        assert torch.equal(call(static_x), static_y)  # the eager replay alongside the graph
