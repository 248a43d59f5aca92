"""``compress run`` under FSDP2: a recipe whose trainer section names ``ModelParallelStrategy`` on 2 CPU
processes (gloo), run as the command itself (Lightning starts the second rank by running the same
command line again; 2 steps per epoch), then resumed from its sharded checkpoint directory. The tiny Bert
of tests/compress/cli/helpers.py is sharded by SequenceClassificationTask.configure_model (each BertLayer
and BertEmbeddings, then the model); pruning and W8A8 QAT; the export and the report are written by rank 0."""
import json
import os
import pathlib
import subprocess
import sys

import pytest

import compress
from tests.compress.cli.helpers import export, pruning, qat, tiny_recipe, write_recipe

REPO = pathlib.Path(__file__).resolve().parents[3]
FSDP = {"class_path": "lightning.pytorch.strategies.ModelParallelStrategy",
        "init_args": {"data_parallel_size": 2, "tensor_parallel_size": 1}}


def compress_command(*args):
    env = dict(os.environ, PYTHONPATH=f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "compress.cli", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=600)


@pytest.fixture(scope="module")
def fsdp_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("fsdp-run")
    recipe = tiny_recipe(root / "out", [pruning(end=2), qat(start=2), export(root / "out" / "compressed")])
    recipe["trainer"].update(devices=2, strategy=FSDP)
    path = write_recipe(root / "recipe.yaml", recipe)
    result = compress_command("run", "--config", path)
    assert result.returncode == 0, result.stderr[-3000:]
    return root, path


@pytest.mark.slow
def test_compress_run_trains_exports_and_reports_under_fsdp(fsdp_run):
    root, _ = fsdp_run
    model = compress.load_compressed(root / "out" / "compressed")
    layers = [m for m in model.modules() if isinstance(m, compress.BSRW8A8Linear)]
    assert len(layers) == 6
    assert all(layer.nnz == (layer.out_features // 32) * (layer.in_features // 32) // 2 for layer in layers)
    report = json.loads((root / "out" / "report.json").read_text())
    assert [m["name"] for m in report["models"]] == ["float weights of this run", "compressed (out)"]


@pytest.mark.slow
def test_compress_run_resumes_from_the_sharded_checkpoint_directory(fsdp_run):
    root, path = fsdp_run
    checkpoint = next((root / "out").glob("lightning_logs/*/checkpoints/*.ckpt"))
    assert checkpoint.is_dir() and (checkpoint / "meta.pt").is_file()  # sharded: one file per rank + meta.pt
    result = compress_command("run", "--config", path, "--ckpt_path", str(checkpoint), "--trainer.max_epochs=3",
                              "--compress.evaluate=false", "--overwrite")  # the first run's export is replaced
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Restored all states from the checkpoint" in result.stderr
    assert compress.load_compressed(root / "out" / "compressed") is not None
