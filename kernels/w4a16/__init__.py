"""W4A16: fp16/bf16 activations x packed int4 weights with group scales (``w4a16_matmul``).

dispatch   the table from (M, N, K, group size, scale dtype, device) to the path and tiles that run
op         validation, launcher, the ``compress_kernels::w4a16_matmul`` custom op and the bound call
wholek     one token row per program holding its whole K strip (few rows, small layers)
fma        one token row per program, CUDA-core FMAs over K splits (M = 1)
tiled      tensor-core tiles, the K tile as nibble planes at small M, split-K
wgmma      the weight as wgmma's register operand, x permuted into nibble-pair order (17-256 rows)
dequant    the weight dequantized once, then cuBLAS (from 128 rows)
"""
from compress_kernels.w4a16.op import bind_w4a16_matmul, w4a16_matmul

__all__ = ["bind_w4a16_matmul", "w4a16_matmul"]
