"""The grouped MoE ops (compress_kernels/moe/op.py) against compress_kernels.reference.moe_*_ref.

CPU: the Triton interpreter on small shapes (several experts, top-1 to top-3, experts with no tokens, one
token, more tokens than BLOCK_M on one expert, K not a multiple of the tile, padded K, every W4A16 product,
split-K); GPU (marked ``gpu``): Mixtral-like shapes, torch.compile(fullgraph) and CUDA-graph replay.
Tolerance ``MOE_TOL``: the dense ops' (tests/kernels/helpers.py) twice, since two GEMMs and the SwiGLU
round in x's dtype in a row; fp16 in the interpreter is exact here. bf16 in the interpreter gets 3e-2: it
truncates every fp32 -> bf16 cast (gate/up, SiLU, the product), a bias of half an ulp (2^-9) each, which the
reference rounds to nearest (seen: 1.2-2.1% on O(1) activations).
"""
from __future__ import annotations

import pytest
import torch

from compress_kernels import reference
from compress_kernels.moe.dispatch import MoeConfig, ProjectionTiles, pick
from compress_kernels.moe.op import (bind_moe_w4a16, bind_moe_w8a8, bind_moe_w8a16, launch, moe_w4a16, moe_w8a8,
                                     moe_w8a16)
from tests.kernels.helpers import DEVICE, DTYPES, random_moe_weights, random_routing, rel_error

MOE_TOL = {torch.float16: 4e-3, torch.bfloat16: 3e-2 if DEVICE == "cpu" else 2e-2}
OPS = {"w4a16": (moe_w4a16, reference.moe_w4a16_ref), "w8a8": (moe_w8a8, reference.moe_w8a8_ref),
       "w8a16": (moe_w8a16, reference.moe_w8a16_ref)}
GROUPS = {"w4a16": (32, 128, None), "w8a8": (None,), "w8a16": (None, 128)}  # the scale layouts each scheme has


def check(scheme, dtype, tokens, hidden, inter, experts, top_k, group_size=None, config=None, ids=None, seed=0,
          device=DEVICE):
    """The op (or ``launch`` with ``config``) on random inputs against its reference; returns the output."""
    op, ref = OPS[scheme]
    x = torch.randn(tokens, hidden, generator=torch.Generator().manual_seed(seed)).to(device=device, dtype=dtype)
    topk_ids, topk_weights = random_routing(tokens, experts, top_k, device=device, seed=seed)
    topk_ids = topk_ids if ids is None else ids.to(device)
    weights = random_moe_weights(scheme, experts, hidden, inter, group_size, device=device, seed=seed)
    if config is None:
        y = op(x, topk_ids, topk_weights, *weights)
    else:
        y = launch(scheme, x, topk_ids, topk_weights, weights, config)
    assert y.shape == (tokens, hidden) and y.dtype == dtype
    assert rel_error(y, ref(x, topk_ids, topk_weights, *weights)) <= MOE_TOL[dtype]
    return y


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scheme,group_size", [(s, g) for s, groups in GROUPS.items() for g in groups])
@pytest.mark.parametrize("tokens,experts,top_k", [(1, 4, 2), (6, 8, 2), (5, 3, 1), (13, 4, 2)])
def test_matches_reference(dtype, scheme, group_size, tokens, experts, top_k):
    """One token; several experts at top-2 with experts left without tokens (6 tokens x 2 over 8); top-1;
    W4A16 runs the one-row kernel at one row per expert (the first), tiles from there on."""
    check(scheme, dtype, tokens, 128, 64, experts, top_k, group_size)


@pytest.mark.parametrize("scheme,group_size", [("w4a16", 64), ("w8a8", None), ("w8a16", 128)])
def test_more_tokens_than_a_block_on_one_expert(scheme, group_size):
    tokens = 40  # every token on expert 2 (and one other): 3 blocks of 16 rows, or 2 of 32 (the dispatch's)
    ids = torch.stack([torch.full((tokens,), 2), torch.arange(tokens) % 2], dim=1)
    assert pick(scheme, 2 * tokens, 4, 64, 64, 64, 64, 64, DEVICE).block_m == 32
    check(scheme, torch.float16, tokens, 64, 64, 4, 2, group_size, ids=ids)
    tiles = ProjectionTiles(32, 64)
    check(scheme, torch.float16, tokens, 64, 64, 4, 2, group_size, ids=ids, config=MoeConfig(16, tiles, tiles))


