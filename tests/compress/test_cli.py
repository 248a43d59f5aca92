"""The ``compress`` CLI: callback composition end to end on a tiny model, export (checkpoints read with
weights_only=True: a pickle that would run code is refused; an earlier export is replaced only with
--overwrite), evaluate, bad recipes."""
import json
import logging
import os
import pathlib
import re
import shutil
import time

import pytest
import torch
import yaml
from safetensors.torch import load_file

import compress
from compress import CheckpointError
from compress.eval.report import REFERENCE_NOTE
from compress.cli import CompressCLI, CompressOptions, RecipeError, check_recipe, eval_options, main, run_command
from compress.lightning.data import DigitsData
from compress.lightning.tasks import SequenceClassificationTask

TINY_BERT = {
    "model_type": "bert", "vocab_size": DigitsData.VOCAB_SIZE, "hidden_size": 64, "num_hidden_layers": 1,
    "num_attention_heads": 2, "intermediate_size": 128, "max_position_embeddings": 80, "type_vocab_size": 1,
}


def tiny_recipe(out_dir, callbacks, **compress_options):
    """A recipe for a tiny Bert on 64 digits: 4 optimizer steps per epoch, 2 epochs."""
    return {
        "seed_everything": 0,
        "model": {"class_path": "compress.lightning.tasks.SequenceClassificationTask",
                  "init_args": {"config": TINY_BERT, "num_labels": 10, "learning_rate": 1e-3}},
        "data": {"class_path": "compress.lightning.data.DigitsData",
                 "init_args": {"batch_size": 16, "max_train_samples": 64}},
        "trainer": {"max_epochs": 2, "accelerator": "cpu", "devices": 1, "enable_progress_bar": False,
                    "enable_model_summary": False, "limit_val_batches": 2, "callbacks": callbacks},
        "compress": {"output_dir": str(out_dir), "eval_batch_sizes": [1, 2], "latency_warmup": 0,
                     "latency_repeats": 1, "max_eval_batches": 2, **compress_options},
    }


def write_recipe(path, recipe):
    path.write_text(yaml.safe_dump(recipe))
    return str(path)


def pruning(sparsity=0.5, start=0, end=4):
    return {"class_path": "compress.lightning.callbacks.BlockPruning",
            "init_args": {"sparsity": sparsity, "start_step": start, "end_step": end, "frequency": 2}}


def qat(config_class="W8A8Config", start=2, **config_args):
    return {"class_path": "compress.lightning.callbacks.QuantizationAware",
            "init_args": {"config": {"class_path": f"compress.configs.{config_class}", "init_args": config_args},
                          "start_step": start}}


def export(dirpath):
    return {"class_path": "compress.lightning.callbacks.Export", "init_args": {"dirpath": str(dirpath)}}


@pytest.fixture(scope="module")
def sparse_w8a8_run(tmp_path_factory):
    """One ``compress run`` with pruning + W8A8 QAT + export (shared by the tests below)."""
    root = tmp_path_factory.mktemp("run")
    recipe = tiny_recipe(root / "out", [pruning(), qat(), export(root / "out" / "compressed")], save_float_model=True)
    path = write_recipe(root / "recipe.yaml", recipe)
    assert run_command(["run", "--config", path]) == 0
    return root, path


