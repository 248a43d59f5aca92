"""Tests for compress/cli/evaluate.py: ``compress evaluate`` compares saved model dirs in one report, refuses an
earlier report (before loading any model) and a compressed dir without its manifest; the recipe's
evaluation options reach EvalOptions."""
import json
import logging
import re
import shutil

import pytest

from compress import CheckpointError
from compress.cli import CompressOptions, run_command
from compress.cli.evaluate import eval_options


@pytest.mark.parametrize("earlier", ["report.md", "report.json", "report.png"])
def test_evaluate_refuses_an_earlier_report_before_loading_any_model(sparse_w8a8_run, tmp_path, earlier):
    root, recipe = sparse_w8a8_run
    (tmp_path / earlier).write_text("an earlier report")
    with pytest.raises(FileExistsError, match=rf"holds an earlier report \(.*{re.escape(earlier)}\); pass --overwrite"):
        run_command(["evaluate", "--config", recipe, "--models", str(tmp_path / "not-a-model"),
                     "--compress.output_dir", str(tmp_path)])
    assert (tmp_path / earlier).read_text() == "an earlier report"
    assert sorted(p.name for p in tmp_path.iterdir()) == [earlier]


def test_evaluate_compares_saved_model_dirs(sparse_w8a8_run, tmp_path, caplog):
    root, recipe = sparse_w8a8_run
    models = [str(root / "out" / "float"), str(root / "out" / "compressed")]
    (tmp_path / "report.md").write_text("an earlier report")
    with caplog.at_level(logging.INFO, logger="compress.cli.evaluate"):
        code = run_command(["evaluate", "--config", recipe, "--models", *models, "--names", "dense", "w8a8",
                            "--compress.output_dir", str(tmp_path), "--compress.latency_mode", "compile",
                            "--overwrite"])
    assert code == 0
    paths = ", ".join(str(tmp_path / f"report.{suffix}") for suffix in ("md", "json", "png"))
    assert f"the report goes to {paths} (replacing the earlier one)" in caplog.text
    assert f"report written: {paths}" in caplog.text
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["reference_kernels"] is True
    assert report["latency_mode"] == "eager"  # compile asked for, CPU times eager
    assert [m["name"] for m in report["models"]] == ["dense", "w8a8"]
    assert report["models"][1]["source"] == models[1]
    assert "| w8a8 |" in (tmp_path / "report.md").read_text()


def test_evaluate_refuses_a_compressed_dir_that_lost_its_manifest(sparse_w8a8_run, tmp_path):
    """Loaded as a plain model it would get random compressed layers and report noise as accuracy."""
    root, recipe = sparse_w8a8_run
    broken = tmp_path / "broken"
    shutil.copytree(root / "out" / "compressed", broken)
    (broken / "manifest.json").unlink()
    refused = r"broken: looks like a compressed-model directory .* no manifest\.json"
    with pytest.raises(CheckpointError, match=refused) as error:
        run_command(["evaluate", "--config", recipe, "--models", str(broken),
              "--compress.output_dir", str(tmp_path / "report")])
    assert "\n" not in str(error.value)
    assert not (tmp_path / "report" / "report.json").exists()


def test_latency_mode_option_defaults_to_cuda_graph_and_reaches_eval_options():
    assert CompressOptions().latency_mode == "cuda_graph"
    settings = eval_options(CompressOptions(latency_mode="eager", latency_seq_len=16), datamodule=None)
    assert settings.latency_mode == "eager" and settings.seq_len == 16


@pytest.mark.parametrize("flag", [True, False])
def test_fusion_and_link_options_reach_eval_options(flag):
    assert CompressOptions().fuse_siblings and CompressOptions().link_quantized_inputs  # on by default
    settings = eval_options(CompressOptions(fuse_siblings=flag, link_quantized_inputs=flag, latency_seq_len=16),
                            datamodule=None)
    assert (settings.fuse_siblings, settings.link_quantized_inputs) == (flag, flag)
