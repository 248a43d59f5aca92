"""Training-aware compression under the ``transformers`` ``Trainer``: a ``TrainerCallback`` that drives
a :class:`compress.schedule.CompressionSchedule`.

::

    schedule = compress.CompressionSchedule(model, pruning=compress.PruningSchedule(0.5, end_step=300),
                                            quantization=compress.W8A8Config())
    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[CompressionCallback(schedule)])
    trainer.train()                  # or trainer.train(resume_from_checkpoint=True)
    compress.convert(model)          # computes what the trained model computed

Trainer events -> schedule:

* ``on_pre_optimizer_step`` (after the backward of the step's last micro-batch and gradient clipping,
  before ``optimizer.step()``) -> :meth:`~compress.schedule.CompressionSchedule.before_optimizer_step`
  (movement / Fisher scores; gradients of the parameters the Trainer's optimizer updates; under fp16
  AMP they are unscaled here only when ``max_grad_norm > 0``, the Trainer's default);
* ``on_step_end`` (after the optimizer step; ``state.global_step`` already counts it) ->
  :meth:`~compress.schedule.CompressionSchedule.step`: masks re-applied, the next step set up;
  one calibration batch is one optimizer step (all its micro-batches are observed);
* ``on_save`` -> the schedule's ``state_dict`` as ``compression_schedule.pt`` in the checkpoint folder
  the Trainer just wrote (``<output_dir>/checkpoint-<step>``), beside the model's weights, where masks,
  observer statistics and scales already are (module buffers in the model's ``state_dict``);
* ``on_train_begin`` -> when the Trainer resumed (its ``global_step`` differs from the schedule's), the
  schedule's state is loaded from ``<output_dir>/checkpoint-<step>/compression_schedule.pt``;
  a schedule whose state was loaded by hand beforehand is taken as it is;
* ``on_train_end`` -> :meth:`~compress.schedule.CompressionSchedule.finish` with ``calibration_data``
  (final masks, fake quantization on, GPTQ where a config asks for it).
"""
from __future__ import annotations

import os

import torch
from transformers import TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from compress.schedule import CompressionSchedule

STATE_FILE = "compression_schedule.pt"


def checkpoint_dir(args, state) -> str:
    """The folder the Trainer writes (or resumes) the checkpoint of ``state.global_step`` in."""
    return os.path.join(args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}")


class CompressionCallback(TrainerCallback):
    """Drive ``schedule`` from the Trainer's events (module docstring). ``calibration_data``: the batches
    GPTQ reads at the end of training (an iterable of batches or a callable(model), as
    :func:`compress.convert` takes), needed only when a config says ``algorithm="gptq"``."""

    def __init__(self, schedule: CompressionSchedule, calibration_data=None):
        if not isinstance(schedule, CompressionSchedule):
            raise TypeError(f"schedule: expected a compress.CompressionSchedule, got {type(schedule).__name__}")
        self.schedule, self.calibration_data = schedule, calibration_data

    def on_train_begin(self, args, state, control, **kwargs):
        if self.schedule.global_step == state.global_step:
            return
        path = os.path.join(checkpoint_dir(args, state), STATE_FILE)
        if not os.path.isfile(path):
            raise ValueError(f"CompressionCallback: the Trainer starts at step {state.global_step} "
                             f"but the schedule is at step {self.schedule.global_step}, and there is no saved "
                             f"schedule at {path}; load its state with schedule.load_state_dict(torch.load(...)) "
                             "before trainer.train()")
        self.schedule.load_state_dict(torch.load(path, weights_only=True))

    def on_pre_optimizer_step(self, args, state, control, optimizer=None, **kwargs):
        self.schedule.before_optimizer_step(optimizer)

    def on_step_end(self, args, state, control, **kwargs):
        self.schedule.step()

    def on_save(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            torch.save(self.schedule.state_dict(), os.path.join(checkpoint_dir(args, state), STATE_FILE))

    def on_train_end(self, args, state, control, **kwargs):
        self.schedule.finish(self.calibration_data)
