"""scripts.bench.decode_runner on the CPU: one batch is compiled and timed with every figure the report needs
(the decode loop itself: tests/compress/eval/test_decode_loop.py)."""
from __future__ import annotations

import argparse
import statistics

import pytest
import torch

from scripts.bench.decode_runner import bench_batch
from scripts.bench.decode_variants import VARIANTS, build_model, llama_config

CPU = torch.device("cpu")


def _model(dtype=torch.float32):
    return build_model(llama_config(2, tiny=True, max_positions=32), dtype, CPU, seed=0)


def test_one_batch_on_the_cpu_gives_every_figure():
    args = argparse.Namespace(prompt_len=4, steps=2, warmup=1, seed=0, repeats=2, compile_backend="aot_eager",
                              compile_mode=None)
    figures = bench_batch(_model(torch.float16), VARIANTS["fp16"], 1, args)
    assert set(figures) == {"batch", "tokens_per_s", "ms_per_step", "times_s", "compile_and_capture_s", "cuda_graph",
                            "compiled_graphs", "first_step_logits_rel_err_vs_eager"}
    assert figures["tokens_per_s"] > 0 and len(figures["times_s"]) == 2 and figures["cuda_graph"] is False
    seconds = statistics.median(figures["times_s"])  # of 2 steps at batch 1
    assert figures["ms_per_step"] == pytest.approx(1e3 * seconds / 2)
    assert figures["tokens_per_s"] == pytest.approx(2 / seconds)
    assert figures["first_step_logits_rel_err_vs_eager"] < 1e-2
