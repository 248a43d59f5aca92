"""PyTorch's own paths for the products our kernels compute: the anchors both benchmarks time ours against.

Every anchor computes ``y = x @ W.T`` for activations x (M, K) and a weight W (N, K) held in the
anchor's own format. Each runs on CUDA (the timed path) and on the CPU, where CI runs the
benchmarks' plumbing; where PyTorch has no CPU kernel for the op the CPU branch is a stand-in that
computes the same product another way (said per anchor below).

* **cuBLAS fp16**: ``F.linear(x, W)`` with x and W fp16. CPU: the same call (ATen's CPU GEMM).
* **torchao's dynamic W8A8** (``torch._int_mm``): x is quantized per token in PyTorch ops,
  ``s_x[m] = max(max_k |x[m, k]|, 1e-8) / 127`` (float32) and ``xq = clamp(round(x / s_x), -128, 127)``
  (int8); ``acc = xq @ w_q.T`` in int32 by ``torch._int_mm`` (cuBLASLt's int8 GEMM, which needs
  M > 16: smaller M are padded with zero rows to 32, as wrappers around ``_int_mm`` do, and the pad
  rows are cut off); ``y = acc * s_x[m] * w_scale[n]`` in x's dtype. The 1e-8 floor on the row
  absmax only matters for an all-zero row (its xq is 0, so its y is 0, as in our kernels' contract);
  it is the floor the committed kernel-benchmark figures (benchmarks/results/kernels-*.json) were
  measured with. CPU: ``torch._int_mm``'s CPU kernel, the same code.
* **Block-scaled W8A8 with ``torch._int_mm``** (the same pipeline in PyTorch ops, block by block): x is
  quantized per token and 128 channels, ``s_x[m, kb] = max(max_{k in kb} |x[m, k]|, 1e-8) / 127`` and
  ``xq = clamp(round(x / s_x), -127, 127)``; then for each 128-deep K block one ``torch._int_mm`` (int32,
  rows padded to 32 when M <= 16 as above) and ``y += acc * (s_x[:, kb] * w_scale[n // 128, kb])`` in
  fp32; ``y`` in x's dtype. PyTorch has no int8 GEMM with per-block rescaling, so this is K / 128 int8
  GEMMs and rescales (it needs K a multiple of 128). CPU: the same ops.
* **tinygemm int4** (``aten._weight_int4pack_mm``, the kernel torchao's int4 weight-only path uses):
  group-wise int4 weights ``q`` (N, K) in [-8, 7] with scales (N, K/G). tinygemm stores
  ``u = q + 8`` in [0, 15] and dequantizes ``W[n, k] = (u - 8) * scale[g, n] + zero[g, n]`` for
  ``g = k // G``, so with ``zero = 0`` it holds exactly the symmetric ``q * scale`` our W4A16 uses.
  ``scales_and_zeros`` is (K/G, N, 2) bf16 (``[..., 0]`` scales, ``[..., 1]`` zeros); activations
  must be bf16 (its CUDA kernel takes no fp16). The packed weight is made once, by
  :func:`tinygemm_pack`: on CUDA ``aten._convert_weight_to_int4pack`` from (N, K/2) uint8, two
  nibbles a byte with the even k in the high nibble; on the CPU ``aten._convert_weight_to_int4pack_for_cpu``
  from the (N, K) int32 ``u``, used with ``aten._weight_int4pack_mm_for_cpu``. Both need
  ``K % (16 * inner_k_tiles) == 0`` (inner_k_tiles = 8, as torchao) and ``N % 16 == 0``.
* **PyTorch's int8 weight-only matmul** (``torch._weight_int8pack_mm``, the op torchao's and Inductor's
  int8 weight-only paths lower to): x (M, K) fp16 / bf16, the int8 weight (N, K) as it is (no packing)
  and one scale per output channel, (N,) in x's dtype (its CPU kernel takes no other); ``y = (x @ w.T) *
  scales``. Its CUDA kernel (PyTorch 2.9 on) is one thread per output with a loop over K in fp32, so
  the benchmarks time it at small M only (:data:`INT8PACK_MAX_M`). CPU: the same op, its CPU kernel.
* **torch BSR**: PyTorch's Triton BSR kernel, ``torch.sparse._triton_ops.bsr_dense_mm``, on W as a
  ``torch.sparse_bsr_tensor`` with 32x32 blocks: it computes ``W @ x.T``, whose dense operand needs
  a multiple of 16 columns, so x is padded with zero rows to the next multiple of 16 and the result
  cut and transposed back. CPU stand-in (the Triton kernel is CUDA-only): torch's sparse BSR times
  dense product in float32 (its CPU kernel has no fp16), cast back to x's dtype.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

INT_MM_MIN_ROWS = 17  # cuBLASLt's int8 GEMM behind torch._int_mm needs M > 16 ...
INT_MM_PADDED_ROWS = 32  # ... so fewer rows are padded to this many
ABSMAX_FLOOR = 1e-8
TINYGEMM_INNER_K_TILES = 8
INT8PACK_MAX_M = 256  # torch._weight_int8pack_mm's CUDA kernel (a thread per output) takes seconds past this
BSR_DENSE_MM_COLUMNS = 16  # bsr_dense_mm needs the dense operand's column count divisible by this


def cublas_fp16(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``y = x @ W.T``: (M, K) and (N, K) fp16 -> (M, N) fp16 (cuBLAS on CUDA)."""
    return F.linear(x, weight)


