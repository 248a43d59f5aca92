"""compress_kernels/common/launch.py: launches run the kernel and, while recording, are bound in parameter order;
inside ``compiling_for`` they compile for the target instead (every op's kernels, compiled for an H100 by
``tests/kernels/common/gpu_compile_probe.py`` in a process without the interpreter)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


import pytest
import torch

import compress_kernels.common.launch as launch_module
from compress_kernels.common.checks import cpu_tensors_allowed, interpreting
from compress_kernels.common.launch import Launch, compiling, compiling_for, launch, recording

ROOT = Path(__file__).resolve().parents[3]


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


def test_compiling_for_compiles_instead_of_running_and_restores_the_outer_state(monkeypatch):
    kernel = _Kernel()
    seen = []
    monkeypatch.setattr(launch_module, "_compile_for", lambda target, k, args, meta: seen.append((target, args, meta))
                        or f"compiled for {target}")
    assert not compiling()
    with compiling_for("sm90") as compiled:
        assert compiling() and cpu_tensors_allowed()
        assert launch(kernel, (4,), "x", 10, num_warps=2) == "compiled for sm90"
        with compiling_for("sm80") as inner:
            launch(kernel, (1,), "y", 1)
        assert [name for name, _ in inner] == ["fn"] and inner[0][1] == "compiled for sm80"
        launch(kernel, (1,), "z", 2)
    assert kernel.calls == []  # nothing ran
    assert seen == [("sm90", ("x", 10), {"num_warps": 2}), ("sm80", ("y", 1), {}), ("sm90", ("z", 2), {})]
    assert [c for _, c in compiled] == ["compiled for sm90", "compiled for sm90"]
    assert not compiling() and cpu_tensors_allowed() == interpreting()
    assert launch(kernel, (1,), "w", 3) is kernel.compiled  # outside: runs again


@pytest.mark.skipif(torch.cuda.is_available(), reason="with a GPU the GPU tests compile and run the kernels")
def test_every_op_compiles_for_an_h100_without_a_gpu():
    """The probe compiles each op's picks (dense, block-sparse, MoE, norm + quantize; fp16 and bf16) for
    sm_90 with Triton's ptxas; every kernel family the tables reach at those shapes shows up."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    run = subprocess.run([sys.executable, "-m", "tests.kernels.common.gpu_compile_probe"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=1500)
    assert run.returncode == 0, run.stderr[-3000:]
    names = {line.split()[0] for line in run.stdout.splitlines()}
    expected = {"_w8a8_matmul_kernel", "_w8a8_tma_kernel", "_w8a8_gemv_kernel", "_w4a16_matmul_kernel",
                "_w4a16_fma_kernel", "_w4a16_wholek_kernel", "_w8a8_block_gemm_kernel", "_w8a8_block_tma_kernel",
                "_w8a16_tiled_kernel", "_w8a16_gemv_kernel", "_bsr_gemm_kernel", "_bsr_gemv_kernel",
                "_bsr_tile_gemm_kernel", "_bsr_w8a8_kernel", "_bsr_w4a16_gemm_kernel", "_bsr_w4a16_gemv_kernel",
                "_moe_w4a16_kernel", "_moe_w4a16_fma_kernel", "_moe_w8a8_kernel", "_moe_w8a16_kernel",
                "_route_pairs_kernel", "_combine_topk_kernel", "_norm_quantize_kernel", "_gelu_quantize_kernel"}
    assert expected <= names, sorted(expected - names)
    lines = [line.split() for line in run.stdout.splitlines()]
    assert len(lines) >= 200  # one line per launch compiled: name, warps, shared bytes, registers, stack bytes
    assert all(len(line) == 5 and 16 <= int(line[3]) <= 255 and int(line[4]) >= 0 for line in lines)
