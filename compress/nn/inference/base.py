"""What every inference module shares (:class:`_InferenceLinear`): dtype-stable buffers, the choice
between the kernels and the reference, the bound kernel calls, the bias and the ``weight`` marker, and
the check of the config a module is built from (``config_class``).

``bias`` (N,) is a buffer in the model dtype. ``weight`` is no weight: an empty tensor in the model
dtype on the module's device (a non-persistent buffer, never saved), for model code that asks
``layer.weight.dtype`` or ``.device``. Scales and indices must keep their dtype when the
model is cast (``model.half().cuda()`` after export): :class:`compress.core.float32.Float32Buffers` lets
a cast move the ``float32`` buffers to another device but never changes their dtype, while ``bias`` and
BSR ``values`` follow the model dtype.

On CUDA inputs in fp16/bf16 the forward calls the Triton kernels; everywhere else it calls the
pure-PyTorch reference of the same op (``kernels/reference.py``), logged once per class. Padding
(W4A16 and W8A16 with K not a multiple of the group size, or of 8) appends zero input channels to the
weight and to ``x``, so the result is exact; the padded K is the config's
(:meth:`compress.configs.W4A16Config.padding`).

How the kernels are called. In eager mode (e.g. ``model.generate`` as most users run it) a forward
must cost little host time, since a decode step calls every linear layer once with a few rows. The
first kernel call binds the op to the module's buffers (the op's ``bind_<op>``, imported with its
launcher from :mod:`compress._kernels`: every argument validated once) and keeps that call; later
calls check only ``x`` (dtype, device, K) and launch without the custom op's dispatch. The bound call
is kept while the buffers passed are the same tensor objects and ``x`` keeps its dtype and device; a
cast or move (``_apply``) drops it, and so do pickling and ``deepcopy`` (it is a cache, not state).
In-place changes of buffer values (``load_state_dict``) need no rebinding: the call holds the buffers
themselves. A buffer whose dtype differs from ``x``'s (``bias`` and BSR ``values`` when the module was
not cast to x's dtype) is converted once and the copy kept until the buffer is replaced or changed in
place. While ``torch.compile`` traces, the forward calls the public launchers instead (validated at
trace time, their ``torch.library`` custom ops in the graph).
"""
from __future__ import annotations

import logging
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from compress.core.float32 import Float32Buffers

logger = logging.getLogger(__name__)
_LOGGED_FALLBACK: set[str] = set()
KERNEL_DTYPES = (torch.float16, torch.bfloat16)  # input dtypes the Triton kernels take (on CUDA)


