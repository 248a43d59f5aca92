"""Tests for the SmolLM2 recipes recipes/smollm2-wikitext-*.yaml on the CPU, without SmolLM2's weights.

* Every recipe parses as written (LightningCLI's ``--print_config``: keys and types, no model built).
* Their compression plans fit SmolLM2's layers: a 2-layer Llama with SmolLM2's widths, from a config.
* W8A8 QAT, W4A16 QAT, 50% blocks and 50% + W8A8 continue from the dense run's float model with its
  schedule and distil from that model, so their perplexities compare with its; 50% + W8A8 quantizes
  once pruning ends.
* Shrunk (a tiny Llama, the MiniLM tokenizer, a few steps, schedules scaled), each trained recipe runs
  end to end: train -> compress -> export -> evaluate -> report; the ones that continue from the dense
  run start from, and distil from, the shrunk dense run's float model.
* The post-training recipes (W4A16 GPTQ, W8A16 GPTQ) quantize the dense run's float model without a
  training step; shrunk, they run end to end too.
"""
from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import pytest
import yaml

from compress import cli, load_compressed
from compress.lightning.paths import MINILM_NAME, SMOLLM2_NAME, data_root
from compress.nn.inference import BSRLinear, BSRW4A16Linear, BSRW8A8Linear, W4A16Linear, W8A8Linear, W8A16Linear

RECIPES = Path(__file__).resolve().parents[2] / "recipes"
TRAINED = ("dense", "w8a8-qat", "w4a16-qat", "sparse50", "sparse50-w8a8", "sparse50-w4a16")
POST_TRAINING = {  # recipe -> (config class, group size, algorithm, exported module)
    "w4a16-gptq": ("W4A16Config", 32, "gptq", W4A16Linear),
    "w8a16-ptq": ("W8A16Config", None, "gptq", W8A16Linear),
}
ALL = (*TRAINED, *POST_TRAINING)
# Train on the dense run's float model, distil from it.
FROM_DENSE = ("w8a8-qat", "w4a16-qat", "sparse50", "sparse50-w8a8", "sparse50-w4a16")
DENSE_FLOAT = "runs/smollm2-wikitext-dense/float"
EXPORTED_MODULE = {"w8a8-qat": W8A8Linear, "w4a16-qat": W4A16Linear, "sparse50": BSRLinear,
                   "sparse50-w8a8": BSRW8A8Linear, "sparse50-w4a16": BSRW4A16Linear}
# SmolLM2-135M-Instruct as published (tests/compress/lightning/test_smollm2.py checks the GGUF against it)
SMOLLM2_SHAPES = dict(model_type="llama", vocab_size=49152, hidden_size=576, intermediate_size=1536,
                      num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3, tie_word_embeddings=True)
TINY_STEPS = 8
TINY_LLAMA = dict(model_type="llama", vocab_size=30522, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                  num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64, tie_word_embeddings=True)

needs_wikitext = pytest.mark.skipif(not (data_root() / "wikitext-2" / "valid.txt").is_file(),
                                    reason="needs $COMPRESS_DATA_DIR/wikitext-2/valid.txt")


def _recipe(name: str) -> dict:
    return yaml.safe_load((RECIPES / f"smollm2-wikitext-{name}.yaml").read_text())


def _write(recipe: dict, path: Path) -> Path:
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path


def _with_model(recipe: dict, config: dict) -> dict:
    """The recipe with its model replaced by a model built from ``config`` (a loaded teacher by a
    snapshot of that model)."""
    init_args = recipe["model"]["init_args"]
    init_args.pop("model_name_or_path")
    init_args["config"] = dict(config)
    if (init_args.get("distillation") or {}).get("teacher"):
        init_args["distillation"]["teacher"] = None
    return recipe


@pytest.mark.parametrize("name", ALL)
def test_recipe_parses_as_written(name, capsys):
    with pytest.raises(SystemExit) as done:
        cli.main(["fit", "--config", str(RECIPES / f"smollm2-wikitext-{name}.yaml"), "--print_config"])
    assert done.value.code in (0, None)
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["model"]["class_path"] == "compress.lightning.tasks.CausalLMTask"
    assert printed["data"]["init_args"]["tokenizer"] == SMOLLM2_NAME
    assert printed["compress"]["output_dir"] == f"runs/smollm2-wikitext-{name}"


