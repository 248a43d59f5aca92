"""W4A16's one-row CUDA-core kernel (compress_kernels/w4a16/fma.py): K splits summed by the last split in
the kernel, empty splits, wrapped columns. CPU: the Triton interpreter; GPU: marked ``gpu``.
Tolerances: ``W4A16_TOL`` (tests/kernels/helpers.py).
"""
from __future__ import annotations

import pytest
import torch

from compress_kernels import reference
from compress_kernels.common.splitk import tile_counters
from compress_kernels.w4a16.dispatch import TileConfig
from compress_kernels.w4a16.op import launch
from tests.kernels.helpers import DEVICE, DTYPES, W4A16_TOL, check_w4a16_config, random_int4_weight, rel_error



@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "m,n,g,cfg",
    [
        (1, 64, 32, TileConfig(1, 32, 32, split_k=3, path="fma")),  # 3 splits over 6 K tiles
        (1, 80, 64, TileConfig(1, 64, 64, split_k=1, path="fma")),  # N not a BLOCK_N multiple
        (3, 96, 64, TileConfig(1, 32, 64, split_k=4, num_warps=2, path="fma")),  # one empty split
        (2, 64, 32, TileConfig(1, 64, 32, split_k=2, num_stages=4, path="fma")),
    ],
)
def test_matches_reference(dtype, m, n, g, cfg):
    check_w4a16_config(dtype, m, 192, n, g, cfg, W4A16_TOL[dtype])


def test_fma_last_split_reduces_and_leaves_counters_zeroed():
    m, k, n, g = 2, 512, 96, 64  # 8 K tiles in 4 splits; N not a BLOCK_N multiple
    x = torch.randn(m, k, device=DEVICE).half()
    qweight, _, scales = random_int4_weight(k, n, g, device=DEVICE)
    bias = torch.randn(n, device=DEVICE).half()
    cfg = TileConfig(1, 64, 64, split_k=4, path="fma")
    first = launch(x, qweight, scales, g, bias, config=cfg)
    assert not tile_counters(x.device, 4).any()  # every ticket counter back at zero
    assert torch.equal(launch(x, qweight, scales, g, bias, config=cfg), first)  # and the next call is right too
    assert rel_error(first, reference.w4a16_matmul_ref(x, qweight, scales, g, bias)) <= W4A16_TOL[torch.float16]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "m,cfg",
    [(1, TileConfig(1, 64, 128, split_k=2, num_stages=3, path="fma")),
     (1, TileConfig(1, 256, 128, split_k=4, num_warps=8, path="fma")),
     (3, TileConfig(1, 128, 64, split_k=1, path="fma"))],
)
def test_gpu_fma_full_size(dtype, m, cfg):
    k, n, g = 4096, 4096 + 64, 128  # N a multiple of 64 only: the wrapped-column path for wider tiles
    x = torch.randn(m, k, device="cuda").to(dtype)
    qweight, _, scales = random_int4_weight(k, n, g, device="cuda")
    bias = torch.randn(n, device="cuda").to(dtype)
    y = launch(x, qweight, scales, g, bias, config=cfg)
    assert rel_error(y, reference.w4a16_matmul_ref(x, qweight, scales, g, bias)) <= W4A16_TOL[dtype]
    for _ in range(3):  # in-kernel split reduction: the same bits whichever split arrives last
        assert torch.equal(launch(x, qweight, scales, g, bias, config=cfg), y)
