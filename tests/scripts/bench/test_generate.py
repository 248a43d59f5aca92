"""scripts.bench.generate end to end on tiny models: the report, ratios, targets, time budget, a model
that cannot load, bad arguments.

The CPU tests run the real script (``--tiny``: tiny random models, the modules' pure-PyTorch references,
``torch.compile`` with ``aot_eager``) so it cannot rot; the GPU test runs the same through the kernels,
inductor and CUDA graphs.
"""
from __future__ import annotations

import json

import pytest

from scripts.bench import generate as bench

TINY_ARGS = ["--tiny", "--repeats", "1", "--no-host-overhead"]


def _run(tmp_path, *extra) -> dict:
    out = tmp_path / "generate.json"
    report = bench.main([*TINY_ARGS, "--out", str(out), *extra])
    assert json.loads(out.read_text()) == json.loads(json.dumps(report))  # the file is the report
    return report


def test_tiny_cpu_run_times_every_mode_and_the_harness(tmp_path):
    report = _run(tmp_path, "--device", "cpu", "--models", "llama2-7b", "--variants", "fp16,w8a8", "--batches", "1",
                  "--eager-rounds", "2")
    assert report["failed"] == [] and report["skipped"] == [] and report["benchmark"] == "generate"
    assert [(r["model"], r["variant"], r["batch"]) for r in report["results"]] == [("llama2-7b", "fp16", 1),
                                                                                  ("llama2-7b", "w8a8", 1)]
    for result in report["results"]:
        for mode in ("eager", "compiled", "harness"):
            assert result[mode]["tokens_per_s"] > 0, mode
        assert result["compiled"]["compile_s"] > 0 and result["compiled"]["tokens_equal_to_eager"] == 1.0
        assert result["harness"]["compiled_graphs"] == 1
    row = report["ratios"]["llama2-7b"]["1"]
    assert row["fp16"]["eager_vs_fp16"] == pytest.approx(1.0) and "compiled_vs_harness" in row["w8a8"]
    paired = report["results"][1]["eager"]
    assert "vs_fp16_paired" not in report["results"][0]["eager"] and len(paired["fp16_times_s"]) == 2
    assert row["w8a8"]["eager_vs_fp16"] == paired["vs_fp16_paired"] > 0  # the ratio of rounds against fp16
    assert row["w8a8"]["eager_vs_fp16_unpaired"] > 0
    assert report["targets"]["llama2-7b w8a8 >= 1.5x fp16 (batch 1, compiled)"] is not None
    assert report["targets"]["llama2-7b w4a16 >= 2.0x fp16 (batch 1, compiled)"] is None  # not measured


def test_tiny_cpu_run_of_a_mixture_of_experts_model(tmp_path):
    """The tiny Mixtral, float (transformers' grouped_mm experts) and W8A8 (QuantizedExperts' grouped path):
    compiled generate gives eager generate's tokens, and the target over its variants is judged."""
    report = _run(tmp_path, "--device", "cpu", "--models", "mixtral", "--variants", "fp16,w8a8", "--batches", "1",
                  "--eager-rounds", "1", "--no-harness")
    assert report["failed"] == [] and [r["variant"] for r in report["results"]] == ["fp16", "w8a8"]
    assert all(r["compiled"]["tokens_equal_to_eager"] == 1.0 for r in report["results"])
    assert report["targets"]["mixtral every variant faster than fp16 (batch 1 and 8, compiled)"] is not None


def test_block_sparse_experts_are_timed_eager_only_with_the_reason(tmp_path):
    report = _run(tmp_path, "--device", "cpu", "--models", "mixtral", "--variants", "fp16,dds50", "--batches", "1",
                  "--eager-rounds", "1")
    assert report["failed"] == []
    fp16, dds50 = report["results"]
    assert "tokens_per_s" in fp16["compiled"] and "tokens_per_s" in dds50["eager"]
    assert "expert loop" in dds50["compiled"]["not_timed"] and "expert loop" in dds50["harness"]["not_timed"]


@pytest.mark.slow
def test_tiny_cpu_run_of_every_model_with_the_host_overhead(tmp_path):
    report = bench.main(["--tiny", "--repeats", "1", "--device", "cpu", "--variants", "fp16,w4a16,dds50",
                         "--batches", "2", "--modes", "eager", "--no-harness", "--out", str(tmp_path / "g.json")])
    assert report["failed"] == []
    assert {r["model"] for r in report["results"]} == {"smollm2", "llama2-7b", "mixtral"}
    assert all("compiled" not in r and "harness" not in r for r in report["results"])
    kinds = {kind for row in report["host_overhead"] for kind in row["modules"]}
    assert kinds == {"w8a8", "w8a8-static", "w8a8-block", "w4a16", "w8a16", "dds50", "dds50-w8a8", "dds50-w4a16"}


