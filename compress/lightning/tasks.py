"""Lightning task modules around a ``transformers`` model.

The task holds the Hugging Face model as ``self.model`` (the compression callbacks look for it
there) and calls it as ``self.model(**batch)``. The model comes either from ``model_name_or_path``
(a directory, a hub id, a ``.gguf`` file, ``"all-MiniLM-L6-v2"`` or ``"SmolLM2-135M-Instruct"``, see
:mod:`compress.lightning.paths`; a directory may also be a ``compress.save_compressed`` dir of float
weights, e.g. the ``float/`` of an earlier run, so a model fine-tuned once can be compressed in later
runs), loaded in
``dtype`` (float32 by default: train in fp32 even from an fp16 copy), or from ``config``: a mapping
with ``model_type`` and the fields of that ``transformers`` config class, for a model built from
scratch (e.g. a tiny Bert or Llama).

* :class:`SequenceClassificationTask`: cross-entropy; validation accuracy and F1
  (:class:`compress.eval.metrics.ClassificationMetrics`).
* :class:`CausalLMTask`: next-token cross-entropy; validation perplexity
  ``exp(sum of token losses / number of predicted tokens)``
  (:class:`compress.eval.metrics.PerplexityMetrics`).

Both take ``distillation`` (a :class:`compress.lightning.distill.DistillationConfig`): from its
``start_step`` on the loss is ``(1 - a) * CE + a * T^2 * KL(teacher || student)`` (per sequence for
classification, per predicted token for a causal LM) against a frozen dense teacher held as
``self.teacher`` (a snapshot of the model taken at that step, or a saved fine-tuned model); the
teacher is module state, so it is in the Lightning checkpoint and a resumed run keeps it. With
``hidden_weight > 0`` the loss adds ``hidden_weight * H``, the relative squared error of every
layer's hidden states against the teacher's (the student's come from the same forward as its
logits), logged as ``train_distill_hidden``.

Optimizer: AdamW (no weight decay on biases and norms) with a linear warm-up over
``warmup_ratio`` of the training steps, then linear decay to zero.

The validation metrics are those :mod:`compress.eval.evaluate` computes on saved models, so training
and evaluation score the same way.

FSDP2: under ``ModelParallelStrategy`` (:mod:`compress.lightning.strategy`) ``configure_model`` shards
``self.model`` over the data-parallel mesh, each transformer layer and then the model
(:func:`compress.schedule.fsdp.fully_shard_model`); Lightning calls it after the callbacks' ``setup``,
so the compression callbacks have swapped their layers by then. Distillation is refused there: the
teacher is a whole copy of the model on every rank, taken from the sharded student.
"""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, Optional

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from torch import nn

from compress.checkpoint import MANIFEST, load_compressed
from compress.eval.metrics import ClassificationMetrics, PerplexityMetrics
from compress.lightning.distill import (
    DistillationConfig,
    Teacher,
    as_distillation_config,
    build_teacher,
    causal_lm_distillation_loss,
    distillation_loss,
    hidden_state_loss,
)
from compress.core.sharding import fsdp_modules
from compress.lightning.paths import resolve_model_source
from compress.lightning.strategy import data_parallel_mesh
from compress.nn.inference import is_inference_module
from compress.schedule.fsdp import fully_shard_model

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def build_model(auto_class, model_name_or_path: str | None, config: dict | None, dtype: str, **model_kwargs):
    """A ``transformers`` model from pretrained weights or from a config mapping (exactly one)."""
    if (model_name_or_path is None) == (config is None):
        raise ValueError(
            "give exactly one of model_name_or_path (pretrained weights) or config (a model from scratch); "
            f"got model_name_or_path={model_name_or_path!r}, config={'set' if config else None}"
        )
    if dtype not in _DTYPES:
        raise ValueError(f"dtype: expected one of {sorted(_DTYPES)}, got {dtype!r}")
    if model_name_or_path is not None:
        source = resolve_model_source(model_name_or_path)
        model = None if source.gguf_file else _saved_float_model(source.path, model_kwargs)
        if model is None:  # a GGUF file is de-quantized to ``dtype`` here (slow: seconds per load)
            model = auto_class.from_pretrained(source.path, dtype=_DTYPES[dtype], **source.from_pretrained_kwargs(),
                                               **model_kwargs)
        model = model.to(_DTYPES[dtype])
    else:
        model = auto_class.from_config(build_config(config, **model_kwargs)).to(_DTYPES[dtype])
    # from_pretrained returns the model in eval mode, and Lightning keeps submodules' modes:
    # without this, dropout would stay off during fine-tuning.
    return model.train()


