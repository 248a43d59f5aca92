"""The shipped recipes: they parse, their compression plans fit their models, and the quickstart runs.

The quickstart test runs the real ``recipes/quickstart.yaml`` end to end with a CI-sized override
(one epoch, fewer timing repeats) in a temporary working directory.
"""
import json
import re
from pathlib import Path

import pytest
import torch
import yaml

import compress
from compress.cli import CompressCLI, check_recipe, run_command
from compress.lightning.paths import repo_root

RECIPES = repo_root() / "recipes"
OURS = ["quickstart.yaml", *sorted(p.name for p in RECIPES.glob("minilm-sst2-*.yaml"))]


def test_the_minilm_variants_are_all_there():
    expected = {"dense", "w8a8-qat", "w8a8block-qat", "w4a16-qat", "w8a16-qat", "sparse50", "sparse50-w8a8",
                "sparse50-w8a8-fsdp", "sparse75-w8a8"}
    assert {name.removeprefix("minilm-sst2-").removesuffix(".yaml") for name in OURS[1:]} == expected


def test_the_75_percent_recipe_is_the_50_percent_one_with_three_quarters_of_the_blocks_pruned():
    ours, half = _recipe("minilm-sst2-sparse75-w8a8.yaml"), _recipe("minilm-sst2-sparse50-w8a8.yaml")
    assert ours["trainer"]["callbacks"][0]["init_args"] == dict(half["trainer"]["callbacks"][0]["init_args"],
                                                                sparsity=0.75)
    assert ours["trainer"]["callbacks"][1] == half["trainer"]["callbacks"][1]
    assert ours["model"] == half["model"] and ours["data"] == half["data"]


def test_the_fsdp_recipe_is_the_sparse_w8a8_one_on_two_gpus_without_distillation():
    """Same model, plan and schedule as minilm-sst2-sparse50-w8a8.yaml, 2 x 16 = 32 samples per step;
    distillation left out (the task refuses it under FSDP)."""
    fsdp, one_gpu = _recipe("minilm-sst2-sparse50-w8a8-fsdp.yaml"), _recipe("minilm-sst2-sparse50-w8a8.yaml")
    strategy = fsdp["trainer"]["strategy"]
    assert strategy["class_path"] == "lightning.pytorch.strategies.ModelParallelStrategy"
    assert strategy["init_args"] == {"data_parallel_size": 2, "tensor_parallel_size": 1}
    assert fsdp["trainer"]["devices"] == 2
    assert 2 * fsdp["data"]["init_args"]["batch_size"] == one_gpu["data"]["init_args"]["batch_size"]
    assert fsdp["trainer"]["callbacks"][:2] == one_gpu["trainer"]["callbacks"][:2]
    assert "distillation" not in fsdp["model"]["init_args"]
    task = CompressCLI(args=["--config", str(RECIPES / "minilm-sst2-sparse50-w8a8-fsdp.yaml"),
                             "--trainer.accelerator=cpu"], run=False).model
    assert task.distillation is None


@pytest.mark.parametrize("name", OURS)
def test_recipe_parses_and_prints_its_config(name, capsys):
    with pytest.raises(SystemExit) as done:
        run_command(["fit", "--config", str(RECIPES / name), "--print_config"])
    assert done.value.code in (0, None)
    printed = capsys.readouterr().out
    assert "class_path: compress.lightning.tasks.SequenceClassificationTask" in printed
    assert "output_dir: runs/" in printed


def test_the_w8a16_recipe_asks_for_w8a16_by_class_path(capsys):
    """A config mapping without its class path would resolve to W4A16Config (the first that fits)."""
    with pytest.raises(SystemExit):
        run_command(["fit", "--config", str(RECIPES / "minilm-sst2-w8a16-qat.yaml"), "--print_config"])
    printed = yaml.safe_load(capsys.readouterr().out)
    (qat,) = [cb for cb in printed["trainer"]["callbacks"] if cb["class_path"].endswith("QuantizationAware")]
    assert qat["init_args"]["config"]["class_path"] == "compress.configs.W8A16Config"
    assert qat["init_args"]["config"]["init_args"]["group_size"] is None  # one scale per output channel


def test_the_block_scaled_recipe_asks_for_w8a8_block_and_trains_like_the_w8a8_one(capsys):
    with pytest.raises(SystemExit):
        run_command(["fit", "--config", str(RECIPES / "minilm-sst2-w8a8block-qat.yaml"), "--print_config"])
    printed = yaml.safe_load(capsys.readouterr().out)
    (qat,) = [cb for cb in printed["trainer"]["callbacks"] if cb["class_path"].endswith("QuantizationAware")]
    assert qat["init_args"]["config"]["class_path"] == "compress.configs.W8A8BlockConfig"
    assert qat["init_args"]["config"]["init_args"]["block"] == 128
    block, per_channel = _recipe("minilm-sst2-w8a8block-qat.yaml"), _recipe("minilm-sst2-w8a8-qat.yaml")
    assert block["model"] == per_channel["model"] and block["data"] == per_channel["data"]
    qat_steps = [cb["init_args"]["start_step"]
                 for recipe in (block, per_channel) for cb in recipe["trainer"]["callbacks"]
                 if cb["class_path"].endswith("QuantizationAware")]
    assert qat_steps == [500, 500]


