"""DDS: dense activations x block-sparse weights, ``y = x @ W.T (+ bias)``: validation, launcher, custom op.

Layout. ``W`` (N, K) is stored in BSR form with 32x32 blocks, exactly as ``torch.sparse_bsr``
(``W.to_sparse_bsr((32, 32))``): ``crow_indices`` (N/32 + 1,) over block rows, ``col_indices``
(nnz,) over block columns, ``values`` (nnz, 32, 32) with ``values[b, i, j] = W[32 r + i, 32 c + j]``
for the b-th stored block, in block row ``r`` and block column ``c = col_indices[b]``. Block row
``r`` owns the stored blocks ``crow[r] <= b < crow[r + 1]``; an empty block row gives zeros (or the
bias). Absent blocks are never read.

Math. For the 32 outputs of block row ``r``::

    y[m, 32 r + i] = sum_{b in row r} sum_j x[m, 32 col[b] + j] * values[b, i, j]   (+ bias)

accumulated in fp32 and stored in ``x``'s dtype. Which kernel runs is decided by
:func:`compress_kernels.bsr.dispatch.pick` from the shapes and nnz alone: the one-row kernel
(:mod:`compress_kernels.bsr.gemv`), the tensor-core tiles (:mod:`compress_kernels.bsr.gemm`) or,
at large M on dense enough layers, the weight written out dense for cuBLAS
(:mod:`compress_kernels.bsr.densify`).

Entry points: ``bsr_matmul(x, weight, bias)`` for a ``torch.sparse_bsr`` weight and
``bsr_matmul_parts(x, crow, col, values, out_features, bias)`` for the parts the inference module
keeps as buffers. Both validate and call the custom op ``compress_kernels::bsr_matmul`` (with a
fake implementation), so callers compile under ``torch.compile`` and capture in CUDA graphs: the
launch depends only on shapes, never on the index values, and does no host synchronisation.
``bind_bsr_matmul_parts`` validates once (indices not checked) and returns a call bound to the
parts, which in eager mode launches without the custom op (:mod:`compress_kernels.common.bound`). The
index *values* are checked (:func:`compress_kernels.bsr.indices.check_bsr_indices`: one pass and one
synchronisation) unless the caller passes ``check_indices=False``, as the inference modules do,
having checked them once when the layer was built or loaded; with it, indices that break the
``torch.sparse_bsr`` invariants give garbage or a memory fault. While ``torch.compile`` traces or a
CUDA graph captures, no synchronisation is possible and the check is skipped: the call before (the
warm-up of a capture, the eager call) is the one that checks. Keep the
parts as plain tensors (buffers, e.g. ``.clone()`` of ``W.to_sparse_bsr(...).values()``): tensors
returned straight by a sparse tensor's ``.values()`` trip Dynamo (IndexError in
``torch/_dynamo/pgo.py``, seen with torch 2.13).
"""
from __future__ import annotations

import torch

from compress_kernels.bsr.densify import bsr_to_dense
from compress_kernels.bsr.dispatch import BsrConfig, cached_pick
from compress_kernels.bsr.gemm import launch_gemm
from compress_kernels.bsr.gemv import launch_gemv
from compress_kernels.bsr.indices import TILE_ROWS, check_bsr_indices, tile_rows_of
from compress_kernels.bsr.tile_gemm import launch_tile_gemm
from compress_kernels.common.bound import BoundMatmul
from compress_kernels.common.checks import check_activation, check_bias, check_same_device, check_tensor
from compress_kernels.common.prefetch import prefetch_allowed
from compress_kernels.reference import BSR_BLOCK

INDEX_DTYPES = (torch.int32, torch.int64)
_MAX_INT32 = 2**31 - 1


def launch(x2, crow_indices, col_indices, values, out_features: int, bias=None, tile_rows: int = 1,
           config: BsrConfig | None = None) -> torch.Tensor:
    """Run validated ``x2`` (M, K) (unit column stride) through the picked kernel (or ``config``);
    returns (M, out_features) in x2's dtype. ``tile_rows``: the indices' tile pattern (1: free blocks)."""
    m, k = x2.shape
    config = config or cached_pick(m, out_features, k, col_indices.shape[0], x2.device, prefetch_allowed(values),
                                   tile_rows)
    if config.kernel == "dense":  # large M: cuBLAS on the dense weight
        weight = bsr_to_dense(crow_indices, col_indices, values, out_features, k)
        return torch.nn.functional.linear(x2, weight, None if bias is None else bias.to(x2.dtype))
    y = torch.empty((m, out_features), dtype=x2.dtype, device=x2.device)
    if m == 0:
        return y
    if config.kernel == "gemv":
        launch_gemv(x2, crow_indices, col_indices, values, bias, y, config)
    elif config.kernel == "gemm":
        launch_gemm(x2, crow_indices, col_indices, values, bias, y, config)
    elif config.kernel == "tiles":
        launch_tile_gemm(x2, crow_indices, col_indices, values, bias, y, config, tile_rows)
    else:
        raise ValueError(f"config.kernel: expected 'dense', 'gemv', 'gemm' or 'tiles', got {config.kernel!r}")
    return y


def launch_nd(x, crow_indices, col_indices, values, out_features: int, bias=None, tile_rows: int = 1) -> torch.Tensor:
    """:func:`launch` on validated ``x`` (..., K): (..., out_features) in x's dtype (the custom op's work)."""
    k = x.shape[-1]
    x2 = x.reshape(-1, k)
    if x2.shape[0] > 0 and x2.stride(-1) != 1:
        x2 = x2.contiguous()
    y = launch(x2, crow_indices, col_indices, values, out_features, bias, tile_rows)
    return y.reshape(*x.shape[:-1], out_features)