@pytest.mark.parametrize("scheme,group_size,hidden,inter", [
    ("w4a16", None, 200, 72),  # per channel, K not a multiple of the 128-deep tile
    ("w4a16", 32, 60, 40),  # K padded with zero weights to the group (60 -> 64, 40 -> 64)
    ("w8a8", None, 100, 36),  # K not a multiple of the tile
    ("w8a16", None, 100, 36),  # K padded to a multiple of 8
    ("w8a16", 128, 100, 136),  # K padded to the 128-channel groups
])
def test_k_not_a_tile_multiple_and_padded_k(scheme, group_size, hidden, inter):
    check(scheme, torch.float16, 5, hidden, inter, 4, 2, group_size)
    check(scheme, torch.bfloat16, 3, hidden, inter, 3, 3, group_size, seed=1)


@pytest.mark.parametrize("scheme", OPS)
def test_short_last_blocks_are_picked_from_64_rows_per_block(scheme):
    """The table's short tiles: both projections at BLOCK_M 64 and 128 (Mixtral, 256 and 512 tokens), none below."""
    for tokens in (512, 256, 64):
        cfg = pick(scheme, 2 * tokens, 8, 4096, 4096, 14336, 128, 128, DEVICE)
        short = 16 if cfg.block_m >= 64 else 0
        assert cfg.gate_up.short_rows == cfg.down.short_rows == short
        assert (cfg.block_m >= 64) == (tokens >= 256)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scheme,group_size,tiles", [
    ("w4a16", 128, ProjectionTiles(32, 128, scale_after_dot=True)),
    ("w4a16", 128, ProjectionTiles(32, 128, planes=True)),
    ("w8a8", None, ProjectionTiles(32, 128)),
    ("w8a16", 128, ProjectionTiles(32, 128)),
    ("w8a16", None, ProjectionTiles(32, 64)),
])
def test_short_last_blocks_run_short_tiles(dtype, scheme, group_size, tiles):
    """Blocks of 32 rows whose last block per expert holds at most 16 pairs run 16-row tiles there: expert 0
    gets 36 pairs (32 + a short block of 4), expert 1 48 (32 + 16, the longest short block), expert 2 49
    (32 + 17: a full-size tile; a short tile would drop its 17th pair), expert 3 3 (one short block)."""
    counts = (36, 48, 49, 3)
    order = torch.randperm(sum(counts), generator=torch.Generator().manual_seed(0))
    ids = torch.cat([torch.full((c,), e) for e, c in enumerate(counts)])[order].view(-1, 1)
    tiles = tiles._replace(short_rows=16)
    config = MoeConfig(32, tiles, tiles._replace(split_k=2))
    check(scheme, dtype, ids.shape[0], 256, 128, 4, 1, group_size, ids=ids, config=config)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scheme,group_size,block_m,tiles", [
    ("w4a16", 128, 16, ProjectionTiles(32, 128, split_k=2, planes=True)),
    ("w4a16", 128, 32, ProjectionTiles(32, 64, split_k=3, scale_after_dot=True)),
    ("w4a16", None, 32, ProjectionTiles(64, 64, split_k=2)),  # dequantized before the dot
    ("w8a8", None, 16, ProjectionTiles(32, 64, split_k=4)),
    ("w8a8", None, 32, ProjectionTiles(64, 128)),
    ("w8a16", 128, 16, ProjectionTiles(32, 64, split_k=2, scale_after_dot=True)),
    ("w8a16", 128, 32, ProjectionTiles(32, 128)),  # grouped scales on the weight before the dot
    ("w8a16", None, 16, ProjectionTiles(32, 64, split_k=2)),
])
def test_every_product_and_split_k(dtype, scheme, group_size, block_m, tiles):
    config = MoeConfig(block_m, tiles._replace(split_k=1), tiles)
    check(scheme, dtype, 9, 256, 96, 4, 2, group_size, config=config)


@pytest.mark.parametrize("scheme", OPS)
def test_ids_outside_the_experts_add_nothing(scheme):
    ids = torch.tensor([[0, 4], [4, 1], [2, 3], [-1, 4]])  # 4: transformers' expert-parallel sentinel E
    y = check(scheme, torch.float16, 4, 64, 32, 4, 2, ids=ids)
    assert torch.equal(y[3], torch.zeros_like(y[3]))