def test_time_budget_skips_work_not_started_in_time(tmp_path):
    report = _run(tmp_path, "--device", "cpu", "--variants", "fp16,w8a8", "--batches", "1,2", "--time-budget", "0")
    assert len(report["skipped"]) == 3 * 2 * 2 and report["results"] == [] and report["failed"] == []
    assert [(s["batch"], s["model"]) for s in report["skipped"][:3]] == [(1, "smollm2"), (1, "smollm2"),
                                                                        (1, "llama2-7b")]  # batch sizes outermost


def test_a_model_that_cannot_load_is_recorded_and_skipped(tmp_path, monkeypatch):
    monkeypatch.setenv("SMOLLM2_DIR", str(tmp_path))  # no GGUF there
    report = bench.main(["--device", "cpu", "--models", "smollm2", "--variants", "fp16", "--batches", "1,2",
                         "--no-host-overhead", "--out", str(tmp_path / "g.json")])
    assert [f["model"] for f in report["failed"]] == ["smollm2"] and "SmolLM2" in report["failed"][0]["error"]
    assert [s["reason"] for s in report["skipped"]] == ["the model could not be loaded (see failed)"] * 2


def _result(model, variant, eager, compiled, harness):
    return dict(model=model, variant=variant, batch=1, eager=dict(tokens_per_s=eager),
                compiled=dict(tokens_per_s=compiled), harness=dict(tokens_per_s=harness))


def test_ratios_and_targets_from_figures():
    results = [_result("llama2-7b", "fp16", 10.0, 100.0, 105.0), _result("llama2-7b", "w4a16", 12.0, 210.0, 220.0),
               _result("llama2-7b", "w8a8", 9.0, 140.0, 170.0), _result("smollm2", "fp16", 30.0, 300.0, 310.0),
               _result("smollm2", "w8a8", 31.0, 320.0, 330.0)]
    table = bench.ratios(results)
    assert table["llama2-7b"]["1"]["w4a16"] == pytest.approx(dict(
        eager_vs_fp16=1.2, compiled_vs_fp16=2.1, harness_vs_fp16=220 / 105, compiled_vs_harness=210 / 220,
        compiled_vs_eager=17.5))
    verdicts = bench.targets(table)
    assert verdicts["eager generate no slower than fp16 (every model, batch, variant)"] is False  # w8a8 9 < 10
    assert verdicts["compiled generate within 10% of the harness (every model, batch, variant)"] is False  # 140/170
    assert verdicts["llama2-7b w4a16 >= 2.0x fp16 (batch 1, compiled)"] is True
    assert verdicts["llama2-7b w8a8 >= 1.5x fp16 (batch 1, compiled)"] is False
    assert verdicts["smollm2 every variant faster than fp16 (batch 1, eager)"] is True
    assert verdicts["smollm2 every variant faster than fp16 (batch 1, compiled)"] is True
    assert "failed" in bench.format_table([dict(results[0], compiled=dict(error="x"))], table)


@pytest.mark.parametrize("argv", [["--variants", "fp32"], ["--models", "gpt2"], ["--modes", "graph"],
                                  ["--batches", "0"], ["--new-tokens", "-1"], ["--layers", "0"],
                                  ["--eager-rounds", "0"]])
def test_bad_arguments_are_rejected(argv):
    with pytest.raises(SystemExit):
        bench.parse_args(["--tiny", "--device", "cpu", *argv])


@pytest.mark.gpu
def test_tiny_gpu_run_compiles_and_graphs_every_variant(tmp_path):
    report = _run(tmp_path, "--device", "cuda", "--batches", "2", "--fail-fast")
    assert report["failed"] == []
    for result in report["results"]:
        if result["model"] == "mixtral" and result["variant"].startswith("dds"):  # block-sparse experts: a loop
            assert "expert loop" in result["compiled"]["not_timed"] and "not_timed" in result["harness"]
            continue
        assert result["compiled"]["fullgraph"] is True and result["compiled"]["mode"] == "reduce-overhead"
        assert result["harness"]["cuda_graph"] is True
