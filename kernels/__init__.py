"""Triton kernels for compressed linear layers (import name ``compress_kernels``): W8A8, block-scaled W8A8,
W4A16, W8A16, DDS, DDS + W8A8 and DDS + W4A16.

One package per op, each with its dispatch table (``dispatch.py``: from the shapes to the kernel and
tiles that run, one commented row per case), its launcher, validation and ``torch.library`` custom op
(``op.py``) and one module per kernel; ``common/`` holds what several ops share. docs/kernels.md
explains each kernel, each table and the current figures; every module is listed in the file tree of
docs/architecture.md. The public calls, by package::

    reference    the pure-PyTorch contract of every op (imports without Triton)
    w8a8/        w8a8_matmul(x, w_q, w_scale, bias=None, x_scale=None),
                 w8a8_matmul_quantized(xq, s_x, w_q, w_scale, bias=None, out_dtype=torch.float16)
    w8a8_block/  w8a8_block_matmul(x, w_q, w_scale, bias=None, *, x_scale=None, out_dtype=None, gelu=False,
                 act_dtype=None): 1 x 128 activation and 128 x 128 weight scales, float or int8 output;
                 quantize_act_blocks(x), quantize_weight_blocks(w), gelu_int8_blocks(xq, s_x, act_dtype)
    w4a16/       w4a16_matmul(x, qweight, scales, group_size, bias=None)
    w8a16/       w8a16_matmul(x, w_q, w_scale, bias=None), w_scale (N,) per channel or (N, K/128) per group
    moe/         moe_w4a16 / moe_w8a8 / moe_w8a16(x, topk_ids, topk_weights, gate_up, gate_up_scales, down,
                 down_scales): a fused-experts layer (gate/up, SwiGLU, down, top-k sum), the weights of every
                 expert stacked, one launch per projection, routing on the device
    bsr/         bsr_matmul(x, weight, bias=None), bsr_matmul_parts(x, crow, col, values, out_features, bias=None,
                 tile_rows=1)
    bsr_w8a8/    bsr_w8a8_matmul_parts(x, crow, col, values_int8, w_scale, out_features, bias=None, x_scale=None),
                 bsr_w8a8_matmul_quantized(xq, s_x, crow, col, values_int8, w_scale, out_features, bias, out_dtype)
    bsr_w4a16/   bsr_w4a16_matmul(x, crow, col, values_int4 (nnz, 32, 4) int32, scales (nnz, 32), out_features,
                 bias=None, tile_rows=1): int4 blocks, one scale per row of each stored block
    norm_quant/  layer_norm_quantize(x, weight, bias, eps, x_scale=None), rms_norm_quantize(x, weight, eps,
                 x_scale=None), gelu_quantize(x, x_scale=None): ``(y, xq, s_x)``, the op's output and its
                 per-token int8 copy (rows of at most ``NORM_QUANT_MAX_ROW`` features)
    common/      checks, bound calls, device facts, tiles, split-K, PDL, L2 prefetch, int8 quantize, int4 unpack

``bind_<op>(x, ...)`` for each matmul op above (``bind_w8a8_matmul``, ``bind_w8a8_matmul_quantized``,
``bind_w4a16_matmul``, ``bind_w8a16_matmul``, ``bind_w8a8_block_matmul``, ``bind_w8a8_block_matmul_int8``,
``bind_w8a8_block_matmul_quantized``, ``bind_bsr_matmul_parts``, ``bind_bsr_w8a8_matmul_parts``,
``bind_bsr_w8a8_matmul_quantized``, ``bind_bsr_w4a16_matmul``) takes the op's arguments, validates them in
full once and returns a call bound to the weight side: ``call(x)`` checks only x (dtype, device, K) and,
in eager mode, launches without the custom op's dispatch (:mod:`compress_kernels.common.bound`). The
inference modules call the ops this way; ``bind_moe_w4a16``, ``bind_moe_w8a8`` and ``bind_moe_w8a16`` do the
same for the MoE ops, whose calls take ``(x, topk_ids, topk_weights)``.

``interpreting()`` says whether Triton runs its CPU interpreter (``TRITON_INTERPRET=1``), where the
launchers accept CPU tensors. This package never imports ``compress``.

Imported by its folder name (``import kernels`` with a checkout's root on ``sys.path``), this file puts
Hugging Face's ``kernels`` package in its place, which transformers imports
(:mod:`compress_kernels.common.hub_kernels`).
"""
if __name__ == "kernels":
    from compress_kernels.common.hub_kernels import load_in_place

    load_in_place()
from compress_kernels.common.checks import interpreting
from compress_kernels.reference import (
    bsr_matmul_ref,
    bsr_w4a16_matmul_ref,
    bsr_w8a8_matmul_quantized_ref,
    bsr_w8a8_matmul_ref,
    dequantize_act_blocks,
    dequantize_weight_blocks,
    gelu_int8_blocks_ref,
    gelu_quantize_ref,
    layer_norm_quantize_ref,
    moe_w4a16_ref,
    moe_w8a8_ref,
    moe_w8a16_ref,
    quantize_act_blocks_ref,
    quantize_per_token,
    quantize_weight_blocks_ref,
    rms_norm_quantize_ref,
    rms_norm_ref,
    swiglu_ref,
    unpack_int4,
    unpack_int4_blocks,
    w4a16_matmul_ref,
    w8a8_matmul_quantized_ref,
    w8a8_block_matmul_quantized_ref,
    w8a8_block_matmul_ref,
    w8a8_matmul_ref,
    w8a16_matmul_ref,
)

