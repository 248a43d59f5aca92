"""Tile bookkeeping shared by the tiled matmul kernels (inlined ``@triton.jit`` helpers).

* :func:`grouped_tile`: program ``pid`` of a 1-D grid -> its (row tile, column tile). Programs walk
  the output in groups of ``GROUP_M`` row tiles, so consecutive programs share one weight column
  tile while it sits in L2 (the order of Triton's matmul tutorial).
* :func:`split_k_range`: the slice ``[k_first, k_last)`` of the K axis that split ``pid_k`` of
  ``SPLIT_K`` owns, in whole ``BLOCK_K`` tiles (the last split may be short or empty).
* :func:`weight_columns`: the column offsets a program loads, as contiguous when N is a multiple of
  BLOCK_N (so loads are 16 bytes wide) and wrapped modulo N otherwise (loads need no mask; the
  stores mask the wrapped columns).
* :func:`block_row_share`: a block-sparse program's block row, its outputs inside it and the slice
  ``[start, end)`` of the row's stored blocks it owns when ``SPLIT`` programs share the row (whole
  ``GROUP`` steps each; the last share may be short or empty).
* :func:`split8`: a tensor whose last three dims are (2, 2, 2) -> its 8 slices in index order (the
  8 nibble positions of a packed int4 word, for the x operand of the W4A16 kernels).
"""
import triton
import triton.language as tl


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


@triton.jit
def block_row_share(crow_ptr, pid_n, pid_s, SPLIT: tl.constexpr, GROUP: tl.constexpr, BLOCK_N: tl.constexpr,
                    BLOCK: tl.constexpr):
    """(block_row, sub, start, end): program (``pid_n``, share ``pid_s``) of a BSR kernel with 32x32 blocks
    (``BLOCK``) owns outputs ``BLOCK * block_row + sub`` (BLOCK_N of them) and stored blocks [start, end)."""
    block_row = (pid_n * BLOCK_N) // BLOCK
    sub = (pid_n * BLOCK_N) % BLOCK + tl.arange(0, BLOCK_N)
    start = tl.load(crow_ptr + block_row).to(tl.int32)
    end = tl.load(crow_ptr + block_row + 1).to(tl.int32)
    if SPLIT > 1:  # a compile-time choice: the unsplit kernel carries none of this
        share = tl.cdiv(tl.cdiv(end - start, SPLIT), GROUP) * GROUP  # whole steps per share
        start = start + pid_s * share
        end = tl.minimum(end, start + share)
    return block_row, sub, start, end


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
