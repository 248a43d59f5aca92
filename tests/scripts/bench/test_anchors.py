"""scripts.bench.anchors against the kernels' references (compress_kernels.reference) on tiny shapes:
on the CPU through the anchors' CPU branches, on a GPU (``gpu`` tests) through the timed paths."""
import pytest
import torch

import compress_kernels.reference as ref
from compress.core.quant import dequantize_groupwise, pack_int4, quantize_groupwise
from scripts.bench import anchors
from scripts.bench.kernel_sweep import bsr_parts_from_mask, random_block_mask

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def rel_err(y, want) -> float:
    return float((y.float() - want.float()).norm() / want.float().norm())


@pytest.mark.parametrize("device", DEVICES)
def test_cublas_fp16_matches_fp32(device):
    x, w = torch.randn(5, 64, device=device).half(), torch.randn(48, 64, device=device).half()
    y = anchors.cublas_fp16(x, w)
    assert y.dtype == torch.float16 and rel_err(y, x.float() @ w.float().T) < 2e-3


def test_row_quantization_matches_the_reference_contract():
    x = torch.randn(7, 96).half()
    x[2] = 0  # an all-zero row: quantizes to 0, no NaN
    xq, s_x = anchors.quantize_rows_int8(x)
    want_q, want_s = ref.quantize_per_token(x)
    assert xq.dtype == torch.int8 and s_x.shape == (7, 1)
    assert (xq.int() - want_q.int()).abs().max() <= 1  # last-bit scale differences move a rounding at most
    assert torch.equal(xq[2], torch.zeros_like(xq[2]))
    nonzero = [0, 1, 3, 4, 5, 6]
    assert torch.allclose(s_x[nonzero, 0], want_s[nonzero], rtol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("m", [1, 5, 16, 17, 33])  # M <= 16 takes the padded path
def test_int_mm_w8a8_matches_the_reference(device, m):
    gen = torch.Generator().manual_seed(m)
    x = torch.randn(m, 64, generator=gen).half().to(device)
    w_q = torch.randint(-127, 128, (48, 64), generator=gen, dtype=torch.int8).to(device)
    w_scale = (torch.rand(48, generator=gen) * 1e-2 + 1e-3).to(device)
    y = anchors.int_mm_w8a8(x, w_q, w_scale)
    assert y.shape == (m, 48) and y.dtype == torch.float16
    assert rel_err(y, ref.w8a8_matmul_ref(x, w_q, w_scale)) < 1e-2


def test_int_mm_w8a8_gives_zero_for_a_zero_row():
    x = torch.zeros(2, 64).half()
    y = anchors.int_mm_w8a8(x, torch.ones(16, 64, dtype=torch.int8), torch.ones(16))
    assert torch.equal(y, torch.zeros_like(y))


@pytest.mark.parametrize("device", DEVICES)
def test_tinygemm_holds_the_same_weights_as_our_w4a16(device):
    torch.manual_seed(0)
    weight = torch.randn(64, 256, device=device)
    q, scales = quantize_groupwise(weight, 128)  # (N, K) int8, (N, K/G)
    packed = anchors.tinygemm_pack(q)
    scales_and_zeros = anchors.tinygemm_scales_and_zeros(scales)
    assert scales_and_zeros.shape == (2, 64, 2) and scales_and_zeros.dtype == torch.bfloat16
    assert torch.equal(scales_and_zeros[..., 1], torch.zeros(2, 64, dtype=torch.bfloat16, device=device))
    x = torch.randn(3, 256, device=device)
    y = anchors.tinygemm_int4_matmul(x.bfloat16(), packed, 128, scales_and_zeros)
    assert y.shape == (3, 64) and y.dtype == torch.bfloat16
    ours = ref.w4a16_matmul_ref(x.half(), pack_int4(q.T), scales.T.half(), 128)  # our layout, same values
    assert rel_err(y, ours) < 2e-2  # bf16 activations and bf16 scales in tinygemm
    assert rel_err(y, x @ dequantize_groupwise(q, scales, 128).T) < 2e-2


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("m", [1, 7, 33])
def test_weight_int8pack_mm_computes_our_w8a16(device, dtype, m):
    """``torch._weight_int8pack_mm`` on the int8 weight and per-channel scales (in x's dtype) of our W8A16."""
    gen = torch.Generator().manual_seed(m)
    x = torch.randn(m, 128, generator=gen).to(dtype).to(device)
    w_q = torch.randint(-128, 128, (48, 128), generator=gen, dtype=torch.int8).to(device)
    scales = (torch.rand(48, generator=gen) * 1e-2 + 1e-3).to(dtype).to(device)
    y = anchors.weight_int8pack_mm(x, w_q, scales)
    assert y.shape == (m, 48) and y.dtype == dtype
    assert rel_err(y, ref.w8a16_matmul_ref(x, w_q, scales)) < (2e-3 if dtype == torch.float16 else 1e-2)


@pytest.mark.parametrize("q, error", [
    (torch.zeros(64, 200, dtype=torch.int8), ValueError),  # K not a multiple of 128
    (torch.zeros(40, 256, dtype=torch.int8), ValueError),  # N not a multiple of 16
    (torch.zeros(64, 256), TypeError),  # not integers
    (torch.zeros(64 * 256, dtype=torch.int8), TypeError),  # not (N, K)
])
def test_tinygemm_pack_refuses_bad_weights(q, error):
    with pytest.raises(error, match="tinygemm_pack: expected"):
        anchors.tinygemm_pack(q)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("m", [1, 16, 20])  # bsr_dense_mm pads M to a multiple of 16
def test_torch_bsr_matches_the_reference(device, m):
    gen = torch.Generator().manual_seed(m)
    crow, col, values = bsr_parts_from_mask(random_block_mask(64, 128, 50, gen, torch.device("cpu")),
                                            torch.float16, gen, torch.device("cpu"))
    crow, col, values = crow.to(device), col.to(device), values.to(device)
    weight = torch.sparse_bsr_tensor(crow, col, values, size=(64, 128), check_invariants=False)
    x = torch.randn(m, 128, generator=gen).half().to(device)
    y = anchors.torch_bsr_matmul(x, weight)
    assert y.shape == (m, 64) and y.dtype == torch.float16
    assert rel_err(y, ref.bsr_matmul_ref(x, crow, col, values, 64)) < 2e-3


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("m", [1, 17])  # M <= 16 takes the padded path
def test_int_mm_w8a8_block_matches_the_reference(device, m):
    gen = torch.Generator().manual_seed(m)
    x = torch.randn(m, 256, generator=gen).half().to(device)
    w_q = torch.randint(-127, 128, (200, 256), generator=gen, dtype=torch.int8).to(device)
    w_scale = (torch.rand(2, 2, generator=gen) * 1e-2 + 1e-3).to(device)
    y = anchors.int_mm_w8a8_block(x, w_q, w_scale)
    assert y.shape == (m, 200) and y.dtype == torch.float16
    assert rel_err(y, ref.w8a8_block_matmul_ref(x, w_q, w_scale)) < 1e-3


def test_block_quantization_matches_the_reference_contract():
    x = torch.randn(3, 256).half()
    x[1, :128] = 0  # a zero block quantizes to 0
    xq, s_x = anchors.quantize_blocks_int8(x)
    want_q, want_s = ref.quantize_act_blocks_ref(x)
    assert (xq.int() - want_q.int()).abs().max() <= 1 and (xq[1, :128] == 0).all()
    assert torch.allclose(s_x[[0, 2]], want_s[[0, 2]], rtol=1e-6)
