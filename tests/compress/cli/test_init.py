"""Tests for compress/cli/__init__.py, the entry point: usage, unknown commands, and how errors are reported
(one line last for a bad input, the traceback first for anything else or with COMPRESS_TRACEBACK=1)."""

import pytest

from compress.cli import main, run_command
from tests.compress.cli.helpers import qat, tiny_recipe, write_recipe


def test_usage_and_unknown_command(capsys):
    assert run_command(["--help"]) == 0
    assert "compress run" in capsys.readouterr().out
    assert run_command(["bogus"]) == 2
    assert "unknown command" in capsys.readouterr().err


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


@pytest.mark.parametrize("value", ["yes", "2", "true"])
def test_an_unusable_compress_traceback_is_refused_before_the_command_runs(tmp_path, monkeypatch, capsys, value):
    monkeypatch.setenv("COMPRESS_TRACEBACK", value)
    recipe = write_recipe(tmp_path / "r.yaml", tiny_recipe(tmp_path / "out", []))
    assert main(["run", "--config", recipe]) == 1
    assert capsys.readouterr().err == (f"compress run: error: ValueError: $COMPRESS_TRACEBACK='{value}': expected 0 "
                                       "or 1 (1: print the traceback of every error)\n")
    assert not (tmp_path / "out").exists()
