"""Tests for compress/cli/run.py: ``compress run`` composes pruning, QAT and export end to end on a tiny
model, writes the float model and a report comparing it with the export, resumes from a checkpoint, and
refuses to replace an earlier run's results without ``--overwrite``."""
import json

import pytest
import torch
from safetensors.torch import load_file

import compress
from compress.cli import run_command
from compress.cli.run import save_float_model
from compress.eval.report import REFERENCE_NOTE
from compress.lightning.tasks import SequenceClassificationTask
from tests.compress.cli.helpers import TINY_BERT, export, pruning, qat, tiny_recipe, write_recipe


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

    model = SequenceClassificationTask(config=TINY_BERT, num_labels=10).model.eval()
    model.config.quantization_config = {"quant_method": "gguf"}
    path = save_float_model(model, tmp_path / "out" / "float")
    config = json.loads((path / "config.json").read_text())
    assert "quantization_config" not in config and config["architectures"] == ["BertForSequenceClassification"]
    theirs = AutoModelForSequenceClassification.from_pretrained(str(path)).eval()
    assert all(torch.equal(theirs.state_dict()[n], t) for n, t in model.state_dict().items())
    assert save_float_model(model, path) == path  # the float/ of an earlier run is replaced


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


def test_a_second_run_into_the_same_output_dir_is_refused_before_training(sparse_w8a8_run, monkeypatch):
    """The finished run's export, float/ and report stay; --overwrite replaces them (checked up to the fit)."""
    root, path = sparse_w8a8_run
    before = (root / "out" / "report.json").read_text()
    fitted = []
    monkeypatch.setattr("lightning.pytorch.Trainer.fit", lambda *a, **k: fitted.append(True) or 1 / 0)
    with pytest.raises(FileExistsError, match=r"compressed: already holds a compressed checkpoint; pass --overwrite"):
        run_command(["run", "--config", path])
    assert fitted == [] and (root / "out" / "report.json").read_text() == before
    with pytest.raises(ZeroDivisionError):  # with the flag the run goes on to the (stubbed) fit
        run_command(["run", "--config", path, "--overwrite"])
    assert fitted == [True]


def test_a_report_or_float_dir_of_an_earlier_run_is_refused_too(tmp_path, monkeypatch):
    monkeypatch.setattr("lightning.pytorch.Trainer.fit", lambda *a, **k: 1 / 0)
    path = write_recipe(tmp_path / "recipe.yaml", tiny_recipe(tmp_path / "out", [pruning()]))  # no export: float/
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "report.md").write_text("earlier")
    with pytest.raises(FileExistsError, match=r"holds an earlier report .*report.md.*pass --overwrite"):
        run_command(["run", "--config", path])
    (tmp_path / "out" / "report.md").unlink()
    (tmp_path / "out" / "float").mkdir()
    (tmp_path / "out" / "float" / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="non-empty directory that is not a compressed checkpoint"):
        run_command(["run", "--config", path, "--overwrite"])  # never replaced, even with the flag
    with pytest.raises(ValueError, match="--overwrite is a flag and takes no value"):
        run_command(["run", "--config", path, "--overwrite=yes"])
