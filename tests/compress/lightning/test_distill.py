"""Tests for compress/lightning/distill.py and the distillation option of SequenceClassificationTask: the loss
against its formula written out, config validation, the snapshot taken once at ``start_step`` next
to block pruning, a teacher loaded from a saved model, resume from a Lightning checkpoint, and the
hidden-state term (hand-computed value, masking, one student forward, the zero-weight path left as
it was, old checkpoints without the field, mismatched teachers, a short fit). Then the causal-LM
form: the per-token loss against its formula and CausalLMTask's distillation option."""
import math

import lightning.pytorch as pl
import pytest
import torch

import compress
from compress.lightning.callbacks import BlockPruning
from compress.lightning.data import DigitsData
from compress.lightning.distill import (
    DistillationConfig,
    Teacher,
    causal_lm_distillation_loss,
    distillation_loss,
    hidden_state_loss,
)
from compress.lightning.tasks import CausalLMTask, SequenceClassificationTask
from tests.compress.lightning.test_tasks import TINY_BERT, TINY_LLAMA


def _formula(student, teacher, labels, alpha, temperature):
    """The loss written out with explicit softmaxes and sums (float64)."""
    s, t = student.double(), teacher.double()
    log_p_student = s - s.exp().sum(-1, keepdim=True).log()
    ce = -log_p_student[torch.arange(len(labels)), labels].mean()
    p_t = torch.softmax(t / temperature, -1)
    q_s = torch.softmax(s / temperature, -1)
    kl = (p_t * (p_t.log() - q_s.log())).sum(-1).mean()
    return (1 - alpha) * ce + alpha * temperature ** 2 * kl


@pytest.mark.parametrize("alpha, temperature", [(0.0, 1.0), (0.5, 2.0), (0.9, 4.0), (1.0, 0.5)])
def test_loss_equals_its_formula(alpha, temperature):
    generator = torch.Generator().manual_seed(int(alpha * 10 + temperature))
    student, teacher = torch.randn(6, 5, generator=generator) * 3, torch.randn(6, 5, generator=generator) * 3
    labels = torch.randint(0, 5, (6,), generator=generator)
    got = distillation_loss(student, teacher, labels, alpha, temperature)
    assert got.item() == pytest.approx(_formula(student, teacher, labels, alpha, temperature).item(), rel=1e-5)


def test_loss_is_zero_soft_term_for_identical_logits_and_gradient_reaches_only_the_student():
    student = torch.randn(4, 3, requires_grad=True)
    teacher = student.detach().clone().requires_grad_(True)
    labels = torch.tensor([0, 1, 2, 0])
    soft_only = distillation_loss(student, teacher, labels, alpha=1.0, temperature=2.0)
    assert soft_only.item() == pytest.approx(0.0, abs=1e-6)
    distillation_loss(student, teacher, labels, alpha=0.5, temperature=2.0).backward()
    assert student.grad is not None and teacher.grad is None
    with pytest.raises(ValueError, match=r"\(B, C\)"):
        distillation_loss(torch.zeros(4, 3), torch.zeros(4, 2), labels, 0.5, 2.0)


@pytest.mark.parametrize("kwargs, error, fragment", [
    ({"alpha": 1.5}, ValueError, "[0, 1]"),
    ({"alpha": True}, TypeError, "expected a number"),
    ({"temperature": 0.0}, ValueError, "> 0"),
    ({"start_step": -1}, ValueError, "non-negative int"),
    ({"teacher": ""}, ValueError, "model dir path"),
    ({"hidden_weight": -0.5}, ValueError, "finite value >= 0"),
    ({"hidden_weight": math.nan}, ValueError, "finite value >= 0"),
    ({"hidden_weight": math.inf}, ValueError, "finite value >= 0"),
    ({"hidden_weight": "1"}, TypeError, "expected a number, got str"),
])
def test_config_validation_says_what_is_allowed(kwargs, error, fragment):
    with pytest.raises(error, match=fragment.replace("[", r"\[").replace("]", r"\]")):
        DistillationConfig(**kwargs)


