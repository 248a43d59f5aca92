"""DDS: dense activations x block-sparse weights, ``y = x @ W.T (+ bias)`` in Triton.

Layout. ``W`` (N, K) is stored in BSR form with 32x32 blocks, exactly as ``torch.sparse_bsr``
(``W.to_sparse_bsr((32, 32))``): ``crow_indices`` (N/32 + 1,) over block rows, ``col_indices``
(nnz,) over block columns, ``values`` (nnz, 32, 32) with ``values[b, i, j] = W[32 r + i, 32 c + j]``
for the b-th stored block, in block row ``r`` and block column ``c = col_indices[b]``. Block row
``r`` owns the stored blocks ``crow[r] <= b < crow[r + 1]``; an empty block row gives zeros (or the
bias). Absent blocks are never read.

Math. For the 32 outputs of block row ``r``::

    y[m, 32 r + i] = sum_{b in row r} sum_j x[m, 32 col[b] + j] * values[b, i, j]   (+ bias)

accumulated in fp32 and stored in ``x``'s dtype.

Two kernels, picked by the launcher from the shape (see ``choose_config``); from M = 2048 on layers
keeping >= 40% of their blocks, neither: the weight is written out dense for cuBLAS
(:mod:`kernels.bsr_densify`).

* ``_bsr_gemv_kernel`` (M = 1, and M <= 4 while the stored blocks stay in L2: :func:`gemv_serves`;
  memory bound): one program per (output row m, BLOCK_N outputs of
  one block row), with BLOCK_N in {8, 16, 32}. Splitting a block row's 32 outputs over several
  programs keeps every SM streaming weights even when N/32 is small, without atomics (the sub-rows
  ``i`` of a block are contiguous in ``values``). Each step gathers GROUP stored blocks: a
  (BLOCK_N, 32 GROUP) weight tile and the matching 32 GROUP entries of ``x``, multiplied on the
  CUDA cores and reduced along K. With ``BsrConfig.prefetch`` > 0 (the one-row pick on layers of
  at most 128 Mi weights), the first program of each block row asks for the first ``prefetch`` bytes
  of the row's stored blocks (contiguous in ``values``) to be brought into L2 before its loop
  (:mod:`kernels._prefetch`); the gemm kernel takes the same option for its share of a block row
  (measured, not picked).
* ``_bsr_gemm_kernel`` (the other calls, tensor cores): one program per (BLOCK_M rows of x, BLOCK_N
  outputs of one block row). Each step gathers GROUP stored blocks into one K-tile of width
  32 GROUP: ``x[m_tile, gathered columns]`` (BLOCK_M, 32 GROUP) times the transposed blocks
  (32 GROUP, BLOCK_N), one ``tl.dot`` with fp32 accumulation. Programs with the same M tile are
  launched together (the block-row index varies fastest), so that x tile stays in L2 while every
  block row reads it. ``BsrConfig.split`` > 1 shares a block row's stored blocks among that many
  programs (whole GROUP steps each), so a layer with few block rows still fills the GPU; the last
  program of each output tile to finish sums the fp32 partials in share order and adds the bias
  (:mod:`kernels._splitk`). ``choose_config`` uses 4 shares at M <= 16 when block rows are long
  (>= 24 stored blocks on average; 8192x8192 at 50%, M = 16, 40.4 -> 28.5 us on an H200), and at
  16 < M <= 64 when there are at most 128 such block rows.

The tile table in ``choose_config`` was tuned on an H100 and an H200 (``scripts/tune_bsr.py``). On the H100
(docs/benchmarks/kernels.md): small M streams weights at 2.1-2.4 TB/s on large layers; at large M
the gathered x tiles (only 32 outputs wide) make the kernel L2-bandwidth bound at about 220 TFLOP/s
of executed work, whatever the sparsity.

Entry points: ``bsr_matmul(x, weight, bias)`` for a ``torch.sparse_bsr`` weight and
``bsr_matmul_parts(x, crow, col, values, out_features, bias)`` for the parts the inference module
keeps as buffers. Both validate and call the custom op ``compress_kernels::bsr_matmul`` (with a
fake implementation), so callers compile under ``torch.compile`` and capture in CUDA graphs: the
launch depends only on shapes, never on the index values, and does no host synchronisation (so the
index *values* are not checked: K comes from ``x`` and ``col_indices`` must be < K/32). Keep the
parts as plain tensors (buffers, e.g. ``.clone()`` of ``W.to_sparse_bsr(...).values()``): tensors
returned straight by a sparse tensor's ``.values()`` trip Dynamo (IndexError in
``torch/_dynamo/pgo.py``, seen with torch 2.13).

Interpreter note: Triton's CPU interpreter multiplies the raw bits of bf16 ``tl.dot`` operands
(bf16 is stored as uint16 there), so under ``TRITON_INTERPRET=1`` bf16 tiles are upcast to fp32
before the dot (``DOT_IN_FP32``); on the GPU the dot runs in bf16.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from compress_kernels._checks import check_activation, check_bias, check_same_device, check_tensor, interpreting
from compress_kernels._pdl import launch_options, let_dependents_launch, pdl_enabled, wait_for_inputs
from compress_kernels._prefetch import prefetch_allowed, prefetch_range
from compress_kernels._splitk import last_split_reduces, tile_counters
from compress_kernels.bsr_densify import bsr_to_dense, densifies
from compress_kernels.reference import BSR_BLOCK

INDEX_DTYPES = (torch.int32, torch.int64)
_MAX_INT32 = 2**31 - 1


@dataclass(frozen=True)
class BsrConfig:
    """Launch parameters: which kernel, tile sizes and Triton's warps / pipelining depth."""

    kernel: str  # "gemv" or "gemm"
    block_m: int  # rows of x per program (1 for gemv)
    block_n: int  # outputs of one block row per program: 8, 16 or 32
    group: int  # stored blocks gathered per step (K-tile width 32 * group)
    num_warps: int
    num_stages: int
    split: int = 1  # gemm: programs sharing one block row's stored blocks (the last one to finish reduces)
    prefetch: int = 0  # bytes of the program's stored blocks prefetched into L2 at its start (kernels._prefetch)


