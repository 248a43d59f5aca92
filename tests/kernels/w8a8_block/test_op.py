"""Block-scaled W8A8's public call, custom ops and bound calls (compress_kernels/w8a8_block/op.py).

CPU: the Triton interpreter; GPU: marked ``gpu``. Tolerances: ``W8A8_BLOCK_TOL`` (tests/kernels/helpers.py).
"""
from __future__ import annotations

import pytest
import torch

from compress_kernels import reference
from compress_kernels.w8a8_block.op import (bind_w8a8_block_matmul, bind_w8a8_block_matmul_int8,
                                            bind_w8a8_block_matmul_quantized, w8a8_block_matmul)
from compress_kernels.w8a8_block.op_blocks import gelu_int8_blocks, quantize_act_blocks, quantize_weight_blocks
from tests.kernels.helpers import BLOCK_EXACT, DEVICE, DTYPES, W8A8_BLOCK_TOL, random_block_weight, rel_error

GPU_TOL = {torch.float16: 2e-3, torch.bfloat16: 8e-3}


def _same(y, ref, tol=W8A8_BLOCK_TOL[torch.float16]) -> bool:
    """Bit for bit in the interpreter (``BLOCK_EXACT``), else within ``tol`` (fp16 outputs)."""
    return torch.equal(y, ref) if BLOCK_EXACT else rel_error(y, ref) <= tol


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,k,n", [(1, 128, 128), (3, 200, 72), (21, 256, 136)])
def test_picked_path_matches_reference(dtype, m, k, n):
    x = torch.randn(m, k, device=DEVICE).to(dtype)
    w_q, w_scale = random_block_weight(n, k, DEVICE)
    bias = torch.randn(n, device=DEVICE)  # float32 bias is accepted too
    y = w8a8_block_matmul(x, w_q, w_scale, bias)
    assert y.shape == (m, n) and y.dtype == dtype
    assert rel_error(y, reference.w8a8_block_matmul_ref(x, w_q, w_scale, bias)) <= W8A8_BLOCK_TOL[dtype]


def test_batched_empty_and_strided_inputs():
    w_q, w_scale = random_block_weight(64, 256, DEVICE)
    assert w8a8_block_matmul(torch.empty(0, 256, device=DEVICE).half(), w_q, w_scale).shape == (0, 64)
    x = torch.randn(2, 3, 256, device=DEVICE).half()
    y = w8a8_block_matmul(x, w_q, w_scale)
    assert y.shape == (2, 3, 64) and _same(y, reference.w8a8_block_matmul_ref(x, w_q, w_scale))
    strided = torch.randn(256, 5, device=DEVICE).half().t()
    assert _same(w8a8_block_matmul(strided, w_q, w_scale), reference.w8a8_block_matmul_ref(strided, w_q, w_scale))


def test_int8_output_feeds_the_next_layer():
    """Two layers chained in int8: the first writes int8 + 1x128 scales (GELU fused), the second reads them."""
    x = torch.randn(4, 256, device=DEVICE).half()
    up_q, up_s = random_block_weight(384, 256, DEVICE, seed=1)
    down_q, down_s = random_block_weight(256, 384, DEVICE, seed=2)
    yq, s_y = w8a8_block_matmul(x, up_q, up_s, out_dtype=torch.int8, gelu=True)
    assert yq.shape == (4, 384) and s_y.shape == (4, 3)
    out = w8a8_block_matmul(yq, down_q, down_s, x_scale=s_y)
    hidden = reference.w8a8_block_matmul_ref(x, up_q, up_s, gelu=True)  # the float chain
    assert _same(out, reference.w8a8_block_matmul_ref(hidden, down_q, down_s), tol=1e-2)  # GPU: the GELU's last bit


