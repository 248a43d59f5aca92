"""Block quantizers: activations per token in 1 x 128 blocks, weights in 128 x 128 blocks.

Activations (``reference.quantize_act_blocks_ref``), x (M, K) fp16 / bf16 (any strides)::

    s_x[m, kb] = max_{k in block kb} |x[m, k]| / 127        xq[m, k] = rint(clamp(x[m, k] / s_x[m, kb], -127, 127))

Program (row m, chunk c) holds ``BLOCKS`` consecutive 128-channel blocks of row m as one (BLOCKS, 128)
tile: one read of x, one write of the int8 copy and of BLOCKS scales. ``xq`` comes out contiguous and
``s_x`` as an (M, Kb) view of a (Kb, M) buffer (strides (1, M)): the GEMM then reads the scales of one
K block for a tile of rows as one contiguous run. Kb = ceil(K / 128); a last partial block takes the
max over the channels it has. It is the producer of a PDL pair with the GEMM after it.

Weights (``reference.quantize_weight_blocks_ref``), w (N, K) float: program (nb, kb) holds one 128 x 128
block, writes its int8 values into ``w_q`` (N, K) contiguous and its scale into ``s_w[nb, kb]``
((ceil(N / 128), Kb) contiguous). Run once per layer at export.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from compress_kernels.common.launch import launch
from compress_kernels.common.pdl import launch_options, let_dependents_launch, pdl_enabled, wait_for_inputs
from compress_kernels.reference import SCALE_BLOCK, scale_blocks
from compress_kernels.w8a8_block.blocks import quantize_rows_sym, quantize_sym, row_block_scales, tile_scale

MAX_BLOCKS_PER_PROGRAM = 16  # activation blocks per program: 2048 channels, a 4 KB read of fp16


@triton.jit
def _quantize_act_blocks_kernel(
    x_ptr, xq_ptr, s_ptr,  # x (M, K), xq (M, K) int8 contiguous, s_x (M, Kb) with strides (stride_sm, stride_sk)
    K, KB, stride_xm, stride_xk, stride_sm, stride_sk,
    BLOCKS: tl.constexpr, BLOCK: tl.constexpr, USE_PDL: tl.constexpr,
):
    wait_for_inputs(USE_PDL)  # x comes from the kernel before
    row = tl.program_id(0).to(tl.int64)
    kb = tl.program_id(1) * BLOCKS + tl.arange(0, BLOCKS)  # (BLOCKS,) block indices
    cols = kb[:, None] * BLOCK + tl.arange(0, BLOCK)[None, :]  # (BLOCKS, BLOCK) channels
    mask = cols < K
    v = tl.load(x_ptr + row * stride_xm + cols * stride_xk, mask=mask, other=0.0).to(tl.float32)
    scale = row_block_scales(v)  # (BLOCKS,)
    tl.store(xq_ptr + row * K + cols, quantize_rows_sym(v, scale), mask=mask)  # fp16 / bf16 values
    tl.store(s_ptr + row * stride_sm + kb * stride_sk, scale, mask=kb < KB)
    let_dependents_launch(USE_PDL)


@triton.jit
def _quantize_weight_blocks_kernel(
    w_ptr, wq_ptr, s_ptr,  # w (N, K) float, w_q (N, K) int8 contiguous, s_w (Nb, Kb) contiguous
    N, K, KB, stride_wn, stride_wk,
    BLOCK: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rows = (pid_n * BLOCK + tl.arange(0, BLOCK)).to(tl.int64)
    cols = pid_k * BLOCK + tl.arange(0, BLOCK)
    mask = (rows < N)[:, None] & (cols < K)[None, :]
    v = tl.load(w_ptr + rows[:, None] * stride_wn + cols[None, :] * stride_wk, mask=mask, other=0.0).to(tl.float32)
    scale = tile_scale(v)
    q = quantize_sym(v, tl.broadcast_to(scale, (BLOCK, BLOCK)))
    tl.store(wq_ptr + rows[:, None] * K + cols[None, :], q, mask=mask)
    tl.store(s_ptr + pid_n * KB + pid_k, scale)


def empty_act_scales(m: int, k: int, device) -> torch.Tensor:
    """An uninitialised (M, ceil(K / 128)) float32 scale tensor in the kernels' layout: each K block's
    scales contiguous (strides (1, M))."""
    return torch.empty((scale_blocks(k), m), dtype=torch.float32, device=device).t()


def launch_quantize_act_blocks(x2: torch.Tensor):
    """Validated x2 (M, K) -> ``(xq int8 (M, K) contiguous, s_x float32 (M, Kb) with strides (1, M))``."""
    m, k = x2.shape
    xq = torch.empty((m, k), dtype=torch.int8, device=x2.device)
    s_x = empty_act_scales(m, k, x2.device)
    if m == 0:
        return xq, s_x
    kb = scale_blocks(k)
    blocks = min(triton.next_power_of_2(kb), MAX_BLOCKS_PER_PROGRAM)
    use_pdl = pdl_enabled(x2.device)
    launch(_quantize_act_blocks_kernel, (m, triton.cdiv(kb, blocks)),
        x2, xq, s_x, k, kb, x2.stride(0), x2.stride(1), s_x.stride(0), s_x.stride(1),
        BLOCKS=blocks, BLOCK=SCALE_BLOCK, USE_PDL=use_pdl, num_warps=4 if blocks <= 8 else 8,
        **launch_options(use_pdl),
    )
    return xq, s_x


def launch_quantize_weight_blocks(w: torch.Tensor):
    """Validated w (N, K) float -> ``(w_q int8 (N, K), s_w float32 (ceil(N / 128), ceil(K / 128)))``, contiguous."""
    n, k = w.shape
    nb, kb = scale_blocks(n), scale_blocks(k)
    w_q = torch.empty((n, k), dtype=torch.int8, device=w.device)
    s_w = torch.empty((nb, kb), dtype=torch.float32, device=w.device)
    if n and k:
        launch(_quantize_weight_blocks_kernel, (nb, kb), w, w_q, s_w, n, k, kb, w.stride(0), w.stride(1),
               BLOCK=SCALE_BLOCK, num_warps=8)
    return w_q, s_w
