"""Second pass of the split-K matmuls: sum fp32 partial products, add the bias, cast to the output dtype.

At small M a matmul has too few output tiles to keep every SM streaming weights, so the W8A8 and
W4A16 tile kernels can cut K into ``SPLIT_K`` slices (:func:`split_k_for` sizes the split). Each slice writes its
fp32 partial result ``partial[s, m, n]`` (already dequantized, so the slices add linearly) into a
workspace of shape (SPLIT_K, M, N) (:func:`split_workspace`: one scratch buffer per device and stream,
reused by every call on that stream); this kernel then computes

    y[m, n] = sum_s partial[s, m, n] (+ bias[n])     in fp32, cast to y's dtype.

Two passes instead of atomic adds keep the result deterministic (same bits on every run), which the
CUDA-graph replay tests rely on. The workspace is small at small M (SPLIT_K * M * N * 4 bytes).

A kernel can also do this pass itself ("the last split reduces", one launch instead of two): each
program stores its partial, then takes a ticket from a per-tile counter (an atomic add after a CTA
barrier, release/acquire at GPU scope); the program that draws the last ticket sums the SPLIT_K
partials in split order (the same order and arithmetic as the pass above, so the same bits), adds the
bias, stores the output and resets the counter to zero. :func:`tile_counters` hands out those
counters: one zeroed int32 buffer per device and stream, grown on demand, that every kernel leaves
zeroed again. A launch captured into a CUDA graph gets counters of its own, so a replay never shares
them with eager calls or with another graph: a slice of a pool zeroed before capture (graphs keep
their slices for good; pools are never freed), or, when the pool is short, a buffer zeroed inside the
graph (a memset node per launch, ~1-2 us each at decode). :func:`last_split_buffers` gives a launcher
both the partials workspace and the counters.

The counters and pools outlive every call, so they must not come from a CUDA-graph memory pool.
``torch.compile``'s CUDA-graph trees (mode ``reduce-overhead``) run their warm-up calls with every
allocation of the calling thread routed to the graph's pool, and refuse a pool tensor that stays alive
afterwards ("tensor(s) in the cudagraph pool not tracked as outputs"). So the long-lived buffers are
allocated and zeroed by a short-lived helper thread (:func:`_outside_graph_pools`), whose allocations go
to the ordinary caching allocator; it synchronizes the device before handing the buffer back. That
happens once per device and stream (and per growth), never in a steady state.
"""
from __future__ import annotations

import threading

import torch
import triton
import triton.language as tl

from compress_kernels.common.launch import launch


@triton.jit
def _splitk_reduce_kernel(
    partial_ptr, bias_ptr, y_ptr,  # (SPLIT_K, M, N) fp32, (N,), (M, N) with row stride stride_ym
    MN, N, stride_ym, SPLIT_K,
    HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr,
):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < MN
    total = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in range(SPLIT_K):
        total += tl.load(partial_ptr + s * MN + offs, mask=mask, other=0.0)
    n = offs % N
    if HAS_BIAS:
        total += tl.load(bias_ptr + n, mask=mask, other=0.0).to(tl.float32)
    m = offs // N
    tl.store(y_ptr + m * stride_ym + n, total.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def last_split_reduces(acc, ws_ptr, cnt_ptr, out_ptr, bias_ptr, offs_m, offs_n, M, N, stride_om, tile_id, pid_k,
                       SPLIT_K: tl.constexpr, HAS_BIAS: tl.constexpr):
    """In-kernel second pass for one (BM, BN) output tile: store this split's fp32 partial ``acc`` into
    ``ws`` (SPLIT_K, M, N); the program drawing the last ticket of counter ``tile_id`` sums the partials
    in split order, adds the bias, stores the output and zeroes the counter.

    The sum is unrolled (``SPLIT_K`` is a compile-time constant) so the SPLIT_K loads, which do not
    depend on each other, are in flight together: one L2 round trip, not SPLIT_K in a row."""
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    ws = ws_ptr + offs_m[:, None].to(tl.int64) * N + offs_n[None, :]
    tl.store(ws + pid_k * M * N, acc, mask=mask)
    tl.debug_barrier()  # every thread's partial is written before the ticket is taken
    ticket = tl.atomic_add(cnt_ptr + tile_id, 1, sem="acq_rel", scope="gpu")
    if ticket == SPLIT_K - 1:
        total = tl.zeros(acc.shape, dtype=tl.float32)
        for s in tl.static_range(SPLIT_K):  # split order: the same sum as splitk_reduce below
            total += tl.load(ws + s * M * N, mask=mask, other=0.0, cache_modifier=".cg")
        if HAS_BIAS:
            total += tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
        out = out_ptr + offs_m[:, None].to(tl.int64) * stride_om + offs_n[None, :]
        tl.store(out, total.to(out_ptr.dtype.element_ty), mask=mask)
        tl.atomic_xchg(cnt_ptr + tile_id, 0)  # leave the counter zeroed for the next launch


@triton.jit
def write_tile(acc, out_ptr, cnt_ptr, y_ptr, bias_ptr, cols, offs_m, offs_n, M, N, stride_os, stride_om, stride_ym,
               tile_id, pid_k, REDUCE_SPLIT: tl.constexpr, ADD_BIAS: tl.constexpr):
    """The epilogue of a split-K GEMM's (BM, BN) tile ``acc`` (fp32): with REDUCE_SPLIT > 1, through
    :func:`last_split_reduces` (``out`` is the partials); otherwise store it (+ the bias at ``cols``) into
    slice ``pid_k`` of ``out`` (the output itself when unsplit, else the partials of a second launch)."""
    if REDUCE_SPLIT > 1:
        last_split_reduces(acc, out_ptr, cnt_ptr, y_ptr, bias_ptr, offs_m, offs_n, M, N, stride_ym,
                           tile_id, pid_k, REDUCE_SPLIT, ADD_BIAS)
    else:
        if ADD_BIAS:  # with a separate split-K reduce pass the bias is added there (ADD_BIAS is False)
            acc += tl.load(bias_ptr + cols).to(tl.float32)[None, :]
        out_ptrs = out_ptr + pid_k * stride_os + offs_m[:, None].to(tl.int64) * stride_om + offs_n[None, :]
        mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
        tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=mask)


