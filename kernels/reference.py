"""Pure-PyTorch references for every op of the package (imports without Triton).

These functions are the numerical contract of the kernels written as code (docs/kernels.md). Each
Triton kernel in this package must compute the same integers and the same output (to fp32
accumulation order), and the CPU fallback of the inference modules in ``compress`` calls them
directly.

Notation: ``x`` activations (..., K) fp16/bf16; weight ``W`` (N, K) as in ``nn.Linear``;
``y = x @ W.T (+ bias)`` in ``x``'s dtype.

Symmetric quantization: ``q = clamp(round(v / s), qmin, qmax)``, ``s = absmax / qmax``, rounding
half to even (``torch.round``). A zero scale (all-zero row or group) is replaced by 1 before the
division so the quantized values are 0 and nothing is NaN or Inf.

* W8A8: ``s_x[m] = max|x[m, :]| / 127`` (or a static scale), ``xq = clamp(round(x / s_x), -128, 127)``,
  ``acc = xq @ w_q.T`` in int32, ``y = acc * s_x[m] * w_scale[n] (+ bias)``.
  Non-finite input: a row of ``x`` holding a NaN or an Inf gets ``s_x[m] = NaN``, so its output row
  is NaN (dynamic or static scale): an overflowed activation is never passed on as finite numbers.
  Its integers are 0 here; the kernels leave them unspecified (only ``s_x`` and ``y`` are contract).
* W4A16: ``qweight`` (K/8, N) int32, nibble ``k % 8`` of ``qweight[k // 8, n]`` holds ``q[k, n]``
  (two's complement, sign-extended on unpack); ``scales`` (K/G, N);
  ``W[n, k] = q[k, n] * scales[k // G, n]``; fp32 accumulation.
* W8A16: ``w_q`` (N, K) int8 (the ``nn.Linear`` layout), symmetric, and ``w_scale`` (N,), one scale per
  output channel ``s_w[n] = max|W[n, :]| / 127``, or (N, K/128), one per group of 128 input channels
  ``s_w[n, g] = max|W[n, 128g : 128(g+1)]| / 127``; ``W[n, k] = w_q[n, k] * s_w[n (, k // 128)]``;
  activations stay fp16 / bf16; ``y = x @ W.T (+ bias)`` with fp32 accumulation. The float ops need no
  rule for non-finite input: a NaN or Inf in a row of ``x`` reaches that output row by arithmetic.
* DDS: ``W`` as ``torch.sparse_bsr`` with 32x32 blocks; absent blocks are zero.
* Sparse W8A8: W8A8 with the int8 weight ``W_q`` in BSR parts (int8 ``values``); absent blocks are zero.
* Sparse W4A16: W4A16 with the int4 weight in BSR parts: ``values`` (nnz, 32, 4) int32, word ``r`` of row
  ``i`` of stored block ``b`` packs the 8 consecutive input channels ``8r .. 8r + 7`` of that block row as
  ``qweight`` does (nibble ``j``: channel ``8r + j``, two's complement), and ``scales`` (nnz, 32), one
  scale per row of each stored block (its group's: a group of G >= 32 channels covers whole blocks);
  ``W[32 R + i, 32 col[b] + k] = q[b, i, k] * scales[b, i]``, absent blocks zero; fp32 accumulation.
* LayerNorm / RMSNorm / GELU + quantize: the op's output in x's dtype and ``quantize_per_token`` of it.
* Block-scaled W8A8 (DeepSeek-V3 / Jetfire style), blocks of ``B = 128``: activations per token with one
  scale per B consecutive channels, ``s_x[m, kb] = max|x[m, B kb : B (kb+1)]| / 127``; weights with one
  scale per B x B block, ``s_w[nb, kb] = max|W[B nb : B (nb+1), B kb : B (kb+1)]| / 127``; both int8
  symmetric, clamped to [-127, 127]; a last partial block (K or N not a multiple of B) takes the max over
  the channels it has. ``y[m, n] = sum_kb float(sum_{k in kb} xq wq  (int32)) * (s_x[m, kb] * s_w[n // B, kb])``
  summed over kb in order in fp32, then ``+ bias``. Epilogues: the output rounded to the activation dtype
  (fp16 / bf16), optionally ``gelu`` (exact, fp32 math) of those values rounded again, and optionally the
  result quantized to int8 with 1 x B scales (:func:`quantize_act_blocks_ref`: the next layer's input format).
  A block holding a NaN or an Inf gets a NaN scale and zero integers (its output rows are NaN).
* Grouped MoE experts (``moe_w4a16_ref``, ``moe_w8a8_ref``, ``moe_w8a16_ref``): the per-expert weights of a
  scheme stacked over experts (E first). Token t's k experts ``e = topk_ids[t, j]`` (an id outside [0, E)
  adds nothing) each compute their gate/up output ``[g, u]`` under the scheme's contract, rounded to x's
  dtype (gate columns first), ``act = rd(rd(silu(g)) * u)`` and ``y = act @ W_down[e].T`` under the
  scheme's contract kept in fp32 (W8A8: ``act`` quantized per row as x is); then
  ``out[t] = rd(sum_j topk_weights[t, j] * y_j)``, summed in slot order in fp32.
"""
from __future__ import annotations

