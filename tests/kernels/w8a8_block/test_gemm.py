"""Every block-scaled W8A8 path (compress_kernels/w8a8_block/gemm.py, tma.py, epilogue.py) against the reference.

Configs are forced through ``op.launch``. Unsplit, a path sums the K blocks in the reference's order,
so on fp16 the interpreter gives the reference's bits (float and int8 outputs); split-K sums in
another order (``W8A8_BLOCK_TOL``), and the interpreter truncates fp32 -> bf16. CPU: the Triton
interpreter; GPU: marked ``gpu``. On the GPU the bit-for-bit checks become tolerances (``BLOCK_EXACT``):
the compiled kernel contracts each step's multiply-add into one FMA.
"""
from __future__ import annotations

import pytest
import torch

from compress_kernels import reference
from compress_kernels.w8a8_block.dispatch import TileConfig
from compress_kernels.w8a8_block.op import launch
from tests.kernels.helpers import BLOCK_EXACT, DEVICE, DTYPES, W8A8_BLOCK_TOL, random_block_weight, rel_error

CONFIGS = {
    "small-m-in-kernel-quantize": TileConfig(16, 64, quantize_x=True),
    "small-m-split": TileConfig(16, 64, split_k=2, quantize_x=True),
    "mid-m-split-3": TileConfig(32, 128, split_k=3, quantize_x=True),
    "pre-pass": TileConfig(32, 128),
    "wide-columns": TileConfig(16, 256),  # a weight scale per column
    "tma": TileConfig(32, 128, path="tma"),
}
UNSPLIT = ("small-m-in-kernel-quantize", "pre-pass", "wide-columns", "tma")


def _operands(m, k, n, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(m, k, generator=gen) * 2).to(dtype).to(DEVICE)
    w_q, w_scale = random_block_weight(n, k, DEVICE, seed)
    bias = torch.randn(n, generator=gen).to(dtype).to(DEVICE)
    return x, w_q, w_scale, bias


