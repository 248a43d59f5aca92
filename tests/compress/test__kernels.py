"""Tests for compress/_kernels.py: the reference is always reachable, and a foreign `kernels`
package (Hugging Face's uses the same import name) is refused with an explanation."""
import sys
import types

import pytest
import torch

from compress import _kernels


def test_reference_is_available():
    x = torch.randn(3, 16)
    xq, scale = _kernels.reference.quantize_per_token(x)
    assert xq.dtype == torch.int8 and scale.shape == (3,)


def test_foreign_kernels_package_is_refused(monkeypatch):
    foreign = types.ModuleType("kernels")
    foreign.__file__ = "/site-packages/kernels/__init__.py"
    monkeypatch.setitem(sys.modules, "kernels", foreign)
    with pytest.raises(ImportError, match="Hugging Face"):
        _kernels._import_package()


def test_launcher_error_names_the_cause_when_unavailable(monkeypatch):
    monkeypatch.setattr(_kernels, "_package", None)
    monkeypatch.setattr(_kernels, "_package_error", ModuleNotFoundError("No module named 'kernels.w8a8'"))
    with pytest.raises(ImportError, match="kernels.w8a8"):
        _kernels.launcher("w8a8_matmul")
