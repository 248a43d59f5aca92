"""Tests for compress/lightning/tasks.py: models from a config or pretrained weights, saved float dirs,
the optimizer and a short fit that logs the validation metrics."""
import lightning.pytorch as pl
import pytest
import torch

from compress.lightning.data import DigitsData
from compress.lightning.paths import MINILM_NAME
from compress.lightning.tasks import CausalLMTask, SequenceClassificationTask

TINY_BERT = {
    "model_type": "bert", "vocab_size": DigitsData.VOCAB_SIZE, "hidden_size": 64, "num_hidden_layers": 1,
    "num_attention_heads": 2, "intermediate_size": 128, "max_position_embeddings": 80, "type_vocab_size": 1,
}
TINY_LLAMA = {
    "model_type": "llama", "vocab_size": 50, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
    "num_attention_heads": 2, "num_key_value_heads": 2, "max_position_embeddings": 64,
}


def test_classification_task_from_config():
    task = SequenceClassificationTask(config=TINY_BERT, num_labels=10)
    assert type(task.model).__name__ == "BertForSequenceClassification"
    assert task.model.config.num_labels == 10 and task.model.config.hidden_size == 64
    batch = {"input_ids": torch.randint(0, 19, (3, 65)), "labels": torch.tensor([0, 5, 9])}
    loss = task.training_step(batch, 0)
    assert torch.isfinite(loss) and loss.requires_grad


def test_model_source_must_be_exactly_one():
    with pytest.raises(ValueError, match="exactly one"):
        SequenceClassificationTask()
    with pytest.raises(ValueError, match="exactly one"):
        SequenceClassificationTask(model_name_or_path="x", config=TINY_BERT)
    with pytest.raises(ValueError, match="model_type"):
        SequenceClassificationTask(config={"hidden_size": 8})
    with pytest.raises(ValueError, match="num_labels"):
        SequenceClassificationTask(config=TINY_BERT, num_labels=1)
    with pytest.raises(ValueError, match="learning_rate"):
        SequenceClassificationTask(config=TINY_BERT, learning_rate=0.0)


def test_pretrained_minilm_loads_in_float32(monkeypatch):
    monkeypatch.delenv("MINILM_DIR", raising=False)
    task = SequenceClassificationTask(model_name_or_path=MINILM_NAME, num_labels=2)
    assert task.model.config.hidden_size == 384
    assert all(p.dtype == torch.float32 for p in task.model.parameters())


def test_a_gguf_file_is_read_with_gguf_file_and_cast_to_the_tasks_dtype(monkeypatch, tmp_path):
    from compress.lightning import paths
    from compress.lightning.tasks import build_model

    gguf = tmp_path / "model.Q4_1.gguf"
    gguf.write_bytes(b"GGUF")
    calls = []

    class FakeAutoModel:
        @staticmethod
        def from_pretrained(path, **kwargs):
            calls.append((path, kwargs))
            return torch.nn.Linear(4, 4).to(torch.float16).eval()

    monkeypatch.setattr(paths.importlib.util, "find_spec", lambda name, *args: object())  # gguf, accelerate
    model = build_model(FakeAutoModel, str(gguf), None, "float32")
    assert calls == [(str(tmp_path), {"dtype": torch.float32, "gguf_file": "model.Q4_1.gguf"})]
    assert model.weight.dtype == torch.float32 and model.training


def test_model_from_a_saved_float_dir_keeps_its_weights(tmp_path):
    import compress

    first = SequenceClassificationTask(config=TINY_BERT, num_labels=10)
    saved = compress.save_compressed(first.model, tmp_path / "float", float_model=True)
    task = SequenceClassificationTask(model_name_or_path=str(saved), num_labels=10)
    assert task.model.training, "a model to fine-tune must come back in train mode (dropout on)"
    for name, tensor in first.model.state_dict().items():
        assert torch.equal(task.model.state_dict()[name], tensor), name
    with pytest.raises(ValueError, match="num_labels=3"):
        SequenceClassificationTask(model_name_or_path=str(saved), num_labels=3)


