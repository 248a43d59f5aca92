"""Tests for compress/cli/export.py: ``compress export`` gives the Export callback's model from the Lightning
checkpoint, replaces an earlier export only with --overwrite, writes compressed-tensors that transformers
loads, and lists its options."""
import json

import pytest
import torch
from safetensors.torch import load_file

import compress
from compress.cli import run_command
from compress.lightning.data import DigitsData
from tests.compress.cli.helpers import pruning, qat, tiny_recipe, write_recipe


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
