"""LayerNorm, RMSNorm and GELU that also write their output quantized per token (``layer_norm_quantize``,
``rms_norm_quantize``, ``gelu_quantize``), for the W8A8 GEMM after them.

dispatch   the row kernels' launch (row width and warps) for rows of K features, and MAX_ROW
op         validation and the three launchers
norm       the LayerNorm / RMSNorm kernel
gelu       the GELU kernel
"""
from compress_kernels.norm_quant.dispatch import MAX_ROW
from compress_kernels.norm_quant.op import gelu_quantize, layer_norm_quantize, rms_norm_quantize

__all__ = ["MAX_ROW", "gelu_quantize", "layer_norm_quantize", "rms_norm_quantize"]
