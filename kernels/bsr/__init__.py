"""DDS: dense fp16/bf16 activations x 32x32 block-sparse fp16/bf16 weights (BSR parts), and what the
int8 variant (:mod:`compress_kernels.bsr_w8a8`) shares with it: the dense path, the index check, the configs.

dispatch    the table from (M, N, K, stored blocks, device) to the kernel and tiles that run; BsrConfig
op          validation, launcher, the ``compress_kernels::bsr_matmul`` custom op, the bound call
gemv        one token row per program on CUDA cores (small M)
gemm        tensor-core tiles over gathered blocks, block rows optionally shared by programs
densify     the weight written out dense (large M on dense enough layers), for cuBLAS or dense W8A8
indices     the full check of BSR index values (run once where a weight comes in)
"""
from compress_kernels.bsr.op import bind_bsr_matmul_parts, bsr_matmul, bsr_matmul_parts

__all__ = ["bind_bsr_matmul_parts", "bsr_matmul", "bsr_matmul_parts"]
