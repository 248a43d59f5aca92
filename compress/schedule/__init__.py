"""Training-aware compression for any training loop: a schedule advanced once per optimizer step.

* :class:`CompressionSchedule` (:mod:`compress.schedule.schedule`): the one object a loop drives
  (``before_optimizer_step``, ``step``, ``finish``, ``state_dict`` / ``load_state_dict``);
* its parts, each a plain object holding its settings and its position:
  :class:`PruningSchedule` (gradual 32x32 block pruning, :mod:`compress.schedule.pruning`),
  :class:`QuantizationSchedule` (QAT from a start step, :mod:`compress.schedule.quantization`),
  :class:`CalibrationSchedule` (W8A8 observers, SmoothQuant, static scales; GPTQ at the end,
  :mod:`compress.schedule.calibration`);
* :mod:`compress.schedule.distributed`: what they do across ranks under ``torch.distributed``.

The Lightning callbacks (:mod:`compress.lightning.callbacks`) and the ``transformers`` Trainer callback
(:mod:`compress.integrations.hf_trainer`) call the same parts from their hooks. Nothing here imports
Lightning or ``transformers``.
"""
from compress.schedule.calibration import CalibrationSchedule
from compress.schedule.pruning import PruningSchedule
from compress.schedule.quantization import QuantizationSchedule
from compress.schedule.schedule import CompressionSchedule

__all__ = ["CalibrationSchedule", "CompressionSchedule", "PruningSchedule", "QuantizationSchedule"]
