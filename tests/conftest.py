"""Test set-up: run Triton's CPU interpreter when there is no GPU, and skip GPU-marked tests there.

``TRITON_INTERPRET`` must be set before Triton compiles any ``@triton.jit`` function, so it is set
here, before any test module imports ``kernels``.
"""
import os

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config, items):
    if HAS_CUDA:
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)
