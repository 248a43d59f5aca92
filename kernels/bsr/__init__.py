"""Block-sparse weights (32x32 blocks, BSR parts): DDS (fp16/bf16 blocks) and DDS + W8A8 (int8 blocks).

dispatch    the two tables from (M, N, K, stored blocks, device) to the kernel and tiles that run
op          DDS: validation, launcher, the ``compress_kernels::bsr_matmul`` custom op, the bound call
op_w8a8     DDS + W8A8: validation, launchers, the ``compress_kernels::bsr_w8a8_matmul`` custom op, bound calls
gemv        DDS, one token row per program on CUDA cores (small M)
gemm        DDS tensor-core tiles over gathered blocks, block rows optionally shared by programs
gemm_w8a8   the same tiles with int8 blocks and per-token int8 activations
densify     the weight written out dense (large M on dense enough layers), for cuBLAS or dense W8A8
"""
from compress_kernels.bsr.op import bind_bsr_matmul_parts, bsr_matmul, bsr_matmul_parts
from compress_kernels.bsr.op_w8a8 import (bind_bsr_w8a8_matmul_parts, bind_bsr_w8a8_matmul_quantized,
                                          bsr_w8a8_matmul_parts, bsr_w8a8_matmul_quantized)

__all__ = ["bind_bsr_matmul_parts", "bind_bsr_w8a8_matmul_parts", "bind_bsr_w8a8_matmul_quantized", "bsr_matmul",
           "bsr_matmul_parts", "bsr_w8a8_matmul_parts", "bsr_w8a8_matmul_quantized"]