SPLIT_MIN_BLOCKS_PER_ROW = 24  # M <= 64: share longer block rows among programs (4 shares)
SPLIT_MAX_BLOCK_ROWS_M64 = 128  # 16 < M <= 64: ... when there are at most this many block rows
FEW_PROGRAMS = 2 * 132  # about two programs per SM of an H100 / H200
GEMV_TWO_ROWS_MAX_BYTES = 16 * 2**20  # M = 2: the one-row kernel while the stored blocks take at most this
GEMV_FOUR_ROWS_MAX_BYTES = 4 * 2**20  # M = 3-4: ... at most this (gemv_serves)
GEMV_PREFETCH_BYTES = 8192  # one-row kernel: bytes of each block row's stored blocks prefetched into L2
PREFETCH_MAX_WEIGHTS = 128 * 2**20  # ... on layers of at most this many weights (N * K)
SMALL_LAYER = 2**20  # N * K at most this (1024x1024, BERT-small / MiniLM layers): the small-layer rules
SMALL_SPLIT_MIN_BLOCKS_PER_ROW = 20  # small layers, 16 < M <= 64: share block rows this long (4 shares)


def gemv_serves(m: int, stored_bytes: int) -> bool:
    """Whether the one-row kernel serves ``m`` rows of a layer whose stored blocks take ``stored_bytes``.

    Each row's programs read the stored blocks again, from L2 only while they fit there with room to
    spare. On an H100 (docs/kernels-notes.md, session 12) the one-row kernel was the faster at M = 2
    up to 16 MiB of blocks and at M = 3-4 up to 4 MiB; beyond, the 16-row tiles were, by up to 3.3x
    (8192x28672 at 50%, M = 4: 327.7 vs 99.5 us)."""
    if m <= 1:
        return True
    limit = GEMV_TWO_ROWS_MAX_BYTES if m <= 2 else (GEMV_FOUR_ROWS_MAX_BYTES if m <= 4 else -1)
    return stored_bytes <= limit