def kernels_run(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether the inference modules call the Triton kernels for inputs on ``device`` in ``dtype`` (CUDA,
    fp16 / bf16); everywhere else they run the pure-PyTorch reference."""
    return torch.device(device).type == "cuda" and dtype in KERNEL_DTYPES


def _log_once(cls_name: str, reason: str) -> None:
    if torch.compiler.is_compiling():  # a logging call inside a traced forward breaks torch.compile(fullgraph=True)
        return
    key = f"{cls_name}:{reason}"
    if key not in _LOGGED_FALLBACK:
        _LOGGED_FALLBACK.add(key)
        logger.info("%s: %s; using the pure-PyTorch reference (kernels/reference.py)", cls_name, reason)


def _version(t: torch.Tensor) -> int | None:
    """``t``'s in-place version counter; None for inference-mode tensors, which have none."""
    return None if t.is_inference() else t._version


_NO_CALLS: dict = {}  # the bound-call cache of a module that has made none (read only)


def _same_objects(a: tuple, b: tuple) -> bool:
    """Whether two argument tuples hold the very same objects, position by position."""
    if len(a) != len(b):
        return False
    for p, q in zip(a, b):  # a loop, not all(...): this runs on every eager forward
        if p is not q:
            return False
    return True


def _pad_inputs(x: torch.Tensor, in_features: int, padded_in_features: int) -> torch.Tensor:
    """``x`` (..., K) with ``padded_in_features - in_features`` zero channels appended (the layers that pad
    K); a wrong K is left for the kernel's check to name."""
    pad = padded_in_features - in_features
    return F.pad(x, (0, pad)) if pad else x


class _InferenceLinear(Float32Buffers):
    """Shared plumbing: dtype-stable float32 buffers, kernel-or-reference dispatch, bound kernel calls, bias."""

    _CACHES = ("_bound_calls", "_dtype_copies")  # instance caches: dropped by a cast, a move, pickling and copying
    config_class: ClassVar[type | None] = None  # the config the module holds as ``config`` (None: none)

    def __init__(self, in_features: int, out_features: int, bias: bool):
        super().__init__()
        for name, value in (("in_features", in_features), ("out_features", out_features)):
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name}: expected a positive int, got {value!r}")
        self.in_features, self.out_features = in_features, out_features
        self.register_buffer("bias", torch.zeros(out_features) if bias else None)
        self.register_buffer("compute_dtype_marker", torch.empty(0), persistent=False)

    def _checked_config(self, config):
        """``config``, or the default ``config_class()`` for None; TypeError for a config of another class."""
        config = config or self.config_class()
        if not isinstance(config, self.config_class):
            raise TypeError(f"config: expected {self.config_class.__name__}, got {type(config).__name__}")
        return config

    @property
    def weight(self) -> torch.Tensor:
        """An empty tensor in the model dtype and on the module's device (it follows casts and moves, as
        ``bias`` does), for model code that reads ``layer.weight.dtype`` / ``.device`` (T5's feed-forward
        casts its input to ``wo.weight.dtype``). The weight itself is in the quantized buffers:
        :meth:`dequantized_weight` rebuilds it."""
        return self.compute_dtype_marker

    def _use_kernel(self, x: torch.Tensor) -> bool:
        """True for CUDA fp16/bf16 inputs; logs (once) why the reference runs otherwise."""
        if x.is_cuda and x.dtype in KERNEL_DTYPES:  # kernels_run, inline: this runs on every forward
            return True
        reason = f"input on {x.device.type}" if x.device.type != "cuda" else f"input dtype {x.dtype}"
        _log_once(type(self).__name__, reason)
        return False

    def _bias_for(self, x: torch.Tensor):
        bias = self._buffers["bias"]
        return bias if bias is None or bias.dtype == x.dtype else self._in_dtype("bias", bias, x.dtype)

    def _in_dtype(self, name: str, t: torch.Tensor | None, dtype: torch.dtype):
        """Buffer ``t`` (named ``name``) in ``dtype``: itself when it has that dtype, else a copy converted
        once and kept until the buffer is replaced or changed in place."""
        if t is None or t.dtype == dtype:
            return t
        if torch.compiler.is_compiling():  # a traced graph converts as it runs
            return t.to(dtype)
        copies = self.__dict__.setdefault("_dtype_copies", {})
        kept = copies.get(name)
        if kept is not None and kept[0] is t and kept[1] == _version(t) and kept[2].dtype == dtype:
            return kept[2]
        copy = t.to(dtype)
        copies[name] = (t, _version(t), copy)
        return copy

    def _kernel(self, launcher, bind, x: torch.Tensor, *args, padded_features: int | None = None,
                **public_kwargs) -> torch.Tensor:
        """The op ``launcher`` (its public launcher, e.g. ``w8a8_matmul``) on ``(x, *args)``: while
        torch.compile traces, ``launcher`` itself (with ``public_kwargs``); in eager mode the call that
        ``bind`` (the op's ``bind_<op>``) returned for ``args``, kept (module docstring).
        ``padded_features``: the K the op takes when larger than ``in_features`` (x gets zero channels)."""
        if torch.compiler.is_compiling():
            x = _pad_inputs(x, self.in_features, padded_features or self.in_features)
            return launcher(x, *args, **public_kwargs)
        key = (x.dtype, x.get_device())
        call = self._kept(bind, key, args) or self._keep(bind, key, args, self._bind(bind, x, args, padded_features))
        return call(x)

    def _bind(self, bind, x: torch.Tensor, args: tuple, padded_features: int | None):
        """``bind(x, *args)`` validated against x padded to ``padded_features``, then taking unpadded inputs
        (a wrong K stays wrong after the pad, for the op's check to name)."""
        if not padded_features or padded_features == self.in_features:
            return bind(x, *args)
        padded = _pad_inputs(x, self.in_features, padded_features)
        return bind(padded, *args).padded_from(self.in_features)

    def _quantized_kernel(self, bind, x: torch.Tensor, xq: torch.Tensor, s_x: torch.Tensor, *args) -> torch.Tensor:
        """The call ``bind(xq, s_x, *args)`` returned (an op's ``bind_<op>_quantized``) on handed-over int8
        inputs (eager mode only), kept as :meth:`_kernel` keeps it."""
        key = (x.dtype, xq.get_device())
        call = self._kept(bind, key, args) or self._keep(bind, key, args, bind(xq, s_x, *args))
        return call(xq, s_x)

    def _kept(self, bind, key: tuple, args: tuple):
        """The call kept from ``bind``, or None when there is none or ``key`` (x's dtype and CUDA device
        index) or any of ``args`` (compared by identity) changed since it was made."""
        kept = self.__dict__.get("_bound_calls", _NO_CALLS).get(bind)
        return kept[2] if kept is not None and kept[0] == key and _same_objects(kept[1], args) else None

    def _keep(self, bind, key: tuple, args: tuple, call):
        """``call``, kept under ``bind`` (the function that made it) with the ``key`` and ``args`` it was
        bound for."""
        self.__dict__.setdefault("_bound_calls", {})[bind] = (key, args, call)
        return call

    def _apply(self, fn, recurse=True):
        for name in self._CACHES:  # they hold the tensors a cast or move replaces
            self.__dict__.pop(name, None)
        return super()._apply(fn, recurse)

    def __getstate__(self):
        state = dict(super().__getstate__())
        for name in self._CACHES:
            state.pop(name, None)
        return state

    @staticmethod
    def _copy_float_state(module: "_InferenceLinear", linear: nn.Module) -> None:
        """The float layer's bias, and its dtype and device as the ``weight`` marker's."""
        if linear.bias is not None:
            module.bias = linear.bias.detach().clone()
        module.compute_dtype_marker = linear.weight.new_empty(0)
