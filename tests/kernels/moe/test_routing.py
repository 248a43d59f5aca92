"""The routing kernel (compress_kernels/moe/routing.py) against a host-side sort of the same pairs.

CPU: the Triton interpreter; GPU: marked ``gpu``."""
from __future__ import annotations

import pytest
import torch

from compress_kernels.moe.routing import num_blocks, route_pairs
from tests.kernels.helpers import DEVICE


def sorted_by_expert(topk_ids: torch.Tensor, num_experts: int, block_m: int):
    """(sorted_pairs, block_expert) computed on the host, one expert at a time."""
    ids = topk_ids.reshape(-1).long().cpu()
    pairs = ids.numel()
    blocks = num_blocks(pairs, num_experts, block_m)
    sorted_pairs = torch.full((blocks * block_m,), pairs, dtype=torch.int32)
    block_expert = torch.full((blocks,), -1, dtype=torch.int32)
    row = 0
    for expert in range(num_experts):
        mine = (ids == expert).nonzero().reshape(-1)
        padded = -(-mine.numel() // block_m) * block_m
        sorted_pairs[row: row + mine.numel()] = mine.to(torch.int32)
        block_expert[row // block_m: (row + padded) // block_m] = expert
        row += padded
    return sorted_pairs, block_expert


def random_ids(tokens, num_experts, top_k, seed=0, device=DEVICE):
    """Distinct experts per token, as a router's top-k gives them."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(num_experts, generator=gen)[:top_k] for _ in range(tokens)])
    return ids.to(device)


@pytest.mark.parametrize("tokens,num_experts,top_k,block_m", [
    (1, 8, 2, 16), (5, 4, 2, 4), (40, 8, 2, 16), (33, 6, 3, 8), (300, 8, 2, 64), (7, 130, 4, 16),
])
def test_matches_a_host_sort(tokens, num_experts, top_k, block_m):
    ids = random_ids(tokens, num_experts, top_k)
    routing = route_pairs(ids, num_experts, block_m)
    pairs, experts = sorted_by_expert(ids, num_experts, block_m)
    assert torch.equal(routing.sorted_pairs.cpu(), pairs)
    assert torch.equal(routing.block_expert.cpu(), experts)


def test_one_expert_takes_every_token_and_others_none():
    ids = torch.zeros(37, 2, dtype=torch.int64, device=DEVICE)
    ids[:, 1] = 3
    routing = route_pairs(ids, 8, 16)
    pairs, experts = sorted_by_expert(ids, 8, 16)
    assert torch.equal(routing.sorted_pairs.cpu(), pairs) and torch.equal(routing.block_expert.cpu(), experts)
    assert routing.block_expert.cpu().tolist().count(0) == 3  # 37 rows: 3 blocks of 16


def test_ids_outside_the_experts_get_no_row():
    ids = torch.tensor([[0, 4], [4, 1], [-1, 1]], dtype=torch.int32, device=DEVICE)  # 4: the sentinel E
    routing = route_pairs(ids, 4, 4)
    pairs, experts = sorted_by_expert(ids, 4, 4)
    assert torch.equal(routing.sorted_pairs.cpu(), pairs) and torch.equal(routing.block_expert.cpu(), experts)
    assert sorted(p for p in routing.sorted_pairs.tolist() if p < 6) == [0, 3, 5]


def test_no_tokens():
    routing = route_pairs(torch.empty(0, 2, dtype=torch.int64, device=DEVICE), 8, 16)
    assert routing.sorted_pairs.numel() == 0 and routing.block_expert.numel() == 0