@pytest.mark.parametrize("scheme", OPS)
def test_no_tokens(scheme):
    op, _ = OPS[scheme]
    ids, weights = random_routing(0, 4, 2, device=DEVICE)
    y = op(torch.empty(0, 64, device=DEVICE).half(), ids, weights, *random_moe_weights(scheme, 4, 64, 32,
                                                                                       device=DEVICE))
    assert y.shape == (0, 64)


@pytest.mark.parametrize("scheme,bind", [("w4a16", bind_moe_w4a16), ("w8a8", bind_moe_w8a8),
                                         ("w8a16", bind_moe_w8a16)])
def test_bound_call_matches_the_op(scheme, bind):
    op, _ = OPS[scheme]
    weights = random_moe_weights(scheme, 4, 64, 32, device=DEVICE)
    x = torch.randn(3, 64, device=DEVICE).half()
    ids, topk_weights = random_routing(3, 4, 2, device=DEVICE)
    call = bind(x, ids, topk_weights, *weights)
    assert torch.equal(call(x, ids, topk_weights), op(x, ids, topk_weights, *weights))
    with pytest.raises(TypeError, match="x: expected dtype torch.float16"):
        call(x.bfloat16(), ids, topk_weights)
    with pytest.raises(ValueError, match=r"x: expected shape \(T, 64\)"):
        call(x[:, :32], ids, topk_weights)


@pytest.mark.parametrize("scheme", OPS)
def test_the_op_is_registered_with_a_fake_for_every_scheme(scheme):
    weights = [t.to("meta") for t in random_moe_weights(scheme, 4, 64, 32)]
    x = torch.empty(5, 64, device="meta", dtype=torch.bfloat16)
    ids, topk_weights = torch.empty(5, 2, dtype=torch.int64, device="meta"), torch.empty(5, 2, device="meta")
    y = torch.ops.compress_kernels.moe_experts(scheme, x, ids, topk_weights, *weights)
    assert y.shape == (5, 64) and y.dtype == torch.bfloat16


def test_the_op_refuses_an_unknown_scheme():
    weights = [t.to("meta") for t in random_moe_weights("w8a8", 4, 64, 32)]
    x = torch.empty(5, 64, device="meta", dtype=torch.bfloat16)
    ids, topk_weights = torch.empty(5, 2, dtype=torch.int64, device="meta"), torch.empty(5, 2, device="meta")
    with pytest.raises(ValueError, match=r"scheme: expected 'w4a16', 'w8a8' or 'w8a16', got 'w2a16'"):
        torch.ops.compress_kernels.moe_experts("w2a16", x, ids, topk_weights, *weights)


def _w4a16_inputs():
    x = torch.randn(3, 64).half()
    ids, weights = random_routing(3, 4, 2)
    return dict(x=x, topk_ids=ids, topk_weights=weights), random_moe_weights("w4a16", 4, 64, 32, 32)


@pytest.mark.parametrize("change,error,words", [
    (dict(x=torch.randn(3, 64)), TypeError, "x: expected dtype"),
    (dict(x=torch.randn(3, 1, 64).half()), ValueError, r"x: expected shape \(T, H\)"),
    (dict(topk_ids=torch.zeros(3, 2)), TypeError, "topk_ids: expected dtype"),
    (dict(topk_ids=torch.zeros(4, 2, dtype=torch.int64)), ValueError, r"topk_ids: expected shape \(3, k\)"),
    (dict(topk_weights=torch.zeros(3, 3)), ValueError, r"topk_weights: expected shape \(3, 2\)"),
    (dict(gate_up_qweight=torch.zeros(4, 8, 63, dtype=torch.int32)), ValueError, "even number 2I"),
    (dict(gate_up_scales=torch.ones(4, 3, 64)), ValueError, "gate_up_scales: expected one row per 32, 64 or 128"),
    (dict(down_qweight=torch.zeros(3, 4, 64, dtype=torch.int32)), ValueError, r"down_qweight: expected shape"),
    (dict(down_scales=torch.ones(4, 1, 64, dtype=torch.float64)), TypeError, "down_scales: expected dtype"),
])
def test_bad_inputs_raise(change, error, words):
    inputs, weights = _w4a16_inputs()
    names = ("gate_up_qweight", "gate_up_scales", "down_qweight", "down_scales")
    call = {**inputs, **dict(zip(names, weights)), **change}
    call = {k: v.to(DEVICE) for k, v in call.items()}
    with pytest.raises(error, match=words):
        moe_w4a16(**call)