import torch

INT8_QMAX = 127
SCALE_BLOCK = 128  # block-scaled W8A8: channels per activation scale, side of a weight scale block
W8A16_GROUP_SIZE = 128  # input channels per scale of grouped W8A16 weights
INT4_QMIN, INT4_QMAX = -8, 7
BSR_BLOCK = 32
BSR_INT4_WORDS = BSR_BLOCK // 8  # int32 words per row of a stored int4 block (8 nibbles each)


def safe_scale(absmax: torch.Tensor, qmax: int) -> torch.Tensor:
    """``absmax / qmax`` in float32, with zero scales replaced by 1 (their values quantize to 0)."""
    # tensor / tensor, not tensor / Python number: on CUDA PyTorch turns division by a scalar into a
    # multiplication by its reciprocal, which differs from IEEE division in the last bit for some values
    absmax = absmax.float()
    scale = absmax / torch.full_like(absmax, qmax)
    return torch.where(scale == 0, torch.ones_like(scale), scale)


def quantize_per_token(x: torch.Tensor, x_scale: torch.Tensor | None = None):
    """Per-row int8 quantization of ``x`` (M, K).

    Returns ``(xq int8 (M, K), s_x float32 (M,))``. With ``x_scale`` (a scalar or (M,)) the given
    static scale is used instead of the dynamic ``max|x[m]| / 127``.
    """
    x32 = x.float()
    if x_scale is None:
        s_x = safe_scale(x32.abs().amax(dim=-1), INT8_QMAX)
    else:
        s_x = x_scale.float().reshape(-1).expand(x32.shape[0]).contiguous()
        s_x = torch.where(s_x == 0, torch.ones_like(s_x), s_x)
    xq = torch.clamp(torch.round(x32 / s_x[:, None]), -128, INT8_QMAX)
    non_finite = ~torch.isfinite(x32).all(dim=-1)  # (M,): such a row's scale is NaN, its integers 0
    xq = torch.where(non_finite[:, None], torch.zeros_like(xq), xq).to(torch.int8)
    s_x = torch.where(non_finite, torch.full_like(s_x, float("nan")), s_x)
    return xq, s_x


def w8a8_matmul_ref(x, w_q, w_scale, bias=None, x_scale=None):
    """``y = (xq @ w_q.T) * s_x[:, None] * w_scale[None, :] (+ bias)`` with exact int32 accumulation."""
    lead, k = x.shape[:-1], x.shape[-1]
    xq, s_x = quantize_per_token(x.reshape(-1, k), x_scale)
    return w8a8_matmul_quantized_ref(xq, s_x, w_q, w_scale, bias, x.dtype).reshape(*lead, w_q.shape[0])


