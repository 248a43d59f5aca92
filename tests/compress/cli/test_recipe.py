"""Tests for compress/cli/recipe.py: bad recipes fail while parsing, told by the one message that matters
(unknown keys, bad values, abbreviated options, unbounded or unreadable files), and the recipe checks log
what a layer's shape costs (group-size padding, blocks that do not tile it)."""
import logging
import os
import re
import time

import pytest
import torch
import yaml

import compress
from compress.cli import CompressCLI, CompressOptions, RecipeError, check_recipe, main, run_command
from tests.compress.cli.helpers import pruning, qat, tiny_recipe, write_recipe


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
    with caplog.at_level(logging.WARNING, logger="compress.cli.recipe"):
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
    with caplog.at_level(logging.WARNING, logger="compress.cli.recipe"):
        check_recipe(task, callbacks)
    assert ("group_size=128 does not divide in_features=48 of layer 'transformer.h.0.attn.c_attn': K is padded "
            "with zero channels to 128") in caplog.text
    assert "layer 'transformer.h.0.attn.c_attn' (144x48) is not a multiple of 32 blocks" in caplog.text
    with pytest.raises(ValueError, match=r"linear layers \(nn.Linear, Conv1D\): \['transformer.h.0.attn.c_attn'"):
        check_recipe(task, [QuantizationAware(plan={"nothing.*": compress.W8A8Config()})])
