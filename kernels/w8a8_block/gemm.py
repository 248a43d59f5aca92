"""Block-scaled W8A8 on tensor cores, pointer-loaded tiles: one rescale per 128-deep K step, split-K.

Operands (``reference.w8a8_block_matmul_quantized_ref``): x (M, K) fp16 / bf16 or its int8 copy ``xq``
with ``s_x`` (M, Kb); ``w_q`` (N, K) int8 (K contiguous) with ``s_w`` (Nb, Kb) fp32 contiguous; Kb, Nb
the 128-wide blocks covering K and N. Program (tile, split) owns a BLOCK_M x BLOCK_N output tile
(grouped tile order, :func:`compress_kernels.common.tiles.grouped_tile`) and a run of K blocks::

    for each K block kb of its split (BLOCK_K = 128: one scale block per step)
        a      = xq[rows, kb]              (BM, 128) int8
        part   = dot(a, w_q[cols, kb]^T)   (BM, BN) int32, exact
        acc   += float(part) * (s_x[rows, kb] * s_w[cols // 128, kb])      fp32

``xq`` and ``s_x`` come from the quantize pass (or the int8 output of a layer before) and the kernel
waits for them (PDL consumer). BLOCK_N <= 128 reads one weight scale per step; wider tiles
read one per column. Rows past M and columns past N are masked (loaded as 0), a last partial K block
too (unless EVEN_K). The end of the tile (bias, GELU, float or int8 output, the split-K sum) is
:mod:`compress_kernels.w8a8_block.epilogue`.
"""
from __future__ import annotations

import triton
import triton.language as tl

from compress_kernels.common.launch import launch
from compress_kernels.common.pdl import launch_options, let_dependents_launch, pdl_enabled, wait_for_inputs
from compress_kernels.common.splitk import last_split_buffers
from compress_kernels.common.tiles import grouped_tile
from compress_kernels.w8a8_block.blocks import block_sum_to_float
from compress_kernels.w8a8_block.epilogue import store_output, store_partial, sum_partials