def test_task_takes_a_config_or_its_mapping_and_rejects_anything_else():
    task = SequenceClassificationTask(config=TINY_BERT, num_labels=10, distillation={"alpha": 0.25})
    assert task.distillation == DistillationConfig(alpha=0.25)
    assert task.hparams["distillation"]["alpha"] == 0.25  # a plain mapping in the checkpoint
    with pytest.raises(TypeError, match="DistillationConfig"):
        SequenceClassificationTask(config=TINY_BERT, num_labels=10, distillation=0.5)


def _task(**distillation):
    torch.manual_seed(0)
    return SequenceClassificationTask(config=TINY_BERT, num_labels=10, learning_rate=1e-3,
                                      distillation=DistillationConfig(**distillation))


def _trainer(max_steps, callbacks=(), **kwargs):
    return pl.Trainer(max_steps=max_steps, callbacks=list(callbacks), accelerator="cpu", logger=False,
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                      limit_val_batches=0, **kwargs)


def _data():
    return DigitsData(batch_size=16, max_train_samples=128)


def _teacher_state(task):
    return {k: v.clone() for k, v in task.teacher.model.state_dict().items()}


class RecordSnapshot(pl.Callback):
    """Records, before each step, whether the teacher is ready and (once) the student's weights."""

    def __init__(self, at_step):
        self.at_step, self.ready, self.student = at_step, [], None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.ready.append(bool(pl_module.teacher.ready))

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == self.at_step:  # after BlockPruning's hook, before training_step
            self.student = {k: v.clone() for k, v in pl_module.model.state_dict().items()}


def test_snapshot_is_taken_once_at_start_step_and_stays_frozen():
    task = _task(alpha=0.7, temperature=2.0, start_step=2)
    record = RecordSnapshot(at_step=2)
    pruning = BlockPruning(0.5, start_step=2, end_step=5, frequency=1)
    _trainer(6, [pruning, record]).fit(task, datamodule=_data())
    assert record.ready == [False, False, True, True, True, True]
    assert all(not p.requires_grad for p in task.teacher.parameters())
    task.train()
    batch = {"input_ids": torch.randint(0, 19, (4, 65)), "labels": torch.zeros(4, dtype=torch.long)}
    assert torch.equal(task.teacher.logits(batch), task.teacher.logits(batch))  # no dropout in the teacher
    assert task.teacher.model.training  # its mode is left as the task set it
    teacher = task.teacher.model.state_dict()
    for name, tensor in teacher.items():  # equal to the student when the snapshot was taken
        assert torch.equal(tensor, record.student[name]), name
    layer = "bert.encoder.layer.0.intermediate.dense.weight"
    assert not torch.equal(teacher[layer], task.model.state_dict()[layer])  # the student moved on (pruned)
    assert (teacher[layer] == 0).float().mean() < 0.1  # the teacher stayed dense
    optimized = {id(p) for group in task.trainer.optimizers[0].param_groups for p in group["params"]}
    assert not optimized & {id(p) for p in task.teacher.parameters()}


def test_a_snapshot_after_pruning_starts_is_warned_about():
    task = _task(alpha=0.5, start_step=2)
    with pytest.warns(UserWarning, match="after \\['BlockPruning'\\] start"):
        _trainer(1, [BlockPruning(0.5, start_step=0, end_step=4)]).fit(task, datamodule=_data())


def test_loss_switches_to_distillation_at_start_step(monkeypatch):
    step = [0]
    monkeypatch.setattr(SequenceClassificationTask, "global_step", property(lambda self: step[0]))
    task = _task(alpha=1.0, temperature=2.0, start_step=1)
    task.model.eval()  # no dropout: a student equal to its teacher computes the same logits
    batch = {"input_ids": torch.randint(0, 19, (4, 65)), "labels": torch.tensor([3, 1, 0, 7])}
    assert task.training_step(batch, 0).item() > 0.5  # before start_step: cross-entropy, untrained model
    assert not bool(task.teacher.ready)
    step[0] = 1
    assert task.training_step(batch, 0).item() == pytest.approx(0.0, abs=1e-6)  # snapshot now: soft term 0
    assert bool(task.teacher.ready)