def split_k_for(m: int, n: int, k: int, cfg, sms: int) -> int:
    """Smallest power-of-two K split giving a program per SM (``sms``), 1 if none needed, at most 16
    and never more splits than K tiles. ``cfg`` is any tile config with ``block_m``, ``block_n`` and
    ``block_k``."""
    tiles = triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n)
    k_tiles = triton.cdiv(k, cfg.block_k)
    split = 1
    while tiles * split < sms and split * 2 <= k_tiles and split < 16:
        split *= 2
    return split


def splitk_reduce(partial: torch.Tensor, bias: torch.Tensor | None, y: torch.Tensor) -> None:
    """Write ``partial.sum(0) (+ bias)`` into ``y`` (M, N); ``partial`` is contiguous (SPLIT_K, M, N) fp32."""
    split_k, m, n = partial.shape
    block = 1024
    grid = (triton.cdiv(m * n, block),)
    launch(_splitk_reduce_kernel, grid,
        partial, bias if bias is not None else partial, y,
        m * n, n, y.stride(0), split_k,
        HAS_BIAS=bias is not None, BLOCK=block, num_warps=4,
    )


def _outside_graph_pools(count: int, device: torch.device, dtype: torch.dtype = torch.int32) -> torch.Tensor:
    """A zeroed (count,) tensor on ``device`` allocated by another thread, so that no CUDA-graph pool the
    calling thread allocates into (torch.compile's warm-up) holds it; the device is synchronized."""
    if device.type != "cuda":
        return torch.zeros(count, dtype=dtype, device=device)
    made: list = []

    def allocate():
        try:
            with torch.cuda.device(device):
                made.append(torch.zeros(count, dtype=dtype, device=device))
                torch.cuda.synchronize(device)
        except BaseException as error:  # handed to the caller
            made.append(error)

    worker = threading.Thread(target=allocate, name="compress-kernels-counters")
    worker.start()
    worker.join()
    if isinstance(made[0], BaseException):
        raise made[0]
    return made[0]


_COUNTERS: dict[tuple[int, int], torch.Tensor] = {}
CAPTURE_POOL = 2**20  # counters per pool of capture slices (4 MiB): ~30 decode-step graphs of a 7B model
_CAPTURE_POOLS: dict[int, list] = {}  # device index -> [pool, next free offset]
_RETIRED_POOLS: list[torch.Tensor] = []  # exhausted pools: graphs may still point into them


def _refill_capture_pool(device: torch.device) -> None:
    """Outside capture: make sure a zeroed pool with room for more captures exists on ``device``."""
    entry = _CAPTURE_POOLS.get(device.index or 0)
    if entry is not None and entry[1] <= CAPTURE_POOL // 2:
        return
    if entry is not None:
        _RETIRED_POOLS.append(entry[0])
    _CAPTURE_POOLS[device.index or 0] = [_outside_graph_pools(CAPTURE_POOL, device), 0]