# ---- torchao's dynamic W8A8 ------------------------------------------------------------------------
def quantize_rows_int8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(M, K) -> (xq int8 (M, K), s_x float32 (M, 1)): ``s_x = max(max|x[m]|, 1e-8) / 127``."""
    s_x = x.abs().amax(dim=-1, keepdim=True).float().clamp(min=ABSMAX_FLOOR) / 127
    xq = torch.clamp(torch.round(x.float() / s_x), -128, 127).to(torch.int8)
    return xq, s_x


def int_mm_w8a8(x: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor) -> torch.Tensor:
    """torchao's dynamic W8A8: x (M, K) fp16, w_q (N, K) int8, w_scale (N,) float32 -> (M, N) in x's dtype.

    ``y = (xq @ w_q.T) * s_x[m] * w_scale[n]`` with ``xq, s_x`` from :func:`quantize_rows_int8` and
    the int32 product from ``torch._int_mm`` (rows padded to 32 when M <= 16).
    """
    m = x.shape[0]
    xq, s_x = quantize_rows_int8(x)
    if m < INT_MM_MIN_ROWS:
        xq = F.pad(xq, (0, 0, 0, INT_MM_PADDED_ROWS - m))
    acc = torch._int_mm(xq, w_q.t())[:m]  # (M, N) int32
    return (acc.float() * s_x * w_scale[None, :]).to(x.dtype)


# ---- block-scaled W8A8 with torch._int_mm ------------------------------------------------------------
BLOCK = 128  # channels per activation scale, side of a weight scale block


def quantize_blocks_int8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(M, K) with K a multiple of 128 -> (xq int8 (M, K), s_x float32 (M, K/128)), ``s_x`` floored as above."""
    m, k = x.shape
    x32 = x.float().reshape(m, k // BLOCK, BLOCK)
    s_x = x32.abs().amax(dim=-1).clamp(min=ABSMAX_FLOOR) / 127
    xq = torch.clamp(torch.round(x32 / s_x[..., None]), -127, 127).to(torch.int8)
    return xq.reshape(m, k), s_x


def int_mm_w8a8_block(x: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor) -> torch.Tensor:
    """Block-scaled W8A8 in PyTorch ops: x (M, K) fp16, w_q (N, K) int8, w_scale (ceil(N/128), K/128) float32
    -> (M, N) in x's dtype, one ``torch._int_mm`` per 128-deep K block (module docstring)."""
    m, k = x.shape
    n = w_q.shape[0]
    xq, s_x = quantize_blocks_int8(x)
    if m < INT_MM_MIN_ROWS:
        xq = F.pad(xq, (0, 0, 0, INT_MM_PADDED_ROWS - m))
    s_w = w_scale.repeat_interleave(BLOCK, dim=0)[:n]  # (N, K/128): each output channel's block scales
    y = torch.zeros(m, n, dtype=torch.float32, device=x.device)
    for kb in range(k // BLOCK):
        cols = slice(kb * BLOCK, (kb + 1) * BLOCK)
        acc = torch._int_mm(xq[:, cols], w_q[:, cols].t())[:m]  # (M, N) int32
        y += acc.float() * (s_x[:, kb, None] * s_w[None, :, kb])
    return y.to(x.dtype)


# ---- tinygemm int4 ---------------------------------------------------------------------------------
def tinygemm_pack(q: torch.Tensor, inner_k_tiles: int = TINYGEMM_INNER_K_TILES) -> torch.Tensor:
    """(N, K) integers in [-8, 7] -> tinygemm's packed int4 weight, on ``q``'s device (module docstring)."""
    if q.dim() != 2 or q.dtype.is_floating_point or q.dtype == torch.bool:
        raise TypeError(f"tinygemm_pack: expected a 2-D integer tensor (N, K), got {q.dtype} of shape {tuple(q.shape)}")
    n, k = q.shape
    if k % (16 * inner_k_tiles) or n % 16:
        raise ValueError(f"tinygemm_pack: expected K % {16 * inner_k_tiles} == 0 and N % 16 == 0, "
                         f"got (N, K) = ({n}, {k})")
    unsigned = q.to(torch.int32) + 8  # (N, K) in [0, 15]
    if q.is_cuda:
        nibbles = (unsigned[:, ::2] << 4 | unsigned[:, 1::2]).to(torch.uint8)  # (N, K/2), even k high
        return torch.ops.aten._convert_weight_to_int4pack(nibbles.contiguous(), inner_k_tiles)
    return torch.ops.aten._convert_weight_to_int4pack_for_cpu(unsigned.contiguous(), inner_k_tiles)


def tinygemm_scales_and_zeros(scales: torch.Tensor) -> torch.Tensor:
    """Group scales (N, K/G) -> tinygemm's (K/G, N, 2) bf16 ``[scale, zero = 0]`` (symmetric int4)."""
    scales_t = scales.t().float()  # (K/G, N)
    return torch.stack([scales_t, torch.zeros_like(scales_t)], dim=-1).to(torch.bfloat16).contiguous()


def tinygemm_int4_matmul(x: torch.Tensor, packed: torch.Tensor, group_size: int,
                         scales_and_zeros: torch.Tensor) -> torch.Tensor:
    """``y = x @ W.T`` for x (M, K) bf16 and W from :func:`tinygemm_pack` / :func:`tinygemm_scales_and_zeros`."""
    if x.is_cuda:
        return torch.ops.aten._weight_int4pack_mm(x, packed, group_size, scales_and_zeros)
    return torch.ops.aten._weight_int4pack_mm_for_cpu(x, packed, group_size, scales_and_zeros)


# ---- PyTorch's int8 weight-only matmul -------------------------------------------------------------
def weight_int8pack_mm(x: torch.Tensor, w_q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """``y = (x @ w_q.T) * scales`` by ``torch._weight_int8pack_mm``: x (M, K) fp16 / bf16, w_q (N, K) int8,
    scales (N,) in x's dtype -> (M, N) in x's dtype."""
    return torch._weight_int8pack_mm(x, w_q, scales)


# ---- torch BSR -------------------------------------------------------------------------------------
def torch_bsr_matmul(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``y = x @ W.T`` for x (M, K) and W (N, K) a ``torch.sparse_bsr_tensor``: (M, N) in x's dtype."""
    if not x.is_cuda:  # CPU stand-in: torch's sparse BSR product, float32 only
        return (weight.to(torch.float32) @ x.float().T).T.to(x.dtype)
    from torch.sparse._triton_ops import bsr_dense_mm

    m = x.shape[0]
    pad = (-m) % BSR_DENSE_MM_COLUMNS
    x_t = F.pad(x, (0, 0, 0, pad)).t() if pad else x.t()  # (K, M + pad)
    return bsr_dense_mm(weight, x_t)[:, :m].t()
