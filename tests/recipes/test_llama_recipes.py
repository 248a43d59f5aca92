"""Tests for the causal-LM recipes recipes/llama-wikitext-*.yaml on the CPU.

Each recipe must parse and validate as written (LightningCLI, real model size), and run end to end
(train -> compress -> export -> evaluate -> report) when shrunk: a tiny Llama, short blocks, a few
steps, with the recipe's own callbacks and schedule scaled to the shorter run. The exported model
must load without the original, and ``compress export`` from the run's Lightning checkpoint must
give the same model as the Export callback.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import yaml

from compress import cli, load_compressed
from compress.lightning.paths import data_root
from compress.nn.inference import BSRLinear, W4A16Linear, W8A8Linear

RECIPES = Path(__file__).resolve().parents[2] / "recipes"
NAMES = ("dense", "w8a8-qat", "w4a16-qat", "sparse50")
EXPORTED_MODULE = {"w8a8-qat": W8A8Linear, "w4a16-qat": W4A16Linear, "sparse50": BSRLinear}
TINY_STEPS = 8
TINY_LLAMA = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2,
                  num_key_value_heads=2, max_position_embeddings=64)

needs_wikitext = pytest.mark.skipif(not (data_root() / "wikitext-2" / "valid.txt").is_file(),
                                    reason="needs $COMPRESS_DATA_DIR/wikitext-2/valid.txt")


def _recipe(name: str) -> dict:
    return yaml.safe_load((RECIPES / f"llama-wikitext-{name}.yaml").read_text())


def _scaled_step(step: int, total: int) -> int:
    return max(1, round(step * TINY_STEPS / total))


def shrink(recipe: dict, out_dir: Path) -> dict:
    """The recipe with a tiny model, short data, TINY_STEPS steps and its schedule scaled to them."""
    total = recipe["trainer"]["max_steps"]
    recipe["model"]["init_args"]["config"].update(TINY_LLAMA)
    recipe["data"]["init_args"].update(block_size=32, batch_size=4, max_train_blocks=32, max_eval_blocks=8)
    recipe["trainer"].update(max_steps=TINY_STEPS, accelerator="cpu", enable_progress_bar=False,
                             log_every_n_steps=1, num_sanity_val_steps=0)
    for callback in recipe["trainer"].get("callbacks", []):
        args = callback["init_args"]
        for key in ("start_step", "end_step"):
            if key in args:
                args[key] = _scaled_step(args[key], total)
        if "frequency" in args:
            args["frequency"] = 1
        if "dirpath" in args:
            args["dirpath"] = str(out_dir / "compressed")
    recipe["compress"].update(output_dir=str(out_dir), eval_batch_sizes=[1], latency_seq_len=16,
                              latency_warmup=0, latency_repeats=1, eval_device="cpu")
    return recipe


def _write(recipe: dict, path: Path) -> Path:
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path


@pytest.mark.parametrize("name", NAMES)
def test_recipe_parses_as_written(name, monkeypatch):
    monkeypatch.setattr("sys.argv", ["compress"])  # LightningCLI reads the program name from argv
    parsed = cli.CompressCLI(args=["--config", str(RECIPES / f"llama-wikitext-{name}.yaml")], run=False)
    config = parsed.model.model.config
    assert (config.model_type, config.hidden_size, config.num_hidden_layers) == ("llama", 512, 8)
    assert config.vocab_size == 30522 and parsed.trainer.max_steps == 480
    plans = [cb.plan for cb in parsed.trainer.callbacks if hasattr(cb, "plan")]
    assert len(plans) == (0 if name == "dense" else 1)
    for plan in plans:  # every decoder linear is targeted; lm_head and embeddings stay dense
        targets = plan.targets(parsed.model.model)
        assert len(targets) == 7 * 8 and not any("lm_head" in t or "embed" in t for t in targets)


def test_recipes_differ_only_in_compression():
    dense = _recipe("dense")
    for name in NAMES[1:]:
        other = _recipe(name)
        assert other["model"] == dense["model"] and other["data"] == dense["data"]
        assert other["seed_everything"] == dense["seed_everything"]
        trainer = {k: v for k, v in other["trainer"].items() if k != "callbacks"}
        assert trainer == dense["trainer"]


def _run(name: str, tmp_path: Path) -> tuple[dict, Path]:
    config = _write(shrink(_recipe(name), tmp_path / "run"), tmp_path / f"{name}.yaml")
    assert cli.run_command(["run", "--config", str(config)]) == 0
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    return report, config


def _perplexities(report: dict) -> list[float]:
    return [model["metrics"]["perplexity"] for model in report["models"]]


@needs_wikitext
def test_w4a16_recipe_trains_exports_and_evaluates(tmp_path):
    report, config = _run("w4a16-qat", tmp_path)
    float_ppl, compressed_ppl = _perplexities(report)
    for ppl in (float_ppl, compressed_ppl):
        assert math.isfinite(ppl) and 1.0 < ppl < 2 * 30522
    exported = load_compressed(tmp_path / "run" / "compressed")
    assert sum(isinstance(m, W4A16Linear) for m in exported.modules()) == 7 * 2
    assert isinstance(exported.lm_head, torch.nn.Linear)

    # `compress export` from the run's last Lightning checkpoint rebuilds the same compressed model
    (checkpoint,) = sorted((tmp_path / "run").rglob("*.ckpt"))
    again_dir = tmp_path / "again"
    assert cli.run_command(["export", "--config", str(config), "--ckpt_path", str(checkpoint),
                     "--export_dir", str(again_dir)]) == 0
    again = load_compressed(again_dir)
    tokens = torch.randint(0, 30522, (2, 16))
    with torch.no_grad():
        assert torch.equal(exported(input_ids=tokens).logits, again(input_ids=tokens).logits)


@needs_wikitext
@pytest.mark.slow
@pytest.mark.parametrize("name", ["dense", "w8a8-qat", "sparse50"])
def test_other_recipes_run_end_to_end(name, tmp_path):
    report, _ = _run(name, tmp_path)
    perplexities = _perplexities(report)
    assert len(perplexities) == (1 if name == "dense" else 2)
    assert all(math.isfinite(p) and p > 1.0 for p in perplexities)
    if name == "dense":
        assert (tmp_path / "run" / "float").is_dir()  # the baseline other recipes compare with
        return
    exported = load_compressed(tmp_path / "run" / "compressed")
    assert sum(isinstance(m, EXPORTED_MODULE[name]) for m in exported.modules()) == 7 * 2
