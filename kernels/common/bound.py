"""Ops bound to their weights: the weight side validated once, then each call checks its input and launches.

An inference layer calls one op with the same weight-side arguments (quantized weight, scales, BSR
indices, bias) on every forward. The public functions (``w4a16_matmul`` ...) check every argument on
every call and then go through the op's ``torch.library`` custom op, whose eager dispatch costs more
Python than the launch itself: about 0.2 ms of host time per call on an H100, where a decode step of a
small model has a few microseconds of GPU work per layer. Each op's ``op.py`` therefore also has a
``bind_<op>(x, ...)``: it validates every argument in full against a first input ``x`` and returns a
call bound to the weight-side arguments, for later inputs of x's dtype, device and K.

:class:`BoundMatmul` (``w8a8_matmul``, ``w4a16_matmul``, ``bsr_matmul_parts``,
``bsr_w8a8_matmul_parts``), called with ``x`` (..., K):

1. in eager mode, for a plain tensor that autograd does not track, replays the launch plan recorded
   for x's layout if there is one (:mod:`compress_kernels.common.plans`: the layout's key holds x's
   dtype, device and shape, so an input that has a plan was checked when the plan was recorded);
2. otherwise checks what can differ from the first input: a tensor of that dtype on that device, with
   at least one dimension and K features (``TypeError`` / ``ValueError`` naming what was expected and
   what came);
3. in eager mode (:func:`launches_directly`) runs the op's ``launch_nd``: the very function its
   custom op runs once it has validated, so the same kernels, tiles and bits; on CUDA through
   :class:`compress_kernels.common.plans.LaunchPlans`, which records its launches as the plan of x's
   layout (or marks the layout as not replayable);
4. otherwise calls the custom op: while ``torch.compile`` traces (its fake implementation gives the
   graph its shapes), on tensor subclasses (``FakeTensor``, functorch wrappers) and while autograd
   records (the op has no backward, and says so).

:class:`BoundQuantizedMatmul` (``w8a8_matmul_quantized``, ``bsr_w8a8_matmul_quantized``,
``w8a8_block_matmul_quantized``) checks ``xq`` (M, K) int8 and ``s_x`` float32 ((M,) per token, or
(M, ceil(K / 128)) block-scaled) on the bound device and launches, with launch plans as above.

A bound call holds the weight-side tensors themselves, so in-place changes of their values (e.g.
``load_state_dict``) reach it; tensors *replaced* (a cast, a move, an assignment) do not: bind again
(``compress.nn.inference`` does, keyed on the tensors' identity).
"""
from __future__ import annotations

from typing import Callable

import torch

from compress_kernels.common.pad import pad_columns
from compress_kernels.common.plans import LaunchPlans


def launches_directly(x) -> bool:
    """True when an op may skip its custom op and launch: eager mode (not while ``torch.compile``
    traces), a plain ``torch.Tensor`` (not a FakeTensor, functorch wrapper or FX proxy) and no
    autograd graph being recorded for it. Under CUDA-graph capture the custom op would run the same
    launch (its eager dispatch adds only host work), so capture launches directly too."""
    if torch.compiler.is_compiling():
        return False
    return type(x) is torch.Tensor and not (x.requires_grad and torch.is_grad_enabled())


