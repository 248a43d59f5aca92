"""Tests for compress/_kernels.py: the reference is always reachable; the launchers are the functions of the
op modules that define them; without Triton they raise ImportError while the CPU path still runs."""
import subprocess
import sys

import compress_kernels
import pytest
import torch

from compress import _kernels


def test_reference_is_available():
    x = torch.randn(3, 16)
    xq, scale = _kernels.reference.quantize_per_token(x)
    assert xq.dtype == torch.int8 and scale.shape == (3,)


@pytest.mark.parametrize("module", ["bsr", "bsr_w8a8", "bsr_w4a16", "norm_quant", "w4a16", "w8a8", "w8a8_block",
                                    "w8a16"])
def test_launchers_are_the_op_modules_functions(module):
    if not compress_kernels.TRITON_AVAILABLE:
        pytest.skip("needs Triton")
    op = __import__(f"compress_kernels.{module}.op", fromlist=["op"])
    names = [name for name in _kernels.__all__ if getattr(getattr(op, name, None), "__module__", None) == op.__name__]
    assert names, f"compress._kernels takes nothing from compress_kernels.{module}.op"
    for name in names:
        assert getattr(_kernels, name) is getattr(op, name), name
        assert getattr(_kernels, name) is getattr(compress_kernels, name), name  # the package's public name too
    assert _kernels.NORM_QUANT_MAX_ROW == compress_kernels.NORM_QUANT_MAX_ROW > 0


def test_without_triton_a_launcher_names_the_cause_and_the_cpu_path_runs():
    code = ("import sys; sys.modules['triton'] = None\n"  # any import of triton now fails
            "import torch, compress\n"
            "from compress import _kernels\n"
            "assert _kernels.NORM_QUANT_MAX_ROW == 0\n"
            "layer = compress.W8A8Linear.from_float(torch.nn.Linear(64, 32))\n"
            "print(tuple(layer(torch.randn(2, 64)).shape))\n"
            "try:\n    _kernels.bind_w8a8_matmul(torch.randn(2, 64))\nexcept ImportError as err:\n    print(err)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.splitlines()[0] == "(2, 32)" and "need Triton" in out
