"""NaN and Inf in the activations: every op gives the reference's answer, a NaN output row.

The contract (compress_kernels/reference.py): a row of ``x`` holding a NaN or an Inf gets a NaN
per-token scale (block-scaled W8A8: a NaN scale for that row's block), so W8A8 (dense and block-sparse,
dynamic or static scale, block-scaled) writes a NaN output row,
and the norm / GELU quantize ops store a NaN scale for it. The float ops (W4A16, W8A16, DDS) propagate
NaN by their arithmetic. Every other row is untouched. Triton's ``max`` skips NaN, so without the kernels'
explicit check a NaN would come out as finite numbers.

CPU: the Triton interpreter. With a GPU the module is marked ``gpu``, so the GPU suite
(``pytest -m gpu``) runs the same cases on the compiled kernels.
"""
from __future__ import annotations

import pytest
import torch

from compress_kernels import reference
from compress_kernels.bsr.dispatch import BsrConfig
from compress_kernels.bsr.op import bsr_matmul_parts
from compress_kernels.bsr_w4a16.op import launch as bsr_w4a16_launch
from compress_kernels.bsr_w8a8.op import bsr_w8a8_matmul_parts
from compress_kernels.norm_quant.op import gelu_quantize, layer_norm_quantize, rms_norm_quantize
from compress_kernels.w4a16.op import w4a16_matmul
from compress_kernels.w8a8.dispatch import TileConfig
from compress_kernels.w8a8.op import launch, w8a8_matmul
from compress_kernels.w8a16.dispatch import TileConfig as W8A16Config
from compress_kernels.w8a16.op import launch as w8a16_launch
from compress_kernels.w8a8_block.dispatch import TileConfig as BlockConfig
from compress_kernels.w8a8_block.op import launch as block_launch
from compress_kernels.w8a8_block.op_blocks import gelu_int8_blocks
from tests.kernels.helpers import (DEVICE, block_sparse_dense, int4_block_sparse, random_block_weight,
                                   random_int4_weight, random_int8_weight, random_w8a16_weight)

pytestmark = [pytest.mark.filterwarnings("ignore::RuntimeWarning")]  # the interpreter's numpy on NaN
if torch.cuda.is_available():
    pytestmark.append(pytest.mark.gpu)

BAD_ROW = 1
VALUES = {"nan": float("nan"), "inf": float("inf"), "-inf": float("-inf")}
W8A8_PATHS = {
    "picked": None,
    "gemv": TileConfig(1, 32, 32, path="gemv"),
    "gemv-split": TileConfig(1, 32, 32, split_k=2, path="gemv"),
    "tiled": TileConfig(16, 32, 32),
}


