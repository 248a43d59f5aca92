"""Kernel sweeps on a GPU: each times the dispatch table's pick and its neighbouring configs for chosen
shapes and M, checks them against the reference and writes JSON rows (python -m scripts.tune.<op>).

sweep    what the sweeps share: options, neighbours, timing (compress.eval.timing), the rows
w8a8     W8A8 (compress_kernels.w8a8)
w4a16    W4A16 (compress_kernels.w4a16)
w8a16    W8A16 (compress_kernels.w8a16)
w8a8_block  block-scaled W8A8 (compress_kernels.w8a8_block), with --int8-out the MLP chain's up-projection
bsr      DDS (compress_kernels.bsr) and, with --int8, DDS + W8A8 (compress_kernels.bsr_w8a8)
moe      the grouped MoE ops (compress_kernels.moe), one scheme per run (--scheme), BLOCK_M and each projection's tiles
"""