def choose_config(m: int, n: int, k: int, nnz: int | None = None) -> BsrConfig:
    """Pick the kernel and tiles from the shapes alone (so the choice is CUDA-graph safe).

    ``nnz`` (stored blocks, the length of ``col_indices``; None = dense) gives the mean blocks per
    block row, which sets the length of each program's serial loop. The table was tuned with
    ``scripts/tune_bsr.py`` on an H100 (M = 1 and M > 256) and an H200 (16 <= M <= 256: 4096x4096,
    4096x11008 and 8192x8192 at 50% and 90% block sparsity); layers of at most ``SMALL_LAYER``
    weights have their own rules (:func:`small_layer_config`); see docs/kernels-notes.md.
    """
    block_rows = n // BSR_BLOCK
    stored = nnz if nnz is not None else block_rows * (k // BSR_BLOCK)
    blocks_per_row = stored / block_rows
    if gemv_serves(m, stored * BSR_BLOCK * BSR_BLOCK * 2):  # 16-bit values
        # Memory bound: 8 outputs per program keeps >= 4 programs per SM streaming; 16 blocks per step
        # cover a whole 90%-sparse row in one step (fewer dependent index -> data round trips). Up to
        # PREFETCH_MAX_WEIGHTS, the first 8 KB of each block row are prefetched into L2 (H100, M = 1:
        # 1-5% faster from 4096x4096 to 8192x8192 and in the decode benchmark, whose largest layer is
        # 4096x22016; 3% slower on 8192x28672 at 50%).
        prefetch = GEMV_PREFETCH_BYTES if n * k <= PREFETCH_MAX_WEIGHTS else 0
        return BsrConfig("gemv", 1, 8, 16, 4, 3, prefetch=prefetch)
    if m <= 16:
        # Long serial loops over few block rows: 4 programs per output tile. With more block rows
        # than FEW_PROGRAMS the SMs are busy anyway and the split only adds its reduce (H100, 50%:
        # 4096x11008 27.7 -> 25.1 us and 8192x28672 109.6 -> 103.0 us unsplit; 8192x8192, 256 rows,
        # keeps the split: 35.0 vs 36.8 us). Rows of 24-48 blocks split too (H100, 90%, M = 16:
        # 11008x4096 12.1 -> 9.6 us, 8192x8192 11.9 -> 11.6).
        if blocks_per_row >= SPLIT_MIN_BLOCKS_PER_ROW and block_rows <= FEW_PROGRAMS:
            return BsrConfig("gemm", 16, 32, 4, 4, 3, split=4)
        return BsrConfig("gemm", 16, 32, 8, 4, 3)
    if n * k <= SMALL_LAYER and (m <= 64 or m > 256):
        return small_layer_config(m, block_rows, blocks_per_row)
    if m <= 64:
        block_m = 64 if m > 32 else 32
        if blocks_per_row >= SPLIT_MIN_BLOCKS_PER_ROW and block_rows <= SPLIT_MAX_BLOCK_ROWS_M64:
            # Few long block rows: 4 shares (H100, M = 64: 4096x4096 at 50% 19.8 -> 16.1 us,
            # 11008x4096 at 50% 42.6 -> 30.7, at 90% 14.1 -> 12.7; 256 block rows gain nothing).
            return BsrConfig("gemm", block_m, 32, 4, 4, 3, split=4)
        programs = block_rows * triton.cdiv(m, block_m)
        # Few programs: gather more blocks per step; many: smaller steps keep more programs resident.
        return BsrConfig("gemm", block_m, 32, 8 if programs <= FEW_PROGRAMS else 4, 4, 4)
    if m <= 256:
        if block_rows * triton.cdiv(m, 128) >= FEW_PROGRAMS:
            return BsrConfig("gemm", 128, 32, 2, 4, 3)
        return BsrConfig("gemm", 64, 32, 4, 4, 3)
    return BsrConfig("gemm", 256, 32, 2, 4, 3)


def small_layer_config(m: int, block_rows: int, blocks_per_row: float) -> BsrConfig:
    """Layers of at most ``SMALL_LAYER`` weights (few block rows) at 16 < M <= 64 or M > 256.

    Such a layer has too few block rows to give every SM a program with the large-layer tiles, so the
    tiles shrink until there are enough programs. Tuned on an H100 with L2-resident weights, as a
    MiniLM-size model runs (``scripts/tune_bsr.py --rotate-mb 1``, 50% blocks; docs/kernels-notes.md,
    "DDS on small layers"). At 16 < M <= 64: 16-row tiles (384x1152 at M = 64: 7.1 -> 6.6 us),
    and block rows of >= ``SMALL_SPLIT_MIN_BLOCKS_PER_ROW`` blocks shared by 4 programs
    (1536x384: 10.3 -> 8.3 us). At M > 256: the largest of 256, 128 and 64 rows giving
    ``FEW_PROGRAMS`` programs, else 64 (1536x384 at M = 512: 23.1 -> 13.8 us).
    """
    if m <= 64:
        if blocks_per_row >= SMALL_SPLIT_MIN_BLOCKS_PER_ROW:
            return BsrConfig("gemm", 32, 32, 4, 4, 3, split=4)
        return BsrConfig("gemm", 16, 32, 8, 4, 3)
    for block_m in (256, 128):
        if block_rows * triton.cdiv(m, block_m) >= FEW_PROGRAMS:
            return BsrConfig("gemm", block_m, 32, 2, 4, 3)
    return BsrConfig("gemm", 64, 32, 4, 4, 3)


@triton.jit
def runs_of_block(offsets, BLOCK: tl.constexpr):
    """Tell the compiler that ``offsets`` are runs of BLOCK consecutive values, each starting at a
    multiple of BLOCK (true for ``32 * index + (arange % 32)``). Triton cannot see this through the
    gathered block indices, and without it the gathers become 2-byte loads instead of 16-byte ones."""
    return tl.max_contiguous(tl.multiple_of(offsets, BLOCK), BLOCK)


@triton.jit
def prefetch_blocks(val_ptr, start, end, BLOCK: tl.constexpr, PREFETCH_BYTES: tl.constexpr):
    """Ask for the first PREFETCH_BYTES of the stored blocks ``start <= b < end`` (contiguous in values)
    to be brought into L2 (kernels._prefetch)."""
    block_bytes = BLOCK * BLOCK * (val_ptr.dtype.element_ty.primitive_bitwidth // 8)
    prefetch_range(val_ptr + start * (BLOCK * BLOCK), (end - start) * block_bytes, PREFETCH_BYTES)


@triton.jit
def _bsr_gemv_kernel(
    x_ptr, crow_ptr, col_ptr, val_ptr, bias_ptr, y_ptr,  # x (M, K), crow, col, values (nnz,32,32), bias (N,), y (M, N)
    stride_xm, stride_ym,
    HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr, GROUP: tl.constexpr, BLOCK: tl.constexpr, USE_PDL: tl.constexpr,
    PREFETCH_BYTES: tl.constexpr,
):
    pid_n = tl.program_id(0)  # which BLOCK_N outputs
    row = tl.program_id(1).to(tl.int64)  # which row of x
    block_row = (pid_n * BLOCK_N) // BLOCK
    sub = (pid_n * BLOCK_N) % BLOCK + tl.arange(0, BLOCK_N)  # output rows inside the block, (BLOCK_N,)
    start = tl.load(crow_ptr + block_row).to(tl.int32)
    end = tl.load(crow_ptr + block_row + 1).to(tl.int32)
    if PREFETCH_BYTES > 0:  # the block row's stored blocks, asked for once (first sub-row, first x row)
        if (pid_n * BLOCK_N) % BLOCK == 0 and row == 0:
            prefetch_blocks(val_ptr, start, end, BLOCK, PREFETCH_BYTES)

    offs_k = tl.arange(0, GROUP * BLOCK)  # gathered K positions
    k_block = offs_k // BLOCK  # which of the GROUP blocks, (32 GROUP,)
    k_in = offs_k % BLOCK  # column inside that block
    x_row = x_ptr + row * stride_xm
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    wait_for_inputs(USE_PDL)  # with PDL: x may still be being written until here (crow is not)
    for p in range(start, end, GROUP):
        blk = p + k_block
        valid = blk < end
        col = tl.load(col_ptr + blk, mask=valid, other=0).to(tl.int32)
        x_k = runs_of_block(col * BLOCK + k_in, BLOCK)  # x columns of the gathered blocks
        w_k = runs_of_block(blk * (BLOCK * BLOCK) + k_in, BLOCK)  # first row of each gathered block
        xv = tl.load(x_row + x_k, mask=valid, other=0.0)  # (32 GROUP,)
        w = tl.load(val_ptr + w_k[None, :] + sub[:, None] * BLOCK, mask=valid[None, :], other=0.0)  # (BLOCK_N, 32 GROUP)
        acc += tl.sum(w.to(tl.float32) * xv.to(tl.float32)[None, :], axis=1)
    let_dependents_launch(USE_PDL)

    offs_n = block_row * BLOCK + sub
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_n).to(tl.float32)
    tl.store(y_ptr + row * stride_ym + offs_n, acc.to(y_ptr.dtype.element_ty))


@triton.jit
def _bsr_gemm_kernel(
    x_ptr, crow_ptr, col_ptr, val_ptr, bias_ptr, y_ptr,  # x (M, K), crow, col, values (nnz,32,32), bias (N,), y (M, N)
    ws_ptr, cnt_ptr,  # SPLIT > 1: fp32 partials (SPLIT, M, N), int32 ticket counters (one per output tile)
    M, N, stride_xm, stride_ym,
    SPLIT: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP: tl.constexpr,
    BLOCK: tl.constexpr, DOT_IN_FP32: tl.constexpr, USE_PDL: tl.constexpr, PREFETCH_BYTES: tl.constexpr,
):
    pid_n = tl.program_id(0)  # which BLOCK_N outputs (fastest: programs of one M tile run together)
    pid_m = tl.program_id(1)  # which BLOCK_M rows of x
    pid_s = tl.program_id(2)  # which share of the block row's stored blocks
    block_row = (pid_n * BLOCK_N) // BLOCK
    sub = (pid_n * BLOCK_N) % BLOCK + tl.arange(0, BLOCK_N)  # (BLOCK_N,)
    row_start = tl.load(crow_ptr + block_row).to(tl.int32)
    row_end = tl.load(crow_ptr + block_row + 1).to(tl.int32)
    if SPLIT > 1:  # a compile-time choice: the unsplit kernel carries none of this
        share = tl.cdiv(tl.cdiv(row_end - row_start, SPLIT), GROUP) * GROUP  # whole steps per share
        start = row_start + pid_s * share
        end = tl.minimum(row_end, start + share)
    else:
        start = row_start
        end = row_end
    if PREFETCH_BYTES > 0:  # this share's stored blocks, one contiguous range of values
        if pid_m == 0:
            prefetch_blocks(val_ptr, start, end, BLOCK, PREFETCH_BYTES)

    first_row = pid_m * BLOCK_M
    x_ptr += first_row.to(tl.int64) * stride_xm
    if SPLIT == 1:  # the output rows of this tile (with a split, last_split_reduces indexes them itself)
        y_ptr += first_row.to(tl.int64) * stride_ym
    offs_m = tl.arange(0, BLOCK_M)
    m_mask = offs_m < M - first_row  # (BLOCK_M,)
    offs_k = tl.arange(0, GROUP * BLOCK)
    k_block = offs_k // BLOCK
    k_in = offs_k % BLOCK

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    wait_for_inputs(USE_PDL)  # with PDL: x may still be being written until here (crow is not)
    for p in range(start, end, GROUP):
        blk = p + k_block  # (32 GROUP,)
        valid = blk < end
        col = tl.load(col_ptr + blk, mask=valid, other=0).to(tl.int32)
        x_k = runs_of_block(col * BLOCK + k_in, BLOCK)
        w_k = runs_of_block(blk * (BLOCK * BLOCK) + k_in, BLOCK)
        a_ptrs = x_ptr + offs_m[:, None] * stride_xm + x_k[None, :]
        a = tl.load(a_ptrs, mask=m_mask[:, None] & valid[None, :], other=0.0)  # (BLOCK_M, 32 GROUP)
        b_ptrs = val_ptr + w_k[:, None] + sub[None, :] * BLOCK
        b = tl.load(b_ptrs, mask=valid[:, None], other=0.0)  # (32 GROUP, BLOCK_N) = blocks transposed
        if DOT_IN_FP32:  # interpreter only: its tl.dot multiplies the raw bits of bf16 operands
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(a, b, acc)
    let_dependents_launch(USE_PDL)

    offs_n = block_row * BLOCK + sub
    if SPLIT > 1:  # the last share of this tile to finish sums the partials (kernels._splitk)
        last_split_reduces(acc, ws_ptr, cnt_ptr, y_ptr, bias_ptr, first_row + offs_m, offs_n, M, N, stride_ym,
                           pid_m * tl.num_programs(0) + pid_n, pid_s, SPLIT, HAS_BIAS)
    else:
        if HAS_BIAS:
            acc += tl.load(bias_ptr + offs_n).to(tl.float32)[None, :]
        y_ptrs = y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :]
        tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=m_mask[:, None])


