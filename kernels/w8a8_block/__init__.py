"""Block-scaled W8A8 (DeepSeek-V3 / Jetfire style): int8 activations with one scale per token and 128
channels, int8 weights with one scale per 128 x 128 block, rescaled once per 128-deep K step.

dispatch    the table from (M, N, K, input and output format, device) to the path and tiles that run
op          the matmul: validation, launch, its four custom ops, the public call and the bound calls
op_blocks   the block quantizers (activations, weights) and the int8 GELU as ops
blocks      in-kernel helpers: block scales, symmetric int8, float rounding, GELU
quantize    the activation (1 x 128) and weight (128 x 128) quantizer kernels
gemm        the tensor-core tiles with pointer loads on int8 x from the quantize pass, split-K
tma         the same step with TMA tile loads (large M)
epilogue    bias, GELU, float or int8 + 1 x 128 scales output, the split-K sum
gelu        the int8 GELU kernel (de-quantize, GELU, re-quantize)
"""
from compress_kernels.w8a8_block.op import (bind_w8a8_block_matmul, bind_w8a8_block_matmul_int8,
                                            bind_w8a8_block_matmul_quantized, w8a8_block_matmul)
from compress_kernels.w8a8_block.op_blocks import gelu_int8_blocks, quantize_act_blocks, quantize_weight_blocks

__all__ = ["bind_w8a8_block_matmul", "bind_w8a8_block_matmul_int8", "bind_w8a8_block_matmul_quantized",
           "gelu_int8_blocks", "quantize_act_blocks", "quantize_weight_blocks", "w8a8_block_matmul"]