def test_quantized_input_int8_output_and_act_dtype():
    x = torch.randn(3, 256, device=DEVICE).bfloat16()
    w_q, w_scale = random_block_weight(128, 256, DEVICE)
    xq, s_x = quantize_act_blocks(x)
    yq, s_y = w8a8_block_matmul(xq, w_q, w_scale, x_scale=s_x, out_dtype=torch.int8, act_dtype=torch.bfloat16)
    ref_q, ref_s = reference.w8a8_block_matmul_quantized_ref(xq, s_x, w_q, w_scale, out_dtype=torch.int8,
                                                             act_dtype=torch.bfloat16)
    assert (yq.int() - ref_q.int()).abs().max() <= 1 and torch.allclose(s_y, ref_s, rtol=1e-2)  # bf16 truncation
    y = w8a8_block_matmul(xq, w_q, w_scale, x_scale=s_x, act_dtype=torch.bfloat16)
    assert y.dtype == torch.bfloat16


def test_one_pipeline_from_float_weights():
    """quantize_weight_blocks -> w8a8_block_matmul against the float product (int8 noise only)."""
    w = torch.randn(128, 256, device=DEVICE) * 0.05
    x = torch.randn(8, 256, device=DEVICE).half()
    w_q, w_scale = quantize_weight_blocks(w)
    y = w8a8_block_matmul(x, w_q, w_scale)
    assert rel_error(y, x.float() @ w.T) < 2e-2


