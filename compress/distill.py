"""Knowledge distillation from a frozen dense teacher, for recovering accuracy while compressing.

Loss, for student logits ``s`` (B, C), teacher logits ``t`` (B, C), labels ``y`` (B,), weight
``a = alpha`` in [0, 1] and temperature ``T > 0``::

    L = (1 - a) * CE(s, y) + a * T^2 * KL(softmax(t / T) || softmax(s / T))

KL is summed over the classes and averaged over the batch; ``T^2`` keeps the gradient of the soft
term on the scale of the hard term (Hinton et al., 2015). Both terms are computed in float32.

The teacher (:class:`Teacher`) is a frozen copy of the model (no gradients, never optimized) whose
forward runs in eval mode (no dropout). It comes either from a **snapshot** of the student, taken at
the first training step ``>= start_step`` (after a dense fine-tuning phase, before pruning or fake
quantization change the weights), or from a **path** to a fine-tuned float model (a ``compress.save_compressed`` dir or a
``transformers`` dir), loaded when the task is built. Its weights and a ``ready`` flag are module
state: they travel with the Lightning checkpoint, so a resumed run keeps the snapshot it took and
never takes a second one from the pruned student. Under DDP every rank holds identical student
weights, so every rank's snapshot (or loaded copy) is the same frozen teacher.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class DistillationConfig:
    """``alpha``: weight of the soft (teacher) term in [0, 1]; ``temperature`` > 0; ``start_step``:
    optimizer step from which the loss distils (and the snapshot is taken); ``teacher``: None for a
    snapshot of the student at ``start_step``, or a path to a fine-tuned float model."""

    alpha: float = 0.5
    temperature: float = 2.0
    start_step: int = 0
    teacher: Optional[str] = None

    def __post_init__(self):
        for name in ("alpha", "temperature"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"distillation.{name}: expected a number, got {type(value).__name__}")
        if not 0.0 <= self.alpha <= 1.0:
            raise ValueError(f"distillation.alpha: expected a value in [0, 1], got {self.alpha!r}")
        if not self.temperature > 0:
            raise ValueError(f"distillation.temperature: expected > 0, got {self.temperature!r}")
        if isinstance(self.start_step, bool) or not isinstance(self.start_step, int) or self.start_step < 0:
            raise ValueError(f"distillation.start_step: expected a non-negative int, got {self.start_step!r}")
        if self.teacher is not None and (not isinstance(self.teacher, str) or not self.teacher):
            raise ValueError(f"distillation.teacher: expected None (snapshot) or a model dir path, got {self.teacher!r}")


def as_distillation_config(value) -> Optional[DistillationConfig]:
    """None, a :class:`DistillationConfig`, or its fields as a mapping (as saved in a checkpoint)."""
    if value is None or isinstance(value, DistillationConfig):
        return value
    if isinstance(value, dict):
        return DistillationConfig(**value)
    raise TypeError(f"distillation: expected None, a DistillationConfig or a mapping of its fields, "
                    f"got {type(value).__name__}")


def distillation_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor, labels: torch.Tensor,
                      alpha: float, temperature: float) -> torch.Tensor:
    """``(1 - alpha) * CE + alpha * T^2 * KL(teacher || student)`` over (B, C) logits (module docstring)."""
    if student_logits.shape != teacher_logits.shape or student_logits.dim() != 2:
        raise ValueError("distillation_loss: expected student and teacher logits of one shape (B, C), got "
                         f"{tuple(student_logits.shape)} and {tuple(teacher_logits.shape)}")
    student, teacher = student_logits.float(), teacher_logits.detach().float()
    hard = F.cross_entropy(student, labels)
    soft = F.kl_div(F.log_softmax(student / temperature, dim=-1), F.log_softmax(teacher / temperature, dim=-1),
                    reduction="batchmean", log_target=True)
    return (1.0 - alpha) * hard + alpha * temperature ** 2 * soft


def _model_inputs(batch: dict) -> dict:
    """The batch without ``labels``: the teacher needs no loss of its own."""
    return {key: value for key, value in batch.items() if key != "labels"}


class Teacher(nn.Module):
    """A frozen copy of a model (no gradients; eval-mode forward) and a ``ready`` flag (see the module docstring)."""

    def __init__(self, model: nn.Module, ready: bool):
        super().__init__()
        self.model = model
        for parameter in self.model.parameters():
            parameter.requires_grad_(False)
        self.register_buffer("ready", torch.tensor(bool(ready)))

    @torch.no_grad()
    def snapshot_(self, student: nn.Module) -> None:
        """Copy the student's current weights and buffers into the teacher (by name) and mark it ready.

        Training modules (``compress.qat.CompressedLinear``) keep ``weight`` / ``bias`` under the
        names of the plain layers they replaced, so a student with swapped layers copies into the
        plain teacher; their extra state (masks, observers) has no place in the teacher.
        """
        source = student.state_dict()
        for name, tensor in self.model.state_dict().items():
            if name not in source:
                raise ValueError(f"Teacher.snapshot_: the student has no {name!r}; expected the teacher's "
                                 "architecture (a copy of the student's model)")
            if source[name].shape != tensor.shape:
                raise ValueError(f"Teacher.snapshot_: {name!r} expected shape {tuple(tensor.shape)}, "
                                 f"got {tuple(source[name].shape)}")
            tensor.copy_(source[name])
        self.ready.fill_(True)

    @torch.no_grad()
    def logits(self, batch: dict) -> torch.Tensor:
        """Teacher logits (B, C) for a batch of model inputs (``labels`` ignored), computed in eval mode.

        The mode is switched for this forward only: Lightning sets and checks the train/eval mode of
        every submodule of the task, and the teacher follows the task like any other submodule.
        """
        was_training = self.model.training
        self.model.eval()
        try:
            return self.model(**_model_inputs(batch)).logits
        finally:
            self.model.train(was_training)


def build_teacher(config: DistillationConfig, student: nn.Module) -> Teacher:
    """A :class:`Teacher`: loaded from ``config.teacher``, else a copy of ``student`` to be snapshot later."""
    if config.teacher is None:
        return Teacher(copy.deepcopy(student), ready=False)
    from compress.evaluate import is_inference_module, load_model_dir

    model = load_model_dir(config.teacher).float()
    if any(is_inference_module(m) for m in model.modules()):
        raise ValueError(f"distillation.teacher: expected a float (uncompressed) model, got compressed layers "
                         f"in {config.teacher}")
    _check_same_labels(model, student, config.teacher)
    return Teacher(model, ready=True)


def _check_same_labels(teacher: nn.Module, student: nn.Module, where: str) -> None:
    expected = getattr(getattr(student, "config", None), "num_labels", None)
    actual = getattr(getattr(teacher, "config", None), "num_labels", None)
    if expected is not None and actual is not None and expected != actual:
        raise ValueError(f"distillation.teacher: expected a model with num_labels={expected}, got {actual} in {where}")
