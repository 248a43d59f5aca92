"""DDS + W8A8: per-token int8 activations x 32x32 block-sparse int8 weights with per-channel scales (a
layer both pruned into blocks and quantized to W8A8). Built on :mod:`compress_kernels.bsr` (the dense
path, the index check, BsrConfig) and the dense W8A8 kernels (its large-M path).

dispatch    the table from (M, N, K, stored blocks, device) to the kernel and tiles that run
op          validation, launchers, the ``compress_kernels::bsr_w8a8_matmul`` custom op, bound calls
gemm        tensor-core tiles over gathered int8 blocks, int32 accumulation, block rows optionally shared
"""
from compress_kernels.bsr_w8a8.op import (bind_bsr_w8a8_matmul_parts, bind_bsr_w8a8_matmul_quantized,
                                          bsr_w8a8_matmul_parts, bsr_w8a8_matmul_quantized)

__all__ = ["bind_bsr_w8a8_matmul_parts", "bind_bsr_w8a8_matmul_quantized", "bsr_w8a8_matmul_parts",
           "bsr_w8a8_matmul_quantized"]
