"""Tests for kernels/w4a16.py against kernels.reference (CPU: Triton interpreter; GPU: marked ``gpu``).

Tolerances (||y - ref|| / ||ref||): the reference dequantizes to fp32; the large-M kernel path rounds
the dequantized weight to x's dtype before the tensor-core product (fp16: 2^-11, bf16: 2^-8 per
weight) and the output is cast to x's dtype (Triton's interpreter truncates fp32 -> bf16):
fp16 <= 2e-3, bf16 <= 1e-2.
"""
from __future__ import annotations

import pytest
import torch

from compress_kernels import reference
from compress_kernels.w4a16 import TileConfig, launch, pick_config, skinny_config, w4a16_matmul
from tests.kernels.helpers import random_int4_weight, rel_error

TOL = {torch.float16: 2e-3, torch.bfloat16: 1e-2}
DTYPES = (torch.float16, torch.bfloat16)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,k,n", [(1, 128, 48), (3, 256, 96), (17, 128, 80), (67, 256, 40)])
@pytest.mark.parametrize("group_size", [32, 64, 128, "K"])
def test_matches_reference(dtype, m, k, n, group_size):
    g = k if group_size == "K" else group_size
    x = torch.randn(m, k, device=DEVICE).to(dtype)
    qweight, _, scales = random_int4_weight(k, n, g, device=DEVICE)
    bias = torch.randn(n, device=DEVICE).to(dtype) if m % 2 else None  # odd M with bias, even without
    y = w4a16_matmul(x, qweight, scales, g, bias)
    ref = reference.w4a16_matmul_ref(x, qweight, scales, g, bias)
    assert y.shape == (m, n) and y.dtype == dtype
    assert rel_error(y, ref) <= TOL[dtype]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "cfg",
    [
        TileConfig(16, 32, 32, split_k=3, scale_after_dot=True, magic_unpack=True),
        TileConfig(16, 32, 32, split_k=2, scale_after_dot=True, magic_unpack=False),
        TileConfig(32, 32, 32, split_k=1, scale_after_dot=False, magic_unpack=True),
        TileConfig(32, 32, 64, split_k=1, scale_after_dot=False, magic_unpack=False),
        TileConfig(16, 32, 32, split_k=2, scale_after_dot=True, magic_unpack=True, expanded_load=True),
        TileConfig(32, 32, 64, split_k=1, scale_after_dot=False, magic_unpack=False, expanded_load=True),
        TileConfig(16, 32, 32, split_k=1, scale_after_dot=True, chunk=2),  # 6 tiles: 3 steps of 2
        TileConfig(16, 32, 32, split_k=2, scale_after_dot=True, chunk=4),  # 3 tiles per split: a masked tail
        TileConfig(32, 32, 32, split_k=1, scale_after_dot=False, magic_unpack=True, chunk=2),
        TileConfig(16, 32, 32, split_k=4, scale_after_dot=True, chunk=2, num_stages=3),  # 2 tiles per split
        TileConfig(0, 0, 0, path="dequant"),
    ],
)
def test_every_kernel_variant(dtype, cfg):
    m, k, n, g = 5, 192, 64, 64  # N a multiple of every BLOCK_N here: the contiguous-column path
    x = torch.randn(m, k, device=DEVICE).to(dtype)
    qweight, _, scales = random_int4_weight(k, n, g, scale_dtype=dtype, device=DEVICE)  # scales in x's dtype
    bias = torch.randn(n, device=DEVICE)
    y = launch(x, qweight, scales, g, bias, config=cfg)
    assert rel_error(y, reference.w4a16_matmul_ref(x, qweight, scales, g, bias)) <= TOL[dtype]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "m,n,g,cfg",
    [
        (1, 64, 32, TileConfig(16, 32, 32, split_k=3, path="skinny")),  # 3 splits over 6 K tiles
        (5, 80, 64, TileConfig(16, 64, 64, split_k=1, path="skinny")),  # N not a BLOCK_N multiple
        (16, 96, 64, TileConfig(16, 32, 64, split_k=2, num_warps=2, path="skinny")),
        (20, 64, 32, TileConfig(32, 32, 32, split_k=4, path="skinny")),  # 4 splits over 6 tiles: one empty
        (40, 48, 64, TileConfig(64, 32, 64, split_k=1, path="skinny")),
        (3, 80, 32, TileConfig(16, 64, 32, split_k=4, path="skinny", prefetch_scale=True)),  # an empty split too
        (17, 64, 64, TileConfig(32, 32, 64, split_k=2, path="skinny", prefetch_scale=True)),
        (1, 64, 32, TileConfig(1, 32, 32, split_k=3, path="fma")),  # 3 splits over 6 K tiles
        (1, 80, 64, TileConfig(1, 64, 64, split_k=1, path="fma")),  # N not a BLOCK_N multiple
        (3, 96, 64, TileConfig(1, 32, 64, split_k=4, num_warps=2, path="fma")),  # one empty split
        (2, 64, 32, TileConfig(1, 64, 32, split_k=2, num_stages=4, path="fma")),
    ],
)
def test_small_m_paths(dtype, m, n, g, cfg):
    check_config_against_reference(dtype, m, 192, n, g, cfg)


