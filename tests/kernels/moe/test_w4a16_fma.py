"""The one-row grouped W4A16 kernel (compress_kernels/moe/w4a16_fma.py) against reference.moe_w4a16_ref.

CPU: the Triton interpreter; GPU: marked ``gpu``. Tolerance: ``MOE_TOL`` (tests/kernels/moe/test_op.py)."""
from __future__ import annotations

import pytest
import torch

from compress_kernels.moe.dispatch import MoeConfig, ProjectionTiles, pick
from compress_kernels.moe.routing import route_pairs
from compress_kernels.moe.w4a16_fma import launch_w4a16_fma
from tests.kernels.helpers import DEVICE, DTYPES
from tests.kernels.moe.test_op import check


def one_row(gate_up: ProjectionTiles, down: ProjectionTiles) -> MoeConfig:
    return MoeConfig(1, gate_up, down)


def test_the_dispatch_takes_it_for_one_row_per_expert():
    assert pick("w4a16", 2, 8, 4096, 4096, 14336, 128, 128, DEVICE).block_m == 1  # Mixtral, 1 token
    assert pick("w4a16", 8, 8, 4096, 4096, 14336, 128, 128, DEVICE).block_m == 1  # 4 tokens
    assert pick("w4a16", 16, 8, 4096, 4096, 14336, 128, 128, DEVICE).block_m == 16  # 8 tokens: 2 rows, tiles
    assert pick("w4a16", 128, 8, 4096, 4096, 14336, 128, 128, DEVICE).block_m == 16  # 64 tokens: tiles
    assert pick("w8a8", 2, 8, 4096, 4096, 14336, 0, 0, DEVICE).block_m == 16  # W8A8: tiles
    cfg = pick("w4a16", 2, 8, 4096, 4096, 14336, 128, 128, DEVICE)
    assert cfg.gate_up.block_n == 32 and cfg.down.split_k == 16  # few rows: narrower gate/up tiles, a K split


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("group_size,hidden,inter,tiles", [
    (128, 256, 128, (ProjectionTiles(64, 128), ProjectionTiles(64, 128, split_k=2))),
    (32, 64, 96, (ProjectionTiles(32, 32), ProjectionTiles(32, 32, split_k=3))),  # a split over 3 tiles: one empty
    (None, 200, 72, (ProjectionTiles(64, 128), ProjectionTiles(64, 128))),  # per channel, K not a tile multiple
    (64, 60, 40, (ProjectionTiles(64, 64), ProjectionTiles(64, 64, split_k=2))),  # K padded to the group
])
@pytest.mark.parametrize("tokens,experts,top_k", [(1, 4, 2), (5, 4, 2)])
def test_matches_reference(dtype, group_size, hidden, inter, tiles, tokens, experts, top_k):
    check("w4a16", dtype, tokens, hidden, inter, experts, top_k, group_size, config=one_row(*tiles))


def test_refuses_blocks_of_more_than_one_row():
    routing = route_pairs(torch.zeros(2, 1, dtype=torch.int64, device=DEVICE), 2, 16)
    with pytest.raises(ValueError, match="blocks of one pair, got block_m=16"):
        launch_w4a16_fma(torch.zeros(2, 64, device=DEVICE).half(), None, None, None, routing, ProjectionTiles(16, 64),
                         True)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("group_size", [32, 128])
@pytest.mark.parametrize("tokens", [1, 2, 4])
def test_gpu_mixtral_like(dtype, group_size, tokens):
    assert pick("w4a16", 2 * tokens, 8, 4096, 4096, 3584, group_size, group_size, "cuda").block_m == 1
    check("w4a16", dtype, tokens, 4096, 3584, 8, 2, group_size, device="cuda")
