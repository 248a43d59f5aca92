"""norm_quant's dispatch table: the launch of the one-row-per-program kernels for rows of K features.

One program holds a whole row in registers (``BLOCK_K`` = K rounded up to a power of two, at most
:data:`MAX_ROW`), so the only choice is its warps: 4 up to 1024 values, 8 up to 4096, 16 beyond
(the rule of the quantize pre-pass, :func:`compress_kernels.common.quantize.row_warps`).
"""
from __future__ import annotations

from typing import NamedTuple

import triton

from compress_kernels.common.quantize import row_warps

MAX_ROW = 16384  # one row in the registers of one program


class RowConfig(NamedTuple):
    """Launch parameters of a row kernel: the row's power-of-two width and the program's warps."""

    block_k: int
    num_warps: int


def pick(k: int) -> RowConfig:
    """The row kernels' launch for rows of ``k`` features (1 <= k <= ``MAX_ROW``)."""
    block_k = triton.next_power_of_2(k)
    return RowConfig(block_k, row_warps(block_k))