def _captured_counters(device: torch.device, count: int) -> torch.Tensor:
    """Counters for a launch being captured: a fresh slice of the pre-zeroed pool, else zeroed in the graph."""
    entry = _CAPTURE_POOLS.get(device.index or 0)
    if entry is None or entry[1] + count > CAPTURE_POOL:
        return torch.zeros(count, dtype=torch.int32, device=device)
    start = entry[1]
    entry[1] = start + -(-count // 32) * 32  # 128-byte aligned slices
    return entry[0][start:start + count]


def tile_counters(device: torch.device, count: int) -> torch.Tensor:
    """A zeroed int32 tensor of at least ``count`` ticket counters, for kernels that reset what they use.

    Eager calls share one buffer per device and stream (calls on one stream never overlap). A call
    being captured into a CUDA graph gets counters no other launch uses (see the module docstring)."""
    if device.type == "cuda":
        if torch.cuda.is_current_stream_capturing():
            return _captured_counters(device, count)
        _refill_capture_pool(device)
    key = (device.index or 0, torch.cuda.current_stream(device).cuda_stream) if device.type == "cuda" else (-1, 0)
    cached = _COUNTERS.get(key)
    if cached is None or cached.numel() < count:
        cached = _COUNTERS[key] = _outside_graph_pools(max(count, 1024), device)
    return cached


_WORKSPACES: dict[tuple[int, int], torch.Tensor] = {}  # (device, stream) -> fp32 scratch for split-K partials
_RETIRED_WORKSPACES: list[torch.Tensor] = []  # outgrown scratch: launches still in flight (or plans) may use it


def split_workspace(device: torch.device, split_k: int, m: int, n: int) -> torch.Tensor:
    """fp32 (split_k, m, n) partials. On CUDA a view of one scratch buffer per device and stream, grown by
    doubling (calls on one stream run in order, so they can share it, and a launch plan that keeps it
    keeps no workspace of its own); while a CUDA graph is captured, a tensor of the graph's own pool."""
    count = split_k * m * n
    if device.type != "cuda" or torch.cuda.is_current_stream_capturing():
        return torch.empty((split_k, m, n), dtype=torch.float32, device=device)
    key = (device.index or 0, torch.cuda.current_stream(device).cuda_stream)
    scratch = _WORKSPACES.get(key)
    if scratch is None or scratch.numel() < count:
        if scratch is not None:
            _RETIRED_WORKSPACES.append(scratch)
        size = max(count, 2 * scratch.numel() if scratch is not None else 0)
        scratch = _WORKSPACES[key] = _outside_graph_pools(size, device, torch.float32)
    return scratch[:count].view(split_k, m, n)


IN_KERNEL_MAX_ROWS = 16  # tensor-core tiles of at most this many rows reduce their K splits in the kernel


def reduces_in_kernel(split_k: int, block_m: int) -> bool:
    """Whether a split tensor-core GEMM sums its partials itself (the last split of a tile) rather than
    in a second launch. On an H100 the in-kernel sum was 1-4% faster for 16-row tiles (W4A16, M = 16)
    but up to 25% slower for 64-row ones (M = 64: one program then reads SPLIT_K 64-row partials alone,
    where the second launch spreads them over the GPU)."""
    return split_k > 1 and block_m <= IN_KERNEL_MAX_ROWS


def split_buffers(out: torch.Tensor, split_k: int, m: int, n: int, tiles: int, in_kernel: bool):
    """``(partials, counters)`` for a split-K GEMM writing ``out`` (M, N): with ``in_kernel`` those of
    :func:`last_split_buffers`; else fp32 partials for :func:`splitk_reduce` (counters unused), or
    ``(out, out)`` when not split."""
    if in_kernel or split_k == 1:
        return last_split_buffers(out, split_k, m, n, tiles)
    return split_workspace(out.device, split_k, m, n), out


def tiled_split_launch(out: torch.Tensor, m: int, n: int, block_m: int, block_n: int, split_k: int):
    """``(grid, in_kernel, partials, counters)`` of a tiled split-K GEMM writing ``out`` (M, N): the grid
    (M tiles * N tiles, split_k), whether the splits are summed in the kernel (:func:`reduces_in_kernel`;
    else by :func:`splitk_reduce`) and the buffers of :func:`split_buffers`."""
    grid = (triton.cdiv(m, block_m) * triton.cdiv(n, block_n), split_k)
    in_kernel = reduces_in_kernel(split_k, block_m)
    partials, counters = split_buffers(out, split_k, m, n, grid[0], in_kernel)
    return grid, in_kernel, partials, counters


def last_split_buffers(out: torch.Tensor, split_k: int, m: int, n: int, tiles: int):
    """``(workspace, counters)`` for a one-launch split-K kernel writing ``out`` (M, N): fp32 partials
    (SPLIT_K, M, N) and ``tiles`` zeroed ticket counters; ``(out, out)`` (unused) when not split."""
    if split_k == 1:
        return out, out
    return split_workspace(out.device, split_k, m, n), tile_counters(out.device, tiles)
