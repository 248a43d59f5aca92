"""Tests for scripts/bench/quality_family.py: a compress evaluate report becomes a results file the
pages render."""
import json

import pytest

from compress.eval.report import LatencyPoint, ModelResult, Report, write_json
from scripts.bench import pages
from scripts.bench.quality_family import family, main


def _model(name, perplexity, ms):
    return ModelResult(name, {"perplexity": perplexity, "loss": 1.0}, "perplexity", False,
                       [LatencyPoint(1, 128, ms), LatencyPoint(8, 128, 4 * ms)], 1000, 2000, source=f"runs/{name}")


@pytest.fixture
def report_and_recipes(tmp_path):
    report = Report([_model("dense", 16.0, 2.0), _model("w8a8-qat", 16.4, 1.0)], "NVIDIA H100", "float16",
                    {"torch": "2.11", "gpu": "NVIDIA H100"}, "cuda_graph")
    path = write_json(report, tmp_path / "report.json")
    (tmp_path / "r-dense.yaml").write_text("seed_everything: 3\ntrainer:\n  max_steps: 150\n")
    (tmp_path / "r-w8a8-qat.yaml").write_text("seed_everything: 3\ntrainer:\n  max_steps: 0\n")
    return path, f"{tmp_path}/r-"


def test_runs_carry_the_report_figures_and_the_recipes_facts(report_and_recipes):
    path, prefix = report_and_recipes
    data = family(path, prefix, "abc1234", {"w8a8-qat": 1.0}, "tiny", "A tiny family")
    dense, qat = data["runs"]
    assert (dense["variant"], dense["seed"], dense["steps"], dense["perplexity"]) == ("dense", 3, 150, 16.0)
    assert (qat["steps"], qat["perplexity"], qat["latency_ms"]) == (0, 16.4, {"1": 1.0, "8": 4.0})
    assert qat["dense_latency_ms"] == {"1": 2.0, "8": 8.0} and qat["source"]["model"] == "runs/w8a8-qat"
    assert data["gpu"] == "NVIDIA H100" and "gpu" not in data["environment"] and data["target_unit"] == "percent"
    page = "\n".join(pages.quality_section("tiny.json", data))
    assert "| w8a8-qat | at most 1.0 percent above dense | 3 | 16.40 | 16.00 | +2.5% | **not met** | 0 of 1 |" in page
    assert "| w8a8-qat | 1.000 (2.00x) | 4.000 (2.00x) |" in page  # dense 2 ms / 1 ms at batch 1


def test_bad_input_is_refused_by_name(report_and_recipes, tmp_path):
    path, prefix = report_and_recipes
    with pytest.raises(ValueError, match=r"\['w4a16-qat'\] have no run"):
        main(["--report", str(path), "--recipe-prefix", prefix, "--commit", "a", "--targets", "w4a16-qat=3",
              "--family", "t", "--description", "d", "--out", str(tmp_path / "o.json")])
    with pytest.raises(FileNotFoundError, match="expected the recipe"):
        family(path, f"{tmp_path}/missing-", "abc", {}, "tiny", "d")
    with pytest.raises(ValueError, match="variant=limit"):
        main(["--report", str(path), "--recipe-prefix", prefix, "--commit", "a", "--targets", "w8a8-qat",
              "--family", "t", "--description", "d", "--out", str(tmp_path / "o.json")])


def test_command_line_writes_the_file(report_and_recipes, tmp_path):
    path, prefix = report_and_recipes
    out = tmp_path / "out" / "tiny-h100.json"
    assert main(["--report", str(path), "--recipe-prefix", prefix, "--commit", "a", "--targets", "w8a8-qat=1",
                 "--family", "tiny", "--description", "d", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["targets"] == {"w8a8-qat": 1.0}


def test_a_rerun_counts_for_the_metric_and_the_joint_run_for_speed(report_and_recipes, tmp_path):
    path, prefix = report_and_recipes
    rerun = Report([_model("float weights of this run", 16.1, 2.2), _model("compressed (w8a8-lsq)", 16.1, 1.1)],
                   "NVIDIA H100", "float16", {"torch": "2.11", "gpu": "NVIDIA H100"}, "cuda_graph")
    rerun_path = write_json(rerun, tmp_path / "rerun.json")
    out = tmp_path / "tiny-h100.json"
    assert main(["--report", str(path), "--recipe-prefix", prefix, "--commit", "a", "--targets", "w8a8-qat=1",
                 "--family", "tiny", "--description", "d", "--out", str(out), "--rerun", f"w8a8-qat={rerun_path}",
                 "--rerun-commit", "b", "--rerun-note", "run again", "--speed-note", "earlier settings"]) == 0
    data = json.loads(out.read_text())
    joint, again = [r for r in data["runs"] if r["variant"] == "w8a8-qat"]
    assert (joint["counts_for"], joint["note"], joint["perplexity"]) == (["speed"], "earlier settings", 16.4)
    assert (again["counts_for"], again["note"], again["perplexity"]) == (["metric"], "run again", 16.1)
    assert again["dense_latency_ms"] == {"1": 2.2, "8": 8.8} and again["source"]["commit"] == "b"
    page = "\n".join(pages.quality_section("tiny.json", data))
    assert "| w8a8-qat | at most 1.0 percent above dense | 3 | 16.10 | 16.00 | +0.6% | met | 1 of 1 |" in page
    with pytest.raises(ValueError, match="one run of it"):
        main(["--report", str(path), "--recipe-prefix", prefix, "--commit", "a", "--family", "t",
              "--description", "d", "--out", str(out), "--rerun", f"w4a16-qat={rerun_path}",
              "--rerun-commit", "b", "--rerun-note", "n", "--speed-note", "s"])


def test_an_added_variant_counts_for_the_metric_with_its_own_baseline(report_and_recipes, tmp_path):
    path, prefix = report_and_recipes
    (tmp_path / "r-w8a16-ptq.yaml").write_text("seed_everything: 0\ntrainer:\n  max_steps: 0\n")
    own = Report([_model("float weights of this run", 16.0, 2.4), _model("compressed (w8a16-ptq)", 16.01, 1.2)],
                 "NVIDIA H100", "float16", {"torch": "2.11", "gpu": "NVIDIA H100"}, "cuda_graph")
    own_path = write_json(own, tmp_path / "own.json")
    out = tmp_path / "tiny-h100.json"
    argv = ["--report", str(path), "--recipe-prefix", prefix, "--commit", "a", "--targets", "w8a16-ptq=1",
            "--family", "tiny", "--description", "d", "--out", str(out), "--add", f"w8a16-ptq={own_path}"]
    with pytest.raises(ValueError, match="--add needs"):
        main(argv)
    assert main([*argv, "--add-commit", "c", "--add-note", "run on its own"]) == 0
    added = json.loads(out.read_text())["runs"][-1]
    assert (added["variant"], added["counts_for"], added["perplexity"], added["steps"]) == (
        "w8a16-ptq", ["metric"], 16.01, 0)
    assert added["dense_latency_ms"] == {"1": 2.4, "8": 9.6} and added["source"]["commit"] == "c"
    with pytest.raises(ValueError, match="already holds it"):
        main([*argv, "--add-commit", "c", "--add-note", "n", "--add", f"w8a8-qat={own_path}"])