def check_config_against_reference(dtype, m, k, n, g, cfg):
    """``launch`` with ``cfg`` on random inputs (a bias for odd M) against the reference."""
    x = torch.randn(m, k, device=DEVICE).to(dtype)
    qweight, _, scales = random_int4_weight(k, n, g, device=DEVICE)
    bias = torch.randn(n, device=DEVICE).to(dtype) if m % 2 else None
    y = launch(x, qweight, scales, g, bias, config=cfg)
    assert y.shape == (m, n) and y.dtype == dtype
    assert rel_error(y, reference.w4a16_matmul_ref(x, qweight, scales, g, bias)) <= TOL[dtype]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "m,k,g,cfg",
    [
        (1, 256, 128, TileConfig(16, 32, 128, split_k=2, scale_after_dot=True, planes=True)),
        (5, 384, 128, TileConfig(16, 64, 128, split_k=1, scale_after_dot=True, planes=True)),  # N wraps
        (16, 384, 128, TileConfig(16, 32, 128, split_k=2, scale_after_dot=True, planes=True, magic_unpack=True)),
        (20, 512, 256, TileConfig(16, 32, 256, split_k=1, scale_after_dot=True, planes=True, magic_unpack=True)),
        (3, 264, 264, TileConfig(16, 32, 128, split_k=2, scale_after_dot=True, planes=True)),  # G = K, masked tail
        (2, 264, 264, TileConfig(16, 32, 128, split_k=1, scale_after_dot=True, planes=True)),
        (40, 256, 128, TileConfig(64, 32, 128, split_k=2, scale_after_dot=True, planes=True)),
        (7, 640, 128, TileConfig(16, 32, 128, split_k=2, scale_after_dot=True, planes=True, prefetch_scale=True)),
        (3, 264, 264, TileConfig(16, 32, 128, split_k=2, scale_after_dot=True, planes=True, prefetch_scale=True)),
        (9, 192, 64, TileConfig(16, 32, 64, split_k=2, scale_after_dot=False, prefetch_scale=True)),  # plain tiles
    ],
)
def test_nibble_planes_match_reference(dtype, m, k, g, cfg):
    check_config_against_reference(dtype, m, k, 80, g, cfg)


def test_nibble_planes_reject_tiles_shallower_than_one_dot():
    x = torch.randn(2, 256, device=DEVICE).half()
    qweight, _, scales = random_int4_weight(256, 32, 64, device=DEVICE)
    with pytest.raises(ValueError, match="block_k >= 128"):
        launch(x, qweight, scales, 64, config=TileConfig(16, 32, 64, scale_after_dot=True, planes=True))


