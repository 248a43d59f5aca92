"""The weight written out dense (compress_kernels/bsr/densify.py), and both ops' large-M dense path."""
import pytest
import torch

import compress_kernels as kernels
from compress_kernels import reference
from compress_kernels.bsr.densify import bsr_to_dense
from compress_kernels.bsr.dispatch import DENSIFY_MIN_M, densifies
from compress_kernels.w8a8 import w8a8_matmul
from tests.kernels.helpers import DEVICE, block_sparse_dense, bsr_parts, int8_block_sparse, rel_error


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.int8])
@pytest.mark.parametrize("sparsity", [0.0, 0.5, 1.0])
def test_bsr_to_dense_rebuilds_the_matrix(dtype, sparsity):
    n, k = 96, 160  # 3 block rows x 5 block columns
    w = block_sparse_dense(n, k, sparsity, torch.float32, empty_rows=(1,)) * 50
    w = w.round().clamp(-127, 127).to(dtype)
    crow, col, values = bsr_parts(w)
    assert torch.equal(bsr_to_dense(crow, col, values, n, k), w)


def test_bsr_to_dense_long_rows_and_unsorted_columns():
    n, k = 32, 32 * 150  # one block row of 150 blocks: more than one SCAN step
    w = block_sparse_dense(n, k, 0.3, torch.float16)
    crow, col, values = bsr_parts(w, torch.int32)
    order = torch.randperm(col.shape[0])
    assert torch.equal(bsr_to_dense(crow, col[order].contiguous(), values[order].contiguous(), n, k), w)


@pytest.mark.parametrize("sparsity", [0.3, 0.9])
def test_dds_large_m_matches_reference_on_either_path(sparsity):
    """A mostly dense layer at M >= DENSIFY_MIN_M runs cuBLAS on the dense weight (a 90% sparse one
    stays on the block kernel); both give the reference's product, a float32 bias and an empty row."""
    n, k = 128, 64
    w = block_sparse_dense(n, k, sparsity, torch.float16, empty_rows=(1,))
    crow, col, values = bsr_parts(w)
    x = torch.randn(2, DENSIFY_MIN_M // 2, k, device=DEVICE).half()
    bias = torch.randn(n, device=DEVICE)
    assert densifies(DENSIFY_MIN_M, n, k, col.shape[0]) == (sparsity == 0.3)
    y = kernels.bsr_matmul_parts(x, crow, col, values, n, bias)
    assert y.shape == (2, DENSIFY_MIN_M // 2, n) and y.dtype == torch.float16
    torch.testing.assert_close(y, reference.bsr_matmul_ref(x, crow, col, values, n, bias), atol=2e-2, rtol=1e-2)
    torch.testing.assert_close(y[..., 32:64], bias[32:64].half().expand_as(y[..., 32:64]), rtol=0, atol=0)


def test_sparse_w8a8_large_m_equals_dense_w8a8():
    """At M >= DENSIFY_MIN_M a mostly dense layer runs the dense W8A8 kernels on the rebuilt int8
    weight: the dense kernel's output, bit for bit."""
    n, k, m = 128, 96, DENSIFY_MIN_M
    sparse_parts, w_scale, w_q = int8_block_sparse(n, k, 0.3, empty_rows=(1,))
    assert densifies(m, n, k, sparse_parts[1].shape[0])
    x = torch.randn(m, k, device=DEVICE).half()
    bias = torch.randn(n, device=DEVICE).half()
    y = kernels.bsr_w8a8_matmul_parts(x, *sparse_parts, w_scale, n, bias)
    assert torch.equal(y, w8a8_matmul(x, w_q, w_scale, bias))
    assert rel_error(y, reference.bsr_w8a8_matmul_ref(x, *sparse_parts, w_scale, n, bias)) <= 1e-3


@pytest.mark.gpu
def test_gpu_full_size_and_cuda_graph():
    n = k = 4096
    w = block_sparse_dense(n, k, 0.5, torch.float16)
    crow, col, values = bsr_parts(w, torch.int32)
    assert torch.equal(bsr_to_dense(crow, col, values, n, k), w)
    x = torch.randn(DENSIFY_MIN_M, k, device="cuda").half()
    graph = torch.cuda.CUDAGraph()
    kernels.bsr_matmul_parts(x, crow, col, values, n)  # compile outside the capture
    with torch.cuda.graph(graph):
        y = kernels.bsr_matmul_parts(x, crow, col, values, n)
    x.copy_(torch.randn_like(x))
    graph.replay()
    assert rel_error(y, torch.nn.functional.linear(x, w)) <= 1e-3


def test_more_block_columns_than_a_grid_holds_are_refused():
    with pytest.raises(ValueError, match="in_features: expected at most"):
        bsr_to_dense(torch.zeros(2, dtype=torch.int32), torch.zeros(0, dtype=torch.int32),
                     torch.zeros(0, 32, 32), 32, 32 * 70000)