@pytest.mark.parametrize("name", ALL[1:])
def test_plans_fit_smollm2s_layers(name, monkeypatch, tmp_path):
    """Every decoder linear of SmolLM2's shapes is targeted (blocks divide it); lm_head is not."""
    monkeypatch.setattr("sys.argv", ["compress"])
    shapes = dict(SMOLLM2_SHAPES, num_hidden_layers=2)
    config = _write(_with_model(_recipe(name), shapes), tmp_path / f"{name}.yaml")
    parsed = cli.CompressCLI(args=["--config", str(config), "--trainer.accelerator=cpu"], run=False)
    cli.check_recipe(parsed.model, parsed.trainer.callbacks)  # raises on a plan that does not fit
    plans = [cb.plan for cb in parsed.trainer.callbacks if hasattr(cb, "plan")]
    assert plans
    for plan in plans:
        targets = plan.targets(parsed.model.model)
        assert len(targets) == 7 * 2 and not any("lm_head" in t or "embed" in t for t in targets)


def _without(mapping: dict, *keys: str) -> dict:
    return {k: v for k, v in mapping.items() if k not in keys}


def test_dense_recipe_saves_the_float_model_the_others_start_from():
    dense = _recipe("dense")
    assert dense["model"]["init_args"]["model_name_or_path"] == SMOLLM2_NAME
    assert dense["compress"]["save_float_model"] is True  # the baseline of the targets, and the others' start
    assert dense["compress"]["output_dir"] + "/float" == DENSE_FLOAT


@pytest.mark.parametrize("name", FROM_DENSE)
def test_recipes_continue_from_the_dense_run_and_distil_from_it(name):
    """Same data, seed and schedule as the dense run, from its float model, with it as the teacher from
    the first step (before any compression starts)."""
    dense, other = _recipe("dense"), _recipe(name)
    assert other["data"] == dense["data"] and other["seed_everything"] == dense["seed_everything"]
    assert _without(other["trainer"], "callbacks") == dense["trainer"]
    model = other["model"]["init_args"]
    assert model["model_name_or_path"] == DENSE_FLOAT
    assert model["distillation"]["teacher"] == DENSE_FLOAT and model["distillation"]["start_step"] == 0
    assert _without(model, "model_name_or_path", "distillation", "learning_rate") == \
        _without(dense["model"]["init_args"], "model_name_or_path", "learning_rate")


@pytest.mark.parametrize("name", ["sparse50-w8a8", "sparse50-w4a16"])
def test_sparse50_quantized_recipes_quantize_once_pruning_ends(name):
    callbacks = {cb["class_path"].rsplit(".", 1)[-1]: cb["init_args"]
                 for cb in _recipe(name)["trainer"]["callbacks"]}
    assert callbacks["QuantizationAware"]["start_step"] == callbacks["BlockPruning"]["end_step"] > 0


@pytest.mark.parametrize("name", POST_TRAINING)
def test_post_training_recipes_quantize_the_dense_runs_float_model_without_training(name, monkeypatch, tmp_path):
    recipe = _recipe(name)
    assert recipe["model"]["init_args"]["model_name_or_path"] == _recipe("dense")["compress"]["output_dir"] + "/float"
    assert recipe["trainer"]["max_steps"] == 0 and recipe["data"] == _recipe("dense")["data"]
    monkeypatch.setattr("sys.argv", ["compress"])
    config = _write(_with_model(recipe, dict(SMOLLM2_SHAPES, num_hidden_layers=2)), tmp_path / f"{name}.yaml")
    parsed = cli.CompressCLI(args=["--config", str(config), "--trainer.accelerator=cpu"], run=False)
    (quantization,) = [cb for cb in parsed.trainer.callbacks if type(cb).__name__ == "QuantizationAware"]
    (configs,) = quantization.plan.rules.values()
    assert [(type(c).__name__, c.group_size, c.algorithm) for c in configs] == [POST_TRAINING[name][:3]]


def _scaled_step(step: int, total: int) -> int:
    return 0 if step == 0 else max(1, round(step * TINY_STEPS / total))