def test_resume_keeps_the_snapshot_instead_of_taking_a_new_one(tmp_path):
    task = _task(alpha=0.5, temperature=2.0, start_step=1)
    trainer = _trainer(3, [BlockPruning(0.5, start_step=1, end_step=6, frequency=1)])
    trainer.fit(task, datamodule=_data())
    ckpt = tmp_path / "mid.ckpt"
    trainer.save_checkpoint(ckpt)
    saved = _teacher_state(task)

    seen = {}

    class Capture(pl.Callback):
        def on_train_start(self, trainer, pl_module):
            seen["ready"] = bool(pl_module.teacher.ready)
            seen["teacher"] = _teacher_state(pl_module)

    resumed = _task(alpha=0.5, temperature=2.0, start_step=1)
    _trainer(6, [BlockPruning(0.5, start_step=1, end_step=6, frequency=1), Capture()]).fit(
        resumed, datamodule=_data(), ckpt_path=ckpt)
    assert seen["ready"] and resumed.global_step == 6
    for name, tensor in saved.items():
        assert torch.equal(seen["teacher"][name], tensor), name
        assert torch.equal(resumed.teacher.model.state_dict()[name], tensor), name


def test_teacher_loaded_from_a_saved_model(tmp_path):
    torch.manual_seed(1)
    dense = SequenceClassificationTask(config=TINY_BERT, num_labels=10).model
    compress.save_compressed(dense, tmp_path / "float", float_model=True)
    task = _task(alpha=0.5, temperature=2.0, teacher=str(tmp_path / "float"))
    assert isinstance(task.teacher, Teacher) and bool(task.teacher.ready)
    for name, tensor in dense.state_dict().items():
        assert torch.equal(task.teacher.model.state_dict()[name], tensor), name
    with pytest.raises(ValueError, match="num_labels=3"):
        SequenceClassificationTask(config=TINY_BERT, num_labels=3,
                                   distillation=DistillationConfig(teacher=str(tmp_path / "float")))


def test_snapshot_refuses_a_different_architecture():
    teacher = Teacher(torch.nn.Linear(4, 4), ready=False)
    with pytest.raises(ValueError, match="expected shape"):
        teacher.snapshot_(torch.nn.Linear(4, 3))
    with pytest.raises(ValueError, match="has no 'weight'"):
        teacher.snapshot_(torch.nn.Sequential(torch.nn.Linear(4, 4)))


@pytest.mark.slow
def test_ddp_ranks_hold_the_same_frozen_teacher(tmp_path):
    import os
    import pathlib
    import subprocess
    import sys

    repo = pathlib.Path(__file__).resolve().parents[3]
    env = dict(os.environ, PYTHONPATH=f"{repo}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    script = pathlib.Path(__file__).with_name("_ddp_distill_script.py")
    result = subprocess.run([sys.executable, str(script), str(tmp_path)], cwd=repo, env=env,
                            capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    rank0, rank1 = (torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in (0, 1))
    assert rank0["ready"] and rank1["ready"]
    for name, tensor in rank0["teacher"].items():
        assert torch.equal(tensor, rank1["teacher"][name]), name
    layer = "bert.encoder.layer.0.intermediate.dense.weight"
    assert torch.equal(rank0["student"][layer], rank1["student"][layer])
    assert not torch.equal(rank0["teacher"][layer], rank0["student"][layer])  # the student trained on


# --- hidden-state distillation ---------------------------------------------------------------------

TWO_LAYER_BERT = {**TINY_BERT, "num_hidden_layers": 2}


def _hidden_formula(student_hidden, teacher_hidden, mask):
    """H written out token by token (float64): per layer sum ||s - t||^2 / sum ||t||^2 over the
    attended tokens, averaged over the layers after the embeddings output."""
    per_layer = []
    for student, teacher in zip(student_hidden[1:], teacher_hidden[1:]):
        error = energy = 0.0
        for b in range(student.shape[0]):
            for i in range(student.shape[1]):
                if mask is None or mask[b, i] == 1:
                    s, t = student[b, i].detach().double(), teacher[b, i].detach().double()
                    error += float(((s - t) ** 2).sum())
                    energy += float((t ** 2).sum())
        per_layer.append(error / energy)
    return sum(per_layer) / len(per_layer)


def _hand_example():
    """One sequence of two tokens (the second is padding), D = 2, embeddings + two layers."""
    teacher = (torch.zeros(1, 2, 2),                      # embeddings: skipped
               torch.tensor([[[3.0, 4.0], [0.0, 1.0]]]),  # layer 1: ||t||^2 = 25 on the real token
               torch.tensor([[[1.0, 0.0], [0.0, 2.0]]]))  # layer 2: ||t||^2 = 1
    student = (torch.full((1, 2, 2), 9.0),
               torch.tensor([[[3.0, 5.0], [0.0, 0.0]]]),  # error 1 on the real token, 1 on the pad
               torch.tensor([[[0.0, 0.0], [0.0, 0.0]]]))  # error 1 on the real token, 4 on the pad
    return student, teacher, torch.tensor([[1, 0]])


def test_hidden_loss_by_hand_with_and_without_a_padding_mask():
    student, teacher, mask = _hand_example()
    masked = hidden_state_loss(student, teacher, mask)
    assert masked.dtype == torch.float32
    assert masked.item() == pytest.approx((1 / 25 + 1 / 1) / 2)
    unmasked = hidden_state_loss(student, teacher, None)  # the padded token counts too
    assert unmasked.item() == pytest.approx(((1 + 1) / (25 + 1) + (1 + 4) / (1 + 4)) / 2)


def test_hidden_loss_matches_its_formula_in_half_precision_and_detaches_the_teacher():
    generator = torch.Generator().manual_seed(3)
    student = [torch.randn(3, 5, 8, generator=generator).half().requires_grad_(True) for _ in range(4)]
    teacher = [(torch.randn(3, 5, 8, generator=generator) * 2).half().requires_grad_(True) for _ in range(4)]
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]])
    got = hidden_state_loss(student, teacher, mask)
    assert got.dtype == torch.float32
    assert got.item() == pytest.approx(_hidden_formula(student, teacher, mask), rel=1e-5)
    got.backward()
    assert all(t.grad is None for t in teacher) and student[0].grad is None  # embeddings skipped
    assert all(s.grad is not None for s in student[1:])