def w8a8_matmul_quantized_ref(xq, s_x, w_q, w_scale, bias=None, out_dtype=torch.float16):
    """:func:`w8a8_matmul_ref` from already quantized ``xq`` (M, K) int8 and ``s_x`` (M,): (M, N) in ``out_dtype``."""
    # int32 accumulation, exactly: |products| <= 2^14, so float64 sums are exact for K < 2^39 and the
    # result fits int32 for K < 2^17. float64 rather than int64: CUDA has no integer matmul.
    acc = (xq.to(torch.float64) @ w_q.to(torch.float64).T).to(torch.int32)
    y = acc.float() * s_x[:, None] * w_scale.float()[None, :]
    if bias is not None:
        y = y + bias.float()
    return y.to(out_dtype)


def unpack_int4(qweight: torch.Tensor) -> torch.Tensor:
    """(K/8, N) int32 -> (K, N) int8 in [-8, 7]; nibble ``j`` of row ``r`` is input channel ``8 r + j``."""
    shifts = torch.arange(0, 32, 4, device=qweight.device, dtype=torch.int32)  # (8,)
    nibbles = (qweight[:, None, :] >> shifts[None, :, None]) & 0xF  # (K/8, 8, N)
    signed = nibbles - ((nibbles & 0x8) << 1)  # two's complement sign extension of 4 bits
    return signed.reshape(-1, qweight.shape[1]).to(torch.int8)


def dequantize_int4(qweight: torch.Tensor, scales: torch.Tensor, group_size: int) -> torch.Tensor:
    """(K/8, N) packed + (K/G, N) scales -> W (N, K) float32."""
    q = unpack_int4(qweight).float()  # (K, N)
    s = scales.float().repeat_interleave(group_size, dim=0)  # (K, N)
    return (q * s).T.contiguous()


def w4a16_matmul_ref(x, qweight, scales, group_size, bias=None):
    """``y = x @ dequantize_int4(qweight, scales).T (+ bias)`` with fp32 accumulation."""
    w = dequantize_int4(qweight, scales, group_size)  # (N, K)
    y = x.float() @ w.T
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)


def dequantize_int8(w_q: torch.Tensor, w_scale: torch.Tensor) -> torch.Tensor:
    """(N, K) int8 and scales (N,) or (N, K/128) -> W (N, K) float32, ``w_q * s_w`` (the W8A16 weight)."""
    scale = w_scale.float()
    if scale.dim() == 1:
        return w_q.float() * scale[:, None]
    return w_q.float() * scale.repeat_interleave(w_q.shape[1] // scale.shape[1], dim=1)


def w8a16_matmul_ref(x, w_q, w_scale, bias=None):
    """``y = x @ dequantize_int8(w_q, w_scale).T (+ bias)`` with fp32 accumulation, in x's dtype."""
    y = x.float() @ dequantize_int8(w_q, w_scale).T
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)


def bsr_matmul_ref(x, crow_indices, col_indices, values, out_features, bias=None):
    """``y = x @ W.T`` for ``W`` (N, K) given by its BSR parts with square blocks; fp32 accumulation."""
    shape = (out_features, x.shape[-1])
    w = torch.sparse_bsr_tensor(crow_indices, col_indices, values.float(), size=shape).to_dense()
    y = x.float() @ w.T
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)


def bsr_to_dense_ref(crow_indices, col_indices, values, out_features, in_features):
    """(N, K) dense matrix of BSR parts with square blocks, in ``values``' dtype; absent blocks zero.

    One zero fill and one scatter, written in place through a (rows, cols, block, block) view of the
    (N, K) result, with no host synchronisation (so it also runs inside CUDA-graph capture)."""
    block = values.shape[-1]
    block_rows, block_cols = out_features // block, in_features // block
    dense = values.new_zeros(out_features, in_features)
    rows = torch.repeat_interleave(torch.arange(block_rows, device=crow_indices.device),
                                   crow_indices.diff().long(), output_size=col_indices.shape[0])
    dense.view(block_rows, block, block_cols, block).permute(0, 2, 1, 3)[rows, col_indices.long()] = values
    return dense


def bsr_w8a8_matmul_ref(x, crow_indices, col_indices, values, w_scale, out_features, bias=None, x_scale=None):
    """:func:`w8a8_matmul_ref` with the int8 weight given by its BSR parts (int8 ``values``)."""
    w_q = bsr_to_dense_ref(crow_indices, col_indices, values, out_features, x.shape[-1])
    return w8a8_matmul_ref(x, w_q, w_scale, bias, x_scale)


