"""W8A16's one-row CUDA-core kernel (compress_kernels/w8a16/gemv.py): the weight bytes turned into exact
values, full and short K tiles, K splits summed by the last split in the kernel, wrapped columns.

CPU: the Triton interpreter; GPU: marked ``gpu``. Tolerances: ``W8A16_TOL`` (tests/kernels/helpers.py).
"""
from __future__ import annotations

import pytest
import torch

from compress_kernels import reference
from compress_kernels.common.splitk import tile_counters
from compress_kernels.w8a16.dispatch import TileConfig, gemv_tile
from compress_kernels.w8a16.op import launch
from tests.kernels.helpers import DEVICE, DTYPES, W8A16_TOL, check_w8a16_config, random_w8a16_weight, rel_error

GEMV = TileConfig(1, 8, 64, path="gemv")


def test_every_byte_value_in_every_position_comes_out_exact():
    """x rows one-hot at channels 0..7 (each byte position of two words): y[m, n] = w_q[n, m] exactly, for
    all 256 int8 values (scale 1)."""
    n, k = 256, 64
    w_q = torch.arange(-128, 128, dtype=torch.int8)[:, None].roll(1, 0).repeat(1, k)  # row n: one value
    w_q = torch.stack([w_q[:, j].roll(j) for j in range(k)], dim=1).contiguous()  # each column shifted
    x = torch.eye(8, k).half()
    y = launch(x.to(DEVICE), w_q.to(DEVICE), torch.ones(n, device=DEVICE), config=GEMV._replace(block_n=32))
    assert torch.equal(y.cpu(), w_q[:, :8].T.half())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "m,k,n,grouped,cfg",
    [
        (1, 264, 40, False, GEMV),  # 4 full tiles and a short one; N not a BLOCK_N multiple
        (1, 264, 42, False, GEMV._replace(block_n=4)),  # the table's 4-channel tiles, N not a multiple
        (2, 264, 48, False, GEMV._replace(split_k=3)),  # 3 splits, the last one short
        (1, 192, 40, False, GEMV._replace(split_k=4, num_warps=2)),  # 3 tiles in 4 splits: one empty
        (3, 256, 64, True, GEMV._replace(block_n=16, split_k=2)),  # group scales, 64-deep tiles
        (1, 384, 24, True, GEMV._replace(block_k=128)),  # one group per tile
    ],
)
def test_matches_reference(dtype, m, k, n, grouped, cfg):
    check_w8a16_config(dtype, m, k, n, grouped, cfg, W8A16_TOL[dtype])


def test_split_k_is_deterministic_and_leaves_counters_zeroed():
    m, k, n = 2, 512, 40
    x = torch.randn(m, k, device=DEVICE).half()
    w_q, w_scale = random_w8a16_weight(n, k, False, device=DEVICE)
    bias = torch.randn(n, device=DEVICE).half()
    cfg = GEMV._replace(split_k=4)
    first = launch(x, w_q, w_scale, bias, config=cfg)
    assert not tile_counters(x.device, m * 5).any()  # every ticket counter back at zero
    assert torch.equal(launch(x, w_q, w_scale, bias, config=cfg), first)
    assert rel_error(first, reference.w8a16_matmul_ref(x, w_q, w_scale, bias)) <= W8A16_TOL[torch.float16]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("k,n,grouped", [(4096, 4096, False), (11008, 4096, False), (4096, 22016, True),
                                         (1024, 1024, False), (384, 1152, False)])
def test_gpu_gemv(dtype, k, n, grouped):
    x = torch.randn(1, k, device="cuda").to(dtype)
    w_q, w_scale = random_w8a16_weight(n, k, grouped, device="cuda")
    bias = torch.randn(n, device="cuda").to(dtype)
    ref = reference.w8a16_matmul_ref(x, w_q, w_scale, bias)
    tol = {torch.float16: 2e-3, torch.bfloat16: 8e-3}[dtype]
    picked = gemv_tile(1, n, k, grouped, torch.cuda.get_device_properties(0).multi_processor_count)
    for cfg in (picked, picked._replace(split_k=picked.split_k * 2), picked._replace(block_n=16, num_warps=8)):
        y = launch(x, w_q, w_scale, bias, config=cfg)
        assert rel_error(y, ref) <= tol, cfg
        assert torch.equal(launch(x, w_q, w_scale, bias, config=cfg), y)  # the same bits whoever reduces