def _saved_float_model(path: str, model_kwargs: dict):
    """The model of a ``compress.save_compressed`` dir holding float weights (e.g. a run's ``float/``,
    to compress a model fine-tuned earlier), or None when ``path`` is not such a dir."""
    if not os.path.lexists(Path(path) / MANIFEST):  # a manifest that is a pipe is refused by load_compressed
        return None
    model = load_compressed(path)
    compressed = [name for name, module in model.named_modules() if is_inference_module(module)]
    if compressed:
        raise ValueError(f"model_name_or_path: expected float weights to fine-tune, got compressed layers "
                         f"{compressed[:3]} in {path}")
    expected = model_kwargs.get("num_labels")
    actual = getattr(getattr(model, "config", None), "num_labels", None)
    if expected is not None and actual != expected:
        raise ValueError(f"model_name_or_path: expected a model with num_labels={expected}, got {actual} in {path}")
    return model


def build_config(config: dict, **overrides):
    """A ``transformers`` config object from ``{"model_type": ..., field: value, ...}``."""
    from transformers import AutoConfig

    if not isinstance(config, dict):
        raise TypeError(f"config: expected a mapping with 'model_type', got {type(config).__name__}")
    fields = dict(config)
    model_type = fields.pop("model_type", None)
    if model_type is None:
        raise ValueError(f"config: expected a 'model_type' key (e.g. 'bert', 'llama'), got keys {sorted(config)}")
    return AutoConfig.for_model(model_type, **fields, **overrides)


class _TransformersTask(pl.LightningModule):
    """Shared training plumbing: loss from the model (or distillation), AdamW + linear warm-up, metrics.

    Subclasses build ``self.model`` and ``self.val_metrics``, then call :meth:`_set_up_distillation`,
    and say how output-level distillation compares their logits (:meth:`output_distillation_loss`).
    """

    def __init__(self, learning_rate: float, weight_decay: float, warmup_ratio: float):
        super().__init__()
        if not learning_rate > 0:
            raise ValueError(f"learning_rate: expected > 0, got {learning_rate!r}")
        if weight_decay < 0:
            raise ValueError(f"weight_decay: expected >= 0, got {weight_decay!r}")
        if not 0 <= warmup_ratio < 1:
            raise ValueError(f"warmup_ratio: expected a fraction in [0, 1), got {warmup_ratio!r}")
        self.model: nn.Module
        self.val_metrics: nn.Module
        self.distillation: Optional[DistillationConfig] = None
        self.teacher: Optional[Teacher] = None

    def _set_up_distillation(self, distillation: Optional[DistillationConfig]) -> None:
        """Keep the config in ``hparams`` as a plain mapping (a checkpoint loads with weights_only=True)
        and build the teacher from ``self.model``; call after ``save_hyperparameters(ignore=["distillation"])``."""
        self.hparams["distillation"] = None if distillation is None else dataclasses.asdict(distillation)
        self.distillation = distillation
        self.teacher = None if distillation is None else build_teacher(distillation, self.model)

    def forward(self, **batch: Any):
        return self.model(**batch)

    def configure_model(self) -> None:
        """Under ``ModelParallelStrategy``: shard ``self.model`` with FSDP2 (module docstring), once;
        under any other strategy nothing."""
        mesh = data_parallel_mesh(self)
        if mesh is None or fsdp_modules(self.model):
            return
        if self.distillation is not None:
            raise ValueError("distillation is not supported under FSDP (ModelParallelStrategy): the teacher is a whole "
                             "copy of the model on every rank, taken from the sharded student; train with 'ddp', or "
                             "without distillation")
        fully_shard_model(self.model, mesh)

    def output_distillation_loss(self, logits: torch.Tensor, teacher_logits: torch.Tensor,
                                 labels: torch.Tensor) -> torch.Tensor:
        """``(1 - a) * CE + a * T^2 * KL(teacher || student)`` for this task's logits and labels."""
        raise NotImplementedError

    def on_train_start(self) -> None:
        if self.teacher is None or bool(self.teacher.ready):
            return
        start = self.distillation.start_step
        early = [type(cb).__name__ for cb in self.trainer.callbacks
                 if hasattr(cb, "plan") and getattr(cb, "start_step", start) < start]
        if early:
            rank_zero_warn(f"distillation: the teacher snapshot at step {start} is taken after {early} start "
                           "compressing; start distillation at or before their start_step for a dense teacher")

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        if self.teacher is None or self.global_step < self.distillation.start_step:
            loss = self.model(**batch).loss
        else:
            loss = self._distillation_loss(batch)
        self.log("train_loss", loss, prog_bar=True, batch_size=batch["input_ids"].shape[0])
        return loss

    def _distillation_loss(self, batch: dict) -> torch.Tensor:
        """The distillation loss of a batch; takes the teacher snapshot first if it is not taken yet."""
        if not bool(self.teacher.ready):
            self.teacher.snapshot_(self.model)
            rank_zero_info(f"distillation: teacher snapshot taken at step {self.global_step}")
        if self.distillation.hidden_weight > 0:
            return self._loss_with_hidden_states(batch)
        logits = self.model(**batch).logits
        return self.output_distillation_loss(logits, self.teacher.logits(batch), batch["labels"])

    def _loss_with_hidden_states(self, batch: dict) -> torch.Tensor:
        """Output-level distillation plus ``hidden_weight * H`` (one student forward gives logits and
        hidden states); logs ``H`` as ``train_distill_hidden``."""
        outputs = self.model(**batch, output_hidden_states=True)
        teacher_logits, teacher_hidden = self.teacher.logits_and_hidden_states(batch)
        output_loss = self.output_distillation_loss(outputs.logits, teacher_logits, batch["labels"])
        hidden = hidden_state_loss(outputs.hidden_states, teacher_hidden, batch.get("attention_mask"))
        self.log("train_distill_hidden", hidden, batch_size=batch["input_ids"].shape[0])
        return output_loss + self.distillation.hidden_weight * hidden

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        outputs = self.model(**batch)
        self.val_metrics.update(outputs, batch)
        self.log("val_loss", outputs.loss, sync_dist=True, batch_size=batch["input_ids"].shape[0])

    def on_validation_epoch_end(self) -> None:
        for name, value in self.val_metrics.compute().items():
            self.log(f"val_{name}", value, prog_bar=True, sync_dist=True)
        self.val_metrics.reset()

    def configure_optimizers(self):
        from transformers import get_linear_schedule_with_warmup

        decay, no_decay = [], []
        for name, parameter in self.model.named_parameters():
            if not parameter.requires_grad:
                continue
            scale = name.endswith("weight_scale")  # a learnable (LSQ) quantization scale: never decayed
            (no_decay if parameter.dim() < 2 or scale else decay).append(parameter)
        optimizer = torch.optim.AdamW(
            [
                {"params": decay, "weight_decay": self.hparams.weight_decay},
                {"params": no_decay, "weight_decay": 0.0},
            ],
            lr=self.hparams.learning_rate,
        )
        total_steps = max(1, int(self.trainer.estimated_stepping_batches))
        warmup_steps = int(self.hparams.warmup_ratio * total_steps)
        schedule = get_linear_schedule_with_warmup(optimizer, warmup_steps, total_steps)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}