class BoundMatmul:
    """``compress_kernels.<op_name>(x, *weights)`` for inputs of one dtype, device and K (module docstring)."""

    __slots__ = ("op_name", "launch_nd", "weights", "dtype", "device", "in_features", "padded_features", "plans")

    def __init__(self, op_name: str, launch_nd: Callable, weights: tuple, x: torch.Tensor):
        self.op_name, self.launch_nd, self.weights = op_name, launch_nd, weights
        self.dtype, self.device, self.in_features = x.dtype, x.device, x.shape[-1]
        self.padded_features = self.in_features  # the K the op itself takes
        self.plans = LaunchPlans(lambda x: launch_nd(x, *weights))

    def padded_from(self, in_features: int) -> "BoundMatmul":
        """This call for inputs of ``in_features`` channels, fewer than the bound K: each call first appends
        zero channels up to K (:func:`compress_kernels.common.pad.pad_columns`, a launch of the call's own,
        so a launch plan replays it; ``F.pad`` on the custom-op path)."""
        padded, launch_nd, weights = self.padded_features, self.launch_nd, self.weights
        if not 0 < in_features <= padded:
            raise ValueError(f"in_features: expected 1..{padded} (the bound K), got {in_features}")
        call = BoundMatmul.__new__(BoundMatmul)
        call.op_name, call.launch_nd, call.weights = self.op_name, launch_nd, weights
        call.dtype, call.device, call.in_features, call.padded_features = self.dtype, self.device, in_features, padded
        call.plans = LaunchPlans(lambda x: launch_nd(pad_columns(x, padded), *weights))
        return call

    def check(self, x) -> None:
        """TypeError / ValueError unless ``x`` is a tensor of the bound dtype, device and K."""
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"x: expected a torch.Tensor, got {type(x).__name__}")
        if x.dtype != self.dtype:
            raise TypeError(f"x: expected dtype {self.dtype} (the dtype {self.op_name} was bound for), got {x.dtype}")
        if x.device != self.device:
            raise ValueError(f"x: expected device {self.device} (where {self.op_name} was bound), got {x.device}")
        shape = x.shape
        if not shape or shape[-1] != self.in_features:
            raise ValueError(f"x: expected shape (..., {self.in_features}), got {tuple(shape)}")

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if type(x) is torch.Tensor and not x.requires_grad and not torch.compiler.is_compiling():
            y = self.plans.replay_known(x)  # an input layout checked and recorded before
            if y is not None:
                return y
        self.check(x)
        if launches_directly(x):
            return self.plans(x)
        if self.padded_features != self.in_features:
            x = torch.nn.functional.pad(x, (0, self.padded_features - self.in_features))
        return getattr(torch.ops.compress_kernels, self.op_name)(x, *self.weights)


class BoundQuantizedMatmul:
    """``launch(xq, s_x, *weights)`` for per-token int8 inputs with the bound device and K (module docstring)."""

    __slots__ = ("op_name", "launch", "weights", "device", "in_features", "scale_columns", "plans")

    def __init__(self, op_name: str, launch: Callable, weights: tuple, xq: torch.Tensor,
                 scale_columns: int | None = None):
        self.op_name, self.launch, self.weights = op_name, launch, weights
        self.plans = LaunchPlans(lambda xq, s_x: launch(xq, s_x, *weights))
        self.device, self.in_features = xq.device, xq.shape[1]
        self.scale_columns = scale_columns  # None: s_x (M,) per token; else (M, scale_columns) (block-scaled)

    def check(self, xq, s_x) -> None:
        """TypeError / ValueError unless ``xq`` is (M, K) int8 and ``s_x`` (M,) float32, both on the bound device."""
        for name, t, dtype in (("xq", xq, torch.int8), ("s_x", s_x, torch.float32)):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
            if t.dtype != dtype:
                raise TypeError(f"{name}: expected dtype {dtype}, got {t.dtype}")
            if t.device != self.device:
                raise ValueError(f"{name}: expected device {self.device} (where {self.op_name} was bound), "
                                 f"got {t.device}")
        if xq.dim() != 2 or xq.shape[1] != self.in_features:
            raise ValueError(f"xq: expected shape (M, {self.in_features}), got {tuple(xq.shape)}")
        if self.scale_columns is None and tuple(s_x.shape) != (xq.shape[0],):
            raise ValueError(f"s_x: expected shape ({xq.shape[0]},) (one scale per row of xq), got {tuple(s_x.shape)}")
        if self.scale_columns is not None and tuple(s_x.shape) != (xq.shape[0], self.scale_columns):
            raise ValueError(f"s_x: expected shape ({xq.shape[0]}, {self.scale_columns}) (one scale per row and "
                             f"128-channel block of xq), got {tuple(s_x.shape)}")

    def __call__(self, xq: torch.Tensor, s_x: torch.Tensor) -> torch.Tensor:
        if type(xq) is torch.Tensor and type(s_x) is torch.Tensor:
            y = self.plans.replay_known(xq, s_x)  # input layouts checked and recorded before
            if y is not None:
                return y
        self.check(xq, s_x)
        return self.plans(xq, s_x)