def bsr_w8a8_matmul_quantized_ref(xq, s_x, crow_indices, col_indices, values, w_scale, out_features, bias=None,
                                  out_dtype=torch.float16):
    """:func:`w8a8_matmul_quantized_ref` with the int8 weight given by its BSR parts."""
    w_q = bsr_to_dense_ref(crow_indices, col_indices, values, out_features, xq.shape[-1])
    return w8a8_matmul_quantized_ref(xq, s_x, w_q, w_scale, bias, out_dtype)


def unpack_int4_blocks(values: torch.Tensor) -> torch.Tensor:
    """(nnz, 32, 4) int32 -> (nnz, 32, 32) int8 in [-8, 7]: nibble ``j`` of word ``r`` of row ``i`` is column
    ``8 r + j`` of that row (the packing of :func:`unpack_int4` along each block row)."""
    shifts = torch.arange(0, 32, 4, device=values.device, dtype=torch.int32)  # (8,)
    nibbles = (values[..., None] >> shifts) & 0xF  # (nnz, 32, 4, 8)
    signed = nibbles - ((nibbles & 0x8) << 1)  # two's complement sign extension of 4 bits
    return signed.reshape(*values.shape[:-1], values.shape[-1] * 8).to(torch.int8)


def dequantize_int4_blocks(values: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """(nnz, 32, 4) packed blocks and (nnz, 32) scales -> (nnz, 32, 32) float32 ``q * scales[b, i]``."""
    return unpack_int4_blocks(values).float() * scales.float()[..., None]


def bsr_w4a16_matmul_ref(x, crow_indices, col_indices, values, scales, out_features, bias=None):
    """``y = x @ W.T (+ bias)`` with fp32 accumulation, ``W`` (N, K) the int4 BSR weight de-quantized in fp32
    (:func:`dequantize_int4_blocks`, absent blocks zero): what :func:`w4a16_matmul_ref` gives on the dense
    int4 weight with its pruned blocks zero."""
    blocks = dequantize_int4_blocks(values, scales)
    w = bsr_to_dense_ref(crow_indices, col_indices, blocks, out_features, x.shape[-1])
    y = x.float() @ w.T
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)


def layer_norm_quantize_ref(x, weight, bias, eps, x_scale=None):
    """``(y, xq, s_x)``: ``y = layer_norm(x)`` over the last dim in x's dtype (fp32 math), and the
    per-token int8 quantization of ``y`` as :func:`quantize_per_token` gives it (``xq`` (M, K))."""
    y = torch.nn.functional.layer_norm(x.float(), x.shape[-1:], None if weight is None else weight.float(),
                                       None if bias is None else bias.float(), eps).to(x.dtype)
    return (y, *quantize_per_token(y.reshape(-1, x.shape[-1]), x_scale))


def rms_norm_quantize_ref(x, weight, eps, x_scale=None):
    """``(y, xq, s_x)``: the RMSNorm of Llama-family ``transformers`` models, ``y = weight *
    (x / sqrt(mean(x^2) + eps))`` with the normalized row (fp32 math) rounded to x's dtype before the
    multiply, ``weight`` in x's dtype; and the per-token int8 quantization of ``y``."""
    y = rms_norm_ref(x, weight, eps)
    return (y, *quantize_per_token(y.reshape(-1, x.shape[-1]), x_scale))


def rms_norm_ref(x, weight, eps):
    """The RMSNorm of Llama-family ``transformers`` models, op for op (fp32 math, rounded before the weight)."""
    x32 = x.float()
    return weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def gelu_quantize_ref(x, x_scale=None):
    """``(y, xq, s_x)``: ``y = gelu(x)`` (the exact, erf form) in x's dtype (fp32 math), and the
    per-token int8 quantization of ``y`` (``xq`` (M, K))."""
    y = torch.nn.functional.gelu(x.float()).to(x.dtype)
    return (y, *quantize_per_token(y.reshape(-1, x.shape[-1]), x_scale))