def test_run_composes_pruning_qat_and_export(sparse_w8a8_run):
    root, _ = sparse_w8a8_run
    model = compress.load_compressed(root / "out" / "compressed")
    layers = [m for m in model.modules() if isinstance(m, compress.BSRW8A8Linear)]
    assert len(layers) == 6  # q, k, v, attention output, intermediate, output of the one layer
    for layer in layers:
        total = (layer.out_features // 32) * (layer.in_features // 32)
        assert layer.nnz == total // 2  # 50% of the 32x32 blocks pruned, the rest stored as int8


def test_run_writes_a_report_comparing_float_and_compressed(sparse_w8a8_run):
    root, _ = sparse_w8a8_run
    report = json.loads((root / "out" / "report.json").read_text())
    names = [m["name"] for m in report["models"]]
    assert names == ["float weights of this run", "compressed (out)"]
    float_model, compressed = report["models"]
    # q/k/v fused; it and both MLP layers take their input quantized by the LayerNorm / GELU before
    assert compressed["compression"] == ("BSRW8A8Linear x4, dense x2 "
                                         "(1 fused sibling group, 3 fed int8 by the norm / GELU before)")
    assert compressed["linear_weight_bytes"] < float_model["linear_weight_bytes"] / 2
    assert [p["batch_size"] for p in compressed["latency"]] == [1, 2]
    assert (root / "out" / "report.md").read_text().count("| float weights of this run |") == 1
    assert (root / "out" / "report.png").stat().st_size > 0
    assert report["latency_mode"] == "eager"  # the recipe asks cuda_graph (default); CPU times eager
    assert all(m["latency_mode"] == "eager" and m["latency_note"] == "" for m in report["models"])
    assert "Latency mode: eager" in (root / "out" / "report.md").read_text()
    assert report["reference_kernels"] is True  # on the CPU the compressed layers run the reference
    assert REFERENCE_NOTE in (root / "out" / "report.md").read_text()


def test_float_model_dir_holds_the_pruned_float_weights(sparse_w8a8_run):
    root, _ = sparse_w8a8_run
    float_model = compress.load_compressed(root / "out" / "float")
    compressed = compress.load_compressed(root / "out" / "compressed")
    name = "bert.encoder.layer.0.intermediate.dense"
    weight = float_model.get_submodule(name).weight
    dequantized = compressed.get_submodule(name).dequantized_weight()
    def zero_blocks(w):
        return w.detach().reshape(w.shape[0] // 32, 32, w.shape[1] // 32, 32).abs().amax(dim=(1, 3)) == 0

    assert torch.equal(zero_blocks(weight), zero_blocks(dequantized))
    assert zero_blocks(weight).float().mean().item() == pytest.approx(0.5)
    assert torch.allclose(weight, dequantized, atol=float(weight.abs().max()) / 127)


def test_the_float_model_dir_is_a_plain_float_checkpoint(tmp_path):
    """A GGUF source leaves quantization_config (quant_method gguf) on the model's config; the float/ dir
    must not keep it, or transformers and llm-compressor refuse the directory."""
    from transformers import AutoModelForSequenceClassification

    from compress.cli import save_float_model

    model = SequenceClassificationTask(config=TINY_BERT, num_labels=10).model.eval()
    model.config.quantization_config = {"quant_method": "gguf"}
    path = save_float_model(model, tmp_path / "out" / "float")
    config = json.loads((path / "config.json").read_text())
    assert "quantization_config" not in config and config["architectures"] == ["BertForSequenceClassification"]
    theirs = AutoModelForSequenceClassification.from_pretrained(str(path)).eval()
    assert all(torch.equal(theirs.state_dict()[n], t) for n, t in model.state_dict().items())
    assert save_float_model(model, path) == path  # the float/ of an earlier run is replaced


def test_export_from_the_lightning_checkpoint_matches_the_export_callback(sparse_w8a8_run):
    root, recipe = sparse_w8a8_run
    checkpoints = sorted((root / "out").rglob("*.ckpt"))
    assert checkpoints, "the run should have written a Lightning checkpoint"
    target = root / "from_ckpt"
    assert run_command(["export", "--config", recipe, "--ckpt_path", str(checkpoints[-1]),
                        "--export_dir", str(target)]) == 0
    ours = load_file(str(target / "model.safetensors"))
    reference = load_file(str(root / "out" / "compressed" / "model.safetensors"))
    assert ours.keys() == reference.keys()
    assert all(torch.equal(ours[k], reference[k]) for k in ours)


def test_export_replaces_an_earlier_export_only_with_overwrite(sparse_w8a8_run, tmp_path):
    root, recipe = sparse_w8a8_run
    checkpoint = str(sorted((root / "out").rglob("*.ckpt"))[-1])
    target = tmp_path / "again"
    assert run_command(["export", "--config", recipe, "--ckpt_path", checkpoint, "--export_dir", str(target)]) == 0
    before = (target / "model.safetensors").stat().st_mtime_ns
    with pytest.raises(FileExistsError, match=r"again: already holds a compressed checkpoint; pass --overwrite"):
        run_command(["export", "--config", recipe, "--ckpt_path", checkpoint, "--export_dir", str(target)])
    assert (target / "model.safetensors").stat().st_mtime_ns == before
    assert run_command(["export", "--config", recipe, "--ckpt_path", checkpoint, "--export_dir", str(target),
                 "--overwrite"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["again"]
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "important.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="not a compressed checkpoint .*even with --overwrite"):
        run_command(["export", "--config", recipe, "--ckpt_path", checkpoint, "--export_dir", str(tmp_path / "notes"),
              "--overwrite"])
    assert (tmp_path / "notes" / "important.txt").read_text() == "keep me"


def test_export_writes_compressed_tensors_that_transformers_loads(tmp_path):
    """W8A8 QAT only (the format holds no block-sparse layer): fit, then export --format compressed-tensors.
    Logits within 3e-2 relative: transformers' dynamic activation scale is max|x| / 127.5, ours max|x| / 127
    (tests/compress/checkpoint/compressed_tensors/test_save.py)."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("compressed_tensors")
    recipe = write_recipe(tmp_path / "recipe.yaml", tiny_recipe(tmp_path / "out", [qat(start=0)]))
    assert run_command(["fit", "--config", recipe]) == 0
    checkpoint = str(sorted((tmp_path / "out").rglob("*.ckpt"))[-1])
    target = tmp_path / "ct"
    assert run_command(["export", "--config", recipe, "--ckpt_path", checkpoint, "--export_dir", str(target),
                        "--format", "compressed-tensors"]) == 0
    config = json.loads((target / "config.json").read_text())
    assert config["quantization_config"]["format"] == "int-quantized"
    ours = compress.load_compressed(target)
    theirs = transformers.AutoModelForSequenceClassification.from_pretrained(str(target)).eval()
    ids = torch.randint(0, DigitsData.VOCAB_SIZE, (4, 66), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected, got = ours(input_ids=ids).logits, theirs(input_ids=ids).logits
    assert ((got - expected).norm() / expected.norm()).item() <= 3e-2


def test_export_to_compressed_tensors_refuses_block_sparse_layers_and_unknown_formats(sparse_w8a8_run, tmp_path):
    root, recipe = sparse_w8a8_run
    checkpoint = str(sorted((root / "out").rglob("*.ckpt"))[-1])
    with pytest.raises(ValueError, match=r"block-sparse layers bert\.encoder\.layer\.0\..* no block-sparse layout"):
        run_command(["export", "--config", recipe, "--ckpt_path", checkpoint, "--export_dir", str(tmp_path / "ct"),
                     "--format", "compressed-tensors"])
    with pytest.raises(ValueError,
                       match=r"--format: expected one of \('compress', 'compressed-tensors'\), got \['gguf'\]"):
        run_command(["export", "--config", recipe, "--ckpt_path", checkpoint, "--export_dir", str(tmp_path / "ct"),
                     "--format", "gguf"])
    assert list(tmp_path.iterdir()) == []


class _RunsCodeWhenUnpickled:
    """Unpickling calls ``pathlib.Path.touch(marker)``: the stand-in for any code a checkpoint could run."""

    def __init__(self, marker):
        self.marker = pathlib.Path(marker)

    def __reduce__(self):
        return (pathlib.Path.touch, (self.marker,))


def test_export_refuses_a_checkpoint_whose_pickle_would_run_code(tmp_path):
    marker = tmp_path / "code-ran"
    evil = tmp_path / "evil.ckpt"
    torch.save({"state_dict": {}, "hyper_parameters": {"x": _RunsCodeWhenUnpickled(marker)}}, evil)
    recipe = write_recipe(tmp_path / "recipe.yaml", tiny_recipe(tmp_path / "out", [qat()]))
    with pytest.raises(ValueError, match=r"evil.ckpt: refused to load: .*not plain data \(Unsupported global: "
                                         r"GLOBAL .*\); checkpoints are loaded without running") as error:
        run_command(["export", "--config", recipe, "--ckpt_path", str(evil), "--export_dir", str(tmp_path / "export")])
    assert "\n" not in str(error.value)  # one line: the one that matters
    assert not marker.exists()
    assert not (tmp_path / "export").exists()


def test_export_refuses_a_file_that_is_not_a_checkpoint(tmp_path):
    (tmp_path / "notes.ckpt").write_text("not a checkpoint")
    recipe = write_recipe(tmp_path / "recipe.yaml", tiny_recipe(tmp_path / "out", [qat()]))
    with pytest.raises(ValueError, match=r"notes.ckpt: expected a Lightning checkpoint written by torch.save"):
        run_command(["export", "--config", recipe, "--ckpt_path", str(tmp_path / "notes.ckpt")])
    torch.save([1, 2], tmp_path / "list.ckpt")
    with pytest.raises(ValueError, match=r"list.ckpt: expected a Lightning checkpoint with a 'state_dict', got list"):
        run_command(["export", "--config", recipe, "--ckpt_path", str(tmp_path / "list.ckpt")])


def test_a_lightning_checkpoint_naming_the_task_by_its_flat_path_loads(sparse_w8a8_run, tmp_path):
    """LightningCLI stores the task's class path in the checkpoint; one written when the task lived in
    ``compress.tasks`` still loads through Lightning's own ``load_from_checkpoint``."""
    root, _ = sparse_w8a8_run
    state = torch.load(sorted((root / "out").rglob("*.ckpt"))[-1], map_location="cpu", weights_only=True)
    assert state["hyper_parameters"]["_class_path"] == "compress.lightning.tasks.SequenceClassificationTask"
    state["hyper_parameters"]["_class_path"] = "compress.tasks.SequenceClassificationTask"
    torch.save(state, tmp_path / "flat.ckpt")
    task = SequenceClassificationTask.load_from_checkpoint(tmp_path / "flat.ckpt", weights_only=True,
                                                           strict=False)  # no prepared layers: no masks, scales
    assert type(task) is SequenceClassificationTask and task.model.config.num_labels == 10


def test_run_resumes_from_a_checkpoint(sparse_w8a8_run, tmp_path):
    """Resumed from the finished run's checkpoint with another seed, the run trains no step (its 2
    epochs are done) and exports the same model; started afresh with that seed it would not."""
    root, _ = sparse_w8a8_run
    checkpoint = sorted((root / "out").rglob("*.ckpt"))[-1]
    recipe = tiny_recipe(tmp_path / "out", [pruning(), qat(), export(tmp_path / "out" / "compressed")], evaluate=False)
    path = write_recipe(tmp_path / "recipe.yaml", recipe)
    assert run_command(["run", "--config", path, "--seed_everything=1", "--ckpt_path", str(checkpoint)]) == 0
    resumed = load_file(str(tmp_path / "out" / "compressed" / "model.safetensors"))
    reference = load_file(str(root / "out" / "compressed" / "model.safetensors"))
    assert resumed.keys() == reference.keys()
    assert all(torch.equal(resumed[k], reference[k]) for k in resumed)


@pytest.mark.parametrize("ckpt_args,words", [(["--ckpt_path", "missing.ckpt"], "existing Lightning checkpoint file"),
                                             (["--ckpt_path", "a.ckpt", "b.ckpt"], "at most one")])
@pytest.mark.parametrize("command", ["run", "export"])
def test_run_and_export_refuse_a_bad_ckpt_path_first(tmp_path, ckpt_args, words, command):
    path = write_recipe(tmp_path / "recipe.yaml", tiny_recipe(tmp_path / "out", [pruning()]))
    with pytest.raises(ValueError, match=words):
        run_command([command, "--config", path, *ckpt_args])
    assert not (tmp_path / "out").exists()  # nothing trained, nothing written


def test_export_needs_a_ckpt_path(tmp_path):
    path = write_recipe(tmp_path / "recipe.yaml", tiny_recipe(tmp_path / "out", [pruning()]))
    with pytest.raises(ValueError, match="expected one --ckpt_path CHECKPOINT, got none"):
        run_command(["export", "--config", path])


def test_export_help_lists_its_options_without_a_recipe(capsys):
    assert run_command(["export", "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: compress export --config RECIPE --ckpt_path CKPT")
    assert all(option in out for option in ("--export_dir DIR", "--overwrite", "--format F"))
    assert run_command(["export", "-h"]) == 0 and capsys.readouterr().out == out


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
    with caplog.at_level(logging.INFO, logger="compress.cli"):
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


def test_unknown_latency_mode_fails_listing_the_allowed_ones(tmp_path, capsys):
    with pytest.raises(ValueError,
                       match=r"compress.latency_mode: expected one of \['cuda_graph', 'eager', 'compile'\]"):
        CompressOptions(latency_mode="graphs")
    recipe = tiny_recipe(tmp_path / "out", [], latency_mode="cuda_graphs")
    with pytest.raises((ValueError, SystemExit)) as error:
        run_command(["run", "--config", write_recipe(tmp_path / "r.yaml", recipe)])
    message = str(error.value) + capsys.readouterr().err
    assert "latency_mode" in message and "cuda_graph" in message and "'eager'" in message
    assert not list(tmp_path.rglob("*.ckpt"))


def test_unknown_recipe_key_fails_while_parsing(tmp_path):
    recipe = tiny_recipe(tmp_path / "out", [])
    recipe["model"]["init_args"]["hidden_sise"] = 3
    refused = r"^model > SequenceClassificationTask > Option 'hidden_sise' is not accepted$"
    with pytest.raises(RecipeError, match=refused):
        run_command(["run", "--config", write_recipe(tmp_path / "r.yaml", recipe)])
    assert not (tmp_path / "out").exists()


def test_sparsity_outside_the_unit_interval_fails_before_training(tmp_path, capsys):
    """The one line that matters, not jsonargparse's report of every type the callbacks list failed to be."""
    recipe = tiny_recipe(tmp_path / "out", [pruning(sparsity=1.5)])
    assert main(["run", "--config", write_recipe(tmp_path / "r.yaml", recipe)]) == 1
    err = capsys.readouterr().err
    assert err.rstrip("\n").splitlines()[-1] == ("compress run: error: RecipeError: sparsity: expected a fraction in "
                                                "[0, 1), got 1.5")
    assert "Traceback" not in err and "Union" not in err
    assert not list(tmp_path.rglob("*.ckpt"))


@pytest.mark.parametrize("callback, expected", [
    (qat(group_size=-3), "trainer.callbacks > QuantizationAware > config > W8A8Config > Option 'group_size' is "
                         "not accepted"),
    ("not a callback", "trainer.callbacks > "),
])
def test_a_bad_callback_is_told_by_the_keys_and_classes_that_lead_to_it(tmp_path, callback, expected):
    recipe = tiny_recipe(tmp_path / "out", [callback])
    with pytest.raises(RecipeError) as error:
        run_command(["run", "--config", write_recipe(tmp_path / "r.yaml", recipe)])
    assert str(error.value).startswith(expected) and "Subtypes" not in str(error.value)


def test_compress_traceback_keeps_the_parsers_full_report(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("COMPRESS_TRACEBACK", "1")
    recipe = tiny_recipe(tmp_path / "out", [pruning(sparsity=1.5)])
    assert main(["run", "--config", write_recipe(tmp_path / "r.yaml", recipe)]) == 1
    err = capsys.readouterr().err
    assert "Does not validate against any of the Union subtypes" in err  # in the traceback's chain
    assert err.rstrip("\n").splitlines()[-1].endswith("RecipeError: sparsity: expected a fraction in [0, 1), got 1.5")


@pytest.mark.parametrize("value", ["yes", "2", "true"])
def test_an_unusable_compress_traceback_is_refused_before_the_command_runs(tmp_path, monkeypatch, capsys, value):
    monkeypatch.setenv("COMPRESS_TRACEBACK", value)
    recipe = write_recipe(tmp_path / "r.yaml", tiny_recipe(tmp_path / "out", []))
    assert main(["run", "--config", recipe]) == 1
    assert capsys.readouterr().err == (f"compress run: error: ValueError: $COMPRESS_TRACEBACK='{value}': expected 0 "
                                       "or 1 (1: print the traceback of every error)\n")
    assert not (tmp_path / "out").exists()


ABBREVIATED = ["--trainer.max_epoch=1", "--data.init_args.batch_siz=4", "--compress.output_di=x"]


@pytest.mark.parametrize("command, option", [(command, option) for command in ("run", "fit", "validate", "export")
                                             for option in ABBREVIATED] + [("evaluate", ABBREVIATED[1]),
                                                                           ("evaluate", ABBREVIATED[2])])
def test_abbreviated_options_are_refused_naming_the_option(tmp_path, command, option):
    """``--trainer.max_epoch`` is not ``--trainer.max_epochs``: every parser, nested ones included, refuses it."""
    recipe = write_recipe(tmp_path / "r.yaml", tiny_recipe(tmp_path / "out", [pruning()]))
    torch.save({"state_dict": {}}, tmp_path / "empty.ckpt")  # export reads its checkpoint first
    extra = {"export": ["--ckpt_path", str(tmp_path / "empty.ckpt")], "evaluate": ["--models", str(tmp_path)]}
    name = option.split("=")[0].split(".")[-1]
    with pytest.raises(RecipeError, match=rf"^(unrecognized arguments: {re.escape(option)}|"
                                          rf"data > DigitsData > Option '{name}' is not accepted)$"):
        run_command([command, "--config", recipe, *extra.get(command, []), option])
    assert not (tmp_path / "out").exists()


def test_an_alias_bomb_recipe_fails_fast_naming_the_file(tmp_path, capsys):
    from tests.compress.lightning.test_recipe_yaml import alias_bomb

    path = tmp_path / "bomb.yaml"
    path.write_text(yaml.safe_dump(tiny_recipe(tmp_path / "out", [])) + alias_bomb())
    started = time.perf_counter()
    assert main(["run", "--config", str(path)]) == 1
    assert time.perf_counter() - started < 2.0
    last = capsys.readouterr().err.rstrip("\n").splitlines()[-1]
    assert last.startswith(f"compress run: error: RecipeFileError: {path}: expected at most 10000 YAML nodes")
    path.write_text(yaml.safe_dump(tiny_recipe(tmp_path / "out", [])))
    started = time.perf_counter()  # a bomb given on the command line goes through the same bound
    with pytest.raises(RecipeError, match="trainer.callbacks > .*expected at most 10000 YAML nodes"):
        run_command(["run", "--config", str(path), f"--trainer.callbacks={alias_bomb()}"])
    assert time.perf_counter() - started < 2.0


@pytest.mark.parametrize("command", ["run", "evaluate"])
def test_a_binary_or_unreadable_recipe_is_refused_naming_the_file(tmp_path, command):
    (tmp_path / "binary.yaml").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00")
    (tmp_path / "folder.yaml").mkdir()
    extra = ["--models", str(tmp_path)] if command == "evaluate" else []
    with pytest.raises(ValueError, match=r"binary.yaml: expected a UTF-8 text YAML recipe, got bytes that are not "
                                         r"text \(byte 0x89 at offset 0\)"):
        run_command([command, "--config", str(tmp_path / "binary.yaml"), *extra])
    with pytest.raises(ValueError, match=r"folder.yaml: expected a regular file, got a directory"):
        run_command([command, "--config", str(tmp_path / "folder.yaml"), *extra])
    os.mkfifo(tmp_path / "pipe.yaml")  # would block a plain open() for ever
    with pytest.raises(ValueError, match=r"pipe.yaml: expected a regular file, got a named pipe"):
        run_command([command, "--config", str(tmp_path / "pipe.yaml"), *extra])
    with pytest.raises(ValueError, match=r"config > File does not exist: '.*missing.yaml'"):
        run_command([command, "--config", str(tmp_path / "missing.yaml"), *extra])


@pytest.mark.parametrize("scheme, bits", [("W4A16", "int4"), ("W8A16", "int8")])
def test_group_size_that_does_not_divide_in_features_pads_with_a_warning(scheme, bits, tmp_path, caplog):
    recipe = tiny_recipe(tmp_path / "out", [qat(f"{scheme}Config", group_size=128)])  # in_features 64 and 128
    cli = CompressCLI(args=["--config", write_recipe(tmp_path / "r.yaml", recipe)], run=False)
    with caplog.at_level(logging.WARNING, logger="compress.cli"):
        check_recipe(cli.model, cli.trainer.callbacks)
    assert re.search(rf"{scheme} group_size=128 does not divide in_features=64 of layer '.*': K is padded with zero "
                     rf"channels to 128 \(100% more {bits} weights there\)", caplog.text)


def test_recipe_checks_read_the_sizes_of_gpt2_conv1d_layers(caplog):
    """Conv1D holds its weight as (in, out): the checks read (in, out) from nx / nf, before prepare."""
    from torch import nn
    from transformers import GPT2Config, GPT2LMHeadModel

    from compress.lightning.callbacks import BlockPruning, QuantizationAware

    task = nn.Module()
    task.model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=16, n_embd=48, n_layer=1, n_head=2))
    callbacks = [QuantizationAware(config=compress.W4A16Config(group_size=128)), BlockPruning(sparsity=0.5)]
    with caplog.at_level(logging.WARNING, logger="compress.cli"):
        check_recipe(task, callbacks)
    assert ("group_size=128 does not divide in_features=48 of layer 'transformer.h.0.attn.c_attn': K is padded "
            "with zero channels to 128") in caplog.text
    assert "layer 'transformer.h.0.attn.c_attn' (144x48) is not a multiple of 32 blocks" in caplog.text
    with pytest.raises(ValueError, match=r"linear layers \(nn.Linear, Conv1D\): \['transformer.h.0.attn.c_attn'"):
        check_recipe(task, [QuantizationAware(plan={"nothing.*": compress.W8A8Config()})])


def test_usage_and_unknown_command(capsys):
    assert run_command(["--help"]) == 0
    assert "compress run" in capsys.readouterr().out
    assert run_command(["bogus"]) == 2
    assert "unknown command" in capsys.readouterr().err


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


def test_a_bad_input_prints_one_line_last_and_exits_1(tmp_path, capsys):
    (tmp_path / "notes.ckpt").write_text("not a checkpoint")
    recipe = write_recipe(tmp_path / "recipe.yaml", tiny_recipe(tmp_path / "out", [qat()]))
    assert main(["export", "--config", recipe, "--ckpt_path", str(tmp_path / "notes.ckpt")]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.rstrip("\n").splitlines()[-1].startswith(
        "compress export: error: ValueError: " + str(tmp_path / "notes.ckpt") + ": expected a Lightning checkpoint")


def test_an_unexpected_error_prints_the_traceback_then_the_line(monkeypatch, capsys):
    import compress.cli as cli

    def broken(command, rest):
        raise RuntimeError("disk\non fire")

    monkeypatch.setattr(cli, "_dispatch", broken)
    assert main(["run", "--config", "r.yaml"]) == 1
    lines = capsys.readouterr().err.rstrip("\n").splitlines()
    assert lines[0] == "Traceback (most recent call last):"
    assert lines[-1] == "compress run: error: RuntimeError: disk on fire"


def test_compress_traceback_shows_the_traceback_of_bad_inputs_too(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("COMPRESS_TRACEBACK", "1")
    (tmp_path / "notes.ckpt").write_text("not a checkpoint")
    recipe = write_recipe(tmp_path / "recipe.yaml", tiny_recipe(tmp_path / "out", [qat()]))
    assert main(["export", "--config", recipe, "--ckpt_path", str(tmp_path / "notes.ckpt")]) == 1
    lines = capsys.readouterr().err.rstrip("\n").splitlines()
    assert "Traceback (most recent call last):" in lines
    assert lines[-1].startswith("compress export: error: ValueError: ")