@pytest.mark.parametrize("kwargs,error,words", [
    (dict(out_dtype=torch.bfloat16), TypeError, "out_dtype: expected None, x's dtype"),
    (dict(act_dtype=torch.bfloat16), TypeError, "act_dtype: expected None or x's dtype"),
    (dict(gelu=1), TypeError, "gelu: expected a bool"),
    (dict(bias=torch.zeros(100)), ValueError, r"bias: expected shape \(64,\)"),
])
def test_bad_call_arguments(kwargs, error, words):
    w_q, w_scale = random_block_weight(64, 256, DEVICE)
    kwargs = {k: v.to(DEVICE) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
    with pytest.raises(error, match=words):
        w8a8_block_matmul(torch.randn(2, 256, device=DEVICE).half(), w_q, w_scale, **kwargs)


@pytest.mark.parametrize("change,error,words", [
    (lambda x, w, s: (x.float(), w, s), TypeError, "x: expected dtype"),
    (lambda x, w, s: (x, w.int(), s), TypeError, "w_q: expected dtype"),
    (lambda x, w, s: (x, w[:, :128], s), ValueError, r"w_q: expected shape \(200, 256\)"),
    (lambda x, w, s: (x, w, s[:, :1]), ValueError, r"w_scale: expected shape \(2, 2\)"),
    (lambda x, w, s: (x, w, s.half()), TypeError, "w_scale: expected dtype"),
    (lambda x, w, s: (x, w, s[0]), ValueError, "w_scale: expected 2 dimensions"),
    (lambda x, w, s: (x[:, :0], w[:, :0], s), ValueError, "K >= 1"),
    (lambda x, w, s: (x, w.to("meta"), s), ValueError, "w_q: expected device"),
])
def test_bad_operands_raise(change, error, words):
    w_q, w_scale = random_block_weight(200, 256, DEVICE)
    x, w_q, w_scale = change(torch.randn(4, 256, device=DEVICE).half(), w_q, w_scale)
    with pytest.raises(error, match=words):
        w8a8_block_matmul(x, w_q, w_scale)


@pytest.mark.parametrize("xq,s_x,words", [
    (torch.zeros(4, 256), torch.ones(4, 2), "xq: expected dtype"),
    (torch.zeros(4, 256, dtype=torch.int8), torch.ones(4), "s_x: expected 2 dimensions"),
    (torch.zeros(4, 256, dtype=torch.int8), torch.ones(4, 3), r"s_x: expected shape \(4, 2\)"),
    (torch.zeros(4, 256, dtype=torch.int8), torch.ones(4, 2, dtype=torch.float16), "s_x: expected dtype"),
])
def test_bad_quantized_inputs_raise(xq, s_x, words):
    w_q, w_scale = random_block_weight(64, 256, DEVICE)
    with pytest.raises((TypeError, ValueError), match=words):
        w8a8_block_matmul(xq.to(DEVICE), w_q, w_scale, x_scale=s_x.to(DEVICE))


def test_quantized_input_dtype_rules():
    w_q, w_scale = random_block_weight(64, 256, DEVICE)
    xq, s_x = torch.zeros(2, 256, dtype=torch.int8, device=DEVICE), torch.ones(2, 2, device=DEVICE)
    with pytest.raises(TypeError, match="act_dtype: expected torch.float16 or torch.bfloat16"):
        w8a8_block_matmul(xq, w_q, w_scale, x_scale=s_x, out_dtype=torch.int8, act_dtype=torch.float32)
    with pytest.raises(TypeError, match="out_dtype: expected None, act_dtype"):
        w8a8_block_matmul(xq, w_q, w_scale, x_scale=s_x, out_dtype=torch.bfloat16)
    assert w8a8_block_matmul(xq, w_q, w_scale, x_scale=s_x).dtype == torch.float16  # act_dtype's default
    assert (w8a8_block_matmul(xq, w_q, w_scale, x_scale=s_x) == 0).all()  # zero input, zero output


def test_ops_are_registered_with_fakes():
    meta = dict(device="meta")
    x = torch.empty(2, 3, 300, dtype=torch.bfloat16, **meta)
    w_q, w_scale = torch.empty(200, 300, dtype=torch.int8, **meta), torch.empty(2, 3, **meta)
    ops = torch.ops.compress_kernels
    assert ops.w8a8_block_matmul(x, w_q, w_scale, None, True).shape == (2, 3, 200)
    yq, s_y = ops.w8a8_block_matmul_int8(x, w_q, w_scale, None, False)
    assert (yq.shape, yq.dtype, s_y.shape, s_y.stride()) == ((6, 200), torch.int8, (6, 2), (1, 6))
    xq, s_x = torch.empty(6, 300, dtype=torch.int8, **meta), torch.empty(6, 3, **meta)
    y = ops.w8a8_block_matmul_quantized(xq, s_x, w_q, w_scale, None, False, torch.bfloat16)
    assert y.shape == (6, 200) and y.dtype == torch.bfloat16
    assert ops.w8a8_block_matmul_quantized_int8(xq, s_x, w_q, w_scale, None, True, torch.float16)[1].shape == (6, 2)
    assert ops.gelu_int8_blocks(xq, s_x, torch.float16)[0].shape == (6, 300)


def test_bound_calls_give_the_public_results():
    x = torch.randn(3, 256, device=DEVICE).half()
    w_q, w_scale = random_block_weight(128, 256, DEVICE)
    bias = torch.randn(128, device=DEVICE).half()
    call = bind_w8a8_block_matmul(x, w_q, w_scale, bias, gelu=True)
    assert torch.equal(call(x), w8a8_block_matmul(x, w_q, w_scale, bias, gelu=True))
    int8_call = bind_w8a8_block_matmul_int8(x, w_q, w_scale, bias)
    yq, s_y = int8_call(x)
    ref_q, ref_s = w8a8_block_matmul(x, w_q, w_scale, bias, out_dtype=torch.int8)
    assert torch.equal(yq, ref_q) and torch.equal(s_y, ref_s)
    down_q, down_s = random_block_weight(64, 128, DEVICE, seed=5)
    quantized_call = bind_w8a8_block_matmul_quantized(yq, s_y, down_q, down_s)
    assert torch.equal(quantized_call(yq, s_y), w8a8_block_matmul(yq, down_q, down_s, x_scale=s_y))
    with pytest.raises(ValueError, match=r"s_x: expected shape \(3, 1\)"):
        quantized_call(yq, s_y[:, :0])
    with pytest.raises(ValueError, match=r"x: expected shape \(\.\.\., 256\)"):
        call(x[:, :128])


def test_int8_gelu_matches_reference():
    xq, s_x = reference.quantize_act_blocks_ref(torch.randn(5, 300, device=DEVICE).half() * 3)
    yq, s_y = gelu_int8_blocks(xq, s_x)
    ref_q, ref_s = reference.gelu_int8_blocks_ref(xq, s_x)
    assert (yq.int() - ref_q.int()).abs().max() <= 1 and torch.allclose(s_y, ref_s, rtol=1e-3)  # erf to fp32 rounding
    expected = torch.nn.functional.gelu(reference.dequantize_act_blocks(xq, s_x))
    step = s_y.repeat_interleave(128, 1)[:, :300]
    assert ((reference.dequantize_act_blocks(yq, s_y) - expected).abs() <= step).all()  # within one int8 step
    with pytest.raises(TypeError, match="act_dtype: expected"):
        gelu_int8_blocks(xq, s_x, torch.float32)


# ---- GPU ---------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m", [1, 7, 16, 64, 200, 2048])
def test_gpu_full_size(dtype, m):
    k, n = 4096, 4096
    x = torch.randn(m, k, device="cuda").to(dtype)
    w_q, w_scale = random_block_weight(n, k, "cuda")
    bias = torch.randn(n, device="cuda").to(dtype)
    ref = reference.w8a8_block_matmul_ref(x, w_q, w_scale, bias)
    assert rel_error(w8a8_block_matmul(x, w_q, w_scale, bias), ref) <= GPU_TOL[dtype]
    yq, s_y = w8a8_block_matmul(x, w_q, w_scale, bias, out_dtype=torch.int8, gelu=True)
    ref_gelu = reference.w8a8_block_matmul_ref(x, w_q, w_scale, bias, gelu=True).reshape(m, n)
    assert rel_error(reference.dequantize_act_blocks(yq, s_y), ref_gelu) <= 1e-2


@pytest.mark.gpu
@pytest.mark.parametrize("m,k,n", [(3, 1000, 300), (300, 1000, 300), (4100, 272, 200)])  # K, N tails; TMA tails
def test_gpu_tails(m, k, n):
    x = torch.randn(m, k, device="cuda").half()
    w_q, w_scale = random_block_weight(n, k, "cuda")
    y = w8a8_block_matmul(x, w_q, w_scale)
    assert rel_error(y, reference.w8a8_block_matmul_ref(x, w_q, w_scale)) <= GPU_TOL[torch.float16]


@pytest.mark.gpu
def test_gpu_torch_compile_fullgraph():
    w_q, w_scale = random_block_weight(256, 512, "cuda")
    bias = torch.randn(256, device="cuda").half()

    def layer(x):
        yq, s_y = w8a8_block_matmul(x, w_q, w_scale, bias, out_dtype=torch.int8, gelu=True)
        return w8a8_block_matmul(x, w_q, w_scale, bias) * 2, yq, s_y

    compiled = torch.compile(layer, fullgraph=True)
    x = torch.randn(8, 512, device="cuda").half()
    for got, want in zip(compiled(x), layer(x)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [4, 512])
def test_gpu_cuda_graph_replay(m):
    up_q, up_s = random_block_weight(1024, 512, "cuda")
    down_q, down_s = random_block_weight(512, 1024, "cuda", seed=1)
    static_x = torch.randn(m, 512, device="cuda").half()

    def chain(x):
        yq, s_y = w8a8_block_matmul(x, up_q, up_s, out_dtype=torch.int8, gelu=True)
        return w8a8_block_matmul(yq, down_q, down_s, x_scale=s_y)

    chain(static_x)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_y = chain(static_x)
    for _ in range(2):
        static_x.copy_(torch.randn(m, 512, device="cuda").half())
        graph.replay()
        torch.testing.assert_close(static_y, chain(static_x), rtol=0, atol=0)
