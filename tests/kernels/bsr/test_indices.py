"""BSR index values (compress_kernels/bsr/indices.py) and the launchers that check them.

Each broken invariant is refused with a message naming it and where; the launchers run the check by
default (a crow past nnz used to kill the process with a memory fault) and skip it with
``check_indices=False``. CPU: the Triton interpreter; with a GPU the module is marked ``gpu``.
"""
from __future__ import annotations

import pytest
import torch

from compress_kernels.bsr.indices import check_bsr_indices
from compress_kernels.bsr.op import bsr_matmul, bsr_matmul_parts
from compress_kernels.bsr_w8a8.op import bsr_w8a8_matmul_parts, bsr_w8a8_matmul_quantized
from tests.kernels.helpers import DEVICE, block_sparse_dense

pytestmark = [pytest.mark.gpu] if torch.cuda.is_available() else []

N, K = 96, 128  # 3 block rows, 4 block columns


def _parts(dtype=torch.float16):
    dense = block_sparse_dense(N, K, 0.5, torch.float32, device="cpu", seed=1)
    bsr = dense.to_sparse_bsr((32, 32))
    crow, col = bsr.crow_indices().to(torch.int32), bsr.col_indices().to(torch.int32)
    return crow.to(DEVICE), col.to(DEVICE), bsr.values().to(dtype).contiguous().to(DEVICE)


BROKEN = {
    "crow starts past 0": (lambda crow, col: crow.__setitem__(0, 1), r"crow_indices\[0\] == 0, got 1"),
    "crow past nnz": (lambda crow, col: crow.__setitem__(-1, crow[-1] + 7), r"crow_indices\[-1\] == nnz"),
    "crow short of nnz": (lambda crow, col: crow.__setitem__(-1, crow[-1] - 1), r"crow_indices\[-1\] == nnz"),
    "crow decreasing": (lambda crow, col: crow.__setitem__(1, crow[2] + 1),
                        r"non-decreasing values, got crow_indices\[1\]"),
    "column too large": (lambda crow, col: col.__setitem__(0, 4),
                         r"block columns in \[0, 4\) \(K / 32\), got col_indices\[0\] = 4"),
    "negative column": (lambda crow, col: col.__setitem__(-1, -3),
                        r"block columns in \[0, 4\) \(K / 32\), got col_indices\[\d+\] = -3"),
    "duplicate column": (lambda crow, col: col.__setitem__(1, col[0]), r"strictly increasing block columns"),
}


def _broken(case):
    crow, col, values = _parts()
    assert int(crow[1] - crow[0]) >= 2  # block row 0 holds two blocks, so a duplicate stays in one row
    BROKEN[case][0](crow, col)
    return crow, col, values


def test_valid_indices_pass_including_empty_rows_and_no_blocks():
    crow, col, _ = _parts()
    check_bsr_indices(crow, col, K // 32)
    check_bsr_indices(torch.tensor([0, 0, 0], device=DEVICE), torch.zeros(0, dtype=torch.int64, device=DEVICE), 4)


@pytest.mark.parametrize("case", BROKEN)
def test_each_broken_invariant_is_named(case):
    crow, col, _ = _broken(case)
    with pytest.raises(ValueError, match=BROKEN[case][1]):
        check_bsr_indices(crow, col, K // 32)


@pytest.mark.parametrize("case", BROKEN)
def test_launchers_refuse_broken_indices(case):
    crow, col, values = _broken(case)
    x = torch.randn(3, K, device=DEVICE).half()
    w_scale = torch.rand(N, device=DEVICE) + 0.01
    int8_values = torch.randint(-127, 128, values.shape, dtype=torch.int8, device=DEVICE)
    xq = torch.randint(-127, 128, (3, K), dtype=torch.int8, device=DEVICE)
    s_x = torch.rand(3, device=DEVICE) + 0.01
    calls = [
        lambda: bsr_matmul_parts(x, crow, col, values, N),
        lambda: bsr_w8a8_matmul_parts(x, crow, col, int8_values, w_scale, N),
        lambda: bsr_w8a8_matmul_quantized(xq, s_x, crow, col, int8_values, w_scale, N),
    ]
    for call in calls:
        with pytest.raises(ValueError, match=BROKEN[case][1]):
            call()


def test_check_indices_false_skips_the_check_and_must_be_a_bool():
    crow, col, values = _parts()
    x = torch.randn(2, K, device=DEVICE).half()
    checked = bsr_matmul_parts(x, crow, col, values, N)
    assert torch.equal(bsr_matmul_parts(x, crow, col, values, N, check_indices=False), checked)
    with pytest.raises(TypeError, match="check_indices: expected a bool, got int"):
        bsr_matmul_parts(x, crow, col, values, N, check_indices=1)


def test_sparse_bsr_weight_is_checked_too():
    crow, col, values = _broken("column too large")
    weight = torch.sparse_bsr_tensor(crow.cpu(), col.cpu(), values.cpu(), size=(N, K)).to(DEVICE)
    with pytest.raises(ValueError, match=BROKEN["column too large"][1]):
        bsr_matmul(torch.randn(2, K, device=DEVICE).half(), weight)


@pytest.mark.gpu
def test_capture_skips_the_check_that_the_warm_up_ran():
    crow, col, values = (t.cuda() for t in _parts())
    x = torch.randn(4, K, device="cuda").half()
    expected = bsr_matmul_parts(x, crow, col, values, N)  # checks, and compiles outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = bsr_matmul_parts(x, crow, col, values, N)
    graph.replay()
    assert torch.equal(y, expected)