def test_hidden_loss_refuses_mismatched_hidden_states():
    student, teacher, mask = _hand_example()
    with pytest.raises(ValueError, match="as many hidden states .* got 3 and 2"):
        hidden_state_loss(student, teacher[:2], mask)
    with pytest.raises(ValueError, match=r"layer 2: .* got \(1, 2, 2\) and \(1, 2, 3\)"):
        hidden_state_loss(student, (*teacher[:2], torch.zeros(1, 2, 3)), mask)
    with pytest.raises(ValueError, match=r"attention_mask of shape \(B, S\) = \(1, 2\), got \(2,\)"):
        hidden_state_loss(student, teacher, torch.tensor([1, 0]))
    with pytest.raises(ValueError, match="at least one layer"):
        hidden_state_loss(student[:1], teacher[:1], mask)


def _student_with_snapshot(monkeypatch, config, **distillation):
    """A task at ``global_step`` 0 in eval mode (no dropout), its teacher snapshot taken, then the
    student's encoder perturbed so the two differ, and a record of the student's forward calls."""
    monkeypatch.setattr(SequenceClassificationTask, "global_step", property(lambda self: 0))
    torch.manual_seed(0)
    task = SequenceClassificationTask(config=config, num_labels=10,
                                      distillation=DistillationConfig(start_step=0, **distillation))
    task.model.eval()
    task.teacher.snapshot_(task.model)
    with torch.no_grad():
        for parameter in task.model.bert.encoder.parameters():
            parameter.add_(0.2 * torch.randn_like(parameter))
    calls = []
    task.model.register_forward_hook(lambda module, args, kwargs, out: calls.append(kwargs), with_kwargs=True)
    return task, calls


def _padded_batch():
    generator = torch.Generator().manual_seed(5)
    mask = torch.tensor([[1] * 10, [1] * 6 + [0] * 4, [1] * 3 + [0] * 7])
    return {"input_ids": torch.randint(0, 19, (3, 10), generator=generator), "attention_mask": mask,
            "labels": torch.tensor([3, 1, 0])}


