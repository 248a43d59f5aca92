"""L2 prefetch: when it is allowed, the DDS default that uses it, and (GPU) that it changes no output bit."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from compress_kernels import _prefetch
from compress_kernels.bsr import GEMV_PREFETCH_BYTES, BsrConfig, choose_config, launch_bsr
from tests.kernels.test_bsr import block_sparse_dense, parts


def test_never_on_cpu_or_under_the_interpreter(monkeypatch):
    values = torch.zeros(4, 32, 32, dtype=torch.float16)
    assert not _prefetch.prefetch_allowed(values)  # a CPU tensor
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert not _prefetch.prefetch_allowed(values)


def test_dds_one_row_pick_prefetches_and_the_tile_kernels_do_not():
    assert choose_config(1, 4096, 4096, 128 * 64).prefetch == GEMV_PREFETCH_BYTES
    assert choose_config(2, 11008, 4096, 344 * 13).prefetch == GEMV_PREFETCH_BYTES
    assert choose_config(1, 28672, 8192, 896 * 128).prefetch == 0  # above PREFETCH_MAX_WEIGHTS: slower there
    for m in (16, 64, 256, 2048):
        assert choose_config(m, 4096, 4096, 128 * 64).prefetch == 0


@pytest.mark.gpu
def test_gpu_unaligned_or_strided_tensors_are_refused():
    values = torch.zeros(65, 32, 32, dtype=torch.float16, device="cuda")
    assert _prefetch.prefetch_allowed(values) is (torch.cuda.get_device_capability()[0] >= 9)
    assert not _prefetch.prefetch_allowed(values.reshape(-1)[1:])  # 2 bytes past an aligned pointer
    assert not _prefetch.prefetch_allowed(values.transpose(1, 2))


@pytest.mark.gpu
@pytest.mark.parametrize("config", [BsrConfig("gemv", 1, 8, 16, 4, 3), BsrConfig("gemv", 1, 32, 4, 4, 2),
                                    BsrConfig("gemm", 16, 32, 8, 4, 3), BsrConfig("gemm", 16, 32, 4, 4, 3, split=4)])
@pytest.mark.parametrize("prefetch", [16, 1000, 8192, 2**20])  # 1000: not a multiple of 16, rounded down
def test_gpu_prefetch_changes_no_output_bit(config, prefetch):
    n, k, m = 2048, 4096, 3 if config.kernel == "gemv" else 16
    w = block_sparse_dense(n, k, 0.5, torch.float16, device="cuda", empty_rows=(0, 5), seed=1)
    crow, col, values = parts(w, torch.int32)
    x = torch.randn(m, k, device="cuda").half()
    bias = torch.randn(n, device="cuda").half()
    plain = torch.empty(m, n, device="cuda", dtype=torch.float16)
    fetched = torch.empty_like(plain)
    launch_bsr(x, crow, col, values, bias, plain, config)
    launch_bsr(x, crow, col, values, bias, fetched, dataclasses.replace(config, prefetch=prefetch))
    assert torch.equal(plain, fetched)
