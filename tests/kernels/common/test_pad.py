"""compress_kernels/common/pad.py: the Triton zero-pad of the last dimension equals ``F.pad``; bad input is refused.

CPU: the Triton interpreter (tests/conftest.py); the same code runs on the GPU.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from compress_kernels.common.pad import BLOCK, pad_columns
from tests.kernels.helpers import DEVICE


@pytest.mark.parametrize("shape,padded", [((3, 40), 64), ((2, 1, 576), 640), ((1, BLOCK + 8), 2 * BLOCK + 16),
                                          ((0, 8), 16)])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_pad_columns_appends_zero_channels_as_f_pad(shape, padded, dtype):
    x = torch.randn(shape, device=DEVICE).to(dtype)
    out = pad_columns(x, padded)
    assert out.shape == (*shape[:-1], padded) and out.is_contiguous()
    assert torch.equal(out, F.pad(x, (0, padded - shape[-1])))


def test_pad_columns_reads_strided_rows_and_returns_x_when_nothing_to_pad():
    base = torch.randn(4, 48, device=DEVICE).half()
    x = base[:, :40]  # rows 48 apart
    assert torch.equal(pad_columns(x, 64), F.pad(x, (0, 24)))
    assert pad_columns(base, 48) is base


@pytest.mark.parametrize("x,padded", [(lambda: torch.randn(2, 64), 32), (lambda: torch.randn(64, 2).t(), 80)])
def test_pad_columns_refuses_a_narrower_target_or_a_strided_last_dimension(x, padded):
    with pytest.raises(ValueError, match="expected K <="):
        pad_columns(x().to(DEVICE).half(), padded)
