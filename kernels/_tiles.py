"""Tile bookkeeping shared by the tiled matmul kernels (inlined ``@triton.jit`` helpers).

* :func:`grouped_tile`: program ``pid`` of a 1-D grid -> its (row tile, column tile). Programs walk
  the output in groups of ``GROUP_M`` row tiles, so consecutive programs share one weight column
  tile while it sits in L2 (the order of Triton's matmul tutorial).
* :func:`split_k_range`: the slice ``[k_first, k_last)`` of the K axis that split ``pid_k`` of
  ``SPLIT_K`` owns, in whole ``BLOCK_K`` tiles (the last split may be short or empty).
* :func:`weight_columns`: the column offsets a program loads, as contiguous when N is a multiple of
  BLOCK_N (so loads are 16 bytes wide) and wrapped modulo N otherwise (loads need no mask; the
  stores mask the wrapped columns).
* :func:`split_k_for` (host side): how many K splits a launch needs to give every SM work.
* :func:`resident_split_k` (host side): the K split for the one-row W8A8 kernel, which hides DRAM
  latency with many resident programs rather than with deep pipelines.
* :func:`prefetch_split_k` (host side): the K split for the one-row W4A16 kernel, which loads one
  tile ahead, so a program wants a run of K tiles and the split needs fewer programs.
* :func:`split8`: a tensor whose last three dims are (2, 2, 2) -> its 8 slices in index order (the
  8 nibble positions of a packed int4 word, for the x operand of the W4A16 kernels).
* ``SMALL_LAYER`` (host side): layers with N * K up to this (e.g. MiniLM's 384 / 1536) sit in L2 and
  get their own tiles in the W8A8 and W4A16 launchers (no split-K where its reduce costs more).
"""
import triton
import triton.language as tl

SMALL_LAYER = 4 * 2**20


@triton.jit
def grouped_tile(pid, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    group_tiles = GROUP_M * num_pid_n
    first_m = (pid // group_tiles) * GROUP_M
    rows_in_group = min(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % group_tiles) % rows_in_group
    pid_n = (pid % group_tiles) // rows_in_group
    return pid_m, pid_n


@triton.jit
def weight_columns(offs_n, N, BLOCK_N: tl.constexpr, EVEN_N: tl.constexpr):
    if EVEN_N:
        return tl.max_contiguous(tl.multiple_of(offs_n, BLOCK_N), BLOCK_N)
    return offs_n % N


@triton.jit
def split_k_range(pid_k, K, SPLIT_K, BLOCK_K: tl.constexpr):
    k_tiles = tl.cdiv(K, BLOCK_K)
    tiles_per_split = tl.cdiv(k_tiles, SPLIT_K)
    k_first = pid_k * tiles_per_split * BLOCK_K
    k_last = min(K, k_first + tiles_per_split * BLOCK_K)
    return k_first, k_last


def split_k_for(m: int, n: int, k: int, cfg, target_programs: int = 264) -> int:
    """Smallest power-of-two K split giving about two programs per SM (132 on an H100), 1 if none needed.

    ``cfg`` is any tile config with ``block_m``, ``block_n`` and ``block_k``.
    """
    tiles = triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n)
    k_tiles = triton.cdiv(k, cfg.block_k)
    split = 1
    while tiles * split < target_programs // 2 and split * 2 <= k_tiles and split < 16:
        split *= 2
    return split


def resident_split_k(m: int, n: int, k: int, cfg, min_programs: int = 640, max_split: int = 32) -> int:
    """Smallest power-of-two K split giving >= ``min_programs`` programs with >= 2 K tiles each.

    For the one-row W8A8 kernel (grid ``m x cdiv(n, block_n) x split``), which hides DRAM latency with
    many resident programs (on the H200 the W4A16 one-row kernel, before it loaded a tile ahead, got
    faster up to ~5 programs per SM and slower past ~8). Shapes too small for that get as many
    programs as one K tile per split allows."""
    tiles = m * triton.cdiv(n, cfg.block_n)
    k_tiles = triton.cdiv(k, cfg.block_k)
    split = 1
    while tiles * split < min_programs and split < max_split and k_tiles // (split * 2) >= 2:
        split *= 2
    if tiles * split < min_programs:  # still short: down to one K tile per split
        while split < max_split and k_tiles // (split * 2) >= 1:
            split *= 2
    return split


def prefetch_split_k(m: int, n: int, k: int, cfg, min_programs: int = 512, max_split_channels: int = 1536,
                     max_split: int = 32) -> int:
    """Smallest power-of-two K split giving >= ``min_programs`` programs (about 4 per SM), then doubled
    while a split spans more than ``max_split_channels`` of K; never under two K tiles per split.

    Grid ``m x cdiv(n, block_n) x split``. Measured on an H100 at M = 1 with the W4A16 kernel
    (docs/kernels-notes.md): 4096x4096 and 11008x4096 fastest at split 8 (512 programs; 16 was 15%
    and 9% slower), 4096x12288 at 4 (768 programs), 4096x22016 at 4 (2 spans 2048 channels: 3% slower)."""
    tiles = m * triton.cdiv(n, cfg.block_n)
    k_tiles = triton.cdiv(k, cfg.block_k)

    def can_double(split):
        return split < max_split and k_tiles // (split * 2) >= 2

    split = 1
    while tiles * split < min_programs and can_double(split):
        split *= 2
    while triton.cdiv(k, split) > max_split_channels and can_double(split):
        split *= 2
    return split


@triton.jit
def split8(t):
    """A tensor whose last three dims are (2, 2, 2), index j = 4a + 2b + c, -> its 8 slices j = 0..7
    (split off c, then b, then a)."""
    c0, c1 = tl.split(t)
    b00, b01 = tl.split(c0)  # (b, c) = (0, 0), (1, 0)
    b10, b11 = tl.split(c1)  # (0, 1), (1, 1)
    s0, s4 = tl.split(b00)
    s2, s6 = tl.split(b01)
    s1, s5 = tl.split(b10)
    s3, s7 = tl.split(b11)
    return s0, s1, s2, s3, s4, s5, s6, s7
