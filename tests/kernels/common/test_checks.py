"""Input checks (compress_kernels/common/checks.py): each names the argument, the expectation and what came."""
import pytest
import torch

from compress_kernels.common import checks
from tests.kernels.helpers import DEVICE


def test_interpreting_follows_triton_interpret(monkeypatch):
    for value, expected in (("1", True), ("0", False), ("", False)):
        monkeypatch.setenv("TRITON_INTERPRET", value)
        assert checks.interpreting() is expected


@pytest.mark.parametrize(
    "call,error,words",
    [
        (lambda: checks.check_tensor("w", [1], (torch.int8,)), TypeError, "w: expected a torch.Tensor, got list"),
        (lambda: checks.check_tensor("w", torch.zeros(2), (torch.int8,)), TypeError, "w: expected dtype in"),
        (lambda: checks.check_tensor("w", torch.zeros(2), (torch.float32,), ndim=2), ValueError,
         r"w: expected 2 dimensions, got shape \(2,\)"),
        (lambda: checks.check_shape("s", torch.zeros(3), (4,)), ValueError, r"s: expected shape \(4,\), got \(3,\)"),
        (lambda: checks.check_bias(torch.zeros(3, dtype=torch.float16), 4, torch.zeros(1, 8).half()), ValueError,
         r"bias: expected shape \(4,\)"),
        (lambda: checks.check_x_scale(torch.zeros(4, 8).half(), torch.ones(3)), ValueError,
         r"x_scale: expected a scalar or shape \(4,\)"),
        (lambda: checks.check_quantized(torch.zeros(2, 8, dtype=torch.int8, device=DEVICE),
                                        torch.ones(2, device=DEVICE), torch.float32), TypeError,
         "out_dtype: expected torch.float16 or torch.bfloat16"),
    ],
)
def test_bad_values_are_named(call, error, words):
    with pytest.raises(error, match=words):
        call()


def test_cpu_activations_need_the_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    checks.check_activation(torch.zeros(2, 8).half())
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="x: expected a CUDA tensor"):
        checks.check_activation(torch.zeros(2, 8).half())
