"""scripts/bench/fsdp.py: each mode's overrides, the recipe copy, the summaries; and on the CPU, a tiny
Bert recipe under FSDP2 (2 gloo processes), DDP and one process end to end into fsdp-bench.json."""
from __future__ import annotations

import json
import os
import pathlib

import pytest

from scripts.bench.fsdp import PROBE, main, mode_overrides, probe_summary, recipe_copy, report_metrics
from tests.compress.cli.helpers import export, pruning, qat, tiny_recipe

REPO = pathlib.Path(__file__).resolve().parents[3]
FSDP = {"class_path": "lightning.pytorch.strategies.ModelParallelStrategy",
        "init_args": {"data_parallel_size": 2, "tensor_parallel_size": 1}}


def fsdp_recipe(out):
    recipe = tiny_recipe(out, [pruning(end=2), qat(start=2), export(out / "compressed")], eval_batch_sizes=[2])
    recipe["trainer"].update(devices=2, strategy=FSDP)
    return recipe


def test_each_mode_takes_the_same_samples_per_step(tmp_path):
    recipe = fsdp_recipe(tmp_path)
    common = ["--trainer.max_steps=5", "--trainer.limit_val_batches=0", "--trainer.enable_progress_bar=false",
              "--trainer.enable_checkpointing=false", f"--compress.output_dir={tmp_path}"]
    assert mode_overrides("fsdp", recipe, 5, tmp_path) == common
    assert mode_overrides("ddp", recipe, 5, tmp_path) == [*common, "--trainer.strategy=ddp", "--trainer.devices=2"]
    assert mode_overrides("single", recipe, 5, tmp_path)[-3:] == ["--trainer.strategy=auto", "--trainer.devices=1",
                                                                  "--data.init_args.batch_size=32"]
    with pytest.raises(ValueError, match="mode: expected one of"):
        mode_overrides("fsdp1", recipe, 5, tmp_path)


def test_the_recipe_copy_takes_the_edits_its_own_export_dir_and_the_probe(tmp_path):
    recipe = fsdp_recipe(tmp_path / "elsewhere")
    copy = recipe_copy(recipe, tmp_path / "fsdp", ["BlockPruning.end_step=3", "trainer.max_epochs=1"])
    pruning_args, _, export_args, probe = [cb.get("init_args") for cb in copy["trainer"]["callbacks"]]
    assert pruning_args["end_step"] == 3 and copy["trainer"]["max_epochs"] == 1
    assert export_args["dirpath"] == str(tmp_path / "fsdp" / "compressed")
    assert copy["trainer"]["callbacks"][-1]["class_path"] == PROBE
    assert probe == {"path": str(tmp_path / "fsdp" / "probe")}
    assert recipe["trainer"]["callbacks"][1]["init_args"]["start_step"] == 2  # the recipe itself is left as it was
    recipe["trainer"]["callbacks"] = recipe["trainer"]["callbacks"][:2]
    with pytest.raises(ValueError, match="no Export callback"):
        recipe_copy(recipe, tmp_path / "fsdp", [])


def test_summaries_read_the_probe_files_and_the_report(tmp_path):
    for rank, peak in ((0, 3 * 2 ** 30), (1, 2 ** 30)):
        record = {"rank": rank, "device": "NVIDIA H100", "peak_allocated_bytes": peak, "peak_reserved_bytes": peak,
                  "step_seconds": [1.0, 0.02, 0.04, 0.03]}
        (tmp_path / f"rank{rank}.json").write_text(json.dumps(record))
    summary = probe_summary(tmp_path, warmup=1, samples_per_step=32)
    assert summary["peak_allocated_gib"] == [3.0, 1.0] and summary["ranks"] == 2
    assert summary["step_ms_median"] == 30.0 and summary["samples_per_s"] == round(32 / 0.03, 1)
    assert probe_summary(tmp_path / "none", 1, 32) == {} and report_metrics(tmp_path / "none.json") == {}
    (tmp_path / "report.json").write_text(json.dumps({"models": [{"metrics": {"accuracy": 0.9}},
                                                                 {"metrics": {"accuracy": 0.89}}]}))
    assert report_metrics(tmp_path / "report.json") == {"float": {"accuracy": 0.9}, "export": {"accuracy": 0.89}}


@pytest.mark.slow
def test_fsdp_ddp_and_one_process_end_to_end_on_the_cpu(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("PYTHONPATH", f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    (tmp_path / "recipe.yaml").write_text(json.dumps(fsdp_recipe(tmp_path / "unused")))
    assert main(["--recipe", str(tmp_path / "recipe.yaml"), "--steps", "3", "--warmup", "1",
                 "--out", str(tmp_path / "bench")]) == 0
    result = json.loads((tmp_path / "bench" / "fsdp-bench.json").read_text())
    assert list(result["modes"]) == ["fsdp", "ddp", "single"] and result["samples_per_step"] == 32
    for mode, entry in result["modes"].items():
        assert entry["returncode"] == 0, mode
        assert entry["ranks"] == (1 if mode == "single" else 2) and entry["steps_timed"] == 2
        assert entry["peak_allocated_gib"] == [None] * entry["ranks"]  # the CPU has no such statistics
        assert 0 <= entry["metrics"]["export"]["accuracy"] <= 1
        assert (tmp_path / "bench" / mode / "compressed" / "manifest.json").is_file()