def launch_bsr(x2, crow_indices, col_indices, values, bias, y, config: BsrConfig | None = None) -> None:
    """Run the kernel on validated operands: ``x2`` (M, K) with unit column stride, ``y`` (M, N)."""
    m, k = x2.shape
    n = y.shape[1]
    if config is None:
        config = choose_config(m, n, k, col_indices.shape[0])
    bias_arg = bias if bias is not None else y  # never read when HAS_BIAS is False
    use_pdl = pdl_enabled(x2.device)
    common = dict(HAS_BIAS=bias is not None, BLOCK_N=config.block_n, GROUP=config.group, BLOCK=BSR_BLOCK,
                  USE_PDL=use_pdl, PREFETCH_BYTES=config.prefetch if config.prefetch and prefetch_allowed(values) else 0,
                  num_warps=config.num_warps, num_stages=config.num_stages, **launch_options(use_pdl))
    if config.kernel == "gemv":
        grid = (n // config.block_n, m)
        _bsr_gemv_kernel[grid](x2, crow_indices, col_indices, values, bias_arg, y,
                               x2.stride(0), y.stride(0), **common)
    elif config.kernel == "gemm":
        grid = (n // config.block_n, triton.cdiv(m, config.block_m), config.split)
        if config.split > 1:
            workspace = torch.empty((config.split, m, n), dtype=torch.float32, device=y.device)
            counters = tile_counters(y.device, grid[0] * grid[1])
        else:
            workspace = counters = y  # unused
        _bsr_gemm_kernel[grid](x2, crow_indices, col_indices, values, bias_arg, y, workspace, counters,
                               m, n, x2.stride(0), y.stride(0), SPLIT=config.split, BLOCK_M=config.block_m,
                               DOT_IN_FP32=interpreting() and x2.dtype == torch.bfloat16, **common)
    else:
        raise ValueError(f"config.kernel: expected 'gemv' or 'gemm', got {config.kernel!r}")


@torch.library.custom_op("compress_kernels::bsr_matmul", mutates_args=())
def _bsr_matmul_op(
    x: torch.Tensor,
    crow_indices: torch.Tensor,
    col_indices: torch.Tensor,
    values: torch.Tensor,
    out_features: int,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    k = x.shape[-1]
    x2 = x.reshape(-1, k)
    if x2.shape[0] > 0 and x2.stride(-1) != 1:
        x2 = x2.contiguous()
    if densifies(x2.shape[0], out_features, k, col_indices.shape[0]):  # large M: cuBLAS on the dense weight
        weight = bsr_to_dense(crow_indices, col_indices, values, out_features, k)
        y = torch.nn.functional.linear(x2, weight, None if bias is None else bias.to(x.dtype))
    else:
        y = torch.empty((x2.shape[0], out_features), dtype=x.dtype, device=x.device)
        if x2.shape[0] > 0:
            launch_bsr(x2, crow_indices, col_indices, values, bias, y)
    return y.reshape(*x.shape[:-1], out_features)


@_bsr_matmul_op.register_fake
def _bsr_matmul_fake(x, crow_indices, col_indices, values, out_features, bias=None):
    return x.new_empty((*x.shape[:-1], out_features))


def check_parts(x, crow_indices, col_indices, values, out_features, bias, value_dtype=None) -> None:
    """Validate the BSR parts against ``x``; raise TypeError / ValueError naming expected vs actual.
    ``values`` must be in ``value_dtype`` (x's dtype when None)."""
    check_activation(x)
    if isinstance(out_features, bool) or not isinstance(out_features, int):
        raise TypeError(f"out_features: expected an int, got {type(out_features).__name__}")
    k = x.shape[-1]
    if out_features <= 0 or out_features % BSR_BLOCK:
        raise ValueError(f"out_features: expected a positive multiple of {BSR_BLOCK}, got {out_features}")
    if k == 0 or k % BSR_BLOCK:
        raise ValueError(f"x: expected K = x.shape[-1] a positive multiple of {BSR_BLOCK}, got {k}")
    check_tensor("crow_indices", crow_indices, INDEX_DTYPES, ndim=1)
    check_tensor("col_indices", col_indices, INDEX_DTYPES, ndim=1)
    check_tensor("values", values, (value_dtype or x.dtype,), ndim=3)
    block_rows = out_features // BSR_BLOCK
    if crow_indices.shape[0] != block_rows + 1:
        raise ValueError(
            f"crow_indices: expected shape ({block_rows + 1},) for out_features={out_features}, "
            f"got {tuple(crow_indices.shape)}"
        )
    nnz = col_indices.shape[0]
    if tuple(values.shape) != (nnz, BSR_BLOCK, BSR_BLOCK):
        raise ValueError(
            f"values: expected shape ({nnz}, {BSR_BLOCK}, {BSR_BLOCK}) (nnz from col_indices, 32x32 blocks), "
            f"got {tuple(values.shape)}"
        )
    if nnz > (k // BSR_BLOCK) * block_rows:
        raise ValueError(f"col_indices: expected at most {(k // BSR_BLOCK) * block_rows} blocks, got {nnz}")
    if nnz * BSR_BLOCK * BSR_BLOCK > _MAX_INT32:
        raise ValueError(f"values: expected fewer than 2^31 elements (32-bit offsets), got {values.numel()}")
    for name, t in (("crow_indices", crow_indices), ("col_indices", col_indices), ("values", values)):
        if not t.is_contiguous():
            raise ValueError(f"{name}: expected a contiguous tensor, got strides {t.stride()}")
    check_same_device(x, crow_indices=crow_indices, col_indices=col_indices, values=values)
    check_bias(bias, out_features, x)


def bsr_matmul_parts(x, crow_indices, col_indices, values, out_features, bias=None):
    """``y = x @ W.T (+ bias)`` for ``W`` (out_features, K) given by its BSR parts (32x32 blocks).

    ``x`` (..., K) fp16/bf16; ``crow_indices`` (N/32 + 1,) and ``col_indices`` (nnz,) int32/int64;
    ``values`` (nnz, 32, 32) in x's dtype; ``bias`` (N,) in x's dtype or float32. Returns (..., N).
    """
    check_parts(x, crow_indices, col_indices, values, out_features, bias)
    return torch.ops.compress_kernels.bsr_matmul(x, crow_indices, col_indices, values, out_features, bias)


def bsr_matmul(x, weight, bias=None):
    """``y = x @ weight.T (+ bias)`` for ``weight`` a ``torch.sparse_bsr`` tensor (N, K), 32x32 blocks."""
    if not isinstance(weight, torch.Tensor):
        raise TypeError(f"weight: expected a torch.Tensor in sparse_bsr layout, got {type(weight).__name__}")
    if weight.layout != torch.sparse_bsr:
        raise ValueError(
            f"weight: expected layout torch.sparse_bsr (e.g. W.to_sparse_bsr((32, 32))), got {weight.layout}"
        )
    if weight.dim() != 2:
        raise ValueError(f"weight: expected a 2-d (N, K) BSR tensor, got shape {tuple(weight.shape)}")
    blocksize = tuple(weight.values().shape[-2:])
    if blocksize != (BSR_BLOCK, BSR_BLOCK):
        raise ValueError(f"weight: expected blocksize ({BSR_BLOCK}, {BSR_BLOCK}), got {blocksize}")
    n, k = weight.shape
    check_activation(x)
    if x.shape[-1] != k:
        raise ValueError(f"x: expected last dimension {k} (weight is {n}x{k}), got shape {tuple(x.shape)}")
    return bsr_matmul_parts(x, weight.crow_indices(), weight.col_indices(), weight.values(), n, bias)