def test_int8_shapes_are_checked():
    x = torch.randn(3, 64, device=DEVICE).half()
    ids, topk_weights = random_routing(3, 4, 2, device=DEVICE)
    gate_up, gate_up_scale, down, down_scale = random_moe_weights("w8a16", 4, 64, 32, 128, device=DEVICE)
    with pytest.raises(ValueError, match=r"down_w_scale: expected shape \(4, 64, 1\)"):
        moe_w8a16(x, ids, topk_weights, gate_up, gate_up_scale, down, down_scale[:, :, :0])
    w8a8 = random_moe_weights("w8a8", 4, 64, 32, device=DEVICE)
    with pytest.raises(TypeError, match="gate_up_w_scale: expected dtype"):
        moe_w8a8(x, ids, topk_weights, w8a8[0], w8a8[1].half(), *w8a8[2:])


# ---- GPU ------------------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scheme,group_size", [("w4a16", 128), ("w4a16", 32), ("w8a8", None), ("w8a16", None),
                                               ("w8a16", 128)])
@pytest.mark.parametrize("tokens", [1, 8, 64, 512])
def test_gpu_mixtral_like(dtype, scheme, group_size, tokens):
    check(scheme, dtype, tokens, 4096, 3584, 8, 2, group_size, device="cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("scheme", OPS)
def test_gpu_skewed_routing_and_sentinels(scheme):
    ids = torch.randint(0, 9, (300, 2))  # 8: the sentinel
    ids[:200, 0] = 3  # one expert takes most tokens
    check(scheme, torch.bfloat16, 300, 1024, 512, 8, 2, ids=ids, device="cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("scheme", OPS)
def test_gpu_torch_compile_fullgraph(scheme):
    op, _ = OPS[scheme]
    weights = random_moe_weights(scheme, 8, 1024, 512, device="cuda")

    def layer(x, ids, topk_weights):
        return op(x, ids, topk_weights, *weights) * 2  # exact, so compiled == eager

    x = torch.randn(16, 1024, device="cuda").bfloat16()
    ids, topk_weights = random_routing(16, 8, 2, device="cuda")
    compiled = torch.compile(layer, fullgraph=True)
    torch.testing.assert_close(compiled(x, ids, topk_weights), layer(x, ids, topk_weights), rtol=0, atol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("scheme", OPS)
def test_gpu_cuda_graph_replay_follows_new_routing(scheme):
    op, ref = OPS[scheme]
    weights = random_moe_weights(scheme, 8, 1024, 512, device="cuda")
    x = torch.randn(4, 1024, device="cuda").half()
    ids, topk_weights = random_routing(4, 8, 2, device="cuda")
    op(x, ids, topk_weights, *weights)  # warm-up: compile the kernels outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = op(x, ids, topk_weights, *weights)
    new_ids, new_weights = random_routing(4, 8, 2, device="cuda", seed=5)
    ids.copy_(new_ids)
    topk_weights.copy_(new_weights)
    x.normal_()
    graph.replay()
    assert rel_error(y, ref(x, ids, topk_weights, *weights)) <= MOE_TOL[torch.float16]
    first = y.clone()
    graph.replay()
    assert torch.equal(y, first)  # deterministic


@pytest.mark.parametrize("scheme", OPS)
def test_a_non_finite_token_gives_a_nan_row_and_leaves_the_others(scheme):
    """As the dense ops: W8A8's per-token scale of a row holding a NaN or Inf is NaN; the float ops propagate."""
    op, ref = OPS[scheme]
    weights = random_moe_weights(scheme, 4, 64, 32, device=DEVICE)
    x = torch.randn(5, 64, device=DEVICE).half()
    x[0, 3], x[3, 7] = float("nan"), float("inf")  # token 0 is also what every padding row reads
    ids, topk_weights = random_routing(5, 4, 2, device=DEVICE)
    y = op(x, ids, topk_weights, *weights)
    assert torch.isnan(y[0]).all() and not torch.isfinite(y[3]).any()  # an Inf meets weights of both signs
    finite = [1, 2, 4]
    assert torch.isfinite(y[finite]).all()
    assert rel_error(y[finite], ref(x, ids, topk_weights, *weights)[finite]) <= MOE_TOL[torch.float16]
