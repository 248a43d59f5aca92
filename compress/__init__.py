"""compress: training-aware compression for PyTorch models (W8A8, block-scaled W8A8, W4A16, W8A16, 32x32 block
sparsity).

Public API (docs/architecture.md)::

    import compress
    from compress import W8A8Config, W8A8BlockConfig, W4A16Config, W8A16Config, BlockSparseConfig, Plan
    compress.prepare(model, plan)                        # training modules (QAT, masks), in place
    schedule = compress.CompressionSchedule(model, pruning=..., quantization=..., calibration=...)
    schedule.step()                                      # after each optimizer.step(), from any loop
    schedule.finish()                                    # final masks, QAT on, GPTQ: convert computes the same
    compress.convert(model)                              # inference modules calling the kernels
    compress.convert(model, plan, calibration_data=...)  # post-training: prune, calibrate, quantize
    compress.save_compressed(model, path)                # crash-safe directory: safetensors + manifest
    compress.save_compressed(model, path, format="compressed-tensors")  # a directory for vLLM / transformers
    compress.load_compressed(path)                       # rebuild without the original weights (either format)
    compress.fuse_siblings(model)                        # q/k/v (and gate/up) as one kernel call each
    compress.link_quantized_inputs(model, example_inputs)  # norms / GELU quantize for the W8A8 layer after
    compress.link_block_chains(model, example_inputs)   # block-scaled MLPs: up -> GELU -> down in int8

Its modules, one line each, are in the file tree of docs/architecture.md, with the layers that
``tests/test_import_graph.py`` holds (``core`` reaches no ``nn``, ``nn`` no ``schedule``, ...).

The Lightning callbacks live in :mod:`compress.lightning.callbacks`, the ``transformers`` Trainer
callback in :mod:`compress.integrations.hf_trainer`; ``import compress`` imports neither Lightning
nor the Trainer.
"""
import importlib
import sys
import types

from compress.checkpoint import CheckpointError, load_compressed, save_compressed
from compress.configs import BlockSparseConfig, W4A16Config, W8A8BlockConfig, W8A8Config, W8A16Config
from compress.nn.block_chain import link_block_chains
from compress.nn.fusion import fuse_siblings
from compress.nn.input_quant import link_quantized_inputs
from compress.nn.inference import (BSRLinear, BSRW4A16Linear, BSRW8A8Linear, W4A16Linear, W8A8BlockLinear, W8A8Linear,
                                   W8A16Linear)
from compress.nn.qat import CompressedLinear
from compress.plan import DEFAULT_EXCLUDE, Plan, convert, prepare
from compress.schedule import CalibrationSchedule, CompressionSchedule, PruningSchedule, QuantizationSchedule


class _ModuleAlias(types.ModuleType):
    """``compress.callbacks``, ``compress.tasks``, ``compress.data``: the names the modules of
    compress/lightning/ had before they moved there, which recipes (``class_path:``) and Lightning
    checkpoints (``_class_path`` in their hyper-parameters) written before still use. Its public
    attributes are those of the module it stands for, imported on first use, so ``import compress``
    does not import Lightning."""

    def __init__(self, name: str, target: str):
        super().__init__(name, f"{name}: another name of {target}")
        self._target = target

    def __getattr__(self, attribute: str):
        if attribute.startswith("_"):  # module metadata, asked by tools that scan sys.modules
            raise AttributeError(f"module {self.__name__!r} has no attribute {attribute!r}")
        return getattr(importlib.import_module(self._target), attribute)


for _name in ("callbacks", "tasks", "data"):
    sys.modules.setdefault(f"compress.{_name}", _ModuleAlias(f"compress.{_name}", f"compress.lightning.{_name}"))

__all__ = [
    "BSRLinear",
    "BSRW4A16Linear",
    "BSRW8A8Linear",
    "BlockSparseConfig",
    "CalibrationSchedule",
    "CheckpointError",
    "CompressedLinear",
    "CompressionSchedule",
    "DEFAULT_EXCLUDE",
    "Plan",
    "PruningSchedule",
    "QuantizationSchedule",
    "W4A16Config",
    "W4A16Linear",
    "W8A8BlockConfig",
    "W8A8BlockLinear",
    "W8A8Config",
    "W8A8Linear",
    "W8A16Config",
    "W8A16Linear",
    "convert",
    "fuse_siblings",
    "link_block_chains",
    "link_quantized_inputs",
    "load_compressed",
    "prepare",
    "save_compressed",
]
