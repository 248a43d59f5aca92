"""Tests for compress/_kernels.py: the reference is always reachable, launchers come by name."""
import compress_kernels
import pytest
import torch

from compress import _kernels


def test_reference_is_available():
    x = torch.randn(3, 16)
    xq, scale = _kernels.reference.quantize_per_token(x)
    assert xq.dtype == torch.int8 and scale.shape == (3,)


def test_launcher_returns_the_package_launcher():
    assert _kernels.launcher("w8a8_matmul") is compress_kernels.w8a8_matmul


def test_launcher_without_triton_names_the_cause(monkeypatch):
    monkeypatch.setattr(compress_kernels, "TRITON_AVAILABLE", False)
    with pytest.raises(ImportError, match="needs Triton"):
        _kernels.launcher("w8a8_matmul")
