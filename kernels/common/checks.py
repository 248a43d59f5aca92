"""Input validation shared by the kernel launchers.

Every check raises ``TypeError`` (wrong type or dtype) or ``ValueError`` (wrong shape, device,
layout or divisibility) with a message naming the argument, what was expected and what came, so a
bad call fails here and never deep inside a Triton kernel.
"""
from __future__ import annotations

import os

import torch

from compress_kernels.common.launch import compiling

ACTIVATION_DTYPES = (torch.float16, torch.bfloat16)


def interpreting() -> bool:
    """True when Triton runs its CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def cpu_tensors_allowed() -> bool:
    """CPU inputs are accepted under the interpreter, or inside ``launch.compiling_for`` (nothing runs)."""
    return interpreting() or compiling()


def check_tensor(name: str, t, dtypes: tuple[torch.dtype, ...], ndim: int | None = None) -> None:
    """``t`` is a tensor with one of ``dtypes`` and, if given, ``ndim`` dimensions."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        allowed = ", ".join(str(d) for d in dtypes)
        raise TypeError(f"{name}: expected dtype in ({allowed}), got {t.dtype}")
    if ndim is not None and t.dim() != ndim:
        raise ValueError(f"{name}: expected {ndim} dimensions, got shape {tuple(t.shape)}")


def check_activation(x) -> None:
    """``x`` is (..., K) fp16/bf16 on a device the kernels run on (CUDA, or CPU when interpreting)."""
    check_tensor("x", x, ACTIVATION_DTYPES)
    if x.dim() < 1:
        raise ValueError("x: expected shape (..., K), got a 0-d tensor")
    if x.device.type not in ("cuda", "meta") and not cpu_tensors_allowed():  # meta: shape inference only
        raise ValueError(
            f"x: expected a CUDA tensor (or TRITON_INTERPRET=1 for CPU tests), got device {x.device}; "
            "use compress_kernels.reference on the CPU"
        )


def check_same_device(x: torch.Tensor, **others) -> None:
    """Every tensor in ``others`` lives on ``x``'s device."""
    for name, t in others.items():
        if t is not None and t.device != x.device:
            raise ValueError(f"{name}: expected device {x.device} (the device of x), got {t.device}")


def check_shape(name: str, t: torch.Tensor, expected: tuple[int, ...]) -> None:
    """``t`` has exactly the shape ``expected``."""
    if tuple(t.shape) != tuple(expected):
        raise ValueError(f"{name}: expected shape {tuple(expected)}, got {tuple(t.shape)}")


def check_bias(bias, n: int, x: torch.Tensor) -> None:
    """``bias`` is None or (N,) in x's dtype or float32, on x's device."""
    if bias is None:
        return
    check_tensor("bias", bias, (x.dtype, torch.float32), ndim=1)
    check_shape("bias", bias, (n,))
    check_same_device(x, bias=bias)


def check_x_scale(x, x_scale) -> None:
    """``x_scale`` is None or a static float32 scale on x's device: one element or one per token (M,)."""
    if x_scale is None:
        return
    check_tensor("x_scale", x_scale, (torch.float32,))
    check_same_device(x, x_scale=x_scale)
    m = x.numel() // x.shape[-1]
    if x_scale.numel() != 1 and tuple(x_scale.shape) != (m,):
        raise ValueError(f"x_scale: expected a scalar or shape ({m},) (one per token), got {tuple(x_scale.shape)}")


def check_quantized(xq, s_x, out_dtype) -> None:
    """``xq`` (M, K) int8 (CUDA, or CPU when interpreting), ``s_x`` (M,) float32 on its device, and an
    fp16 / bf16 ``out_dtype``: the input of the GEMMs that start from per-token int8 activations."""
    check_tensor("xq", xq, (torch.int8,), ndim=2)
    if xq.device.type != "cuda" and not cpu_tensors_allowed():
        raise ValueError(f"xq: expected a CUDA tensor (or TRITON_INTERPRET=1 for CPU tests), got device {xq.device}")
    if xq.shape[1] == 0:
        raise ValueError("xq: expected K >= 1 input features, got K = 0")
    check_tensor("s_x", s_x, (torch.float32,), ndim=1)
    check_shape("s_x", s_x, (xq.shape[0],))
    check_same_device(xq, s_x=s_x)
    if out_dtype not in ACTIVATION_DTYPES:
        raise TypeError(f"out_dtype: expected torch.float16 or torch.bfloat16, got {out_dtype}")
