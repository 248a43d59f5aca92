"""Bulk L2 prefetch of a contiguous weight range at the start of a program.

``cp.async.bulk.prefetch.L2.global [addr], size`` (PTX ISA 8.0, sm_90) asks the memory system to
bring ``size`` contiguous bytes at ``addr`` into L2 and returns at once: no registers, no shared
memory, no completion to wait for. Both ``addr`` and ``size`` must be multiples of 16.

Use: the DDS one-row kernel (:mod:`compress_kernels.bsr.gemv`) reads the stored blocks of one block row, a
contiguous range of ``values``, through a chain of dependent steps (block index, then the x
columns it names). One prefetch of the first ``PREFETCH_BYTES`` of that range, issued by thread 0 of
one program per block row before its loop, starts those DRAM reads at once. On an H100 8 KB took
1-5% off 9 of 10 layer / sparsity cells at M = 1 and was 3% slower on the tenth (8192x28672 at 50%,
so layers above 128 Mi weights do without); larger prefetches were slower, and so were prefetches
ahead of the W8A8 16-row GEMM and of the DDS tile kernel.

:func:`prefetch_range` clamps the size to the bytes left in the range (rounded down to 16), so a
prefetch never reaches past the tensor. The launcher decides whether a prefetch is legal
(:func:`prefetch_allowed`: CUDA, sm_90 or later, 16-byte aligned data); the interpreter never runs one.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from compress_kernels.common.checks import interpreting
from compress_kernels.common.device import hopper_or_newer

# from thread 0 of the program only: every thread would otherwise ask for the same range
PREFETCH_ONCE_ASM = tl.constexpr(
    "{\n\t.reg .pred first;\n\t.reg .u32 tid;\n\tmov.u32 tid, %tid.x;\n\tsetp.eq.u32 first, tid, 0;\n\t"
    "@first cp.async.bulk.prefetch.L2.global [$1], $2;\n\tmov.u32 $0, 0;\n\t}")


def prefetch_allowed(t: torch.Tensor) -> bool:
    """True when ranges of the contiguous tensor ``t`` can be bulk-prefetched: a CUDA tensor on sm_90
    or later whose data pointer is a multiple of 16 bytes, outside the interpreter."""
    if interpreting() or not t.is_contiguous() or not hopper_or_newer(t.device):
        return False
    return t.data_ptr() % 16 == 0


@triton.jit
def prefetch_range(ptr, bytes_left, PREFETCH_BYTES: tl.constexpr):
    """Prefetch ``min(PREFETCH_BYTES, bytes_left)`` bytes (rounded down to 16; nothing if that is 0)
    at the 16-byte aligned scalar pointer ``ptr`` into L2, issued by thread 0 of the program."""
    size = (tl.minimum(bytes_left, PREFETCH_BYTES) // 16 * 16).to(tl.int32)
    if size > 0:
        tl.inline_asm_elementwise(PREFETCH_ONCE_ASM, "=r,l,r", [ptr, size], dtype=tl.int32, is_pure=False, pack=1)
