"""DDS + W4A16: fp16/bf16 activations x 32x32 block-sparse int4 weights with group scales (a layer both
pruned into blocks and quantized to W4A16). Built on :mod:`compress_kernels.bsr` (the index check, the
configs) and the int4 unpacking of :mod:`compress_kernels.common.int4`.

dispatch    the table from (M, N, K, stored blocks, device) to the kernel and tiles that run
op          validation, launcher, the ``compress_kernels::bsr_w4a16_matmul`` custom op, the bound call
gemv        one token row per program on CUDA cores, int4 nibbles turned into fp32 in place (small M)
planes      2-8 token rows on tensor cores, four blocks a dot as nibble planes, the blocks kept apart along M
gemm        tensor-core tiles, one 32-deep dot per stored block scaled after it, block rows optionally shared
"""
from compress_kernels.bsr_w4a16.op import bind_bsr_w4a16_matmul, bsr_w4a16_matmul

__all__ = ["bind_bsr_w4a16_matmul", "bsr_w4a16_matmul"]
