"""W8A8 matmul: int8 activations x int8 weights, int32 accumulation, fused dequantization epilogue.

Math (the contract of ``kernels.reference.w8a8_matmul_ref``), with ``x`` (M, K) fp16/bf16, ``w_q``
(N, K) int8 (the ``nn.Linear`` layout, K contiguous), ``w_scale`` (N,) fp32::

    s_x[m]     = max_k |x[m, k]| / 127         (dynamic, per token; 0 -> 1)   or a static scale
    xq[m, k]   = clamp(rint(x[m, k] / s_x[m]), -128, 127)       rint = round half to even
    acc[m, n]  = sum_k xq[m, k] * w_q[n, k]                      exact, int32
    y[m, n]    = acc[m, n] * s_x[m] * w_scale[n] (+ bias[n])     in fp32, stored in x's dtype

Two paths, the same integers and the same output bits:

* pre-pass (the default): ``_quantize_rows_kernel`` (one program per row: the whole row in registers
  up to K = 4096, else an absmax pass then a quantize pass) writes ``xq`` (M, K) int8 and ``s_x``
  (M,) fp32; ``_w8a8_matmul_kernel`` multiplies with ``tl.dot(..., out_dtype=int32)`` and dequantizes
  in its epilogue.
* fused (opt-in, ``TileConfig(fused=True)``, :mod:`kernels.w8a8_fused`): one launch; each GEMM
  program computes its rows' scales and quantizes its x tiles in registers. It saves a launch, but
  every N tile redoes the quantization, and on an H200 that cost more than the launch at every shape
  and M measured (docs/kernels-notes.md), so ``pick_config`` never chooses it.
* gemv (``TileConfig(gemv=True)``, :mod:`kernels.w8a8_gemv`): one launch, one token row per
  program on CUDA cores, the row quantized in the kernel; ``pick_config`` takes it at every M = 1
  call and up to M = 4 on small layers, unsplit (:func:`row_gemv_config`: 8 outputs per program
  walking all of K in 1024-deep steps; on an H100 4-33% faster than the split one-row tiles and
  the tensor-core tile before it).

Quantization uses IEEE division (``div_rn``; the fused kernel an exactly equivalent float64
multiply), clamps to [-128, 127], then rounds with the float trick ``(v + 1.5 * 2**23) - 1.5 * 2**23``,
exact round-half-even for ``|v| < 2**22`` (clamping before or after rounding gives the same integer
because the bounds are integers), so ``xq`` equals the reference's integers exactly.

Tiles are chosen by a heuristic on (M bucket, N, K) (``pick_config``), never by autotuning, so the
kernel can be captured in a CUDA graph on its first call. At small M the weight bytes dominate:
narrow N tiles and, where N is small, split-K keep all SMs streaming (fp32 partials summed in split
order: by the last split of each 16-row tile to finish, in the kernel, else by a second launch;
:func:`kernels._splitk.reduces_in_kernel`). At large M the work is int8 tensor-core bound:
128x256x128 tiles loaded by TMA (:mod:`kernels.w8a8_tma`; 256x128 tiles with pointer loads where a
tensor descriptor cannot describe the operands), grouped tile order for L2 reuse, a deep pipeline.
Small layers (N * K <= ``SMALL_LAYER``, e.g. MiniLM's 384 / 1536) take the largest tile that still
gives every SM an output tile, without split-K.

The op is registered as ``torch.ops.compress_kernels.w8a8_matmul`` with a fake implementation, so
callers compile under ``torch.compile`` and capture in CUDA graphs; ``w8a8_matmul`` calls it.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from compress_kernels._checks import (ACTIVATION_DTYPES, check_activation, check_bias, check_same_device, check_shape,
                             check_tensor, interpreting)
from compress_kernels._pdl import launch_options, let_dependents_launch, pdl_enabled, wait_for_inputs
from compress_kernels._splitk import last_split_reduces, splitk_reduce, tiled_split_launch
from compress_kernels._tiles import SMALL_LAYER, grouped_tile, resident_split_k, split_k_for, split_k_range
from compress_kernels.w8a8_fused import launch_fused, quantize_int8
from compress_kernels.w8a8_gemv import launch_gemv
from compress_kernels.w8a8_tma import launch_tma, tma_ready


ROW_GEMV_SMALL_MAX_M = 4  # small layers take the one-row kernel up to here (H100: 1024x1024 M = 4 5.5 -> 4.5 us;
# from M = 2 on larger layers it lost: 4096x4096 M = 2 14.0 vs 12.0 us)
GEMV_MAX_N = 264 * 64  # wider layers walk K in 512-deep steps in the one-row kernel (row_gemv_config)


class TileConfig(NamedTuple):
    """Launch parameters of the GEMM; ``fused``: one launch that quantizes x itself (no pre-pass);
    ``gemv``: the one-row CUDA-core kernel of :mod:`kernels.w8a8_gemv` (``block_m`` ignored)."""

    block_m: int
    block_n: int
    block_k: int
    split_k: int = 1
    group_m: int = 8
    num_warps: int = 4
    num_stages: int = 3
    fused: bool = False
    gemv: bool = False
    tma: bool = False  # pre-pass path without split-K: tiles loaded through TMA descriptors (kernels.w8a8_tma)


@triton.jit
def _quantize_rows_kernel(
    x_ptr, xq_ptr, sx_ptr, static_ptr,  # x (M, K), xq (M, K) int8 contiguous, s_x (M,) fp32, static scale
    K, stride_xm, stride_xk,
    STATIC: tl.constexpr, STATIC_PER_ROW: tl.constexpr, BLOCK_K: tl.constexpr, ONE_PASS: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    wait_for_inputs(USE_PDL)  # x comes from the kernel before
    row = tl.program_id(0)
    x_row = x_ptr + row.to(tl.int64) * stride_xm
    offs = tl.arange(0, BLOCK_K)
    if STATIC:
        if STATIC_PER_ROW:
            scale = tl.load(static_ptr + row)
        else:
            scale = tl.load(static_ptr)
    if ONE_PASS:  # the whole row (K <= BLOCK_K) in registers: x is read once
        row_mask = offs < K
        row_vals = tl.load(x_row + offs * stride_xk, mask=row_mask, other=0.0).to(tl.float32)
        if not STATIC:
            scale = tl.math.div_rn(tl.max(tl.abs(row_vals), axis=0), 127.0)
        scale = tl.where(scale == 0.0, 1.0, scale)
        tl.store(sx_ptr + row, scale)
        tl.store(xq_ptr + row.to(tl.int64) * K + offs, quantize_int8(row_vals, scale), mask=row_mask)
    else:  # an absmax pass, then a quantize pass, BLOCK_K at a time
        if not STATIC:
            absmax = tl.zeros((BLOCK_K,), dtype=tl.float32)
            for k0 in range(0, K, BLOCK_K):
                v = tl.load(x_row + (k0 + offs) * stride_xk, mask=k0 + offs < K, other=0.0)
                absmax = tl.maximum(absmax, tl.abs(v.to(tl.float32)))
            scale = tl.math.div_rn(tl.max(absmax, axis=0), 127.0)
        scale = tl.where(scale == 0.0, 1.0, scale)
        tl.store(sx_ptr + row, scale)
        xq_row = xq_ptr + row.to(tl.int64) * K
        for k0 in range(0, K, BLOCK_K):
            mask = k0 + offs < K
            v = tl.load(x_row + (k0 + offs) * stride_xk, mask=mask, other=0.0).to(tl.float32)
            tl.store(xq_row + k0 + offs, quantize_int8(v, scale), mask=mask)
    # the GEMM may launch now (it waits for this kernel before reading xq); at the kernel's start this
    # made batch 8 of a MiniLM-size model slower (kernels/_pdl.py)
    let_dependents_launch(USE_PDL)


@triton.jit
def _w8a8_matmul_kernel(
    xq_ptr, w_ptr, sx_ptr, sw_ptr, bias_ptr, out_ptr,  # xq (M, K) i8, w (N, K) i8, (M,), (N,), (N,), out
    y_ptr, cnt_ptr,  # REDUCE_SPLIT > 1: the output (M, N) and one ticket counter per output tile
    M, N, K,
    stride_xm, stride_xk, stride_wn, stride_wk, stride_os, stride_om, stride_ym,  # stride_os: between split-K slices
    SPLIT_K, ADD_BIAS: tl.constexpr, EVEN_K: tl.constexpr, REDUCE_SPLIT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    wait_for_inputs(USE_PDL)  # xq and s_x come from the quantize kernel before
    # grouped tile order: GROUP_M row-tiles share each weight column-tile while it sits in L2
    pid_m, pid_n = grouped_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    pid_k = tl.program_id(1)

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = (offs_m % M).to(tl.int64)  # wrapped rows/cols: loads need no M/N mask, stores are masked
    cols = (offs_n % N).to(tl.int64)
    offs_k = tl.arange(0, BLOCK_K)

    k_first, k_last = split_k_range(pid_k, K, SPLIT_K, BLOCK_K)
    x_ptrs = xq_ptr + rows[:, None] * stride_xm + (k_first + offs_k)[None, :] * stride_xk  # (BM, BK)
    w_ptrs = w_ptr + cols[None, :] * stride_wn + (k_first + offs_k)[:, None] * stride_wk  # (BK, BN)

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
    for k0 in range(k_first, k_last, BLOCK_K):
        if EVEN_K:
            a = tl.load(x_ptrs)
            b = tl.load(w_ptrs)
        else:
            a = tl.load(x_ptrs, mask=(k0 + offs_k)[None, :] < K, other=0)
            b = tl.load(w_ptrs, mask=(k0 + offs_k)[:, None] < K, other=0)
        acc = tl.dot(a, b, acc, out_dtype=tl.int32)
        x_ptrs += BLOCK_K * stride_xk
        w_ptrs += BLOCK_K * stride_wk
    let_dependents_launch(USE_PDL)

    s_x = tl.load(sx_ptr + rows)
    s_w = tl.load(sw_ptr + cols)
    y = acc.to(tl.float32) * s_x[:, None] * s_w[None, :]
    if REDUCE_SPLIT > 1:  # out is the fp32 partials (SPLIT_K, M, N); the last split to finish sums them
        last_split_reduces(y, out_ptr, cnt_ptr, y_ptr, bias_ptr, offs_m, offs_n, M, N, stride_ym,
                           tl.program_id(0), pid_k, REDUCE_SPLIT, ADD_BIAS)
    else:
        if ADD_BIAS:
            y += tl.load(bias_ptr + cols).to(tl.float32)[None, :]
        out_ptrs = out_ptr + pid_k * stride_os + offs_m[:, None].to(tl.int64) * stride_om + offs_n[None, :]
        mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
        tl.store(out_ptrs, y.to(out_ptr.dtype.element_ty), mask=mask)


SMALL_M_TILE = TileConfig(16, 64, 256, split_k=1, num_warps=4, num_stages=5)  # 2 <= M <= 16, layers > 64 Mi
NARROW_MAX_WEIGHTS = 64 * 2**20  # 2 <= M <= 16 up to this many weights: 32 outputs per program
LARGE_M_TMA_TILE = TileConfig(128, 256, 128, num_warps=8, num_stages=4, tma=True)  # M > 256 (192 KB of shared memory)
LARGE_M_TILE = TileConfig(256, 128, 128, num_warps=8, num_stages=3)  # M > 256 where TMA cannot run
TARGET_TILES = 132  # one program per SM of an H100 / H200
SMALL_LAYER_TILES = (  # largest first; the first giving TARGET_TILES output tiles wins, else the last
    TileConfig(128, 128, 128, num_warps=8, num_stages=3),
    TileConfig(128, 64, 128, num_warps=8, num_stages=3),
    TileConfig(64, 64, 128, num_warps=4, num_stages=3),
    TileConfig(32, 64, 128, num_warps=4, num_stages=3),
)


def small_layer_config(m: int, n: int) -> TileConfig:
    """Largest tile of ``SMALL_LAYER_TILES`` that still gives every SM an output tile (no split-K)."""
    for cfg in SMALL_LAYER_TILES:
        if triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n) >= TARGET_TILES:
            return cfg
    return SMALL_LAYER_TILES[-1]


def small_m_tile(n: int, k: int) -> TileConfig:
    """The 16-row tile at 2 <= M <= 16 (no split-K): 32 outputs per program on layers of at most
    ``NARROW_MAX_WEIGHTS`` weights, else 64. On an H100 the 32-wide tile (twice the programs) was 2-5%
    faster from 4096x4096 to 11008x4096 and level on 8192x8192 at M = 4, 8 and 16, and 1% slower
    on 8192x28672 (docs/kernels-notes.md, "W8A8 and DDS at small M: L2 prefetch")."""
    if n * k <= NARROW_MAX_WEIGHTS:
        return SMALL_M_TILE._replace(block_n=32)
    return SMALL_M_TILE


def pick_config(m: int, n: int, k: int) -> TileConfig:
    """Tiles by M bucket and layer size, from the shape alone (CUDA-graph safe: no autotuning).

    M = 1, any layer, and M <= 4 on small layers: the one-row kernel without a K split
    (``row_gemv_config``). Otherwise the pre-pass path: the fused one (``TileConfig(fused=True)``)
    measured slower at every shape and M tried. Small layers
    (N * K <= ``SMALL_LAYER``) at 16 < M take ``small_layer_config``, except M <= 64 with K >= 1024,
    where split-K measured faster (1536x384 M=64: 9.3 vs 11.3 us on an H200).
    """
    if n * k <= SMALL_LAYER and m > 16 and not (m <= 64 and k >= 1024):
        return small_layer_config(m, n)
    if m == 1 or (m <= ROW_GEMV_SMALL_MAX_M and n * k <= SMALL_LAYER):  # no quantize launch, no K split
        return row_gemv_config(n, k)
    if m <= 16:  # no split-K: slower at every shape measured, even summed in the kernel (docs/kernels-notes.md)
        return small_m_tile(n, k)
    if m <= 64:
        cfg = TileConfig(32, 64, 256, num_warps=4, num_stages=4)
    elif m <= 256:
        cfg = TileConfig(128, 128, 128, num_warps=8, num_stages=4)
    else:  # H100, M = 2048 / 8192: 1.2-1.5x faster than LARGE_M_TILE with pointer loads (docs/kernels-notes.md)
        cfg = LARGE_M_TMA_TILE
    return cfg._replace(split_k=split_k_for(m, n, k, cfg))


def row_gemv_config(n: int, k: int) -> TileConfig:
    """The one-row kernel without a K split: 8 outputs per program (N / 8 programs), K walked in
    1024-deep steps (512 on layers wider than ``GEMV_MAX_N``; one step of K rounded up to a power of
    two when K is shorter). H100, M = 1 (docs/kernels-notes.md, session 12), us before -> after:
    4096x4096 11.7 -> 10.0, 11008x4096 25.8 -> 22.9, 8192x8192 33.4 -> 30.9, 4096x22016 42.4 -> 39.4,
    8192x28672 101.6 -> 97.2, 1024x1024 5.6 -> 3.9, 384x1152 4.8 -> 3.3. The split one-row tiles
    (:func:`gemv_config`) and the tensor-core tile with its quantize launch were slower at every
    shape measured. Unsplit, the output has the two-launch path's bits."""
    deep = 512 if n > GEMV_MAX_N else 1024
    return TileConfig(1, 8, min(deep, max(32, triton.next_power_of_2(k))), num_warps=4, num_stages=3, gemv=True)


