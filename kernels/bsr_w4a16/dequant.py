"""Large-M path of DDS + W4A16: the stored int4 blocks de-quantized to x's dtype, then the DDS op.

At many rows the int4 tile kernel (:mod:`compress_kernels.bsr_w4a16.gemm`) unpacks every stored block
once per M tile and scales each block's dot on CUDA cores; the weight bytes it saves no longer matter
there. This path de-quantizes each stored block once per call into a (nnz, 32, 32) buffer of x's dtype
and hands it, with the same indices, to the DDS launcher (:func:`compress_kernels.bsr.op.launch`), whose
table picks its tiles or, on dense enough layers from 2048 rows, the weight written out for cuBLAS.

:func:`dequantize_blocks` is one Triton launch, a program per stored block ``b`` (layout of
:mod:`compress_kernels.bsr_w4a16.op`)::

    out[b, i, 8 r + j] = nibble j of values[b, i, r] * scales[b, i]      (fp32 product, rounded to dtype)

The product is rounded to x's dtype once per weight (the tile kernel keeps it in fp32): the rounding
of a dense fp16 layer, within the contract's tolerance. Cost: nnz 1024 element writes, nnz 576 bytes
read (a 50% 4096x4096 layer: 16 MiB written, a few microseconds).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from compress_kernels.common.int4 import unpack_int4_tile
from compress_kernels.common.launch import launch
from compress_kernels.reference import BSR_BLOCK, BSR_INT4_WORDS


@triton.jit
def _dequantize_blocks_kernel(val_ptr, s_ptr, out_ptr, BLOCK: tl.constexpr, WORDS: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)  # the stored block
    rows = tl.arange(0, BLOCK)  # its 32 outputs
    words = tl.arange(0, WORDS)
    packed = tl.load(val_ptr + b * (BLOCK * WORDS) + rows[None, :] * WORDS + words[:, None])  # (4, 32): word, row
    scale = tl.load(s_ptr + b * BLOCK + rows).to(tl.float32)  # (32,) one per row
    w = unpack_int4_tile(packed, BLOCK, BLOCK, tl.float32) * scale[None, :]  # (32 channels, 32 rows)
    channels = tl.arange(0, BLOCK)
    tl.store(out_ptr + b * (BLOCK * BLOCK) + rows[None, :] * BLOCK + channels[:, None], w.to(out_ptr.dtype.element_ty))


def dequantize_blocks(values: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(nnz, 32, 32) blocks in ``dtype`` from validated int4 ``values`` (nnz, 32, 4) and ``scales`` (nnz, 32)."""
    nnz = values.shape[0]
    out = torch.empty((nnz, BSR_BLOCK, BSR_BLOCK), dtype=dtype, device=values.device)
    if nnz:
        launch(_dequantize_blocks_kernel, (nnz,), values, scales, out, BLOCK=BSR_BLOCK, WORDS=BSR_INT4_WORDS,
               num_warps=4)
    return out
