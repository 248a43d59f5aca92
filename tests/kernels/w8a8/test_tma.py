"""W8A8's GEMM with TMA tile loads (compress_kernels/w8a8/tma.py): the same integers and epilogue as the
pointer-loaded tiles, zero-filled boxes past M, N and K, and operands TMA cannot describe refused.
CPU: the Triton interpreter (it runs tensor descriptors too); GPU: marked ``gpu``.
"""
from __future__ import annotations

import pytest
import torch

from compress_kernels import reference
from compress_kernels.w8a8.dispatch import TileConfig
from compress_kernels.w8a8.op import launch
from compress_kernels.w8a8.tma import tma_ready
from tests.kernels.helpers import DEVICE, DTYPES, W8A8_TOL, random_int8_weight, rel_error



@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,k,n,with_bias", [(5, 64, 48, True), (70, 160, 96, False), (33, 96, 40, True)])
def test_tma_tiles_equal_the_pointer_kernel(dtype, m, k, n, with_bias):
    x = torch.randn(m, k, device=DEVICE).to(dtype)  # M, N, K not tile multiples: the boxes zero-fill
    w_q, w_scale = random_int8_weight(n, k, DEVICE)
    bias = torch.randn(n, device=DEVICE).to(dtype) if with_bias else None
    cfg = TileConfig(32, 32, 64, num_warps=4, num_stages=3)
    plain = launch(x, w_q, w_scale, bias, config=cfg)
    tma = launch(x, w_q, w_scale, bias, config=cfg._replace(path="tma"))
    assert torch.equal(tma, plain)  # the same exact integers and the same epilogue
    assert rel_error(tma, reference.w8a8_matmul_ref(x, w_q, w_scale, bias)) <= W8A8_TOL[dtype]


def test_operands_tma_cannot_describe_are_refused():
    m, k, n = 4, 72, 24  # K = 72: an int8 row stride of 72 bytes, not a multiple of 16
    x = torch.randn(m, k, device=DEVICE).half()
    w_q, w_scale = random_int8_weight(n, k, DEVICE)
    assert not tma_ready(w_q) and not tma_ready(w_q, torch.empty(m, k, dtype=torch.int8, device=DEVICE))
    assert tma_ready(w_q[:, :64].contiguous()) and not tma_ready(w_q[:, :64])  # a 72-byte row stride
    with pytest.raises(ValueError, match="the tma path needs split_k 1 and TMA-describable operands"):
        launch(x, w_q, w_scale, config=TileConfig(16, 32, 64, path="tma"))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,k,n", [(2048, 4096, 4096), (300, 4096, 11008 + 16), (8192, 1024, 1024)])
@pytest.mark.parametrize("cfg", [TileConfig(128, 256, 128, num_warps=8, num_stages=3, path="tma"),
                                 TileConfig(256, 128, 128, num_warps=8, num_stages=4, path="tma")])
def test_gpu_tma_tiles_equal_the_pointer_kernel(dtype, m, k, n, cfg):
    x = torch.randn(m, k, device="cuda").to(dtype)
    w_q, w_scale = random_int8_weight(n, k, "cuda")
    bias = torch.randn(n, device="cuda").to(dtype)
    tma = launch(x, w_q, w_scale, bias, config=cfg)
    assert torch.equal(tma, launch(x, w_q, w_scale, bias, config=cfg._replace(path="tiled")))
    ref = reference.w8a8_matmul_ref(x, w_q, w_scale, bias)
    assert rel_error(tma, ref) <= {torch.float16: 1e-3, torch.bfloat16: 4e-3}[dtype]