def gemv_config(m: int, n: int, k: int, block_n: int = 64, block_k: int = 128, num_warps: int = 4) -> TileConfig:
    """The one-row CUDA-core kernel (:mod:`kernels.w8a8_gemv`) with enough K splits to keep many
    programs resident."""
    cfg = TileConfig(1, block_n, block_k, num_warps=num_warps, num_stages=3, gemv=True)
    return cfg._replace(split_k=resident_split_k(m, n, k, cfg))


def _validate(x, w_q, w_scale, bias, x_scale) -> None:
    check_activation(x)
    check_tensor("w_q", w_q, (torch.int8,), ndim=2)
    k = x.shape[-1]
    if k == 0:
        raise ValueError("x: expected K >= 1 input features, got K = 0")
    n = w_q.shape[0]
    check_shape("w_q", w_q, (n, k))
    check_tensor("w_scale", w_scale, (torch.float32,), ndim=1)
    check_shape("w_scale", w_scale, (n,))
    check_bias(bias, n, x)
    check_same_device(x, w_q=w_q, w_scale=w_scale)
    check_x_scale(x, x_scale)


def check_x_scale(x, x_scale) -> None:
    """``x_scale`` is None or a static float32 scale on x's device: one element or one per token (M,)."""
    if x_scale is None:
        return
    check_tensor("x_scale", x_scale, (torch.float32,))
    check_same_device(x, x_scale=x_scale)
    m = x.numel() // x.shape[-1]
    if x_scale.numel() != 1 and tuple(x_scale.shape) != (m,):
        raise ValueError(f"x_scale: expected a scalar or shape ({m},) (one per token), got {tuple(x_scale.shape)}")