try:
    import triton  # noqa: F401

    TRITON_AVAILABLE = True
except ImportError:  # pragma: no cover - Triton ships with every Linux install of the project
    TRITON_AVAILABLE = False

if TRITON_AVAILABLE:
    from compress_kernels.bsr import bind_bsr_matmul_parts, bsr_matmul, bsr_matmul_parts
    from compress_kernels.bsr_w4a16 import bind_bsr_w4a16_matmul, bsr_w4a16_matmul
    from compress_kernels.bsr_w8a8 import (bind_bsr_w8a8_matmul_parts, bind_bsr_w8a8_matmul_quantized,
                                           bsr_w8a8_matmul_parts, bsr_w8a8_matmul_quantized)
    from compress_kernels.moe import bind_moe_w4a16, bind_moe_w8a8, bind_moe_w8a16, moe_w4a16, moe_w8a8, moe_w8a16
    from compress_kernels.norm_quant import MAX_ROW as NORM_QUANT_MAX_ROW
    from compress_kernels.norm_quant import gelu_quantize, layer_norm_quantize, rms_norm_quantize
    from compress_kernels.w4a16 import bind_w4a16_matmul, w4a16_matmul
    from compress_kernels.w8a8 import bind_w8a8_matmul, bind_w8a8_matmul_quantized, w8a8_matmul, w8a8_matmul_quantized
    from compress_kernels.w8a16 import bind_w8a16_matmul, w8a16_matmul
    from compress_kernels.w8a8_block import (bind_w8a8_block_matmul, bind_w8a8_block_matmul_int8,
                                             bind_w8a8_block_matmul_quantized, gelu_int8_blocks, quantize_act_blocks,
                                             quantize_weight_blocks, w8a8_block_matmul)
else:  # pragma: no cover

    def _missing(*_args, **_kwargs):
        raise ImportError("the kernels need Triton: pip install triton (Linux), or use compress_kernels.reference")

    w8a8_matmul = w4a16_matmul = bsr_matmul = bsr_matmul_parts = bsr_w8a8_matmul_parts = _missing
    w8a8_matmul_quantized = bsr_w8a8_matmul_quantized = layer_norm_quantize = gelu_quantize = _missing
    rms_norm_quantize = bind_w8a8_matmul = bind_w8a8_matmul_quantized = bind_w4a16_matmul = _missing
    bind_bsr_matmul_parts = bind_bsr_w8a8_matmul_parts = bind_bsr_w8a8_matmul_quantized = _missing
    w8a16_matmul = bind_w8a16_matmul = bsr_w4a16_matmul = bind_bsr_w4a16_matmul = _missing
    moe_w4a16 = moe_w8a8 = moe_w8a16 = bind_moe_w4a16 = bind_moe_w8a8 = bind_moe_w8a16 = _missing
    w8a8_block_matmul = bind_w8a8_block_matmul = bind_w8a8_block_matmul_int8 = _missing
    bind_w8a8_block_matmul_quantized = quantize_act_blocks = quantize_weight_blocks = gelu_int8_blocks = _missing
    NORM_QUANT_MAX_ROW = 0

__all__ = [
    "NORM_QUANT_MAX_ROW",
    "TRITON_AVAILABLE",
    "bind_bsr_matmul_parts",
    "bind_bsr_w4a16_matmul",
    "bind_bsr_w8a8_matmul_parts",
    "bind_bsr_w8a8_matmul_quantized",
    "bind_moe_w4a16",
    "bind_moe_w8a8",
    "bind_moe_w8a16",
    "bind_w4a16_matmul",
    "bind_w8a8_block_matmul",
    "bind_w8a8_block_matmul_int8",
    "bind_w8a8_block_matmul_quantized",
    "bind_w8a8_matmul",
    "bind_w8a8_matmul_quantized",
    "bind_w8a16_matmul",
    "bsr_matmul",
    "bsr_matmul_parts",
    "bsr_matmul_ref",
    "bsr_w4a16_matmul",
    "bsr_w4a16_matmul_ref",
    "bsr_w8a8_matmul_parts",
    "bsr_w8a8_matmul_quantized",
    "bsr_w8a8_matmul_quantized_ref",
    "bsr_w8a8_matmul_ref",
    "dequantize_act_blocks",
    "dequantize_weight_blocks",
    "gelu_int8_blocks",
    "gelu_int8_blocks_ref",
    "gelu_quantize",
    "gelu_quantize_ref",
    "interpreting",
    "layer_norm_quantize",
    "layer_norm_quantize_ref",
    "moe_w4a16",
    "moe_w4a16_ref",
    "moe_w8a8",
    "moe_w8a8_ref",
    "moe_w8a16",
    "moe_w8a16_ref",
    "quantize_act_blocks",
    "quantize_act_blocks_ref",
    "quantize_per_token",
    "quantize_weight_blocks",
    "quantize_weight_blocks_ref",
    "rms_norm_quantize",
    "rms_norm_quantize_ref",
    "rms_norm_ref",
    "swiglu_ref",
    "unpack_int4",
    "unpack_int4_blocks",
    "w4a16_matmul",
    "w4a16_matmul_ref",
    "w8a8_block_matmul",
    "w8a8_block_matmul_quantized_ref",
    "w8a8_block_matmul_ref",
    "w8a8_matmul",
    "w8a8_matmul_quantized",
    "w8a8_matmul_quantized_ref",
    "w8a8_matmul_ref",
    "w8a16_matmul",
    "w8a16_matmul_ref",
]
