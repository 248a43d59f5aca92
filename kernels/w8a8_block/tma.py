"""Block-scaled W8A8 with TMA tile loads (Hopper tensor descriptors), for large M.

Same contract and step as the pointer tiles of :mod:`compress_kernels.w8a8_block.gemm`, on an input
already quantized (``xq`` (M, K) int8, ``s_x`` (M, Kb)); ``w_q`` (N, K) int8, ``s_w`` (Nb, Kb)::

    for each K block kb:  acc += float(dot(xq[tile, kb], w_q[tile, kb]^T)) * (s_x[rows, kb] * s_w[nb, kb])

The copy engine fetches whole (BLOCK_M, 128) and (BLOCK_N, 128) int8 boxes into shared memory,
zero-filling past M, N and K, so the K loop computes no addresses or masks; the scales of a K block
are one contiguous run of ``s_x`` in the kernels' layout (strides (1, M)) and one ``s_w`` value per
tile (BLOCK_N = 128). No split-K: at large M the output tiles fill the GPU. The fp32 running sum and
the int32 product of a step are both live; the dispatch table's tiles (128 x 128 with one warp group,
or 64 x 128) were the fastest of its sweep. A descriptor needs 16-byte aligned base pointers and row strides:
:func:`compress_kernels.w8a8.tma.tma_ready` checks both int8 operands, and the dispatch table takes
the pointer tiles otherwise. Triton's interpreter runs descriptors too, so the CPU tests cover this path.
"""
from __future__ import annotations

import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from compress_kernels.common.launch import launch
from compress_kernels.common.pdl import launch_options, let_dependents_launch, pdl_enabled, wait_for_inputs
from compress_kernels.common.tiles import grouped_tile
from compress_kernels.w8a8_block.blocks import block_sum_to_float
from compress_kernels.w8a8_block.epilogue import store_output


@triton.jit
def _w8a8_block_tma_kernel(
    x_desc, sx_ptr, w_desc, sw_ptr, bias_ptr, out_ptr, sy_ptr,  # xq / w_q descriptors, s_x (M, Kb), s_w (Nb, Kb)
    M, N, KB, stride_sxm, stride_sxk, stride_swn, stride_om, stride_sym, stride_syk,
    HAS_BIAS: tl.constexpr, GELU: tl.constexpr, OUT_INT8: tl.constexpr, ACT_BF16: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    wait_for_inputs(USE_PDL)  # xq and s_x come from the kernel before
    pid_m, pid_n = grouped_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    off_m = pid_m * BLOCK_M
    off_n = pid_n * BLOCK_N
    offs_m = off_m + tl.arange(0, BLOCK_M)
    offs_n = off_n + tl.arange(0, BLOCK_N)
    m_ok = offs_m < M
    sx_ptrs = sx_ptr + offs_m.to(tl.int64) * stride_sxm
    sw_ptrs = sw_ptr + (off_n // BLOCK_K) * stride_swn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kb in range(0, KB):
        a = x_desc.load([off_m, kb * BLOCK_K])  # (BM, BK), zeros past M and K
        b = w_desc.load([off_n, kb * BLOCK_K])  # (BN, BK), zeros past N and K
        s_a = tl.load(sx_ptrs + kb * stride_sxk, mask=m_ok, other=0.0)
        s_b = tl.load(sw_ptrs + kb)
        part = tl.dot(a, b.T, out_dtype=tl.int32)
        acc += block_sum_to_float(part) * (s_a[:, None] * s_b)
    let_dependents_launch(USE_PDL)
    store_output(acc, offs_m, offs_n, pid_n, M, N, bias_ptr, out_ptr, sy_ptr, stride_om, stride_sym, stride_syk,
                 HAS_BIAS, GELU, OUT_INT8, ACT_BF16)


def launch_tma(xq, s_x, w_q, w_scale, bias, out, s_out, cfg, gelu: bool, act_bf16: bool) -> None:
    """``out`` (M, N) (float, or int8 with ``s_out`` (M, Nb)) <- the product of quantized ``xq`` and
    ``w_q`` with ``cfg``'s tiles (BLOCK_N = BLOCK_K = 128, no split-K); inputs validated by the caller."""
    m, k = xq.shape
    n = w_q.shape[0]
    x_desc = TensorDescriptor.from_tensor(xq, [cfg.block_m, cfg.block_k])
    w_desc = TensorDescriptor.from_tensor(w_q, [cfg.block_n, cfg.block_k])
    use_pdl = pdl_enabled(xq.device)
    int8_out = s_out is not None
    grid = (triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n),)
    launch(_w8a8_block_tma_kernel, grid,
        x_desc, s_x, w_desc, w_scale, bias if bias is not None else w_scale, out, s_out if int8_out else w_scale,
        m, n, triton.cdiv(k, cfg.block_k), s_x.stride(0), s_x.stride(1), w_scale.stride(0), out.stride(0),
        s_out.stride(0) if int8_out else 0, s_out.stride(1) if int8_out else 0,
        HAS_BIAS=bias is not None, GELU=gelu, OUT_INT8=int8_out, ACT_BF16=act_bf16,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m, USE_PDL=use_pdl,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, **launch_options(use_pdl),
    )