def test_a_float_dir_whose_manifest_is_a_pipe_is_refused_without_blocking(tmp_path):
    import os

    import compress
    from tests.compress.checkpoint.test_files import fails_instead_of_hanging

    saved = compress.save_compressed(SequenceClassificationTask(config=TINY_BERT, num_labels=10).model,
                                     tmp_path / "float", float_model=True)
    (saved / "manifest.json").unlink()
    os.mkfifo(saved / "manifest.json")
    with fails_instead_of_hanging(), pytest.raises(compress.CheckpointError, match=r"float/manifest\.json: expected "
                                                                                   "a regular file, got a named pipe"):
        SequenceClassificationTask(model_name_or_path=str(saved), num_labels=10)


def test_model_from_a_compressed_dir_is_refused(tmp_path):
    import compress

    model = SequenceClassificationTask(config=TINY_BERT, num_labels=10).model
    compress.convert(model, compress.W8A8Config())
    saved = compress.save_compressed(model, tmp_path / "w8a8")
    with pytest.raises(ValueError, match="expected float weights"):
        SequenceClassificationTask(model_name_or_path=str(saved), num_labels=10)


def test_short_fit_logs_metrics_and_warms_up_the_learning_rate(tmp_path):
    task = SequenceClassificationTask(config=TINY_BERT, num_labels=10, learning_rate=1e-3, warmup_ratio=0.5)
    data = DigitsData(batch_size=16, max_train_samples=64)
    trainer = pl.Trainer(max_epochs=1, limit_val_batches=2, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path)
    trainer.fit(task, datamodule=data)
    assert {"val_accuracy", "val_f1", "val_loss", "train_loss"} <= set(trainer.callback_metrics)
    assert 0.0 <= float(trainer.callback_metrics["val_accuracy"]) <= 1.0
    scheduler = trainer.lr_scheduler_configs[0].scheduler
    # 4 steps, 2 of warm-up: the learning rate went up to the peak and back down to 0
    assert scheduler.get_last_lr()[0] == pytest.approx(0.0)
    assert trainer.optimizers[0].param_groups[1]["weight_decay"] == 0.0  # biases and norms


def test_learnable_group_scales_get_no_weight_decay():
    from compress.configs import W4A16Config
    from compress.lightning.callbacks import QuantizationAware

    task = CausalLMTask(config=TINY_LLAMA, weight_decay=0.1)
    trainer = pl.Trainer(max_steps=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, accelerator="cpu",
                         callbacks=[QuantizationAware(W4A16Config(32, learnable_scale=True))])
    ids = torch.randint(0, 50, (4, 16))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}
    trainer.fit(task, torch.utils.data.DataLoader([batch], batch_size=None))
    decayed, not_decayed = (group["params"] for group in trainer.optimizers[0].param_groups)
    scales = [p for name, p in task.model.named_parameters() if name.endswith("weight_scale")]
    assert scales and all(p.dim() == 2 for p in scales)  # (N, K/G): 2-D like a weight
    assert all(any(p is q for q in not_decayed) for p in scales)
    assert not any(any(p is q for q in decayed) for p in scales)


def test_causal_lm_task_step():
    task = CausalLMTask(config=TINY_LLAMA)
    ids = torch.randint(0, 50, (2, 16))
    loss = task.training_step({"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}, 0)
    assert torch.isfinite(loss)
    task.validation_step({"input_ids": ids, "labels": ids}, 0)
    assert task.val_metrics.compute()["perplexity"] > 1.0


class _DataParallelMesh:
    """Stands for ModelParallelStrategy's (data_parallel, tensor_parallel) mesh, tensor parallel of size 1."""

    def __getitem__(self, name):
        return type("Mesh", (), {"size": lambda self: 1, "ndim": 1})()


def test_configure_model_refuses_distillation_under_fsdp_and_shards_nothing_elsewhere():
    task = SequenceClassificationTask(config=TINY_BERT, num_labels=10, distillation={"alpha": 0.5})
    task.configure_model()  # no device mesh: not ModelParallelStrategy, nothing to do
    task._device_mesh = _DataParallelMesh()
    with pytest.raises(ValueError, match="distillation is not supported under FSDP"):
        task.configure_model()