@torch.library.custom_op("compress_kernels::bsr_matmul", mutates_args=())
def _bsr_matmul_op(
    x: torch.Tensor,
    crow_indices: torch.Tensor,
    col_indices: torch.Tensor,
    values: torch.Tensor,
    out_features: int,
    bias: torch.Tensor | None = None,
    tile_rows: int = 1,
) -> torch.Tensor:
    return launch_nd(x, crow_indices, col_indices, values, out_features, bias, tile_rows)


@_bsr_matmul_op.register_fake
def _bsr_matmul_fake(x, crow_indices, col_indices, values, out_features, bias=None, tile_rows=1):
    return x.new_empty((*x.shape[:-1], out_features))


def check_parts(x, crow_indices, col_indices, values, out_features, bias, value_dtype=None,
                check_indices: bool = True, block_shape: tuple[int, int] = (BSR_BLOCK, BSR_BLOCK),
                block_layout: str = "32x32 blocks", tile_rows: int = 1) -> None:
    """Validate the BSR parts against ``x``; raise TypeError / ValueError naming expected vs actual.
    ``values`` must be in ``value_dtype`` (x's dtype when None) with shape (nnz, *block_shape) (what one
    stored block is: ``block_layout``); ``check_indices``: also the index values (a host synchronisation)."""
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
    if tuple(values.shape) != (nnz, *block_shape):
        raise ValueError(
            f"values: expected shape {(nnz, *block_shape)} (nnz from col_indices, {block_layout}), "
            f"got {tuple(values.shape)}"
        )
    if nnz > (k // BSR_BLOCK) * block_rows:
        raise ValueError(f"col_indices: expected at most {(k // BSR_BLOCK) * block_rows} blocks, got {nnz}")
    if values.numel() > _MAX_INT32:
        raise ValueError(f"values: expected fewer than 2^31 elements (32-bit offsets), got {values.numel()}")
    for name, t in (("crow_indices", crow_indices), ("col_indices", col_indices), ("values", values)):
        if not t.is_contiguous():
            raise ValueError(f"{name}: expected a contiguous tensor, got strides {t.stride()}")
    check_same_device(x, crow_indices=crow_indices, col_indices=col_indices, values=values)
    check_bias(bias, out_features, x)
    if not isinstance(check_indices, bool):
        raise TypeError(f"check_indices: expected a bool, got {type(check_indices).__name__}")
    if isinstance(tile_rows, bool) or tile_rows not in TILE_ROWS:
        raise ValueError(f"tile_rows: expected one of {TILE_ROWS}, got {tile_rows!r}")
    if check_indices and not _building_a_graph(x):
        check_bsr_indices(crow_indices, col_indices, k // BSR_BLOCK)
        found = tile_rows_of(crow_indices, col_indices) if tile_rows > 1 else 1
        if found < tile_rows:
            raise ValueError(f"tile_rows={tile_rows}: expected every {tile_rows} block rows from a multiple of "
                             f"{tile_rows} to store the same block columns, got indices that do not (their "
                             f"pattern: tile_rows={found})")


def _building_a_graph(x) -> bool:
    """True while ``torch.compile`` traces or a CUDA graph captures: no host synchronisation is
    possible there, so the index check is left to the calls outside (the warm-up before a capture)."""
    if torch.compiler.is_compiling():
        return True
    return x.device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def bsr_matmul_parts(x, crow_indices, col_indices, values, out_features, bias=None, tile_rows=1, *,
                     check_indices=True):
    """``y = x @ W.T (+ bias)`` for ``W`` (out_features, K) given by its BSR parts (32x32 blocks).

    ``x`` (..., K) fp16/bf16; ``crow_indices`` (N/32 + 1,) and ``col_indices`` (nnz,) int32/int64;
    ``values`` (nnz, 32, 32) in x's dtype; ``bias`` (N,) in x's dtype or float32. Returns (..., N).
    ``tile_rows`` (1, 2, 4 or 8): the block rows store the same block columns in tiles of that many
    (:func:`compress_kernels.bsr.indices.tile_rows_of`), which large M runs on the tile kernel
    (:mod:`compress_kernels.bsr.tile_gemm`). ``check_indices=False`` skips the index-value check (for
    indices already checked once, the tile pattern included).
    """
    check_parts(x, crow_indices, col_indices, values, out_features, bias, check_indices=check_indices,
                tile_rows=tile_rows)
    return torch.ops.compress_kernels.bsr_matmul(x, crow_indices, col_indices, values, out_features, bias, tile_rows)


def bind_bsr_matmul_parts(x, crow_indices, col_indices, values, out_features, bias=None, tile_rows=1) -> BoundMatmul:
    """:func:`bsr_matmul_parts` with every argument validated now, against ``x`` (the index *values* not:
    check them once where they come in), and the parts bound for later inputs of x's dtype, device
    and K (:class:`compress_kernels.common.bound.BoundMatmul`)."""
    check_parts(x, crow_indices, col_indices, values, out_features, bias, check_indices=False, tile_rows=tile_rows)
    return BoundMatmul("bsr_matmul", launch_nd, (crow_indices, col_indices, values, out_features, bias, tile_rows),
                       x)


def bsr_matmul(x, weight, bias=None, *, check_indices=True):
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
    return bsr_matmul_parts(x, weight.crow_indices(), weight.col_indices(), weight.values(), n, bias,
                            check_indices=check_indices)
