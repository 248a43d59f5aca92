"""Token-to-expert routing on the device: the (token, slot) pairs sorted by expert, each expert's rows padded
to the GEMM's BLOCK_M, in one single-program launch with no host synchronisation.

Input: ``topk_ids`` (T, k) integers, the router's choice of k experts per token. A *pair* is one (token,
slot): pair ``p = t * k + j`` stands for token ``t`` sent to expert ``topk_ids[t, j]``; there are
P = T k of them. An id outside [0, E) (``transformers``' expert-parallel sentinel E, or anything else)
sends the pair nowhere: it gets no row and adds nothing to the output.

Output, sized from T, k, E and BLOCK_M alone (so a CUDA graph can capture the call; no ``.item()``,
``nonzero`` or sort whose size depends on the ids)::

    sorted_pairs  (num_blocks * BLOCK_M,) int32   expert 0's pairs in increasing p, padded with the
                                                  sentinel P to a multiple of BLOCK_M, then expert 1's, ...;
                                                  every slot after the last expert's is P too
    block_expert  (num_blocks,) int32             the expert of each BLOCK_M block of sorted_pairs; -1 for
                                                  the blocks after the last expert's (the GEMMs skip them)

    num_blocks = ceil((P + min(P, E) (BLOCK_M - 1)) / BLOCK_M)

(at most min(P, E) experts get pairs, each wasting at most BLOCK_M - 1 padding slots), so every block
of a grouped GEMM's rows belongs to one expert and reads that expert's weights once.

How: one program walks the ids twice in chunks of ``BLOCK_P``. First pass: per-expert counts, from the
(BLOCK_P, E) one-hot of each chunk summed over the chunk. Then each expert's padded size
``ceil(count / BLOCK_M) * BLOCK_M`` and its start (exclusive cumulative sum). Second pass: a pair's slot is
its expert's start, plus the pairs of that expert in earlier chunks (a running count), plus those before
it in the chunk (exclusive cumulative sum of the one-hot down the chunk), so pairs keep their order
within an expert and the result is deterministic. Last, the padding slots of each expert, the tail
slots and the block experts. Every slot is written once (the four kinds of store never overlap), so no
barrier is needed inside the program.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from compress_kernels.common.launch import launch

CHUNK_ELEMENTS = 4096  # one-hot elements (pairs x experts) per chunk: BLOCK_P = CHUNK_ELEMENTS / E, at most 256
TAIL_BLOCKS = 16  # blocks per step of the tail and block-expert stores


class Routing(NamedTuple):
    """The pairs of a call sorted by expert (module docstring), for GEMM rows in blocks of ``block_m``."""

    sorted_pairs: torch.Tensor  # (num_blocks * block_m,) int32: pair index, or num_pairs for a padding row
    block_expert: torch.Tensor  # (num_blocks,) int32: expert of each block, -1 past the last expert's
    num_pairs: int  # P = T k, also the sentinel
    top_k: int
    block_m: int


def num_blocks(num_pairs: int, num_experts: int, block_m: int) -> int:
    """Blocks of ``block_m`` rows that always hold the padded pairs: at most min(P, E) experts get pairs and
    each wastes at most ``block_m - 1`` slots."""
    return triton.cdiv(num_pairs + min(num_pairs, num_experts) * (block_m - 1), block_m)


@triton.jit
def _route_pairs_kernel(
    ids_ptr, pairs_ptr, block_expert_ptr,  # ids (P,), sorted pairs (NUM_BLOCKS * BLOCK_M,), block experts (NUM_BLOCKS,)
    P, E, NUM_BLOCKS,
    BLOCK_M: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_P: tl.constexpr, TAIL: tl.constexpr,
):
    experts = tl.arange(0, BLOCK_E)
    offs_p = tl.arange(0, BLOCK_P)
    counts = tl.zeros((BLOCK_E,), dtype=tl.int32)
    for p0 in range(0, P, BLOCK_P):  # pass 1: pairs per expert
        ids = tl.load(ids_ptr + p0 + offs_p, mask=p0 + offs_p < P, other=-1)
        hit = ((ids[:, None] == experts[None, :]) & (experts < E)[None, :]).to(tl.int32)  # (BLOCK_P, BLOCK_E)
        counts += tl.sum(hit, axis=0)
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    ends = tl.cumsum(padded, axis=0)
    starts = ends - padded
    total = tl.sum(padded, axis=0)

    running = starts  # pass 2: each pair's slot, in pair order within its expert
    for p0 in range(0, P, BLOCK_P):
        ids = tl.load(ids_ptr + p0 + offs_p, mask=p0 + offs_p < P, other=-1)
        hit = ((ids[:, None] == experts[None, :]) & (experts < E)[None, :]).to(tl.int32)
        before = tl.cumsum(hit, axis=0) - hit  # pairs of the same expert earlier in the chunk
        slot = tl.sum(hit * (running[None, :] + before), axis=1)
        tl.store(pairs_ptr + slot, p0 + offs_p, mask=tl.sum(hit, axis=1) > 0)
        running += tl.sum(hit, axis=0)

    offs_r = tl.arange(0, BLOCK_M)  # each expert's padding slots
    padding = starts[:, None] + counts[:, None] + offs_r[None, :]
    tl.store(pairs_ptr + padding, tl.full((BLOCK_E, BLOCK_M), 0, tl.int32) + P,
             mask=offs_r[None, :] < (padded - counts)[:, None])

    offs_b = tl.arange(0, TAIL)  # block experts, and the slots of the blocks past the last expert's
    for b0 in range(0, NUM_BLOCKS, TAIL):
        blocks = b0 + offs_b
        in_range = blocks < NUM_BLOCKS
        first_row = blocks * BLOCK_M
        expert = tl.sum((ends[None, :] <= first_row[:, None]).to(tl.int32), axis=1)  # experts ending before it
        used = first_row < total
        tl.store(block_expert_ptr + blocks, tl.where(used, expert, -1), mask=in_range)
        tail = first_row[:, None] + offs_r[None, :]
        tl.store(pairs_ptr + tail, tl.full((TAIL, BLOCK_M), 0, tl.int32) + P, mask=(in_range & ~used)[:, None])


def route_pairs(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> Routing:
    """Sort the pairs of validated ``topk_ids`` (T, k) by expert for GEMM rows in blocks of ``block_m``
    (a power of two): one launch, no host synchronisation (module docstring)."""
    tokens, top_k = topk_ids.shape
    pairs = tokens * top_k
    blocks = num_blocks(pairs, num_experts, block_m)
    sorted_pairs = torch.empty(blocks * block_m, dtype=torch.int32, device=topk_ids.device)
    block_expert = torch.empty(blocks, dtype=torch.int32, device=topk_ids.device)
    if pairs:
        block_e = triton.next_power_of_2(num_experts)
        block_p = max(1, min(256, CHUNK_ELEMENTS // block_e, triton.next_power_of_2(pairs)))
        launch(_route_pairs_kernel, (1,),
            topk_ids.reshape(-1), sorted_pairs, block_expert, pairs, num_experts, blocks,
            BLOCK_M=block_m, BLOCK_E=block_e, BLOCK_P=block_p, TAIL=TAIL_BLOCKS, num_warps=4,
        )
    return Routing(sorted_pairs, block_expert, pairs, top_k, block_m)