def shrink(recipe: dict, out_dir: Path) -> dict:
    """The recipe with a tiny Llama and the MiniLM tokenizer (no SmolLM2 files needed), short data,
    TINY_STEPS steps (none for a recipe without training steps) and its schedules (callbacks,
    distillation) scaled to them."""
    total = recipe["trainer"]["max_steps"]
    _with_model(recipe, TINY_LLAMA)
    distillation = recipe["model"]["init_args"].get("distillation")
    if distillation:
        distillation["start_step"] = _scaled_step(distillation["start_step"], total)
    recipe["data"]["init_args"].update(tokenizer=MINILM_NAME, block_size=32, batch_size=4, max_train_blocks=32,
                                       max_eval_blocks=8)
    recipe["trainer"].update(max_steps=TINY_STEPS if total else 0, accelerator="cpu", enable_progress_bar=False,
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


def _run(name: str, out_dir: Path, start: Path | None = None) -> list[float]:
    """Run the shrunk recipe with ``compress run`` into ``out_dir`` (a recipe that continues from the dense
    run: from the float model in ``start`` and with it as the teacher); the perplexities of its report."""
    recipe = shrink(_recipe(name), out_dir)
    if start is not None:
        init_args = recipe["model"]["init_args"]
        del init_args["config"]
        init_args["model_name_or_path"] = init_args["distillation"]["teacher"] = str(start)
    config = _write(recipe, out_dir.parent / f"{out_dir.name}-{name}.yaml")
    assert cli.main(["run", "--config", str(config)]) == 0
    report = json.loads((out_dir / "report.json").read_text())
    return [model["metrics"]["perplexity"] for model in report["models"]]


@pytest.fixture(scope="module")
def shrunk_dense(tmp_path_factory) -> tuple[Path, list[float]]:
    """The shrunk dense recipe, run once for the module: its output dir and perplexities."""
    out_dir = tmp_path_factory.mktemp("dense") / "run"
    return out_dir, _run("dense", out_dir)


def _check_run(name: str, perplexities: list[float], out_dir: Path) -> None:
    assert len(perplexities) == (1 if name == "dense" else 2)
    assert all(math.isfinite(p) and 1.0 < p < 2 * TINY_LLAMA["vocab_size"] for p in perplexities)
    if name == "dense":
        assert (out_dir / "float" / "manifest.json").is_file()  # what the GPTQ recipe quantizes
        return
    exported = load_compressed(out_dir / "compressed")
    assert sum(isinstance(m, EXPORTED_MODULE[name]) for m in exported.modules()) == 7 * 2
    assert exported.lm_head.weight is exported.model.embed_tokens.weight  # tied, and dense


@needs_wikitext
@pytest.mark.slow
def test_dense_recipe_runs_end_to_end(shrunk_dense):
    out_dir, perplexities = shrunk_dense
    _check_run("dense", perplexities, out_dir)


@needs_wikitext
@pytest.mark.slow
@pytest.mark.parametrize("name", FROM_DENSE)
def test_recipes_from_the_dense_run_run_end_to_end(name, shrunk_dense, tmp_path):
    dense_dir, _ = shrunk_dense
    _check_run(name, _run(name, tmp_path / "run", start=dense_dir / "float"), tmp_path / "run")


@needs_wikitext
@pytest.mark.parametrize("name", POST_TRAINING)
def test_post_training_recipes_run_without_a_training_step(name, tmp_path, caplog):
    """max_steps 0: Calibration draws its batches at fit start, GPTQ rounds every targeted layer, and
    Export saves them; the float copy is the model as loaded."""
    recipe = shrink(_recipe(name), tmp_path / "run")
    config = _write(recipe, tmp_path / f"{name}.yaml")
    with caplog.at_level(logging.INFO):
        assert cli.main(["run", "--config", str(config)]) == 0
    assert "GPTQ quantized 14 layers on 16 training batches" in caplog.text
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert len(report["models"]) == 2
    assert all(math.isfinite(m["metrics"]["perplexity"]) for m in report["models"])
    exported = load_compressed(tmp_path / "run" / "compressed")
    assert sum(isinstance(m, POST_TRAINING[name][3]) for m in exported.modules()) == 7 * 2
