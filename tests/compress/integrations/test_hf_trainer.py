"""Tests for compress/integrations/hf_trainer.py: the ``transformers`` Trainer drives a
CompressionSchedule (pruning by movement, W8A8 QAT; GPTQ at the end), its export computes what the
trained model computed, and a run resumed from a Trainer checkpoint ends with the uninterrupted run's
masks and weights."""
import shutil

import pytest
import torch

import compress
from compress import CompressionSchedule, PruningSchedule, QuantizationSchedule, W4A16Config, W8A8Config
from compress.nn.qat import compressed_layers

pytest.importorskip("accelerate", reason="the transformers Trainer needs accelerate")
from compress.integrations.hf_trainer import STATE_FILE, CompressionCallback  # noqa: E402


def tiny_bert():
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    config = BertConfig(vocab_size=40, hidden_size=64, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=128, max_position_embeddings=32, num_labels=3)
    return BertForSequenceClassification(config)


def samples(count=64):
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(1, 40, (count, 16), generator=generator)
    return [{"input_ids": row, "labels": row[:3].sum() % 3} for row in ids]


def schedule_for(model):
    return CompressionSchedule(model, pruning=PruningSchedule(0.5, start_step=1, end_step=5, frequency=1,
                                                               score="movement"),
                               quantization=QuantizationSchedule(W8A8Config(), start_step=3))


def trainer_for(model, callback, output_dir, max_steps=6):
    from transformers import Trainer, TrainingArguments

    args = TrainingArguments(output_dir=str(output_dir), max_steps=max_steps, per_device_train_batch_size=8,
                             learning_rate=1e-3, save_strategy="steps", save_steps=3, report_to="none",
                             use_cpu=True, seed=0, disable_tqdm=True, logging_strategy="no")
    return Trainer(model=model, args=args, train_dataset=samples(), callbacks=[callback])


def test_the_trainer_drives_the_schedule_and_the_export_computes_the_same(tmp_path):
    model = tiny_bert()
    schedule = schedule_for(model)
    trainer_for(model, CompressionCallback(schedule), tmp_path).train()
    assert schedule.global_step == 6 and schedule.finished
    layers = compressed_layers(model)
    assert len(layers) == 6  # query, key, value, attention output, intermediate, output
    for layer in layers.values():
        assert (~layer.mask).float().mean().item() == pytest.approx(0.5) and layer.fake_quant_enabled
    assert all(total.any() for total in schedule.pruning.gradient_scores.values())
    saved = torch.load(tmp_path / "checkpoint-3" / STATE_FILE, weights_only=True)
    assert saved["global_step"] == 3 and saved["pruning"]["last_pruned_step"] == 3
    ids = torch.randint(1, 40, (2, 16))
    model.eval()
    with torch.no_grad():
        trained = model(input_ids=ids).logits
        compress.convert(model)
        torch.testing.assert_close(model(input_ids=ids).logits, trained, atol=1e-3, rtol=1e-3)


def test_a_resumed_trainer_ends_like_the_uninterrupted_run(tmp_path):
    model = tiny_bert()
    trainer_for(model, CompressionCallback(schedule_for(model)), tmp_path / "full").train()

    resumed_dir = tmp_path / "resumed"
    shutil.copytree(tmp_path / "full" / "checkpoint-3", resumed_dir / "checkpoint-3")
    resumed = tiny_bert()
    schedule = schedule_for(resumed)
    trainer_for(resumed, CompressionCallback(schedule), resumed_dir).train(resume_from_checkpoint=True)
    assert schedule.global_step == 6
    for name, tensor in model.state_dict().items():  # weights, masks, observer statistics
        assert torch.equal(resumed.state_dict()[name], tensor), name
    assert sum(name.endswith(".mask") for name in model.state_dict()) == 6


def test_resuming_without_the_schedule_state_is_a_clear_error(tmp_path):
    model = tiny_bert()
    trainer_for(model, CompressionCallback(schedule_for(model)), tmp_path, max_steps=3).train()
    (tmp_path / "checkpoint-3" / STATE_FILE).unlink()
    fresh = tiny_bert()
    with pytest.raises(ValueError, match="no saved schedule at"):
        trainer_for(fresh, CompressionCallback(schedule_for(fresh)), tmp_path).train(resume_from_checkpoint=True)


def test_gptq_runs_at_train_end_on_the_callbacks_calibration_data(tmp_path):
    model = tiny_bert()
    schedule = CompressionSchedule(model, quantization=W4A16Config(32, algorithm="gptq"))
    batches = [{"input_ids": torch.stack([s["input_ids"] for s in samples(8)])}]
    trainer_for(model, CompressionCallback(schedule, calibration_data=batches), tmp_path, max_steps=2).train()
    assert all(layer.weight_quantized for layer in compressed_layers(model).values())


def test_the_callback_needs_a_schedule():
    with pytest.raises(TypeError, match="compress.CompressionSchedule"):
        CompressionCallback(PruningSchedule(0.5))
