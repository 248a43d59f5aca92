"""Tile bookkeeping shared by the tiled matmul kernels (inlined ``@triton.jit`` helpers).

* :func:`grouped_tile`: program ``pid`` of a 1-D grid -> its (row tile, column tile). Programs walk
  the output in groups of ``GROUP_M`` row tiles, so consecutive programs share one weight column
  tile while it sits in L2 (the order of Triton's matmul tutorial).
* :func:`split_k_range`: the slice ``[k_first, k_last)`` of the K axis that split ``pid_k`` of
  ``SPLIT_K`` owns, in whole ``BLOCK_K`` tiles (the last split may be short or empty).
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
def split_k_range(pid_k, K, SPLIT_K, BLOCK_K: tl.constexpr):
    k_tiles = tl.cdiv(K, BLOCK_K)
    tiles_per_split = tl.cdiv(k_tiles, SPLIT_K)
    k_first = pid_k * tiles_per_split * BLOCK_K
    k_last = min(K, k_first + tiles_per_split * BLOCK_K)
    return k_first, k_last