def test_training_step_adds_the_weighted_hidden_term_from_one_student_forward(monkeypatch):
    task, calls = _student_with_snapshot(monkeypatch, TWO_LAYER_BERT, alpha=0.5, temperature=2.0,
                                         hidden_weight=0.7)
    batch = _padded_batch()
    loss = task.training_step(batch, 0)
    assert len(calls) == 1 and calls[0].get("output_hidden_states") is True  # logits and hidden states at once
    with torch.no_grad():
        student = task.model(**batch, output_hidden_states=True)
        teacher_logits, teacher_hidden = task.teacher.logits_and_hidden_states(batch)
    assert len(teacher_hidden) == 3 and torch.equal(teacher_logits, task.teacher.logits(batch))
    hidden = _hidden_formula(student.hidden_states, teacher_hidden, batch["attention_mask"])
    output_level = _formula(student.logits, teacher_logits, batch["labels"], 0.5, 2.0).item()
    assert 0.7 * hidden > 1e-3 * output_level  # the hidden term is large enough to be told apart
    assert loss.item() == pytest.approx(output_level + 0.7 * hidden, rel=1e-6)


def test_zero_hidden_weight_keeps_the_output_level_loss_and_requests_no_hidden_states(monkeypatch):
    task, calls = _student_with_snapshot(monkeypatch, TINY_BERT, alpha=0.5, temperature=2.0)
    batch = _padded_batch()
    loss = task.training_step(batch, 0)
    assert len(calls) == 1 and "output_hidden_states" not in calls[0]
    with torch.no_grad():
        expected = distillation_loss(task.model(**batch).logits, task.teacher.logits(batch), batch["labels"], 0.5, 2.0)
    assert torch.equal(loss.detach(), expected)


def test_a_teacher_with_another_depth_is_refused_when_hidden_states_are_distilled(monkeypatch):
    from transformers import AutoModelForSequenceClassification

    from compress.lightning.tasks import build_config

    task, _ = _student_with_snapshot(monkeypatch, TINY_BERT, hidden_weight=1.0)
    deeper = AutoModelForSequenceClassification.from_config(build_config(TWO_LAYER_BERT, num_labels=10))
    task.teacher = Teacher(deeper, ready=True)
    with pytest.raises(ValueError, match="as many hidden states .* got 2 and 3"):
        task.training_step(_padded_batch(), 0)


def test_a_checkpoint_saved_without_hidden_weight_still_loads(tmp_path):
    task = _task(alpha=0.5, temperature=2.0, start_step=0)
    trainer = _trainer(1)
    trainer.fit(task, datamodule=_data())
    ckpt = tmp_path / "old.ckpt"
    trainer.save_checkpoint(ckpt)
    saved = torch.load(ckpt, weights_only=True)
    del saved["hyper_parameters"]["distillation"]["hidden_weight"]  # as written before the field existed
    torch.save(saved, ckpt)
    loaded = SequenceClassificationTask.load_from_checkpoint(ckpt, weights_only=True)
    assert loaded.distillation == DistillationConfig(alpha=0.5, temperature=2.0, start_step=0, hidden_weight=0.0)
    assert bool(loaded.teacher.ready)


def test_a_short_fit_with_hidden_distillation_logs_a_finite_loss_and_hidden_term():
    torch.manual_seed(0)
    task = SequenceClassificationTask(config=TWO_LAYER_BERT, num_labels=10, learning_rate=1e-3,
                                      distillation=DistillationConfig(alpha=0.5, start_step=1, hidden_weight=1.0))
    trainer = _trainer(4, [BlockPruning(0.5, start_step=1, end_step=3, frequency=1)])
    trainer.fit(task, datamodule=_data())
    logged = trainer.callback_metrics
    assert bool(task.teacher.ready) and trainer.global_step == 4
    assert math.isfinite(logged["train_loss"].item())
    assert 0 < logged["train_distill_hidden"].item() < math.inf  # the pruned student drifted from its teacher


# ---- causal LM --------------------------------------------------------------------------------------