@pytest.mark.parametrize("name", CONFIGS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_float_output_matches_reference(name, dtype):
    m, k, n = (19, 272, 200) if CONFIGS[name].path == "tma" else (19, 300, 200)  # TMA rows: K a multiple of 16
    x, w_q, w_scale, bias = _operands(m, k, n, dtype)
    y = launch(x, None, w_q, w_scale, bias, False, dtype, config=CONFIGS[name])
    ref = reference.w8a8_block_matmul_ref(x, w_q, w_scale, bias)
    assert y.shape == (m, n) and y.dtype == dtype
    if BLOCK_EXACT and dtype == torch.float16 and name in UNSPLIT:
        assert torch.equal(y, ref)
    assert rel_error(y, ref) <= W8A8_BLOCK_TOL[dtype]


@pytest.mark.parametrize("name", ["small-m-split", "pre-pass", "tma"])
@pytest.mark.parametrize("gelu", [False, True])
def test_int8_output_is_the_quantized_float_output(name, gelu):
    cfg = CONFIGS[name]._replace(block_n=128)
    x, w_q, w_scale, bias = _operands(9, 256, 200, torch.float16, seed=1)
    yq, s_y = launch(x, None, w_q, w_scale, bias, gelu, torch.int8, torch.float16, config=cfg)
    ref_q, ref_s = reference.w8a8_block_matmul_ref(x, w_q, w_scale, bias, gelu=gelu, out_dtype=torch.int8)
    assert yq.shape == (9, 200) and yq.dtype == torch.int8 and s_y.shape == (9, 2)
    if name == "small-m-split" or not BLOCK_EXACT:  # another sum order: an integer may move by one at an edge
        assert (yq.int() - ref_q.int()).abs().max() <= 1 and torch.allclose(s_y, ref_s, rtol=1e-2)
    else:
        assert torch.equal(yq, ref_q) and torch.equal(s_y, ref_s)


@pytest.mark.parametrize("gelu", [False, True])
def test_float_output_with_gelu(gelu):
    x, w_q, w_scale, bias = _operands(5, 128, 64, torch.float16, seed=2)
    y = launch(x, None, w_q, w_scale, bias, gelu, torch.float16, config=CONFIGS["small-m-in-kernel-quantize"])
    ref = reference.w8a8_block_matmul_ref(x, w_q, w_scale, bias, gelu=gelu)
    assert rel_error(y, ref) <= W8A8_BLOCK_TOL[torch.float16]
    if gelu:
        assert (y >= -0.2).all()  # GELU's minimum is about -0.17


@pytest.mark.parametrize("name", ["pre-pass", "tma", "small-m-split"])
def test_quantized_input_gives_the_float_input_result(name):
    cfg = CONFIGS[name]._replace(quantize_x=False)
    x, w_q, w_scale, bias = _operands(7, 256, 128, torch.float16, seed=3)
    xq, s_x = reference.quantize_act_blocks_ref(x)
    y = launch(xq, s_x, w_q, w_scale, bias, False, torch.float16, config=cfg)
    assert rel_error(y, reference.w8a8_block_matmul_ref(x, w_q, w_scale, bias)) <= W8A8_BLOCK_TOL[torch.float16]
    if name != "small-m-split" and BLOCK_EXACT:
        assert torch.equal(y, reference.w8a8_block_matmul_quantized_ref(xq, s_x, w_q, w_scale, bias))


@pytest.mark.parametrize("name", ["small-m-in-kernel-quantize", "pre-pass", "tma"])
def test_zero_rows_and_blocks_give_zeros(name):
    x, w_q, w_scale, _ = _operands(6, 256, 128, torch.float16, seed=4)
    x[1] = 0
    x[3, :128] = 0  # one zero block: the row's other block still counts
    w_q[:, 128:] = 0  # a zero weight block column
    y = launch(x, None, w_q, w_scale, None, False, torch.float16, config=CONFIGS[name])
    assert torch.isfinite(y).all() and (y[1] == 0).all()
    ref = reference.w8a8_block_matmul_ref(x, w_q, w_scale)
    assert torch.equal(y, ref) if BLOCK_EXACT else rel_error(y, ref) <= W8A8_BLOCK_TOL[torch.float16]
    assert rel_error(y[3], reference.w8a8_block_matmul_ref(x[3:4, :], w_q, w_scale)[0]) <= (
        0 if BLOCK_EXACT else W8A8_BLOCK_TOL[torch.float16])


def test_odd_m_and_one_row_through_every_row_tile():
    for m in (1, 3, 17, 33):
        x, w_q, w_scale, bias = _operands(m, 128, 96, torch.float16, seed=m)
        y = launch(x, None, w_q, w_scale, bias, False, torch.float16, config=TileConfig(16, 32, quantize_x=True))
        ref = reference.w8a8_block_matmul_ref(x, w_q, w_scale, bias)
        assert torch.equal(y, ref) if BLOCK_EXACT else rel_error(y, ref) <= W8A8_BLOCK_TOL[torch.float16], m


def test_bad_configs_are_refused_by_name():
    x, w_q, w_scale, _ = _operands(2, 128, 128, torch.float16)
    for cfg, words in ((TileConfig(16, 64, block_k=64), "config.block_k"), (TileConfig(16, 96), "config.block_n"),
                       (TileConfig(16, 64, path="fused"), "config.path"),
                       (TileConfig(16, 128, split_k=2, path="tma"), "split_k 1")):
        with pytest.raises(ValueError, match=words):
            launch(x, None, w_q, w_scale, None, False, torch.float16, config=cfg)
    with pytest.raises(ValueError, match="int8 output needs 128-wide tiles"):
        launch(x, None, w_q, w_scale, None, False, torch.int8, torch.float16, config=TileConfig(16, 64))
    xq, s_x = reference.quantize_act_blocks_ref(x)
    with pytest.raises(ValueError, match="quantize_x"):
        launch(xq, s_x, w_q, w_scale, None, False, torch.float16, config=TileConfig(16, 64, quantize_x=True))
