"""The fixture of the kernel-branch tests of compress/nn/inference/."""
import pytest
import torch

from compress.nn.inference import (BSRLinear, BSRW4A16Linear, BSRW8A8Linear, W4A16Linear, W8A8BlockLinear, W8A8Linear,
                                   W8A16Linear)


@pytest.fixture
def kernel_modules(monkeypatch):
    """Make the modules take their kernel branch on the CPU (the interpreter runs the Triton kernels)."""
    import compress_kernels
    from compress_kernels import interpreting

    if not compress_kernels.TRITON_AVAILABLE or not interpreting():
        pytest.skip("needs the project's Triton kernels and TRITON_INTERPRET=1 (set by conftest without a GPU)")
    for cls in (W8A8Linear, W4A16Linear, W8A16Linear, W8A8BlockLinear, BSRLinear, BSRW8A8Linear, BSRW4A16Linear):
        monkeypatch.setattr(cls, "_use_kernel", lambda self, x: x.dtype in (torch.float16, torch.bfloat16))