def test_causal_lm_loss_is_the_formula_over_the_predicted_tokens():
    """Position i predicts label i + 1; tokens labelled -100 count in neither term."""
    generator = torch.Generator().manual_seed(3)
    student, teacher = torch.randn(2, 5, 7, generator=generator) * 2, torch.randn(2, 5, 7, generator=generator) * 2
    labels = torch.randint(0, 7, (2, 5), generator=generator)
    labels[1, 3:] = -100  # e.g. padding at the end of the second sequence
    rows = [(b, i) for b in range(2) for i in range(4) if labels[b, i + 1] != -100]
    assert len(rows) == 6
    by_hand = _formula(torch.stack([student[b, i] for b, i in rows]), torch.stack([teacher[b, i] for b, i in rows]),
                       torch.stack([labels[b, i + 1] for b, i in rows]), 0.5, 2.0)
    got = causal_lm_distillation_loss(student, teacher, labels, 0.5, 2.0)
    assert got.item() == pytest.approx(by_hand.item(), rel=1e-5)
    full = labels.clamp_min(0)  # nothing ignored: no indexing, the same formula over all 8 rows
    every = [(b, i) for b in range(2) for i in range(4)]
    by_hand = _formula(torch.stack([student[b, i] for b, i in every]), torch.stack([teacher[b, i] for b, i in every]),
                       torch.stack([full[b, i + 1] for b, i in every]), 0.5, 2.0)
    loss = causal_lm_distillation_loss(student, teacher, full, 0.5, 2.0)
    assert loss.item() == pytest.approx(by_hand.item(), rel=1e-5)
    with pytest.raises(ValueError, match=r"\(B, S, V\)"):
        causal_lm_distillation_loss(student[0], teacher[0], labels[0], 0.5, 2.0)
    with pytest.raises(ValueError, match=r"labels of shape \(B, S\) = \(2, 5\)"):
        causal_lm_distillation_loss(student, teacher, labels[:, 1:], 0.5, 2.0)


def _causal_lm_task(monkeypatch, step, **distillation) -> CausalLMTask:
    monkeypatch.setattr(CausalLMTask, "global_step", property(lambda self: step[0]))
    torch.manual_seed(0)
    task = CausalLMTask(config=TINY_LLAMA, distillation=distillation)
    task.model.eval()  # no dropout: a student equal to its teacher computes the same logits
    return task


def test_causal_lm_task_distils_per_token_from_its_snapshot(monkeypatch):
    step = [0]
    task = _causal_lm_task(monkeypatch, step, alpha=0.5, temperature=2.0, start_step=1)
    assert task.hparams["distillation"] == {"alpha": 0.5, "temperature": 2.0, "start_step": 1, "teacher": None,
                                            "hidden_weight": 0.0}  # a plain mapping in the checkpoint
    ids = torch.randint(0, 50, (2, 12))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}
    with torch.no_grad():
        own_loss = task.model(**batch).loss
    assert torch.equal(task.training_step(batch, 0).detach(), own_loss)  # before start_step: the model's loss
    step[0] = 1
    loss = task.training_step(batch, 0)  # snapshot now: the soft term is 0
    assert bool(task.teacher.ready)
    assert loss.item() == pytest.approx(0.5 * own_loss.item(), rel=1e-5)
    with torch.no_grad():
        for parameter in task.model.model.layers.parameters():
            parameter.add_(0.2 * torch.randn_like(parameter))
        logits, teacher_logits = task.model(**batch).logits, task.teacher.logits(batch)
    shifted = [(b, i) for b in range(2) for i in range(11)]
    by_hand = _formula(torch.stack([logits[b, i] for b, i in shifted]),
                       torch.stack([teacher_logits[b, i] for b, i in shifted]),
                       torch.stack([ids[b, i + 1] for b, i in shifted]), 0.5, 2.0)
    assert task.training_step(batch, 0).item() == pytest.approx(by_hand.item(), rel=1e-5)


def test_causal_lm_task_adds_the_hidden_state_term(monkeypatch):
    task = _causal_lm_task(monkeypatch, [0], alpha=0.5, temperature=1.0, start_step=0, hidden_weight=2.0)
    ids = torch.randint(0, 50, (2, 12))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}
    task.training_step(batch, 0)  # takes the snapshot
    with torch.no_grad():
        for parameter in task.model.model.layers.parameters():
            parameter.add_(0.2 * torch.randn_like(parameter))
        student = task.model(**batch, output_hidden_states=True)
        teacher_logits, teacher_hidden = task.teacher.logits_and_hidden_states(batch)
    output_level = causal_lm_distillation_loss(student.logits, teacher_logits, ids, 0.5, 1.0).item()
    hidden = _hidden_formula(student.hidden_states, teacher_hidden, batch["attention_mask"])
    assert hidden > 1e-4
    assert task.training_step(batch, 0).item() == pytest.approx(output_level + 2.0 * hidden, rel=1e-5)
