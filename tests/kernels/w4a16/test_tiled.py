"""W4A16's tensor-core tiles (compress_kernels/w4a16/tiled.py): scales after or before the dot, the K
tile as nibble planes, the next scale row loaded ahead, split-K summed in the kernel or by a second
launch, masked K tails and wrapped columns. CPU: the Triton interpreter; GPU: marked ``gpu``.
Tolerances: ``W4A16_TOL`` (tests/kernels/helpers.py).
"""
from __future__ import annotations

import pytest
import torch

from compress_kernels import reference
from compress_kernels.w4a16.dispatch import TileConfig
from compress_kernels.w4a16.op import launch
from tests.kernels.helpers import DEVICE, DTYPES, W4A16_TOL, check_w4a16_config, random_int4_weight, rel_error



@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "cfg",
    [
        TileConfig(16, 32, 32, split_k=3, scale_after_dot=True),  # summed in the kernel
        TileConfig(16, 32, 32, split_k=2, scale_after_dot=True, prefetch_scale=True),
        TileConfig(32, 32, 32, split_k=1),  # dequantized before the dot
        TileConfig(32, 32, 64, split_k=2),  # summed by a second launch
    ],
)
def test_plain_tiles_match_reference(dtype, cfg):
    m, k, n, g = 5, 192, 64, 64  # N a multiple of every BLOCK_N here: the contiguous-column path
    x = torch.randn(m, k, device=DEVICE).to(dtype)
    qweight, _, scales = random_int4_weight(k, n, g, scale_dtype=dtype, device=DEVICE)  # scales in x's dtype
    bias = torch.randn(n, device=DEVICE)
    y = launch(x, qweight, scales, g, bias, config=cfg)
    assert rel_error(y, reference.w4a16_matmul_ref(x, qweight, scales, g, bias)) <= W4A16_TOL[dtype]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "m,k,g,cfg",
    [
        (1, 256, 128, TileConfig(16, 32, 128, split_k=2, scale_after_dot=True, planes=True)),
        (5, 384, 128, TileConfig(16, 64, 128, split_k=1, scale_after_dot=True, planes=True)),  # N wraps
        (16, 384, 128, TileConfig(16, 32, 128, split_k=2, scale_after_dot=True, planes=True)),
        (20, 512, 256, TileConfig(16, 32, 256, split_k=1, scale_after_dot=True, planes=True)),
        (3, 264, 264, TileConfig(16, 32, 128, split_k=2, scale_after_dot=True, planes=True)),  # G = K, masked tail
        (2, 264, 264, TileConfig(16, 32, 128, split_k=1, scale_after_dot=True, planes=True)),
        (40, 256, 128, TileConfig(64, 32, 128, split_k=2, scale_after_dot=True, planes=True)),
        (7, 640, 128, TileConfig(16, 32, 128, split_k=2, scale_after_dot=True, planes=True, prefetch_scale=True)),
        (3, 264, 264, TileConfig(16, 32, 128, split_k=2, scale_after_dot=True, planes=True, prefetch_scale=True)),
        (9, 192, 64, TileConfig(16, 32, 64, split_k=2, scale_after_dot=False, prefetch_scale=True)),  # plain tiles
    ],
)
def test_nibble_planes_match_reference(dtype, m, k, g, cfg):
    check_w4a16_config(dtype, m, k, 80, g, cfg, W4A16_TOL[dtype])


def test_nibble_planes_reject_tiles_shallower_than_one_dot():
    x = torch.randn(2, 256, device=DEVICE).half()
    qweight, _, scales = random_int4_weight(256, 32, 64, device=DEVICE)
    with pytest.raises(ValueError, match="block_k >= 128"):
        launch(x, qweight, scales, 64, config=TileConfig(16, 32, 64, scale_after_dot=True, planes=True))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m", [1, 4, 16, 33, 64])
def test_gpu_nibble_planes_full_size(dtype, m):
    k, n, g = 4096, 4096 + 64, 128  # N a multiple of 64 only: the wrapped-column path for 128-wide tiles
    x = torch.randn(m, k, device="cuda").to(dtype)
    qweight, _, scales = random_int4_weight(k, n, g, device="cuda")
    bias = torch.randn(n, device="cuda").to(dtype)
    ref = reference.w4a16_matmul_ref(x, qweight, scales, g, bias)
    for block_n, split in ((64, 4), (128, 3)):  # 3 splits: a ragged last one
        cfg = TileConfig(16 if m <= 16 else 64, block_n, 128, split_k=split, num_stages=4, scale_after_dot=True,
                         planes=True)
        assert rel_error(launch(x, qweight, scales, g, bias, config=cfg), ref) <= W4A16_TOL[dtype]
