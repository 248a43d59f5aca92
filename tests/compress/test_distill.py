"""Tests for compress/distill.py and the distillation option of SequenceClassificationTask: the loss
against its formula written out, config validation, the snapshot taken once at ``start_step`` next
to block pruning, a teacher loaded from a saved model, and resume from a Lightning checkpoint."""
import lightning.pytorch as pl
import pytest
import torch

import compress
from compress.callbacks import BlockPruning
from compress.data import DigitsData
from compress.distill import DistillationConfig, Teacher, distillation_loss
from compress.tasks import SequenceClassificationTask
from tests.compress.test_tasks import TINY_BERT


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
    compress.save_compressed(dense, tmp_path / "float")
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

    repo = pathlib.Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=f"{repo}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    script = pathlib.Path(__file__).with_name("_ddp_distill_script.py")
    result = subprocess.run([sys.executable, str(script), str(tmp_path)], cwd=repo, env=env,
                            capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    rank0, rank1 = (torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1))
    assert rank0["ready"] and rank1["ready"]
    for name, tensor in rank0["teacher"].items():
        assert torch.equal(tensor, rank1["teacher"][name]), name
    layer = "bert.encoder.layer.0.intermediate.dense.weight"
    assert torch.equal(rank0["student"][layer], rank1["student"][layer])
    assert not torch.equal(rank0["teacher"][layer], rank0["student"][layer])  # the student trained on
