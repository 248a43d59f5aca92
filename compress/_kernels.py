"""The one place where ``compress`` reaches the project's kernels (import name ``compress_kernels``).

``reference`` is the pure-PyTorch contract of every kernel (:mod:`compress_kernels.reference`); it
needs no Triton and is what the inference modules run on the CPU. :func:`launcher` looks up a Triton
launcher by name, only when an inference module sees a CUDA input. :func:`check_bsr_indices` is
the full check of BSR index values (run when a block-sparse layer is loaded, not per forward).
"""
from __future__ import annotations

import compress_kernels
from compress_kernels import reference

__all__ = ["check_bsr_indices", "launcher", "reference"]


def launcher(name: str):
    """The Triton launcher ``compress_kernels.<name>`` (e.g. ``"w8a8_matmul"``); ImportError without Triton."""
    if not compress_kernels.TRITON_AVAILABLE:
        raise ImportError(f"compress_kernels.{name} needs Triton, which is not installed (pip install triton, Linux)")
    return getattr(compress_kernels, name)


def check_bsr_indices(crow_indices, col_indices, block_cols: int) -> None:
    """:func:`compress_kernels.bsr.indices.check_bsr_indices`: ValueError unless the indices hold the
    ``torch.sparse_bsr`` invariants for ``block_cols`` block columns."""
    from compress_kernels.bsr.indices import check_bsr_indices as check

    check(crow_indices, col_indices, block_cols)
