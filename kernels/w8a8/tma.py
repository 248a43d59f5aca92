"""W8A8 GEMM on quantized inputs with TMA tile loads (Hopper tensor descriptors), for large M.

Same contract as the pointer-loaded GEMM of :mod:`compress_kernels.w8a8.gemm` (``xq`` (M, K) int8 and
``s_x`` (M,) from the quantize pass, ``w_q`` (N, K) int8, ``w_scale`` (N,) fp32)::

    acc[m, n] = sum_k xq[m, k] * w_q[n, k]        (int32, exact)
    y[m, n]   = acc[m, n] * s_x[m] * w_scale[n] (+ bias[n])      fp32, stored in y's dtype

The x and weight tiles come through host-built tensor descriptors (``TensorDescriptor``): the copy
engine fetches whole (BLOCK_M, BLOCK_K) / (BLOCK_N, BLOCK_K) boxes into shared memory, zero-filling
past M, N and K, so the kernel computes no per-element addresses or masks in its K loop. The weight
box is K-major like ``w_q`` and enters the dot transposed. No split-K: this path is for large M,
where the output tiles alone fill the GPU. A descriptor needs 16-byte aligned base pointers and row
strides (K a multiple of 16 for int8, unit stride along K); :func:`tma_ready` checks that, and the
dispatch table takes the pointer kernel otherwise. Triton's interpreter runs descriptors too, so
the CPU tests cover the indexing and the zero fill.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from compress_kernels.common.device import tma_capable, tma_describable
from compress_kernels.common.launch import launch
from compress_kernels.common.pdl import launch_options, let_dependents_launch, pdl_enabled, wait_for_inputs
from compress_kernels.common.tiles import grouped_tile


@triton.jit
def _w8a8_tma_kernel(
    x_desc, w_desc, sx_ptr, sw_ptr, bias_ptr, y_ptr,  # xq (M, K) and w_q (N, K) descriptors, (M,), (N,), (N,), y
    M, N, K, stride_ym,
    ADD_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, USE_PDL: tl.constexpr,
):
    wait_for_inputs(USE_PDL)  # xq and s_x come from the quantize kernel before
    pid_m, pid_n = grouped_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    off_m = pid_m * BLOCK_M
    off_n = pid_n * BLOCK_N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
    for k0 in range(0, K, BLOCK_K):
        a = x_desc.load([off_m, k0])  # (BM, BK), zeros past M and K
        b = w_desc.load([off_n, k0])  # (BN, BK), zeros past N and K
        acc = tl.dot(a, b.T, acc, out_dtype=tl.int32)
    let_dependents_launch(USE_PDL)

    offs_m = off_m + tl.arange(0, BLOCK_M)
    offs_n = off_n + tl.arange(0, BLOCK_N)
    m_ok = offs_m < M
    n_ok = offs_n < N
    s_x = tl.load(sx_ptr + offs_m, mask=m_ok, other=0.0)
    s_w = tl.load(sw_ptr + offs_n, mask=n_ok, other=0.0)
    y = acc.to(tl.float32) * s_x[:, None] * s_w[None, :]
    if ADD_BIAS:
        y += tl.load(bias_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    y_ptrs = y_ptr + offs_m[:, None].to(tl.int64) * stride_ym + offs_n[None, :]
    tl.store(y_ptrs, y.to(y_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


def tma_ready(w_q: torch.Tensor, xq: torch.Tensor | None = None) -> bool:
    """Whether both int8 operands can be described for TMA: a GPU of compute capability >= 9.0 (or
    the interpreter), unit stride along K, 16-byte aligned base pointers and row strides. ``xq``
    None: the quantize pass will allocate it, contiguous (aligned when K is a multiple of 16)."""
    if not tma_capable(w_q.device):
        return False
    if xq is None:
        return w_q.shape[1] % 16 == 0 and tma_describable(w_q)
    return tma_describable(xq) and tma_describable(w_q)


def launch_tma(xq, s_x, w_q, w_scale, bias, cfg, y) -> None:
    """``y`` (M, N) <- the dequantized product of ``xq`` and ``w_q`` with ``cfg``'s tiles (no split-K)."""
    m, k = xq.shape
    n = w_q.shape[0]
    x_desc = TensorDescriptor.from_tensor(xq, [cfg.block_m, cfg.block_k])
    w_desc = TensorDescriptor.from_tensor(w_q, [cfg.block_n, cfg.block_k])
    use_pdl = pdl_enabled(xq.device)
    grid = (triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n),)
    launch(_w8a8_tma_kernel, grid,
        x_desc, w_desc, s_x, w_scale, bias if bias is not None else w_scale, y,
        m, n, k, y.stride(0),
        ADD_BIAS=bias is not None, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
        GROUP_M=cfg.group_m, USE_PDL=use_pdl, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        **launch_options(use_pdl),
    )
