"""The one place where ``compress`` reaches the project's kernels (import name ``compress_kernels``).

``reference`` is the pure-PyTorch contract of every kernel (:mod:`compress_kernels.reference`); it
needs no Triton and is what the inference modules run on the CPU. :func:`launcher` looks up a Triton
launcher by name, only when an inference module sees a CUDA input.
"""
from __future__ import annotations

import compress_kernels
from compress_kernels import reference

__all__ = ["launcher", "reference"]


def launcher(name: str):
    """The Triton launcher ``compress_kernels.<name>`` (e.g. ``"w8a8_matmul"``); ImportError without Triton."""
    if not compress_kernels.TRITON_AVAILABLE:
        raise ImportError(f"compress_kernels.{name} needs Triton, which is not installed (pip install triton, Linux)")
    return getattr(compress_kernels, name)
