"""What several ops share: input checks, device facts, tile order, split-K, PDL, L2 prefetch,
per-token int8 quantization and int4 unpacking.

checks     validation with errors naming the expected and the actual value
bound      ops bound to their weights: validated once, launched without the custom op in eager mode
device     SM count, L2 size and compute capability, read from the device (H100 values off CUDA)
tiles      grouped tile order, K split ranges, wrapped weight columns (``@triton.jit`` helpers)
splitk     the split-K reduction (a second pass, or by the last split in the kernel) and its counters
pdl        programmatic dependent launch between a producer kernel and the GEMM after it
prefetch   bulk L2 prefetch of a contiguous weight range
quantize   per-token int8 quantization: in-kernel helpers and the pre-pass launch
int4       exact unpacking of packed int4 weights (tiles, nibble planes, CUDA-core products)
"""
