"""scripts.bench.decode end to end on a tiny Llama: the report, ratios, targets, time budget, bad arguments.

The CPU tests run the real harness (``--tiny``: tiny config, pure-PyTorch reference path of the
inference modules, ``torch.compile`` with ``aot_eager``) so it cannot rot; the GPU test runs the
same tiny model with inductor and CUDA graphs through the Triton kernels.
"""
from __future__ import annotations

import json

import pytest

from scripts.bench import decode as bench
from scripts.bench.decode_variants import ALL_VARIANTS

TINY_ARGS = ["--tiny", "--steps", "2", "--repeats", "1", "--warmup", "1"]


def _run(tmp_path, *extra) -> dict:
    out = tmp_path / "decode.json"
    report = bench.main([*TINY_ARGS, "--out", str(out), *extra])
    assert json.loads(out.read_text()) == json.loads(json.dumps(report))  # the file is the report
    return report


def _by_variant(report: dict) -> dict:
    return {r["variant"]: r for r in report["results"]}


def test_tiny_cpu_harness_times_every_requested_variant(tmp_path):
    report = _run(tmp_path, "--device", "cpu", "--variants", "fp16,w4a16,int4-aten", "--batch", "2")
    assert report["failed"] == [] and report["skipped"] == []
    assert report["config"]["fused_siblings"] is True and report["benchmark"] == "decode"
    results = _by_variant(report)
    assert list(results) == ["fp16", "w4a16", "int4-aten"]
    for result in results.values():
        (batch,) = result["batches"]
        assert batch["batch"] == 2 and batch["tokens_per_s"] > 0 and len(batch["times_s"]) == 1
        assert batch["compiled_graphs"] == 1, "all decoder layers must share one compiled graph"
        assert batch["first_step_logits_rel_err_vs_eager"] < 1e-2
        assert batch["cuda_graph"] is False  # nothing to capture on the CPU
    # packed int4 weights: a quarter of the fp16 bytes plus one fp32 / bf16 scale per 128 weights
    assert results["w4a16"]["weight_bytes"] < 0.3 * results["fp16"]["weight_bytes"]
    assert results["int4-aten"]["dtype"] == "bfloat16"
    assert report["ratios"]["2"]["fp16"]["vs_fp16"] == pytest.approx(1.0)
    assert set(report["targets"].values()) == {None}  # no batch-1 figures, so no verdicts


@pytest.mark.slow
def test_tiny_cpu_harness_all_variants(tmp_path):
    report = _run(tmp_path, "--device", "cpu", "--batch", "1")
    assert report["failed"] == []
    assert list(_by_variant(report)) == list(ALL_VARIANTS)
    assert all(ok is not None for ok in report["targets"].values())
    assert report["ratios"]["1"]["fp16-eager"]["vs_fp16_eager"] == pytest.approx(1.0)


def test_tiny_cpu_harness_times_w8a16_and_pytorchs_int8_weight_only_op(tmp_path):
    report = _run(tmp_path, "--device", "cpu", "--variants", "fp16,w8a16,int8-aten", "--batch", "1")
    assert report["failed"] == [] and list(_by_variant(report)) == ["fp16", "w8a16", "int8-aten"]
    results = _by_variant(report)
    for name in ("w8a16", "int8-aten"):  # int8 weights: half the fp16 bytes plus one scale per output channel
        assert results[name]["weight_bytes"] < 0.52 * results["fp16"]["weight_bytes"]
        (batch,) = results[name]["batches"]
        assert batch["compiled_graphs"] == 1 and batch["first_step_logits_rel_err_vs_eager"] < 1e-2
    verdicts = report["targets"]
    assert verdicts["w8a16 >= 1.7x fp16 (batch 1)"] is not None
    assert verdicts["w8a16 ahead of int8-aten (batch 1)"] is not None


def test_tiny_cpu_harness_times_50_percent_blocks_with_w4a16(tmp_path):
    """The ``dds50-w4a16`` row: half the blocks of every decoder matrix, int4 in groups of 128, exported to
    ``BSRW4A16Linear`` (on the CPU its reference runs); about half of ``w4a16``'s bytes."""
    report = _run(tmp_path, "--device", "cpu", "--variants", "fp16,w4a16,dds50-w4a16", "--batch", "1")
    assert report["failed"] == [] and list(_by_variant(report)) == ["fp16", "w4a16", "dds50-w4a16"]
    results = _by_variant(report)
    (batch,) = results["dds50-w4a16"]["batches"]
    assert batch["compiled_graphs"] == 1 and batch["first_step_logits_rel_err_vs_eager"] < 1e-2
    # half the int4 blocks (0.25 bytes per weight) plus a float32 scale per row of each stored block (0.0625)
    assert results["dds50-w4a16"]["weight_bytes"] < 0.6 * results["w4a16"]["weight_bytes"]
    assert report["ratios"]["1"]["dds50-w4a16"]["vs_fp16"] > 0


def test_time_budget_skips_variants_not_started_in_time(tmp_path):
    report = _run(tmp_path, "--device", "cpu", "--variants", "fp16-eager,w8a8", "--batch", "1",
                  "--time-budget", "0")
    assert [s["variant"] for s in report["skipped"]] == ["fp16-eager", "w8a8"]
    assert report["results"] == [] and report["failed"] == []


def test_ratios_and_targets_from_figures():
    results = [{"variant": v, "batches": [{"batch": 1, "tokens_per_s": tps}]}
               for v, tps in [("fp16", 100.0), ("fp16-eager", 50.0), ("w4a16", 250.0), ("int4-aten", 200.0),
                              ("w8a8", 140.0), ("w8a16", 175.0), ("int8-aten", 20.0)]]
    table = bench.ratios(results)
    assert table["1"]["w4a16"] == {"vs_fp16": 2.5, "vs_fp16_eager": 5.0}
    verdicts = bench.targets(table)
    assert verdicts["w4a16 >= 2.0x fp16 (batch 1)"] is True
    assert verdicts["w4a16 ahead of int4-aten (batch 1)"] is True
    assert verdicts["w8a8 >= 1.5x fp16 (batch 1)"] is False
    assert verdicts["dds90 >= 3x fp16 (batch 1)"] is None  # not measured
    assert verdicts["w8a16 >= 1.7x fp16 (batch 1)"] is True and verdicts["w8a16 ahead of int8-aten (batch 1)"] is True


@pytest.mark.parametrize("argv", [["--variants", "fp32"], ["--batch", "0"], ["--batch", "x"], ["--steps", "-1"],
                                  ["--warmup", "0"], ["--no-fuse"]])
def test_bad_arguments_are_rejected(argv):
    with pytest.raises(SystemExit):
        bench.parse_args(["--tiny", "--device", "cpu", *argv])


@pytest.mark.gpu
def test_tiny_gpu_compiles_and_graphs_every_variant(tmp_path):
    report = _run(tmp_path, "--device", "cuda", "--batch", "2", "--fail-fast")
    assert report["failed"] == []
    for result in report["results"]:
        for batch in result["batches"]:
            assert batch["cuda_graph"] is result["compiled"]
            assert batch["compiled_graphs"] == (1 if result["compiled"] else 0)
            assert batch["first_step_logits_rel_err_vs_eager"] < 3e-2, (result["variant"], batch)
