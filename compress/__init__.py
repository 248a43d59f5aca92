"""compress: training-aware compression for PyTorch models (W8A8, W4A16, 32x32 block sparsity).

Public API (docs/architecture.md)::

    import compress
    from compress import W8A8Config, W4A16Config, BlockSparseConfig, Plan
    compress.prepare(model, plan)                        # training modules (QAT, masks), in place
    compress.convert(model)                              # inference modules calling the kernels
    compress.convert(model, plan, calibration_data=...)  # post-training: prune, calibrate, quantize
    compress.save_compressed(model, path)                # atomic directory: safetensors + manifest
    compress.load_compressed(path)                       # rebuild without the original weights
    compress.fuse_siblings(model)                        # q/k/v (and gate/up) as one kernel call each
    compress.link_quantized_inputs(model, example_inputs)  # norms / GELU quantize for the W8A8 layer after

Lightning callbacks live in :mod:`compress.callbacks` (imported lazily so the core library does not
import Lightning).
"""
from compress.checkpoint import CheckpointError, load_compressed, save_compressed
from compress.configs import BlockSparseConfig, W4A16Config, W8A8Config
from compress.fusion import fuse_siblings
from compress.input_quant import link_quantized_inputs
from compress.modules import BSRLinear, BSRW8A8Linear, W4A16Linear, W8A8Linear
from compress.plan import DEFAULT_EXCLUDE, Plan, convert, prepare
from compress.qat import CompressedLinear

__all__ = [
    "BSRLinear",
    "BSRW8A8Linear",
    "BlockSparseConfig",
    "CheckpointError",
    "CompressedLinear",
    "DEFAULT_EXCLUDE",
    "Plan",
    "W4A16Config",
    "W4A16Linear",
    "W8A8Config",
    "W8A8Linear",
    "convert",
    "fuse_siblings",
    "link_quantized_inputs",
    "load_compressed",
    "prepare",
    "save_compressed",
]
