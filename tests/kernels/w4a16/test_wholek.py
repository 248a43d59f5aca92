"""W4A16's whole-K-strip kernel (compress_kernels/w4a16/wholek.py) against compress_kernels.reference.

CPU: the Triton interpreter; GPU: marked ``gpu``. Tolerances: ``W4A16_TOL`` (tests/kernels/helpers.py);
the integer-valued case below is exact.
"""
from __future__ import annotations

import pytest
import torch

from compress_kernels.w4a16.dispatch import TileConfig, wholek_block_k
from compress_kernels.w4a16.op import launch
from tests.kernels.helpers import DEVICE, DTYPES, W4A16_TOL, check_w4a16_config, pack_int4, random_int4_weight



def wholek(k: int, block_n: int, num_warps: int = 4) -> TileConfig:
    return TileConfig(1, block_n, wholek_block_k(k), num_warps=num_warps, path="wholek")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "m,k,n,g,block_n",
    [
        (1, 256, 64, 32, 16),
        (1, 192, 48, 64, 32),  # K not a power of two: the packed rows past K are masked
        (2, 128, 40, 128, 16),  # N not a BLOCK_N multiple: wrapped columns, masked stores
        (3, 384, 32, 128, 8),
        (1, 320, 24, 320, 8),  # one scale group per channel (G = K)
    ],
)
def test_matches_reference(dtype, m, k, n, g, block_n):
    check_w4a16_config(dtype, m, k, n, g, wholek(k, block_n), W4A16_TOL[dtype])


@pytest.mark.parametrize("first", [0, 1])  # -8 in the even or the odd nibble positions: both ends everywhere
def test_extreme_nibbles_and_zero_groups_exact(first):
    k, n = 96, 16
    q = torch.full((k, n), 7, dtype=torch.int8)
    q[first::2] = -8
    scales = torch.ones(3, n, device=DEVICE)
    scales[1] = 0.0  # an all-zero group contributes nothing, and nothing becomes NaN
    x = torch.arange(1, k + 1, device=DEVICE).half()[None]  # distinct x per channel: catches a swap
    y = launch(x, pack_int4(q).to(DEVICE), scales, 32, config=wholek(k, 8))
    keep = torch.ones(k, dtype=torch.bool)
    keep[32:64] = False
    expected = x[:, keep].float() @ q[keep].float().to(DEVICE)
    assert torch.isfinite(y).all()
    assert torch.equal(y.float(), expected)


def test_strided_x_matches_contiguous():
    k, n, g = 128, 32, 64
    qweight, _, scales = random_int4_weight(k, n, g, device=DEVICE)
    wide = torch.randn(2, 2 * k, device=DEVICE).half()
    x = wide[:, ::2]  # row stride 2K, channel stride 2
    cfg = wholek(k, 16)
    strided = launch(x, qweight, scales, g, config=cfg)
    assert torch.equal(strided, launch(x.contiguous(), qweight, scales, g, config=cfg))


@pytest.mark.parametrize(
    "cfg,words",
    [
        (TileConfig(1, 16, 64, path="wholek"), "block_k a power of two >= K = 128"),
        (TileConfig(1, 16, 192, path="wholek"), "got 192"),
        (TileConfig(1, 16, 128, split_k=2, path="wholek"), "split_k 1"),
    ],
)
def test_bad_configs_raise(cfg, words):
    qweight, _, scales = random_int4_weight(128, 16, 32, device=DEVICE)
    with pytest.raises(ValueError, match=words):
        launch(torch.randn(1, 128, device=DEVICE).half(), qweight, scales, 32, config=cfg)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("k,n,g,block_n,warps", [(4096, 4096 + 8, 128, 16, 4), (1024, 1024, 32, 8, 2),
                                                 (4096, 11008, 4096, 32, 8), (384, 1152, 128, 16, 4)])
@pytest.mark.parametrize("m", [1, 2])
def test_gpu_full_size(dtype, k, n, g, block_n, warps, m):
    check_w4a16_config(dtype, m, k, n, g, wholek(k, block_n, warps), W4A16_TOL[dtype], device="cuda")
