"""Tests for compress/cli/checkpoints.py: --ckpt_path is checked before anything trains, a sharded (FSDP2)
directory is taken by run and refused by export, and checkpoints are read with weights_only=True (a pickle
that would run code is refused without running it)."""
import pathlib

import pytest
import torch

from compress.cli import run_command
from compress.cli.checkpoints import checkpoint_option
from tests.compress.cli.helpers import pruning, qat, tiny_recipe, write_recipe


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


@pytest.mark.parametrize("ckpt_args,words", [(["--ckpt_path", "missing.ckpt"], "existing Lightning checkpoint file"),
                                             (["--ckpt_path", "a.ckpt", "b.ckpt"], "at most one")])
@pytest.mark.parametrize("command", ["run", "export"])
def test_run_and_export_refuse_a_bad_ckpt_path_first(tmp_path, ckpt_args, words, command):
    path = write_recipe(tmp_path / "recipe.yaml", tiny_recipe(tmp_path / "out", [pruning()]))
    with pytest.raises(ValueError, match=words):
        run_command([command, "--config", path, *ckpt_args])
    assert not (tmp_path / "out").exists()  # nothing trained, nothing written


def test_run_takes_a_sharded_checkpoint_directory_and_export_refuses_it(tmp_path):
    (tmp_path / "sharded").mkdir()
    (tmp_path / "sharded" / "meta.pt").write_bytes(b"")
    args = ["--ckpt_path", str(tmp_path / "sharded")]
    assert checkpoint_option(args, "run", sharded=True) == (str(tmp_path / "sharded"), [])
    with pytest.raises(ValueError, match="sharded \\(FSDP2\\) checkpoint directory.*dcp_to_torch_save"):
        checkpoint_option(args, "export")
    (tmp_path / "plain").mkdir()
    with pytest.raises(ValueError, match="expected an existing Lightning checkpoint file or sharded checkpoint"):
        checkpoint_option(["--ckpt_path", str(tmp_path / "plain")], "run", sharded=True)
