"""Knowledge distillation from a frozen dense teacher, for recovering accuracy while compressing.

Loss, for student logits ``s`` (B, C), teacher logits ``t`` (B, C), labels ``y`` (B,), weight
``a = alpha`` in [0, 1] and temperature ``T > 0``::

    L = (1 - a) * CE(s, y) + a * T^2 * KL(softmax(t / T) || softmax(s / T))

KL is summed over the classes and averaged over the batch; ``T^2`` keeps the gradient of the soft
term on the scale of the hard term (Hinton et al., 2015). Both terms are computed in float32. For a
causal LM (:func:`causal_lm_distillation_loss`) the rows are the predicted tokens: the logits
(B, S, V) at position ``i`` against the label at ``i + 1``, tokens labelled ``-100`` left out, as in
the model's own loss; CE and KL are then means over those tokens.

Hidden-state (intermediate) distillation, with weight ``w = hidden_weight >= 0``, adds ``w * H``::

    L = (1 - a) * CE + a * T^2 * KL(teacher || student) + w * H

    H = (1 / L) * sum_{l=1..L}  sum_{i in A} ||h_s^l[i] - h_t^l[i]||^2 / sum_{i in A} ||h_t^l[i]||^2

where ``h^l`` (B, S, D) is the output of transformer layer ``l`` (``output_hidden_states=True``
gives ``L + 1`` tensors; index 0, the embeddings output, is skipped), ``i`` runs over the tokens
``A`` with ``attention_mask == 1`` (every token when the batch has no mask) and ``||.||`` is the
norm over the ``D`` features. Each layer's term is a relative squared error: dividing by the
teacher's energy makes it scale-free, so layers whose activations differ in magnitude weigh the
same and ``w`` means the same for any model width. It pulls every layer of the pruned student back
toward the dense teacher's representation, not only its outputs, as in TinyBERT and in the
block-movement-pruning work (Block Pruning For Faster Transformers). Computed in float32, teacher
side detached. With ``w = 0`` (the default) no hidden states are requested and the loss is exactly
the output-level one above.

The teacher (:class:`Teacher`) is a frozen copy of the model (no gradients, never optimized) whose
forward runs in eval mode (no dropout). It comes either from a **snapshot** of the student, taken at
the first training step ``>= start_step`` (after a dense fine-tuning phase, before pruning or fake
quantization change the weights), or from a **path** to a fine-tuned float model (a
``compress.save_compressed`` dir or a ``transformers`` dir), loaded when the task is built. Its
weights and a ``ready`` flag are module state: they travel with the Lightning checkpoint, so a
resumed run keeps the snapshot it took and never takes a second one from the pruned student. Under
DDP every rank holds identical student weights, so every rank's snapshot (or loaded copy) is the same
frozen teacher.
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from compress.checkpoint import load_model_dir
from compress.nn.inference import is_inference_module


@dataclass(frozen=True)
class DistillationConfig:
    """``alpha``: weight of the soft (teacher) term in [0, 1]; ``temperature`` > 0; ``start_step``:
    optimizer step from which the loss distils (and the snapshot is taken); ``teacher``: None for a
    snapshot of the student at ``start_step``, or a path to a fine-tuned float model;
    ``hidden_weight`` >= 0: weight of the hidden-state term (0 = output-level distillation only)."""

    alpha: float = 0.5
    temperature: float = 2.0
    start_step: int = 0
    teacher: Optional[str] = None
    hidden_weight: float = 0.0

    def __post_init__(self):
        for name in ("alpha", "temperature", "hidden_weight"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"distillation.{name}: expected a number, got {type(value).__name__}")
        if not 0.0 <= self.alpha <= 1.0:
            raise ValueError(f"distillation.alpha: expected a value in [0, 1], got {self.alpha!r}")
        if not self.temperature > 0:
            raise ValueError(f"distillation.temperature: expected > 0, got {self.temperature!r}")
        if not 0.0 <= self.hidden_weight < math.inf:
            raise ValueError(f"distillation.hidden_weight: expected a finite value >= 0, got {self.hidden_weight!r}")
        if isinstance(self.start_step, bool) or not isinstance(self.start_step, int) or self.start_step < 0:
            raise ValueError(f"distillation.start_step: expected a non-negative int, got {self.start_step!r}")
        if self.teacher is not None and (not isinstance(self.teacher, str) or not self.teacher):
            raise ValueError("distillation.teacher: expected None (snapshot) or a model dir path, "
                             f"got {self.teacher!r}")


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


def causal_lm_distillation_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor, labels: torch.Tensor,
                                alpha: float, temperature: float, ignore_index: int = -100) -> torch.Tensor:
    """:func:`distillation_loss` over the predicted tokens of a causal LM: (B, S, V) logits, (B, S) labels
    (not yet shifted: position ``i`` predicts ``labels[:, i + 1]``); ``ignore_index`` labels are left out."""
    if student_logits.shape != teacher_logits.shape or student_logits.dim() != 3:
        raise ValueError("causal_lm_distillation_loss: expected student and teacher logits of one shape (B, S, V), "
                         f"got {tuple(student_logits.shape)} and {tuple(teacher_logits.shape)}")
    if tuple(labels.shape) != tuple(student_logits.shape[:2]):
        raise ValueError(f"causal_lm_distillation_loss: expected labels of shape (B, S) = "
                         f"{tuple(student_logits.shape[:2])}, got {tuple(labels.shape)}")
    vocab = student_logits.shape[-1]
    targets = labels[:, 1:].reshape(-1)
    student, teacher = student_logits[:, :-1].reshape(-1, vocab), teacher_logits[:, :-1].reshape(-1, vocab)
    predicted = targets != ignore_index
    if not bool(predicted.all()):  # index only when needed: each copy of (tokens, V) logits is large
        student, teacher, targets = student[predicted], teacher[predicted], targets[predicted]
    return distillation_loss(student, teacher, targets, alpha, temperature)


def hidden_state_loss(student_hidden: Sequence[torch.Tensor], teacher_hidden: Sequence[torch.Tensor],
                      attention_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``H``: mean over layers 1..L of the relative squared error of the hidden states (module docstring).

    ``student_hidden`` / ``teacher_hidden``: the ``hidden_states`` tuples of a ``transformers``
    forward, ``L + 1`` tensors (B, S, D) each, index 0 (embeddings) skipped; ``attention_mask``
    (B, S): tokens with 1 count, or None for every token. Returns a float32 scalar.
    """
    if len(student_hidden) != len(teacher_hidden):
        raise ValueError(f"hidden_state_loss: expected as many hidden states from the student as from the teacher, "
                         f"got {len(student_hidden)} and {len(teacher_hidden)}")
    if len(student_hidden) < 2:
        raise ValueError("hidden_state_loss: expected the embeddings output and at least one layer's output, got "
                         f"{len(student_hidden)} hidden state(s)")
    layer_errors = [_relative_squared_error(index, student, teacher, attention_mask)
                    for index, (student, teacher) in enumerate(zip(student_hidden, teacher_hidden)) if index > 0]
    return torch.stack(layer_errors).mean()