ONE_PASS_MAX_K = 16384  # the longest row one program can hold in registers
ONE_PASS_DEFAULT_K = 4096  # rows up to this long are read once by default (H100: 4096x4096 M = 8192 quantize
# pass 47.8 -> 35.7 us; at K = 11008, padded to 16384, one pass was slower: 40.2 -> 56.1 us at M = 2048)


def quantize_rows(x2: torch.Tensor, x_scale: torch.Tensor | None = None, one_pass: bool | None = None):
    """Triton per-token quantization of ``x2`` (M, K): ``(xq int8 (M, K), s_x fp32 (M,))``.

    ``one_pass`` (default: K <= ``ONE_PASS_DEFAULT_K``; never above ``ONE_PASS_MAX_K``): one program
    holds its whole row and reads x once; otherwise it reads the row twice in 2048-wide blocks (absmax
    pass, quantize pass). Same integers."""
    m, k = x2.shape
    xq = torch.empty((m, k), dtype=torch.int8, device=x2.device)
    s_x = torch.empty((m,), dtype=torch.float32, device=x2.device)
    if m == 0:
        return xq, s_x
    static = x_scale.reshape(-1).contiguous() if x_scale is not None else s_x
    one_pass = (k <= ONE_PASS_DEFAULT_K if one_pass is None else one_pass) and k <= ONE_PASS_MAX_K
    block_k = triton.next_power_of_2(k) if one_pass else min(triton.next_power_of_2(k), 2048)
    use_pdl = pdl_enabled(x2.device, pair=True)
    _quantize_rows_kernel[(m,)](
        x2, xq, s_x, static, k, x2.stride(0), x2.stride(1),
        STATIC=x_scale is not None, STATIC_PER_ROW=x_scale is not None and x_scale.numel() > 1,
        BLOCK_K=block_k, ONE_PASS=one_pass, USE_PDL=use_pdl,
        num_warps=4 if block_k <= 1024 else (8 if block_k <= 4096 else 16), **launch_options(use_pdl),
    )
    return xq, s_x