class SequenceClassificationTask(_TransformersTask):
    """Fine-tune an ``AutoModelForSequenceClassification`` (e.g. MiniLM on SST-2, tiny Bert on digits)."""

    def __init__(
        self,
        model_name_or_path: str | None = None,
        config: dict | None = None,
        num_labels: int = 2,
        learning_rate: float = 5e-5,
        weight_decay: float = 0.01,
        warmup_ratio: float = 0.1,
        dtype: str = "float32",
        distillation: Optional[DistillationConfig] = None,
    ):
        super().__init__(learning_rate, weight_decay, warmup_ratio)
        if isinstance(num_labels, bool) or not isinstance(num_labels, int) or num_labels < 2:
            raise ValueError(f"num_labels: expected an int >= 2, got {num_labels!r}")
        distillation = as_distillation_config(distillation)
        self.save_hyperparameters(ignore=["distillation"])
        from transformers import AutoModelForSequenceClassification

        self.model = build_model(
            AutoModelForSequenceClassification, model_name_or_path, config, dtype, num_labels=num_labels
        )
        self.val_metrics = ClassificationMetrics(num_labels)
        self._set_up_distillation(distillation)

    def output_distillation_loss(self, logits, teacher_logits, labels):
        """Over the (B, C) logits of the sequences and their (B,) labels."""
        return distillation_loss(logits, teacher_logits, labels, self.distillation.alpha,
                                 self.distillation.temperature)


class CausalLMTask(_TransformersTask):
    """Fine-tune an ``AutoModelForCausalLM`` (e.g. a tiny Llama on WikiText-2, SmolLM2); reports perplexity."""

    def __init__(
        self,
        model_name_or_path: str | None = None,
        config: dict | None = None,
        learning_rate: float = 1e-4,
        weight_decay: float = 0.01,
        warmup_ratio: float = 0.05,
        dtype: str = "float32",
        distillation: Optional[DistillationConfig] = None,
    ):
        super().__init__(learning_rate, weight_decay, warmup_ratio)
        distillation = as_distillation_config(distillation)
        self.save_hyperparameters(ignore=["distillation"])
        from transformers import AutoModelForCausalLM

        self.model = build_model(AutoModelForCausalLM, model_name_or_path, config, dtype)
        self.val_metrics = PerplexityMetrics()
        self._set_up_distillation(distillation)

    def output_distillation_loss(self, logits, teacher_logits, labels):
        """Over every predicted token: (B, S, V) logits against the (B, S) labels shifted by one."""
        return causal_lm_distillation_loss(logits, teacher_logits, labels, self.distillation.alpha,
                                           self.distillation.temperature)