def _relative_squared_error(index: int, student: torch.Tensor, teacher: torch.Tensor,
                            attention_mask: Optional[torch.Tensor]) -> torch.Tensor:
    """``sum ||s - t||^2 / sum ||t||^2`` over the attended tokens of one layer's (B, S, D) outputs, float32."""
    if student.shape != teacher.shape or student.dim() != 3:
        raise ValueError(f"hidden_state_loss: layer {index}: expected student and teacher hidden states of one shape "
                         f"(B, S, D), got {tuple(student.shape)} and {tuple(teacher.shape)}")
    student, teacher = student.float(), teacher.detach().float()
    if attention_mask is not None:
        if tuple(attention_mask.shape) != tuple(student.shape[:2]):
            raise ValueError("hidden_state_loss: expected attention_mask of shape (B, S) = "
                             f"{tuple(student.shape[:2])}, got {tuple(attention_mask.shape)}")
        attended = attention_mask == 1  # (B, S)
        student, teacher = student[attended], teacher[attended]  # (tokens, D)
    error = (student - teacher).square().sum()
    # a teacher whose attended outputs are all zero would divide by zero: keep the ratio finite
    energy = teacher.square().sum().clamp_min(torch.finfo(torch.float32).tiny)
    return error / energy


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

        Training modules (``compress.nn.qat.CompressedLinear``) keep ``weight`` / ``bias`` under the
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

    def logits(self, batch: dict) -> torch.Tensor:
        """Teacher logits (B, C) for a batch of model inputs (``labels`` ignored), computed in eval mode."""
        return self._eval_forward(batch).logits

    def logits_and_hidden_states(self, batch: dict) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        """Teacher logits (B, C) and ``hidden_states`` (L + 1 tensors (B, S, D)) from one eval-mode forward."""
        outputs = self._eval_forward(batch, output_hidden_states=True)
        return outputs.logits, tuple(outputs.hidden_states)

    @torch.no_grad()
    def _eval_forward(self, batch: dict, **options):
        """The model's outputs for a batch (``labels`` ignored), without gradients, in eval mode.

        The mode is switched for this forward only: Lightning sets and checks the train/eval mode of
        every submodule of the task, and the teacher follows the task like any other submodule.
        """
        was_training = self.model.training
        self.model.eval()
        try:
            return self.model(**_model_inputs(batch), **options)
        finally:
            self.model.train(was_training)


def build_teacher(config: DistillationConfig, student: nn.Module) -> Teacher:
    """A :class:`Teacher`: loaded from ``config.teacher``, else a copy of ``student`` to be snapshot later."""
    if config.teacher is None:
        return Teacher(copy.deepcopy(student), ready=False)
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