def launch(x2, w_q, w_scale, bias=None, x_scale=None, config: TileConfig | None = None) -> torch.Tensor:
    """Run the kernels on validated 2-D ``x2`` (M, K); returns (M, N) in x2's dtype.

    ``config.fused``: one launch (:mod:`kernels.w8a8_fused`); else the quantize pre-pass then the GEMM.
    A split GEMM sums its partials in the kernel (16-row tiles) or in a second launch, as the fused path.
    """
    m, k = x2.shape
    n = w_q.shape[0]
    y = torch.empty((m, n), dtype=x2.dtype, device=x2.device)
    if m == 0:
        return y
    cfg = config or pick_config(m, n, k)
    w_scale = w_scale.contiguous()
    bias = bias.contiguous() if bias is not None else None
    if cfg.fused:
        return launch_fused(x2, w_q, w_scale, bias, x_scale, cfg, y)
    if cfg.gemv:
        return launch_gemv(x2, w_q, w_scale, bias, x_scale, cfg, y)
    xq, s_x = quantize_rows(x2, x_scale)
    return launch_gemm(xq, s_x, w_q, w_scale, bias, cfg, y)


def launch_gemm(xq, s_x, w_q, w_scale, bias, cfg: TileConfig, y) -> torch.Tensor:
    """The GEMM of the pre-pass path on quantized ``xq`` (M, K) int8 and ``s_x`` (M,) into ``y`` (M, N)."""
    m, k = xq.shape
    n = w_q.shape[0]
    if cfg.tma:
        if cfg.split_k == 1 and tma_ready(xq, w_q):
            return launch_tma(xq, s_x, w_q, w_scale, bias, cfg, y)
        cfg = LARGE_M_TILE._replace(split_k=split_k_for(m, n, k, LARGE_M_TILE))  # the pointer kernel's tiles
    use_pdl = pdl_enabled(xq.device, pair=True)
    grid, in_kernel, out, counters = tiled_split_launch(y, m, n, cfg.block_m, cfg.block_n, cfg.split_k)
    _w8a8_matmul_kernel[grid](
        xq, w_q, s_x, w_scale, bias if bias is not None else w_scale, out, y, counters,
        m, n, k,
        xq.stride(0), xq.stride(1), w_q.stride(0), w_q.stride(1),
        m * n if cfg.split_k > 1 else 0, out.stride(-2), y.stride(0),
        cfg.split_k, ADD_BIAS=bias is not None and (cfg.split_k == 1 or in_kernel),
        EVEN_K=k % (cfg.block_k * cfg.split_k) == 0, REDUCE_SPLIT=cfg.split_k if in_kernel else 1,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
        GROUP_M=cfg.group_m, USE_PDL=use_pdl, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        **launch_options(use_pdl),
    )
    if cfg.split_k > 1 and not in_kernel:
        splitk_reduce(out, bias, y)
    return y


