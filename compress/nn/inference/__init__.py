"""Inference modules: ``nn.Linear`` replacements whose forward calls the project's kernels, one file
per scheme (:mod:`~compress.nn.inference.base` holds what they share: buffers, kernel or reference,
bound kernel calls).

=============  ===================================================  ================================
module         buffers (N = out_features, K = in_features)          forward
=============  ===================================================  ================================
W8A8Linear     ``w_q`` (N, K) int8, ``w_scale`` (N,) float32,        ``kernels.w8a8_matmul``: int8 x
               ``act_scale`` () float32 (static only),              int8, int32 accumulation,
               ``input_smoothing`` (K,) float32 (SmoothQuant        ``acc * s_x[m] * s_w[n] (+ b)``
               factors no norm could absorb; optional)
W4A16Linear    ``qweight`` (Kp/8, N) int32, ``scales`` (Kp/G, N)    ``kernels.w4a16_matmul``: int4
               float32; Kp = K padded to a multiple of G and 8      unpack, dequantize, fp32 acc.
W8A16Linear    ``w_q`` (N, Kp) int8, ``w_scale`` (N,) float32 per   ``kernels.w8a16_matmul``: int8 x
               channel or (N, Kp/128) per group; Kp = K padded to   fp16/bf16, fp32 accumulation
               a multiple of 8 (of 128 with groups)
W8A8BlockLinear ``w_q`` (N, K) int8, ``w_scale`` (ceil(N/128),     ``kernels.w8a8_block_matmul``:
               ceil(K/128)) float32: one scale per 128 x 128       x int8 per token and 128
               block                                                channels, one rescale per K block
BSRLinear      ``crow_indices`` (N/32+1,) int32, ``col_indices``    ``kernels.bsr_matmul_parts``:
               (nnz,) int32, ``values`` (nnz, 32, 32) model dtype   absent blocks skipped
BSRW8A8Linear  the BSR indices, ``values`` (nnz, 32, 32) int8, and   ``kernels.bsr_w8a8_matmul_parts``:
               W8A8Linear's ``w_scale`` / ``act_scale`` /           W8A8 with absent blocks
               ``input_smoothing``                                  skipped
BSRW4A16Linear the BSR indices, ``values`` (nnz, 32, 4) int32 (int4  ``kernels.bsr_w4a16_matmul``:
               packed along K), ``scales`` (nnz, 32) float32: one   W4A16 with absent blocks
               per row of each stored block                         skipped
=============  ===================================================  ================================

Files: ``w8a8.py``, ``w4a16.py``, ``w8a16.py``, ``w8a8_block.py``, ``bsr.py``, ``bsr_w8a8.py``,
``bsr_w4a16.py`` (one module each), ``base.py``. Here: :data:`INFERENCE_MODULES` (the classes by name, as
checkpoint manifests list them), :data:`BLOCK_SPARSE_MODULES` (those holding BSR parts, whose indices
are checked on load), :func:`to_float`, :func:`is_inference_module`, and the registration of the module
each config exports to (``config.inference_module``, ``config.block_sparse_module``: the configs import
no ``nn``, so the table is filled here).
"""
import torch
from torch import nn

from compress.configs import (BlockSparseConfig, W4A16Config, W8A8BlockConfig, W8A8Config, W8A16Config,
                              register_inference_module)
from compress.nn.inference.base import _InferenceLinear, kernels_run
from compress.nn.inference.bsr import BSRLinear
from compress.nn.inference.bsr_w4a16 import BSRW4A16Linear
from compress.nn.inference.bsr_w8a8 import BSRW8A8Linear
from compress.nn.inference.w4a16 import W4A16Linear
from compress.nn.inference.w8a8 import W8A8Linear
from compress.nn.inference.w8a8_block import W8A8BlockLinear
from compress.nn.inference.w8a16 import W8A16Linear

INFERENCE_MODULES = {cls.__name__: cls for cls in (W8A8Linear, W4A16Linear, W8A16Linear, W8A8BlockLinear, BSRLinear,
                                                   BSRW8A8Linear, BSRW4A16Linear)}

for _config, _module in ((W8A8Config, W8A8Linear), (W4A16Config, W4A16Linear), (W8A16Config, W8A16Linear),
                         (W8A8BlockConfig, W8A8BlockLinear), (BlockSparseConfig, BSRLinear)):
    register_inference_module(_config, _module)
# the schemes whose kernels store the kept blocks on their own; the others keep pruned blocks as zeros
register_inference_module(W8A8Config, BSRW8A8Linear, block_sparse=True)
register_inference_module(W4A16Config, BSRW4A16Linear, block_sparse=True)
BLOCK_SPARSE_MODULES = (BSRLinear, BSRW8A8Linear, BSRW4A16Linear)  # the modules storing BSR parts


def to_float(module: _InferenceLinear) -> nn.Linear:
    """A plain ``nn.Linear`` with the module's dequantized weight (float32) and bias."""
    linear = nn.Linear(module.in_features, module.out_features, bias=module.bias is not None)
    with torch.no_grad():
        linear.weight.copy_(module.dequantized_weight())
        if module.bias is not None:
            linear.bias.copy_(module.bias.float())
    return linear


def is_inference_module(module: nn.Module) -> bool:
    """True for the inference modules of this package (:data:`INFERENCE_MODULES`, kernel-backed)."""
    return isinstance(module, tuple(INFERENCE_MODULES.values()))


__all__ = ["BLOCK_SPARSE_MODULES", "BSRLinear", "BSRW4A16Linear", "BSRW8A8Linear", "INFERENCE_MODULES", "W4A16Linear",
           "W8A8BlockLinear", "W8A8Linear", "W8A16Linear", "is_inference_module", "kernels_run", "to_float"]
