"""Grouped MoE experts: every expert's gate/up (SwiGLU in its epilogue) and down in one launch each.

routing    the (token, slot) pairs sorted by expert on the device, padded to BLOCK_M per expert
dispatch   the table from (scheme, pairs, experts, shapes) to BLOCK_M and each projection's tiles
blocks     in-kernel pieces the GEMMs share: a block's rows, SwiGLU, the two stores
w4a16      the grouped W4A16 GEMM (the dense kernel's int4 products)
w4a16_fma  grouped W4A16 for one row per program (decode), CUDA-core FMAs
w8a8       the grouped W8A8 GEMM and the per-row quantization of routed rows
w8a16      the grouped W8A16 GEMM (the dense kernel's int8 -> x dtype products)
combine    the top-k weighted sum (and the down projection's K splits) into the output
op         validation, launchers, the ``compress_kernels::moe_experts`` custom op and the bound calls
"""
from compress_kernels.moe.op import (BoundMoE, bind_moe_w4a16, bind_moe_w8a8, bind_moe_w8a16, moe_w4a16, moe_w8a8,
                                     moe_w8a16)

__all__ = ["BoundMoE", "bind_moe_w4a16", "bind_moe_w8a8", "bind_moe_w8a16", "moe_w4a16", "moe_w8a8", "moe_w8a16"]