@torch.library.custom_op("compress_kernels::w8a8_matmul", mutates_args=())
def _w8a8_op(
    x: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor, bias: torch.Tensor | None, x_scale: torch.Tensor | None
) -> torch.Tensor:
    _validate(x, w_q, w_scale, bias, x_scale)
    k = x.shape[-1]
    y2 = launch(x.reshape(-1, k), w_q, w_scale, bias, x_scale)
    return y2.reshape(*x.shape[:-1], w_q.shape[0])


@_w8a8_op.register_fake
def _w8a8_fake(x, w_q, w_scale, bias, x_scale):
    _validate(x, w_q, w_scale, bias, x_scale)
    return x.new_empty((*x.shape[:-1], w_q.shape[0]))


def check_quantized(xq, s_x, out_dtype) -> None:
    """``xq`` (M, K) int8 (CUDA, or CPU when interpreting), ``s_x`` (M,) float32 on its device."""
    check_tensor("xq", xq, (torch.int8,), ndim=2)
    if xq.device.type != "cuda" and not interpreting():
        raise ValueError(f"xq: expected a CUDA tensor (or TRITON_INTERPRET=1 for CPU tests), got device {xq.device}")
    if xq.shape[1] == 0:
        raise ValueError("xq: expected K >= 1 input features, got K = 0")
    check_tensor("s_x", s_x, (torch.float32,), ndim=1)
    check_shape("s_x", s_x, (xq.shape[0],))
    check_same_device(xq, s_x=s_x)
    if out_dtype not in ACTIVATION_DTYPES:
        raise TypeError(f"out_dtype: expected torch.float16 or torch.bfloat16, got {out_dtype}")