FLAT_PATHS = {"compress.lightning.tasks.": "compress.tasks.", "compress.lightning.data.": "compress.data.",
              "compress.lightning.callbacks.": "compress.callbacks."}


@pytest.mark.parametrize("style", ["flat", "short"])
def test_quickstart_with_flat_or_short_class_paths_parses_to_the_same_classes(style, tmp_path, ):
    """Recipes written before the Lightning modules moved to compress/lightning/ (``compress.callbacks.X``),
    and recipes naming classes by short name (``class_path: BlockPruning``), still resolve."""
    text = (RECIPES / "quickstart.yaml").read_text()
    if style == "flat":
        for new, old in FLAT_PATHS.items():
            text = text.replace(new, old)
    else:
        text = re.sub(r"class_path: compress\.[\w.]*\.(\w+)", r"class_path: \1", text)
    assert "class_path: compress.lightning" not in text
    (tmp_path / "recipe.yaml").write_text(text)
    cli = CompressCLI(args=["--config", str(tmp_path / "recipe.yaml")], run=False)
    assert type(cli.model).__module__ == "compress.lightning.tasks"
    assert type(cli.datamodule).__module__ == "compress.lightning.data"
    ours = [cb for cb in cli.trainer.callbacks if type(cb).__module__ == "compress.lightning.callbacks"]
    assert [type(cb).__name__ for cb in ours] == ["BlockPruning", "QuantizationAware", "Export"]


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in OURS if n != "minilm-sst2-dense.yaml" and n.startswith("minilm")])
def test_minilm_plans_fit_the_model(name, monkeypatch):
    monkeypatch.delenv("MINILM_DIR", raising=False)  # the packaged copy has the same shapes
    cli = CompressCLI(args=["--config", str(RECIPES / name)], run=False)
    check_recipe(cli.model, cli.trainer.callbacks)  # raises on a plan that does not fit
    assert any(type(cb).__module__ == "compress.lightning.callbacks" for cb in cli.trainer.callbacks)


@pytest.mark.slow
def test_quickstart_end_to_end(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    overrides = ["--trainer.max_epochs=1", "--compress.latency_repeats=3", "--compress.latency_warmup=1"]
    assert run_command(["run", "--config", str(RECIPES / "quickstart.yaml"), *overrides]) == 0
    out = Path("runs/quickstart")
    report = json.loads((out / "report.json").read_text())
    float_model, compressed = report["models"]
    assert float_model["metrics"]["accuracy"] > 0.3  # 10 classes: chance is 0.1
    # 2 layers x 6 linears, evaluated with q/k/v fused: 2 layers x 4 kernel calls
    assert compressed["compression"].startswith("BSRW8A8Linear x8")
    assert "(2 fused sibling groups, 6 fed int8" in compressed["compression"]
    assert [p["batch_size"] for p in compressed["latency"]] == [1, 8, 32]
    assert (out / "report.md").is_file() and (out / "report.png").is_file()
    model = compress.load_compressed(out / "compressed")
    layer = model.get_submodule("bert.encoder.layer.0.intermediate.dense")
    assert type(layer).__name__ == "BSRW8A8Linear" and layer.values.dtype == torch.int8
    assert layer.nnz == (512 // 32) * (128 // 32) // 2  # 50% of the 32x32 blocks pruned, the rest int8


def _recipe(name: str) -> dict:
    import yaml

    return yaml.safe_load((RECIPES / name).read_text())


def test_minilm_family_trains_every_variant_for_the_dense_baselines_epochs():
    epochs = {name: _recipe(name)["trainer"]["max_epochs"] for name in OURS[1:]}
    assert len(set(epochs.values())) == 1, epochs


@pytest.mark.parametrize("name", ["minilm-sst2-sparse50.yaml", "minilm-sst2-sparse50-w8a8.yaml"])
def test_sparse_minilm_recipes_distil_from_a_dense_snapshot(name):
    recipe = _recipe(name)
    distillation = recipe["model"]["init_args"]["distillation"]
    pruning = next(cb["init_args"] for cb in recipe["trainer"]["callbacks"]
                   if cb["class_path"].endswith("BlockPruning"))
    assert distillation.get("teacher") is None  # a snapshot: the suite trains the dense recipe side by side
    assert distillation["start_step"] <= pruning["start_step"] < pruning["end_step"]
    task = CompressCLI(args=["--config", str(RECIPES / name), "--trainer.accelerator=cpu"], run=False).model
    assert task.distillation.alpha == distillation["alpha"] and not bool(task.teacher.ready)