def _with_bad_value(m: int, k: int, value: str, dtype=torch.float16) -> torch.Tensor:
    x = torch.randn(m, k, device=DEVICE).to(dtype)
    x[BAD_ROW, k // 3] = VALUES[value]
    return x


def _check_rows(y: torch.Tensor, ref: torch.Tensor) -> None:
    """The bad row is NaN in both; every other row is finite and equal to the reference's."""
    assert torch.isnan(ref[BAD_ROW]).all(), "the reference itself must give a NaN row"
    assert torch.isnan(y[BAD_ROW]).all(), f"bad row came out as {y[BAD_ROW][:4].tolist()}"
    good = [r for r in range(y.shape[0]) if r != BAD_ROW]
    assert torch.isfinite(y[good]).all()
    torch.testing.assert_close(y[good].float(), ref[good].float(), rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("value", VALUES)
@pytest.mark.parametrize("path", W8A8_PATHS)
@pytest.mark.parametrize("m", [2, 8, 33])
@pytest.mark.parametrize("static", [False, True])
def test_w8a8_bad_row_is_nan(value, path, m, static):
    k, n = 96, 64
    x = _with_bad_value(m, k, value)
    w_q, w_scale = random_int8_weight(n, k, DEVICE)
    x_scale = torch.tensor(0.03, device=DEVICE) if static else None
    if W8A8_PATHS[path] is None:
        y = w8a8_matmul(x, w_q, w_scale, x_scale=x_scale)
    else:
        y = launch(x, w_q, w_scale, x_scale=x_scale, config=W8A8_PATHS[path])
    _check_rows(y, reference.w8a8_matmul_ref(x, w_q, w_scale, x_scale=x_scale))


@pytest.mark.parametrize("value", ["nan", "inf"])
def test_w8a8_one_row_is_nan(value):
    """M = 1: the whole output is the bad row's."""
    k, n = 64, 48
    x = torch.randn(1, k, device=DEVICE).half()
    x[0, 5] = VALUES[value]
    w_q, w_scale = random_int8_weight(n, k, DEVICE)
    assert torch.isnan(w8a8_matmul(x, w_q, w_scale)).all()


@pytest.mark.parametrize("value", VALUES)
@pytest.mark.parametrize("m", [1, 8, 40])
@pytest.mark.parametrize("static", [False, True])
def test_bsr_w8a8_bad_row_is_nan(value, m, static):
    k, n = 96, 64
    m_eff = max(m, 2)  # BAD_ROW is row 1
    x = _with_bad_value(m_eff, k, value)
    dense = block_sparse_dense(n, k, 0.5, torch.float32, device=DEVICE)
    w_q, w_scale = random_int8_weight(n, k, DEVICE)
    w_q = torch.where(dense != 0, w_q, torch.zeros_like(w_q))
    bsr = w_q.to_sparse_bsr((32, 32)) if DEVICE == "cpu" else w_q.cpu().to_sparse_bsr((32, 32))
    crow, col, values = (t.to(DEVICE) for t in (bsr.crow_indices(), bsr.col_indices(), bsr.values()))
    x_scale = torch.tensor(0.03, device=DEVICE) if static else None
    y = bsr_w8a8_matmul_parts(x, crow, col, values, w_scale, n, x_scale=x_scale)
    _check_rows(y, reference.bsr_w8a8_matmul_ref(x, crow, col, values, w_scale, n, x_scale=x_scale))


@pytest.mark.parametrize("value", ["nan", "inf"])
@pytest.mark.parametrize("op", ["gelu", "layer_norm", "rms_norm"])
@pytest.mark.parametrize("static", [False, True])
def test_norm_quantize_bad_row_has_a_nan_scale(value, op, static):
    m, k = 4, 96
    x = _with_bad_value(m, k, value)
    x_scale = torch.tensor(0.05, device=DEVICE) if static else None
    weight = torch.rand(k, device=DEVICE).half() + 0.5
    bias = torch.randn(k, device=DEVICE).half()
    if op == "gelu":
        got, ref = gelu_quantize(x, x_scale), reference.gelu_quantize_ref(x, x_scale)
    elif op == "layer_norm":
        got = layer_norm_quantize(x, weight, bias, 1e-5, x_scale)
        ref = reference.layer_norm_quantize_ref(x, weight, bias, 1e-5, x_scale)
    else:
        got = rms_norm_quantize(x, weight, 1e-6, x_scale)
        ref = reference.rms_norm_quantize_ref(x, weight, 1e-6, x_scale)
    (y, xq, s_x), (y_ref, xq_ref, s_ref) = got, ref
    assert torch.isnan(s_ref[BAD_ROW]) and torch.isnan(s_x[BAD_ROW])
    # the op's own output: non-finite where the reference's is
    assert torch.equal(torch.isfinite(y), torch.isfinite(y_ref))
    good = [r for r in range(m) if r != BAD_ROW]
    assert torch.isfinite(s_x[good]).all()
    assert torch.equal(s_x[good], s_ref[good]) and torch.equal(xq[good], xq_ref[good])


@pytest.mark.parametrize("value", ["nan", "inf"])
def test_float_ops_propagate(value):
    """W4A16, W8A16 (its one-row kernel and its tiles), DDS and DDS + W4A16 (both kernels) compute in floats:
    the bad row is non-finite, the others finite."""
    m, k, n = 4, 128, 64
    x = _with_bad_value(m, k, value)
    qweight, _, scales = random_int4_weight(k, n, 32, torch.float16, DEVICE)
    dense = block_sparse_dense(n, k, 0.5, torch.float16, device=DEVICE)
    bsr = dense.cpu().to_sparse_bsr((32, 32))
    parts = [t.to(DEVICE) for t in (bsr.crow_indices(), bsr.col_indices(), bsr.values())]
    w_q, w_scale = random_w8a16_weight(n, k, True, device=DEVICE)
    w8a16 = [w8a16_launch(x, w_q, w_scale, config=cfg) for cfg in (W8A16Config(1, 16, 64, split_k=2, path="gemv"),
                                                                   W8A16Config(16, 32, 64, scale_after_dot=True))]
    int4_parts, block_scales, _, _ = int4_block_sparse(n, k, 0.5, 32, full_rows=(0, 1))
    bsr_w4a16 = [bsr_w4a16_launch(x, *int4_parts, block_scales, n, config=cfg)
                 for cfg in (BsrConfig("gemv", 1, 8, 2, 4, 3), BsrConfig("gemm", 16, 32, 2, 4, 3, split=2))]
    for y in (w4a16_matmul(x, qweight, scales, 32), bsr_matmul_parts(x, *parts, n), *w8a16, *bsr_w4a16):
        assert not torch.isfinite(y[BAD_ROW]).any() or torch.isnan(y[BAD_ROW]).any()
        assert torch.isfinite(y[[r for r in range(m) if r != BAD_ROW]]).all()


@pytest.mark.parametrize("value", VALUES)
@pytest.mark.parametrize("config", [BlockConfig(16, 64), BlockConfig(16, 64, split_k=2),
                                    BlockConfig(16, 128, path="tma")])
@pytest.mark.parametrize("int8_out", [False, True])
def test_w8a8_block_bad_row_is_nan(value, config, int8_out):
    """Block-scaled W8A8: the bad block's NaN scale makes its output row NaN (a NaN output scale with int8
    output), and the int8 GELU passes the NaN scale on."""
    m, k, n = 4, 256, 128
    x = _with_bad_value(m, k, value)
    w_q, w_scale = random_block_weight(n, k, DEVICE)
    ref = reference.w8a8_block_matmul_ref(x, w_q, w_scale)
    if not int8_out:
        _check_rows(block_launch(x, None, w_q, w_scale, config=config), ref)
        return
    yq, s_y = block_launch(x, None, w_q, w_scale, None, True, torch.int8, torch.float16,
                           config=config._replace(block_n=128))
    assert torch.isnan(s_y[BAD_ROW]).all() and torch.isfinite(s_y[[0, 2, 3]]).all()
    assert torch.isnan(gelu_int8_blocks(yq, s_y)[1][BAD_ROW]).all()