def quantized_config(m: int, n: int, k: int) -> TileConfig:
    """``pick_config``'s tiles for a GEMM whose input is already quantized: the pre-pass path's
    (the one-row and fused kernels quantize x themselves, so M = 1 takes the 16-row tile)."""
    cfg = pick_config(m, n, k)
    return small_m_tile(n, k) if cfg.gemv or cfg.fused else cfg


def w8a8_matmul_quantized(xq, s_x, w_q, w_scale, bias=None, out_dtype=torch.float16) -> torch.Tensor:
    """:func:`w8a8_matmul` from an input already quantized per token (e.g. by ``kernels.norm_quant``):
    ``xq`` (M, K) int8 and ``s_x`` (M,) float32 -> (M, N) in ``out_dtype`` (fp16 / bf16)."""
    check_quantized(xq, s_x, out_dtype)
    m, k = xq.shape
    check_tensor("w_q", w_q, (torch.int8,), ndim=2)
    n = w_q.shape[0]
    check_shape("w_q", w_q, (n, k))
    check_tensor("w_scale", w_scale, (torch.float32,), ndim=1)
    check_shape("w_scale", w_scale, (n,))
    if bias is not None:
        check_tensor("bias", bias, (out_dtype, torch.float32), ndim=1)
        check_shape("bias", bias, (n,))
    check_same_device(xq, w_q=w_q, w_scale=w_scale, bias=bias)
    y = torch.empty((m, n), dtype=out_dtype, device=xq.device)
    if m == 0:
        return y
    bias = bias.contiguous() if bias is not None else None
    return launch_gemm(xq.contiguous(), s_x.contiguous(), w_q, w_scale.contiguous(), bias, quantized_config(m, n, k), y)


def w8a8_matmul(x, w_q, w_scale, bias=None, x_scale=None) -> torch.Tensor:
    """``y = dequant(quant(x) @ w_q.T) (+ bias)``: x (..., K) fp16/bf16 -> (..., N) in x's dtype.

    ``x_scale``: None for dynamic per-token scales, else a static fp32 scale (a Python float, a
    one-element tensor or one per token, shape (M,)).
    """
    if isinstance(x_scale, (int, float)) and isinstance(x, torch.Tensor):
        x_scale = torch.tensor(float(x_scale), dtype=torch.float32, device=x.device)
    _validate(x, w_q, w_scale, bias, x_scale)
    return torch.ops.compress_kernels.w8a8_matmul(x, w_q, w_scale, bias, x_scale)