def test_skinny_split_balance():
    from compress_kernels.w4a16 import _balanced_split_k

    cfg = TileConfig(16, 64, 128, path="skinny")
    for k, n in [(4096, 4096), (11008, 4096), (8192, 8192), (8192, 28672)]:
        split = _balanced_split_k(1, n, k, cfg)
        programs = (n // 64) * split
        assert programs >= 264 and programs / (-(-programs // 132) * 132) >= 0.85
        assert (k // 128) // split >= 2  # every split keeps two K tiles to pipeline
    assert _balanced_split_k(1, 1024, 1024, cfg) == 4  # under one wave: as many programs as K allows
    chunked = TileConfig(16, 64, 128, chunk=4)  # a split counts loop steps of 4 tiles, and keeps two of them
    for k, n in [(4096, 4096), (8192, 28672)]:
        assert (k // (128 * 4)) // _balanced_split_k(1, n, k, chunked) >= 2


def test_unknown_path_is_refused_with_the_known_ones():
    qweight, _, scales = random_int4_weight(64, 32, 32, device=DEVICE)
    with pytest.raises(ValueError, match="expected fma, wholek, tiled, wgmma, skinny or dequant, got 'swap'"):
        launch(torch.randn(2, 64, device=DEVICE).half(), qweight, scales, 32, config=TileConfig(16, 32, 32, path="swap"))


def test_per_channel_group_with_k_not_a_tile_multiple():
    m, k, n = 3, 200, 24  # G = K = 200: BLOCK_K does not divide K, tails are masked
    x = torch.randn(m, k, device=DEVICE).half()
    qweight, _, scales = random_int4_weight(k, n, k, device=DEVICE)
    for cfg in (None, TileConfig(16, 32, 64, split_k=2, scale_after_dot=True),
                TileConfig(0, 0, 0, path="dequant"), TileConfig(16, 32, 64, split_k=2, path="skinny"),
                TileConfig(1, 32, 64, split_k=2, path="fma"),
                TileConfig(16, 32, 64, split_k=2, magic_unpack=True, expanded_load=True),
                TileConfig(16, 32, 64, split_k=2, scale_after_dot=True, chunk=2)):
        y = launch(x, qweight, scales, k, config=cfg)
        assert rel_error(y, reference.w4a16_matmul_ref(x, qweight, scales, k)) <= TOL[torch.float16]


@pytest.mark.parametrize("m,cfg", [(1, TileConfig(1, 16, 32, split_k=2, path="fma")), (1, None), (4, None)])
@pytest.mark.parametrize("first", [0, 1])  # -8 in the even or the odd nibble positions: both ends everywhere
def test_extreme_nibbles_and_zero_groups(m, cfg, first):
    k, n = 64, 16
    q = torch.full((k, n), 7, dtype=torch.int8)
    q[first::2] = -8  # the two ends of the int4 range, alternating
    from tests.kernels.helpers import pack_int4

    qweight = pack_int4(q).to(DEVICE)
    scales = torch.ones(2, n, device=DEVICE)
    scales[1] = 0.0  # an all-zero group contributes nothing, and nothing becomes NaN
    x = torch.arange(1, k + 1, device=DEVICE).half().expand(m, k)  # distinct x per channel: catches a swap
    y = launch(x, qweight, scales, 32, config=cfg)
    expected = x[:, :32].float() @ q[:32].float().to(DEVICE)
    assert torch.isfinite(y).all()
    assert torch.equal(y.float(), expected)


def test_empty_and_batched_inputs():
    qweight, _, scales = random_int4_weight(64, 24, 32, device=DEVICE)
    assert w4a16_matmul(torch.empty(0, 64, device=DEVICE).half(), qweight, scales, 32).shape == (0, 24)
    x = torch.randn(2, 3, 64, device=DEVICE).bfloat16()
    y = w4a16_matmul(x, qweight, scales, 32)
    assert y.shape == (2, 3, 24)
    ref = reference.w4a16_matmul_ref(x.reshape(6, 64), qweight, scales, 32).reshape(2, 3, 24)
    assert rel_error(y, ref) <= TOL[torch.bfloat16]


def test_pick_config_buckets():
    small = pick_config(1, 11008, 4096, 128)
    mid = pick_config(256, 4096, 4096, 128)  # from M = 128 on: dequantize + cuBLAS
    assert small.block_m <= 16 and small.split_k >= 1 and small.block_k <= 128
    assert mid.path == "dequant" and pick_config(64, 4096, 4096, 128).path == "tiled"
    assert skinny_config(64, 4096, 4096, 128).path == "skinny" and skinny_config(1, 4096, 4096, 32).block_k <= 32
    assert pick_config(4096, 4096, 4096, 128).path == "dequant"
    assert pick_config(1, 11008, 4096, 32).block_k <= 32  # a K tile never crosses a scale group
    assert small.path == "fma" and pick_config(2, 8192, 8192, 128).planes
    for m, n, k, g in ((3, 2048, 4096, 128), (3, 4096, 4096, 128), (16, 28672, 8192, 128), (16, 4096, 4096, 4096)):
        cfg = pick_config(m, n, k, g)  # 128-deep K tiles: the nibble planes
        assert cfg.path == "tiled" and cfg.planes and cfg.block_k == 128
        assert cfg.block_n == (128 if n >= 8192 else 64) and cfg.prefetch_scale == (cfg.block_n == 64)
    assert not pick_config(16, 4096, 4096, 64).planes and not pick_config(17, 4096, 4096, 128).planes


def test_pick_config_gives_few_rows_the_whole_k_strip():
    for m, n, k, g in ((1, 1024, 1024, 128), (2, 4096, 4096, 32), (1, 1152, 384, 384), (2, 384, 1536, 64)):
        cfg = pick_config(m, n, k, g)
        assert cfg.path == "wholek" and cfg.split_k == 1 and k <= cfg.block_k <= 2 * k
        assert (cfg.block_n, cfg.num_warps) == ((16, 8) if cfg.block_k <= 2048 else (8, 4))
    for m, n, k in ((3, 1024, 1024), (16, 1536, 384), (8, 384, 1536)):  # small layers up to 16 rows
        cfg = pick_config(m, n, k, 128)
        assert cfg.path == "wholek" and cfg.num_warps == 4 and cfg.block_n == (32 if cfg.block_k <= 1024 else 16)
    assert pick_config(3, 4096, 4096, 128).path == "tiled"  # a third row of a larger layer: the tensor-core tiles
    assert pick_config(17, 1024, 1024, 128).path == "tiled"
    assert pick_config(1, 11008, 4096, 128).path == "fma"  # more than 16 Mi weights
    assert pick_config(1, 8192, 8192, 128).path == "fma"  # K past 4096


@pytest.mark.parametrize("dtype", DTYPES)
def test_default_planes_with_16_bit_scales_match_reference(dtype):
    """16-bit scales make the launcher load each scale row one K tile ahead (any tile width)."""
    m, k, n, g = 6, 640, 8192, 128  # 8192 outputs: 128-wide tiles, which do not prefetch with fp32 scales
    assert pick_config(m, n, k, g).planes and not pick_config(m, n, k, g).prefetch_scale
    x = torch.randn(m, k, device=DEVICE).to(dtype)
    qweight, _, scales = random_int4_weight(k, n, g, scale_dtype=dtype, device=DEVICE)
    y = w4a16_matmul(x, qweight, scales, g)
    assert rel_error(y, reference.w4a16_matmul_ref(x, qweight, scales, g)) <= TOL[dtype]


def test_pick_config_gives_large_layers_the_swapped_nibble_pairs_from_17_to_256_rows():
    for m, n, k in ((17, 4096, 4096), (32, 4096, 4096), (33, 28672, 8192), (64, 11008, 4096), (256, 8192, 8192)):
        cfg = pick_config(m, n, k, 128)
        assert cfg.path == "wgmma" and cfg.block_k == 128 and cfg.split_k >= 1
        assert cfg.block_m == (32 if m <= 32 else 64 if m <= 64 else 128)
    assert pick_config(64, 4096, 11008, 128).block_n == 256 and pick_config(64, 4096, 11008, 128).num_warps == 8
    assert pick_config(64, 4096, 4096, 128).path == "tiled"  # 16 Mi weights: the 64-row tiled kernel above 32 rows
    assert pick_config(256, 4096, 4096, 128).path == "dequant"
    assert pick_config(257, 8192, 8192, 128).path == "dequant"
    assert pick_config(64, 8192, 8192, 64).path == "tiled"  # 64-channel groups: a 128-deep tile would cross them
    assert pick_config(64, 8192, 8192, 8192).path == "wgmma"  # per channel
    assert pick_config(32, 1024, 1024, 128).path == "tiled"  # small layers keep their own tiles


@pytest.mark.parametrize("k,n,g", [(384, 384, 128), (384, 1536, 128), (384, 1536, 384), (256, 1024, 32)])
def test_small_layers_take_no_split_k(k, n, g):
    for m in (1, 16):
        assert pick_config(m, n, k, g).path == "wholek" and pick_config(m, n, k, g).split_k == 1
    for m in (17, 64):
        cfg = pick_config(m, n, k, g)
        assert cfg.path == "tiled" and cfg.split_k == 1 and cfg.block_k <= min(g, 128) and k % cfg.block_k == 0
    assert pick_config(64, 384, 1536, 128).split_k > 1  # K = 1536: many K steps, split-K still pays


def test_fma_last_split_reduces_and_leaves_counters_zeroed():
    from compress_kernels._splitk import tile_counters

    m, k, n, g = 2, 512, 96, 64  # 8 K tiles in 4 splits; N not a BLOCK_N multiple
    x = torch.randn(m, k, device=DEVICE).half()
    qweight, _, scales = random_int4_weight(k, n, g, device=DEVICE)
    bias = torch.randn(n, device=DEVICE).half()
    cfg = TileConfig(1, 64, 64, split_k=4, path="fma")
    first = launch(x, qweight, scales, g, bias, config=cfg)
    assert not tile_counters(x.device, 4).any()  # every ticket counter back at zero
    assert torch.equal(launch(x, qweight, scales, g, bias, config=cfg), first)  # and the next call is right too
    assert rel_error(first, reference.w4a16_matmul_ref(x, qweight, scales, g, bias)) <= TOL[torch.float16]


def test_fma_split_rule():
    from compress_kernels._tiles import prefetch_split_k

    cfg = TileConfig(1, 64, 128, path="fma")
    measured_best = {(4096, 4096): 8, (11008, 4096): 8, (4096, 12288): 4, (4096, 22016): 4}  # H100, M = 1
    for (k, n), best in measured_best.items():
        assert prefetch_split_k(1, n, k, cfg) == best
    for k, n in [(4096, 11008), (8192, 8192), (8192, 28672)]:
        split = prefetch_split_k(1, n, k, cfg)
        assert (n // 64) * split >= 512 and k // split <= 1536 and (k // 128) // split >= 2
    assert prefetch_split_k(1, 1024, 1024, cfg) == 4  # two K tiles per split at least
    assert prefetch_split_k(2, 28672, 8192, cfg) == 8  # K spans still capped with two rows


def test_op_is_registered_with_fake():
    x = torch.empty(2, 3, 64, device="meta", dtype=torch.bfloat16)
    qweight = torch.empty(8, 24, dtype=torch.int32, device="meta")
    y = torch.ops.compress_kernels.w4a16_matmul(x, qweight, torch.empty(2, 24, device="meta"), 32, None)
    assert y.shape == (2, 3, 24) and y.dtype == torch.bfloat16


@pytest.mark.parametrize(
    "args,error,words",
    [
        (dict(x=torch.randn(2, 64)), TypeError, "x: expected dtype"),
        (dict(qweight=torch.zeros(8, 24, dtype=torch.int64)), TypeError, "qweight: expected dtype"),
        (dict(qweight=torch.zeros(4, 24, dtype=torch.int32)), ValueError, r"qweight: expected shape \(8, 24\)"),
        (dict(x=torch.randn(2, 60).half()), ValueError, "multiple of 8"),
        (dict(group_size=48), ValueError, "group_size: expected one of"),
        (dict(group_size=32.0), TypeError, "group_size: expected an int"),
        (dict(x=torch.randn(2, 96).half(), qweight=torch.zeros(12, 24, dtype=torch.int32), group_size=64),
         ValueError, "multiple of group_size"),
        (dict(scales=torch.ones(3, 24)), ValueError, r"scales: expected shape \(2, 24\)"),
        (dict(scales=torch.ones(2, 24, dtype=torch.float64)), TypeError, "scales: expected dtype"),
        (dict(bias=torch.zeros(25).half()), ValueError, r"bias: expected shape \(24,\)"),
        (dict(scales=torch.ones(2, 24, device="meta")), ValueError, "scales: expected device"),
    ],
)
def test_bad_inputs_raise(args, error, words):
    qweight, _, scales = random_int4_weight(64, 24, 32)
    call = dict(x=torch.randn(2, 64).half(), qweight=qweight, scales=scales, group_size=32, bias=None)
    call.update(args)
    call = {k: v.to(DEVICE) if isinstance(v, torch.Tensor) and v.device.type == "cpu" else v for k, v in call.items()}
    with pytest.raises(error, match=words):
        w4a16_matmul(**call)


def test_cpu_tensor_without_interpreter_raises(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    qweight, _, scales = random_int4_weight(64, 24, 32)
    with pytest.raises(ValueError, match="expected a CUDA tensor"):
        w4a16_matmul(torch.randn(2, 64).half(), qweight, scales, 32)


# ----------------------------------------------------------------------------------------- GPU only


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m", [1, 16, 32, 64, 2048])
@pytest.mark.parametrize("group_size", [32, 128])
def test_gpu_full_size(dtype, m, group_size):
    k = n = 4096
    x = torch.randn(m, k, device="cuda").to(dtype)
    qweight, _, scales = random_int4_weight(k, n, group_size, device="cuda")
    bias = torch.randn(n, device="cuda").to(dtype)
    y = w4a16_matmul(x, qweight, scales, group_size, bias)
    assert rel_error(y, reference.w4a16_matmul_ref(x, qweight, scales, group_size, bias)) <= TOL[dtype]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,chunk,stages", [(1, 2, 3), (1, 4, 3), (16, 4, 4), (33, 2, 3), (64, 2, 3)])
@pytest.mark.parametrize("k,n", [(4096, 4096), (2048, 1000)])  # 1000: wrapped columns, masked stores
def test_gpu_chunked_steps_match_reference_and_unchunked(dtype, m, chunk, stages, k, n):
    g = 128
    x = torch.randn(m, k, device="cuda").to(dtype)
    qweight, _, scales = random_int4_weight(k, n, g, device="cuda")
    bias = torch.randn(n, device="cuda").to(dtype)
    base = TileConfig(16 if m <= 16 else 64, 64, 128, num_warps=4, scale_after_dot=True)  # chunks: plain tiles
    cfg = base._replace(chunk=chunk, num_stages=stages, split_k=3)  # 3 splits: a ragged last one
    y = launch(x, qweight, scales, g, bias, config=cfg)
    assert rel_error(y, reference.w4a16_matmul_ref(x, qweight, scales, g, bias)) <= TOL[dtype]
    y1 = launch(x, qweight, scales, g, bias, config=cfg._replace(chunk=1))
    assert rel_error(y, y1) <= 1e-6  # same tiles, scales and summation order: equal up to FMA contraction


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m", [1, 7, 16, 33, 64])
def test_gpu_skinny_inline_ptx_matches_plain_unpack(dtype, m):
    k, n, g = 2048, 1000, 128  # N not a multiple of BLOCK_N: wrapped columns, masked stores
    x = torch.randn(m, k, device="cuda").to(dtype)
    qweight, _, scales = random_int4_weight(k, n, g, device="cuda")
    bias = torch.randn(n, device="cuda").to(dtype)
    cfg = skinny_config(m, n, k, g)
    assert cfg.path == "skinny" and cfg.asm_unpack
    y_asm = launch(x, qweight, scales, g, bias, config=cfg)
    y_plain = launch(x, qweight, scales, g, bias, config=cfg._replace(asm_unpack=False))
    torch.testing.assert_close(y_asm, y_plain, rtol=0, atol=0)  # the same exact int4 operands
    assert rel_error(y_asm, reference.w4a16_matmul_ref(x, qweight, scales, g, bias)) <= TOL[dtype]


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
    assert rel_error(y, reference.w4a16_matmul_ref(x, qweight, scales, g, bias)) <= TOL[dtype]
    for _ in range(3):  # in-kernel split reduction: the same bits whichever split arrives last
        assert torch.equal(launch(x, qweight, scales, g, bias, config=cfg), y)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m", [1, 4, 16, 33, 64])
@pytest.mark.parametrize("asm,magic", [(True, False), (False, False), (False, True)])
def test_gpu_nibble_planes_full_size(dtype, m, asm, magic):
    k, n, g = 4096, 4096 + 64, 128  # N a multiple of 64 only: the wrapped-column path for 128-wide tiles
    x = torch.randn(m, k, device="cuda").to(dtype)
    qweight, _, scales = random_int4_weight(k, n, g, device="cuda")
    bias = torch.randn(n, device="cuda").to(dtype)
    ref = reference.w4a16_matmul_ref(x, qweight, scales, g, bias)
    for block_n, split in ((64, 4), (128, 3)):  # 3 splits: a ragged last one
        cfg = TileConfig(16 if m <= 16 else 64, block_n, 128, split_k=split, num_stages=4, scale_after_dot=True,
                         planes=True, asm_unpack=asm, magic_unpack=magic)
        assert rel_error(launch(x, qweight, scales, g, bias, config=cfg), ref) <= TOL[dtype]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m", [17, 32, 64, 200])
@pytest.mark.parametrize("scale_after_dot", [False, True])
def test_gpu_wgmma_pairs_full_size(dtype, m, scale_after_dot):
    k, n, g = 4096, 4096 + 64, 128  # N a multiple of 64 only: the wrapped-column path for 128-wide tiles
    x = torch.randn(m, k, device="cuda").to(dtype)
    qweight, _, scales = random_int4_weight(k, n, g, device="cuda")
    bias = torch.randn(n, device="cuda").to(dtype)
    ref = reference.w4a16_matmul_ref(x, qweight, scales, g, bias)
    for block_m, block_n, split in ((32, 64, 1), (64, 128, 3), (128, 128, 4)):  # 3 splits: a ragged last one
        cfg = TileConfig(block_m, block_n, 128, split_k=split, scale_after_dot=scale_after_dot, path="wgmma")
        assert rel_error(launch(x, qweight, scales, g, bias, config=cfg), ref) <= TOL[dtype]


@pytest.mark.gpu
def test_gpu_wgmma_default_path_in_a_cuda_graph():
    k, n, m = 4096, 8192, 64
    qweight, _, scales = random_int4_weight(k, n, 128, device="cuda")
    assert pick_config(m, n, k, 128).path == "wgmma"
    static_x = torch.randn(m, k, device="cuda").half()
    w4a16_matmul(static_x, qweight, scales, 128)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_y = w4a16_matmul(static_x, qweight, scales, 128)
    static_x.copy_(torch.randn(m, k, device="cuda").half())
    graph.replay()
    torch.testing.assert_close(static_y, w4a16_matmul(static_x, qweight, scales, 128), rtol=0, atol=0)
    assert rel_error(static_y, reference.w4a16_matmul_ref(static_x, qweight, scales, 128)) <= TOL[torch.float16]


@pytest.mark.gpu
def test_gpu_torch_compile_fullgraph():
    qweight, _, scales = random_int4_weight(512, 256, 128, device="cuda")

    def layer(x):
        return torch.relu(w4a16_matmul(x, qweight, scales, 128)) * 2  # exact in bf16, so compiled == eager

    compiled = torch.compile(layer, fullgraph=True)
    x = torch.randn(8, 512, device="cuda").bfloat16()
    torch.testing.assert_close(compiled(x), layer(x), rtol=0, atol=0)


@pytest.mark.gpu
def test_gpu_cuda_graph_replay():
    qweight, _, scales = random_int4_weight(1024, 512, 128, device="cuda")
    static_x = torch.randn(4, 1024, device="cuda").half()
    w4a16_matmul(static_x, qweight, scales, 128)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_y = w4a16_matmul(static_x, qweight, scales, 128)
    for _ in range(2):
        static_x.copy_(torch.randn(4, 1024, device="cuda").half())
        graph.replay()
        torch.testing.assert_close(static_y, w4a16_matmul(static_x, qweight, scales, 128), rtol=0, atol=0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "m,k,g,cfg",
    [
        (1, 256, 128, TileConfig(16, 32, 128, split_k=2, path="wgmma")),  # split summed in the kernel
        (5, 384, 128, TileConfig(16, 64, 128, split_k=1, path="wgmma")),  # N wraps (80 outputs)
        (20, 512, 128, TileConfig(16, 32, 128, split_k=3, path="wgmma")),  # two token tiles, uneven split
        (40, 256, 256, TileConfig(32, 16, 128, split_k=1, path="wgmma")),  # per channel (G = K)
        (64, 384, 128, TileConfig(64, 32, 128, split_k=2, path="wgmma")),  # split summed by a second launch
        (7, 256, 128, TileConfig(16, 32, 128, split_k=2, scale_after_dot=True, path="wgmma")),  # scale after the dot
        (33, 256, 256, TileConfig(32, 16, 128, split_k=1, scale_after_dot=True, path="wgmma")),
    ],
)
def test_wgmma_planes_match_reference(dtype, m, k, g, cfg):
    check_config_against_reference(dtype, m, k, 80, g, cfg)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,sliced", [(80, False), (80, True), (81, False)])
def test_wgmma_reads_16_bit_scales_in_pairs_or_converts_them(dtype, n, sliced):
    """16-bit scales are read as int32 pairs when the layout allows (even N, even row stride and offset);
    a slice starting at an odd element, or an odd N, takes the fp32 copy instead: same result."""
    m, k, g = 5, 256, 128
    x = torch.randn(m, k, device=DEVICE).to(dtype)
    qweight, _, scales = random_int4_weight(k, n + sliced, g, scale_dtype=dtype, device=DEVICE)
    qweight, scales = (qweight[:, 1:], scales[:, 1:]) if sliced else (qweight, scales)
    bias = torch.randn(n, device=DEVICE).to(dtype)
    y = launch(x, qweight, scales, g, bias, config=TileConfig(16, 32, 128, split_k=2, path="wgmma"))
    assert rel_error(y, reference.w4a16_matmul_ref(x, qweight, scales, g, bias)) <= TOL[dtype]


def test_permute_pairs_puts_each_nibble_pair_side_by_side():
    from compress_kernels.w4a16_wgmma import permute_pairs
    x = torch.arange(3 * 256, dtype=torch.float32, device=DEVICE).reshape(3, 256).to(torch.float16)
    xp = permute_pairs(x)
    for kt in (0, 128):
        for p in range(4):  # pair p: columns 8r + 2p + e, r = 0..15, e = 0, 1, in (r, e) order
            expected = torch.stack([x[:, kt + 2 * p: kt + 128: 8], x[:, kt + 2 * p + 1: kt + 128: 8]], dim=-1)
            assert torch.equal(xp[:, kt + 32 * p: kt + 32 * p + 32], expected.reshape(3, 32))


@pytest.mark.parametrize("k,g", [(264, 264), (256, 64)])
def test_wgmma_path_refuses_tiles_across_scale_groups(k, g):
    x = torch.randn(2, k, device=DEVICE).half()
    qweight, _, scales = random_int4_weight(k, 32, g, device=DEVICE)
    with pytest.raises(ValueError, match="wgmma path needs block_k = 128"):
        launch(x, qweight, scales, g, config=TileConfig(16, 32, 128, path="wgmma"))