@triton.jit
def _w8a8_block_gemm_kernel(
    x_ptr, sx_ptr, w_ptr, sw_ptr, bias_ptr, out_ptr, sy_ptr,  # xq (M, K), s_x (M, Kb), w_q (N, K), s_w (Nb, Kb)
    ws_ptr, cnt_ptr,  # SPLIT_K > 1: fp32 partials (SPLIT_K, M, N) and one ticket counter per output tile
    M, N, K, KB,
    stride_xm, stride_xk, stride_sxm, stride_sxk, stride_wn, stride_wk, stride_swn, stride_om, stride_sym, stride_syk,
    HAS_BIAS: tl.constexpr, GELU: tl.constexpr, OUT_INT8: tl.constexpr,
    ACT_BF16: tl.constexpr, SPLIT_K: tl.constexpr, EVEN_K: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    wait_for_inputs(USE_PDL)  # xq and s_x come from the kernel before
    tile_id = tl.program_id(0)
    pid_m, pid_n = grouped_tile(tile_id, M, N, BLOCK_M, BLOCK_N, GROUP_M)
    pid_k = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_ok = offs_m < M
    n_ok = offs_n < N
    rows = offs_m.to(tl.int64)
    cols = offs_n.to(tl.int64)

    per_split = tl.cdiv(KB, SPLIT_K)
    kb_first = pid_k * per_split
    kb_last = min(KB, kb_first + per_split)
    x_ptrs = x_ptr + rows[:, None] * stride_xm + (kb_first * BLOCK_K + offs_k)[None, :] * stride_xk  # (BM, BK)
    w_ptrs = w_ptr + cols[None, :] * stride_wn + (kb_first * BLOCK_K + offs_k)[:, None] * stride_wk  # (BK, BN)
    if BLOCK_N > BLOCK_K:  # a scale per column: (BN,)
        sw_ptrs = sw_ptr + (offs_n // BLOCK_K) * stride_swn
    else:  # the tile lies in one 128-row block of w: one scale per step
        sw_ptrs = sw_ptr + (pid_n * BLOCK_N // BLOCK_K) * stride_swn

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kb in range(kb_first, kb_last):
        if EVEN_K:
            x_mask = m_ok[:, None]
            w_mask = n_ok[None, :]
        else:
            k_ok = kb * BLOCK_K + offs_k < K
            x_mask = m_ok[:, None] & k_ok[None, :]
            w_mask = n_ok[None, :] & k_ok[:, None]
        a = tl.load(x_ptrs, mask=x_mask, other=0)
        s_a = tl.load(sx_ptr + rows * stride_sxm + kb * stride_sxk, mask=m_ok, other=0.0)
        b = tl.load(w_ptrs, mask=w_mask, other=0)
        if BLOCK_N > BLOCK_K:
            s_b = tl.load(sw_ptrs + kb, mask=n_ok, other=0.0)[None, :]
        else:
            s_b = tl.load(sw_ptrs + kb)
        part = tl.dot(a, b, out_dtype=tl.int32)
        acc += block_sum_to_float(part) * (s_a[:, None] * s_b)  # exact conversion, one FMA
        x_ptrs += BLOCK_K * stride_xk
        w_ptrs += BLOCK_K * stride_wk
    let_dependents_launch(USE_PDL)

    if SPLIT_K == 1:
        store_output(acc, offs_m, offs_n, pid_n, M, N, bias_ptr, out_ptr, sy_ptr, stride_om, stride_sym, stride_syk,
                     HAS_BIAS, GELU, OUT_INT8, ACT_BF16)
    else:
        ticket = store_partial(acc, ws_ptr, cnt_ptr, offs_m, offs_n, M, N, tile_id, pid_k)
        if ticket == SPLIT_K - 1:  # the last split of this tile: sum the partials, then the epilogue
            total = sum_partials(ws_ptr, offs_m, offs_n, M, N, BLOCK_M, BLOCK_N, SPLIT_K)
            store_output(total, offs_m, offs_n, pid_n, M, N, bias_ptr, out_ptr, sy_ptr, stride_om, stride_sym,
                         stride_syk, HAS_BIAS, GELU, OUT_INT8, ACT_BF16)
            tl.atomic_xchg(cnt_ptr + tile_id, 0)  # leave the counter zeroed for the next launch


def launch_tiles(x2, s_x, w_q, w_scale, bias, out, s_out, cfg, gelu: bool, act_bf16: bool) -> None:
    """Write the product into ``out`` (M, N) (float, or int8 with ``s_out`` (M, Nb)) with ``cfg``'s tiles.

    ``x2`` (M, K) int8 with ``s_x`` (M, Kb). Inputs validated by the caller; ``w_scale`` contiguous."""
    m, k = x2.shape
    n = w_q.shape[0]
    kb = triton.cdiv(k, cfg.block_k)
    tiles = triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n)
    workspace, counters = last_split_buffers(out, cfg.split_k, m, n, tiles)
    use_pdl = pdl_enabled(x2.device)
    int8_out = s_out is not None
    launch(_w8a8_block_gemm_kernel, (tiles, cfg.split_k),
        x2, s_x, w_q, w_scale, bias if bias is not None else w_scale, out,
        s_out if int8_out else w_scale, workspace, counters,
        m, n, k, kb,
        x2.stride(0), x2.stride(1), s_x.stride(0), s_x.stride(1),
        w_q.stride(0), w_q.stride(1), w_scale.stride(0), out.stride(0),
        s_out.stride(0) if int8_out else 0, s_out.stride(1) if int8_out else 0,
        HAS_BIAS=bias is not None, GELU=gelu, OUT_INT8=int8_out, ACT_BF16=act_bf16,
        SPLIT_K=cfg.split_k, EVEN_K=k % cfg.block_k == 0, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m, USE_PDL=use_pdl, num_warps=cfg.num_warps,
        num_stages=cfg.num_stages, **launch_options(use_pdl),
    )
