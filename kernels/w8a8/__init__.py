"""W8A8: int8 per-token activations x int8 per-channel weights (``w8a8_matmul``, ``w8a8_matmul_quantized``).

dispatch   the table from (M, N, K, device) to the path and tiles that run
op         validation, launchers, the ``compress_kernels::w8a8_matmul`` custom op and the bound calls
gemv       one token row per program on CUDA cores, the row quantized in the kernel (small M)
gemm       the int8 tensor-core GEMM after the quantize pass, pointer-loaded tiles, split-K
tma        the same GEMM with TMA tile loads (large M)
"""
from compress_kernels.w8a8.op import bind_w8a8_matmul, bind_w8a8_matmul_quantized, w8a8_matmul, w8a8_matmul_quantized

__all__ = ["bind_w8a8_matmul", "bind_w8a8_matmul_quantized", "w8a8_matmul", "w8a8_matmul_quantized"]