# ---- block-scaled W8A8 ---------------------------------------------------------------------------
def scale_blocks(channels: int) -> int:
    """Scale blocks of :data:`SCALE_BLOCK` covering ``channels`` (the last one may be partial)."""
    return -(-channels // SCALE_BLOCK)


def _quantize_blocked(v: torch.Tensor, dims: tuple[int, ...]):
    """Symmetric int8 of float32 ``v`` with one scale per block spanning ``dims``: ``(q float32 in
    [-127, 127], scale float32 with ``dims`` kept as size 1)``; a block holding a NaN or an Inf gets a
    NaN scale and zero integers. Zero padding never changes a block's absmax."""
    scale = safe_scale(v.abs().amax(dim=dims, keepdim=True), INT8_QMAX)
    non_finite = (~torch.isfinite(v)).sum(dim=dims, keepdim=True) > 0
    scale = torch.where(non_finite, torch.full_like(scale, float("nan")), scale)
    q = torch.clamp(torch.round(v / scale), -INT8_QMAX, INT8_QMAX)
    return torch.where(non_finite, torch.zeros_like(q), q), scale


def quantize_act_blocks_ref(x: torch.Tensor):
    """Per-token int8 with one scale per 128 channels: x (M, K) float -> ``(xq int8 (M, K), s_x float32
    (M, ceil(K / 128)))``, ``s_x[m, kb] = max|x[m, 128 kb : 128 (kb + 1)]| / 127`` (0 -> 1)."""
    m, k = x.shape
    kb = scale_blocks(k)
    padded = torch.nn.functional.pad(x.float(), (0, kb * SCALE_BLOCK - k)).reshape(m, kb, SCALE_BLOCK)
    q, scale = _quantize_blocked(padded, (2,))
    return q.reshape(m, kb * SCALE_BLOCK)[:, :k].to(torch.int8), scale.reshape(m, kb)


def dequantize_act_blocks(xq: torch.Tensor, s_x: torch.Tensor) -> torch.Tensor:
    """(M, K) int8 and (M, ceil(K / 128)) scales -> (M, K) float32 ``xq * s_x[m, k // 128]``."""
    return xq.float() * s_x.float().repeat_interleave(SCALE_BLOCK, dim=1)[:, : xq.shape[1]]


def quantize_weight_blocks_ref(w: torch.Tensor):
    """Weight (N, K) -> ``(w_q int8 (N, K), s_w float32 (ceil(N / 128), ceil(K / 128)))``, one scale per
    128 x 128 block, ``s_w[nb, kb] = max|W[block]| / 127`` (0 -> 1)."""
    n, k = w.shape
    nb, kb = scale_blocks(n), scale_blocks(k)
    padded = torch.nn.functional.pad(w.float(), (0, kb * SCALE_BLOCK - k, 0, nb * SCALE_BLOCK - n))
    q, scale = _quantize_blocked(padded.reshape(nb, SCALE_BLOCK, kb, SCALE_BLOCK), (1, 3))
    w_q = q.reshape(nb * SCALE_BLOCK, kb * SCALE_BLOCK)[:n, :k].to(torch.int8)
    return w_q, scale.reshape(nb, kb)


def dequantize_weight_blocks(w_q: torch.Tensor, w_scale: torch.Tensor) -> torch.Tensor:
    """(N, K) int8 and (ceil(N / 128), ceil(K / 128)) scales -> W (N, K) float32."""
    n, k = w_q.shape
    expanded = w_scale.float().repeat_interleave(SCALE_BLOCK, 0).repeat_interleave(SCALE_BLOCK, 1)
    return w_q.float() * expanded[:n, :k]


def w8a8_block_matmul_quantized_ref(xq, s_x, w_q, w_scale, bias=None, gelu=False, out_dtype=torch.float16,
                                    act_dtype=None):
    """Block-scaled W8A8 from ``xq`` (M, K) int8 and ``s_x`` (M, ceil(K/128)): (M, N) in ``out_dtype``
    (fp16 / bf16), or, with ``out_dtype=torch.int8``, ``quantize_act_blocks_ref`` of the output in ``act_dtype``
    (fp16 / bf16): ``(yq int8 (M, N), s_y (M, ceil(N/128)))``. ``gelu``: the exact GELU of the output
    rounded to its float dtype, in fp32, rounded again."""
    k = xq.shape[1]
    s_w = w_scale.float().repeat_interleave(SCALE_BLOCK, dim=0)[: w_q.shape[0]]  # (N, Kb): row n's scales
    y = torch.zeros(xq.shape[0], w_q.shape[0], dtype=torch.float32, device=xq.device)
    for kb in range(scale_blocks(k)):
        cols = slice(kb * SCALE_BLOCK, min(k, (kb + 1) * SCALE_BLOCK))
        # int32 sums, exactly (float64 holds them: |sum| <= 128 * 127^2); then one rescale per block
        part = (xq[:, cols].to(torch.float64) @ w_q[:, cols].to(torch.float64).T).to(torch.int32).float()
        y = y + part * (s_x[:, kb, None].float() * s_w[None, :, kb])
    return _block_epilogue(y, bias, gelu, out_dtype, act_dtype)


def _block_epilogue(y, bias, gelu, out_dtype, act_dtype):
    """Bias, the float rounding, GELU and the optional int8 output of :func:`w8a8_block_matmul_quantized_ref`."""
    if bias is not None:
        y = y + bias.float()
    float_dtype = act_dtype if out_dtype == torch.int8 else out_dtype
    out = y.to(float_dtype)
    if gelu:
        out = torch.nn.functional.gelu(out.float()).to(float_dtype)
    return quantize_act_blocks_ref(out) if out_dtype == torch.int8 else out


def w8a8_block_matmul_ref(x, w_q, w_scale, bias=None, gelu=False, out_dtype=None):
    """Block-scaled W8A8 of float ``x`` (..., K): ``quantize_act_blocks_ref(x)`` then
    :func:`w8a8_block_matmul_quantized_ref`; (..., N) in ``out_dtype`` (None: x's dtype), or with
    ``out_dtype=torch.int8`` the int8 output ``(yq (M, N), s_y (M, ceil(N/128)))`` rounded through x's dtype."""
    lead, k = x.shape[:-1], x.shape[-1]
    xq, s_x = quantize_act_blocks_ref(x.reshape(-1, k))
    out_dtype = x.dtype if out_dtype is None else out_dtype
    y = w8a8_block_matmul_quantized_ref(xq, s_x, w_q, w_scale, bias, gelu, out_dtype, act_dtype=x.dtype)
    return y if out_dtype == torch.int8 else y.reshape(*lead, w_q.shape[0])


def gelu_int8_blocks_ref(xq, s_x, act_dtype=torch.float16):
    """int8 GELU in the 1 x 128 activation format: ``quantize_act_blocks_ref(gelu(dequantize_act_blocks(xq, s_x)))``,
    the de-quantized values and the GELU's rounded to ``act_dtype`` as a float layer would hold them."""
    x = dequantize_act_blocks(xq, s_x).to(act_dtype)
    return quantize_act_blocks_ref(torch.nn.functional.gelu(x.float()).to(act_dtype))


# ---- grouped MoE experts -------------------------------------------------------------------------
def swiglu_ref(h: torch.Tensor) -> torch.Tensor:
    """(M, 2I) gate/up outputs (gate columns first) in a float dtype -> ``rd(rd(silu(gate)) * up)`` (M, I) in
    that dtype, fp32 math, SiLU's output and the product each rounded (``rd``) as fp16 / bf16 ops round them."""
    gate, up = h.float().chunk(2, dim=-1)
    return (torch.nn.functional.silu(gate).to(h.dtype).float() * up).to(h.dtype)


def moe_combine_ref(y: torch.Tensor, topk_ids, topk_weights, num_experts: int, dtype) -> torch.Tensor:
    """``out[t] = rd(sum_j w[t, j] * y[t, j])`` of the expert outputs ``y`` (T, k, H) fp32, summed in slot order
    in fp32 from zero over the slots whose expert is in [0, E), rounded once to ``dtype``."""
    routed = (topk_ids >= 0) & (topk_ids < num_experts)
    out = torch.zeros(y.shape[0], y.shape[2], dtype=torch.float32, device=y.device)
    for j in range(y.shape[1]):
        weighted = topk_weights[:, j, None].float() * y[:, j]
        out = out + torch.where(routed[:, j, None], weighted, torch.zeros_like(weighted))
    return out.to(dtype)


def moe_experts_ref(x, topk_ids, topk_weights, num_experts: int, gate_up, down) -> torch.Tensor:
    """A fused-experts layer: token t's k experts ``e = topk_ids[t, j]`` each compute
    ``y = down(swiglu_ref(gate_up(x_t, e)), e)`` (``gate_up`` -> (.., 2I) in x's dtype, ``down`` -> (.., H)
    fp32), combined by :func:`moe_combine_ref`. Every expert runs on every token and keeps the rows routed
    to it: no data-dependent shape, so this also runs inside a graph capture or a compiled graph."""
    y = None
    for expert in range(num_experts):
        out = down(swiglu_ref(gate_up(x, expert)), expert)  # (T, H) fp32
        y = torch.zeros(*topk_ids.shape, out.shape[-1], dtype=torch.float32, device=x.device) if y is None else y
        y = torch.where((topk_ids == expert)[..., None], out[:, None, :], y)
    return moe_combine_ref(y, topk_ids, topk_weights, num_experts, x.dtype)


def _padded(v: torch.Tensor, k: int) -> torch.Tensor:
    """``v`` (..., K) with zero channels appended up to ``k`` (the padding of a weight's K)."""
    return torch.nn.functional.pad(v, (0, k - v.shape[-1]))


def moe_w4a16_ref(x, topk_ids, topk_weights, gate_up_qweight, gate_up_scales, down_qweight, down_scales):
    """Grouped W4A16 experts: per expert, ``qweight[e]`` (Kp/8, N) and ``scales[e]`` (Kp/G, N) under the W4A16
    contract (G = Kp / scales rows); gate/up rounded to x's dtype, down's sums kept in fp32."""
    k_up, k_down = gate_up_qweight.shape[1] * 8, down_qweight.shape[1] * 8

    def gate_up(v, e):
        return w4a16_matmul_ref(_padded(v, k_up), gate_up_qweight[e], gate_up_scales[e],
                                k_up // gate_up_scales.shape[1])

    def down(a, e):
        return _padded(a, k_down).float() @ dequantize_int4(down_qweight[e], down_scales[e],
                                                            k_down // down_scales.shape[1]).T

    return moe_experts_ref(x, topk_ids, topk_weights, gate_up_qweight.shape[0], gate_up, down)


def moe_w8a8_ref(x, topk_ids, topk_weights, gate_up_w_q, gate_up_w_scale, down_w_q, down_w_scale):
    """Grouped W8A8 experts: x and each expert's activation quantized per row (:func:`quantize_per_token`),
    ``w_q[e]`` (N, K) int8 and ``w_scale[e]`` (N,) under the W8A8 contract; down's output kept in fp32."""
    xq, s_x = quantize_per_token(x)

    def gate_up(_, e):
        return w8a8_matmul_quantized_ref(xq, s_x, gate_up_w_q[e], gate_up_w_scale[e], None, x.dtype)

    def down(a, e):
        return w8a8_matmul_quantized_ref(*quantize_per_token(a), down_w_q[e], down_w_scale[e], None, torch.float32)

    return moe_experts_ref(x, topk_ids, topk_weights, gate_up_w_q.shape[0], gate_up, down)


def moe_w8a16_ref(x, topk_ids, topk_weights, gate_up_w_q, gate_up_w_scale, down_w_q, down_w_scale):
    """Grouped W8A16 experts: ``w_q[e]`` (N, Kp) int8 and ``w_scale[e]`` (N,) or (N, Kp/128) under the W8A16
    contract; gate/up rounded to x's dtype, down's sums kept in fp32."""
    k_up, k_down = gate_up_w_q.shape[2], down_w_q.shape[2]

    def gate_up(v, e):
        return w8a16_matmul_ref(_padded(v, k_up), gate_up_w_q[e], gate_up_w_scale[e])

    def down(a, e):
        return _padded(a, k_down).float() @ dequantize_int8(down_w_q[e], down_w_scale[e]).T

    return moe_experts_ref(x, topk_ids, topk_weights, gate_up_w_q.shape[0], gate_up, down)
