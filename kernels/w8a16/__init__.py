"""W8A16: fp16/bf16 activations x int8 weights with per-channel or per-group scales (``w8a16_matmul``).

dispatch   the table from (M, N, K, scale grouping, device) to the path and tiles that run
op         validation, launcher, the ``compress_kernels::w8a16_matmul`` custom op and the bound call
gemv       one token row per program on CUDA cores, the weight converted in registers, split-K (small M)
tiled      tensor-core tiles, the weight tile converted to x's dtype in the loop, split-K
"""
from compress_kernels.w8a16.op import bind_w8a16_matmul, w8a16_matmul

__all__ = ["bind_w8a16_matmul", "w8a16_matmul"]
