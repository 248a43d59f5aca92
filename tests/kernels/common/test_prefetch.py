"""L2 prefetch (compress_kernels/common/prefetch.py): when it is allowed, and (GPU) that it changes no
output bit of the DDS one-row kernel."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from compress_kernels.bsr.dispatch import BsrConfig
from compress_kernels.bsr.gemv import launch_gemv
from compress_kernels.common import prefetch as _prefetch
from tests.kernels.helpers import block_sparse_dense, bsr_parts


def test_never_on_cpu_or_under_the_interpreter(monkeypatch):
    values = torch.zeros(4, 32, 32, dtype=torch.float16)
    assert not _prefetch.prefetch_allowed(values)  # a CPU tensor
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert not _prefetch.prefetch_allowed(values)


@pytest.mark.gpu
def test_gpu_unaligned_or_strided_tensors_are_refused():
    values = torch.zeros(65, 32, 32, dtype=torch.float16, device="cuda")
    assert _prefetch.prefetch_allowed(values) is (torch.cuda.get_device_capability()[0] >= 9)
    assert not _prefetch.prefetch_allowed(values.reshape(-1)[1:])  # 2 bytes past an aligned pointer
    assert not _prefetch.prefetch_allowed(values.transpose(1, 2))


@pytest.mark.gpu
@pytest.mark.parametrize("config", [BsrConfig("gemv", 1, 8, 16, 4, 3), BsrConfig("gemv", 1, 32, 4, 4, 2)])
@pytest.mark.parametrize("prefetch", [16, 1000, 8192, 2**20])  # 1000: not a multiple of 16, rounded down
def test_gpu_prefetch_changes_no_output_bit(config, prefetch):
    n, k, m = 2048, 4096, 3
    w = block_sparse_dense(n, k, 0.5, torch.float16, device="cuda", empty_rows=(0, 5), seed=1)
    crow, col, values = bsr_parts(w, torch.int32)
    x = torch.randn(m, k, device="cuda").half()
    bias = torch.randn(n, device="cuda").half()
    plain = torch.empty(m, n, device="cuda", dtype=torch.float16)
    fetched = torch.empty_like(plain)
    launch_gemv(x, crow, col, values, bias, plain, config)
    launch_gemv(x, crow, col, values, bias, fetched, dataclasses.replace(config, prefetch=prefetch))
    assert torch.equal(plain, fetched)
