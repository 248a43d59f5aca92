"""Inference modules: ``nn.Linear`` replacements whose forward calls the project's kernels.

=============  ===================================================  ================================
module         buffers (N = out_features, K = in_features)          forward
=============  ===================================================  ================================
W8A8Linear     ``w_q`` (N, K) int8, ``w_scale`` (N,) float32,        ``kernels.w8a8_matmul``: int8 x
               ``act_scale`` () float32 (static only),              int8, int32 accumulation,
               ``input_smoothing`` (K,) float32 (SmoothQuant        ``acc * s_x[m] * s_w[n] (+ b)``
               factors no norm could absorb; optional)
W4A16Linear    ``qweight`` (Kp/8, N) int32, ``scales`` (Kp/G, N)    ``kernels.w4a16_matmul``: int4
               float32; Kp = K padded to a multiple of G and 8      unpack, dequantize, fp32 acc.
W8A16Linear    ``w_q`` (N, Kp) int8, ``w_scale`` (N,) float32 per   ``kernels.w8a16_matmul``: int8 x
               channel or (N, Kp/128) per group; Kp = K padded to   fp16/bf16, fp32 accumulation
               a multiple of 8 (of 128 with groups)
W8A8BlockLinear ``w_q`` (N, K) int8, ``w_scale`` (ceil(N/128),     ``kernels.w8a8_block_matmul``:
               ceil(K/128)) float32: one scale per 128 x 128       x int8 per token and 128
               block                                                channels, one rescale per K block
BSRLinear      ``crow_indices`` (N/32+1,) int32, ``col_indices``    ``kernels.bsr_matmul_parts``:
               (nnz,) int32, ``values`` (nnz, 32, 32) model dtype   absent blocks skipped
BSRW8A8Linear  the BSR indices, ``values`` (nnz, 32, 32) int8, and   ``kernels.bsr_w8a8_matmul_parts``:
               W8A8Linear's ``w_scale`` / ``act_scale`` /           W8A8 with absent blocks
               ``input_smoothing``                                  skipped
=============  ===================================================  ================================

``W8A8BlockLinear`` needs no padding (the kernels mask a last partial block). Linked into an MLP chain by
:func:`compress.nn.block_chain.link_block_chains`, an up-projection writes ``gelu`` of its output as int8
+ 1 x 128 scales (``chain_head``) and the down-projection reads them (``chain_tail``) without a float
round trip.

``BSRW8A8Linear`` serves a layer both pruned into blocks and quantized to W8A8: it holds exactly the
int8 weight and scales ``W8A8Linear`` would, minus the absent blocks, and computes the same output.

``bias`` (N,) is a buffer in the model dtype. ``weight`` is no weight: an empty tensor in the model
dtype on the module's device (a non-persistent buffer, never saved), for model code that asks
``layer.weight.dtype`` or ``.device``. Scales and indices must keep their dtype when the
model is cast (``model.half().cuda()`` after export): :class:`compress.core.float32.Float32Buffers` lets
a cast move the ``float32`` buffers to another device but never changes their dtype, while ``bias`` and
BSR ``values`` follow the model dtype.

On CUDA inputs in fp16/bf16 the forward calls the Triton kernels; everywhere else it calls the
pure-PyTorch reference of the same op (``kernels/reference.py``), logged once per class. Padding
(W4A16 and W8A16 with K not a multiple of the group size, or of 8) appends zero input channels to the
weight and to ``x``, so the result is exact.

How the kernels are called. In eager mode (e.g. ``model.generate`` as most users run it) a forward
must cost little host time, since a decode step calls every linear layer once with a few rows. The
first kernel call binds the op to the module's buffers (``compress_kernels.bind_<op>``: every
argument validated once) and keeps that call; later calls check only ``x`` (dtype, device, K) and
launch without the custom op's dispatch. The bound call is kept while the buffers passed are the same
tensor objects and ``x`` keeps its dtype and device; a cast or move (``_apply``) drops it, and so do
pickling and ``deepcopy`` (it is a cache, not state). In-place changes of buffer values
(``load_state_dict``) need no rebinding: the call holds the buffers themselves. A buffer whose dtype
differs from ``x``'s (``bias`` and BSR ``values`` when the module was not cast to x's dtype) is
converted once and the copy kept until the buffer is replaced or changed in place. While
``torch.compile`` traces, the forward calls the public launchers instead (validated at trace time,
their ``torch.library`` custom ops in the graph).

BSR index *values* are checked where they come in (``check_indices()``: :func:`compress.load_compressed`
runs it on every block-sparse layer; ``from_float`` builds valid ones), so the forwards pass
``check_indices=False`` and launch without a host synchronisation.
"""
from __future__ import annotations

import logging
import math

import torch
import torch.nn.functional as F
from torch import nn

from compress import _kernels
from compress.configs import BlockSparseConfig, W4A16Config, W8A8BlockConfig, W8A8Config, W8A16Config
from compress.core.block_quant import dequantize_weight_blocks, quantize_weight_blocks
from compress.core.float32 import Float32Buffers
from compress.core.quant import (
    INT8_QMAX,
    dequantize_groupwise,
    dequantize_per_channel,
    pack_int4,
    quantize_groupwise,
    quantize_per_channel,
    unpack_int4,
)
from compress.core.sparsity import bsr_to_dense, check_bsr_shape, dense_to_bsr

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

    def __init__(self, in_features: int, out_features: int, bias: bool):
        super().__init__()
        for name, value in (("in_features", in_features), ("out_features", out_features)):
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name}: expected a positive int, got {value!r}")
        self.in_features, self.out_features = in_features, out_features
        self.register_buffer("bias", torch.zeros(out_features) if bias else None)
        self.register_buffer("compute_dtype_marker", torch.empty(0), persistent=False)

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

    def _kernel(self, op: str, x: torch.Tensor, *args, padded_features: int | None = None,
                **public_kwargs) -> torch.Tensor:
        """``compress_kernels.<op>(x, *args)``: while torch.compile traces, the public launcher (with
        ``public_kwargs``); in eager mode the call ``bind_<op>`` bound to ``args`` (module docstring).
        ``padded_features``: the K the op takes when larger than ``in_features`` (x gets zero channels)."""
        if torch.compiler.is_compiling():
            x = _pad_inputs(x, self.in_features, padded_features or self.in_features)
            return _kernels.launcher(op)(x, *args, **public_kwargs)
        key = (x.dtype, x.get_device())
        call = self._kept(op, key, args) or self._keep(op, key, args, self._bind(op, x, args, padded_features))
        return call(x)

    def _bind(self, op: str, x: torch.Tensor, args: tuple, padded_features: int | None):
        """``bind_<op>`` validated against x padded to ``padded_features``, then taking unpadded inputs (a
        wrong K stays wrong after the pad, for the op's check to name)."""
        if not padded_features or padded_features == self.in_features:
            return _kernels.launcher(f"bind_{op}")(x, *args)
        padded = _pad_inputs(x, self.in_features, padded_features)
        return _kernels.launcher(f"bind_{op}")(padded, *args).padded_from(self.in_features)

    def _quantized_kernel(self, op: str, x: torch.Tensor, xq: torch.Tensor, s_x: torch.Tensor, *args) -> torch.Tensor:
        """``compress_kernels.<op>(xq, s_x, *args)`` for handed-over int8 inputs (eager mode only), bound as
        :meth:`_kernel` binds."""
        key = (x.dtype, xq.get_device())
        call = self._kept(op, key, args) or self._keep(op, key, args, _kernels.launcher(f"bind_{op}")(xq, s_x, *args))
        return call(xq, s_x)

    def _kept(self, op: str, key: tuple, args: tuple):
        """The bound call kept for ``op``, or None when there is none or ``key`` (x's dtype and CUDA device
        index) or any of ``args`` (compared by identity) changed since it was made."""
        kept = self.__dict__.get("_bound_calls", _NO_CALLS).get(op)
        return kept[2] if kept is not None and kept[0] == key and _same_objects(kept[1], args) else None

    def _keep(self, op: str, key: tuple, args: tuple, call):
        """``call``, kept for ``op`` with the ``key`` and ``args`` it was bound for."""
        self.__dict__.setdefault("_bound_calls", {})[op] = (key, args, call)
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


def _smoothed(x: torch.Tensor, input_smoothing: torch.Tensor | None) -> torch.Tensor:
    """``x / input_smoothing`` per input channel (SmoothQuant factors), in x's dtype; x without factors."""
    return x if input_smoothing is None else (x.float() / input_smoothing).to(x.dtype)


def _activation_repr(module) -> str:
    """How a W8A8 module quantizes its input: dynamic or static scale, smoothed or not."""
    mode = f"static act_scale={module.act_scale.item():.4g}" if module.config.static else "dynamic per-token"
    return mode + (", smoothed" if module.input_smoothing is not None else "")


class _TakesHandedInput:
    """W8A8 kinds: use the int8 copy of ``x`` that a linked norm / GELU already wrote
    (:mod:`compress.nn.input_quant` sets ``input_source``; dynamic scales without smoothing only)."""

    def _handed_input(self, x: torch.Tensor):
        """``(xq (M, K) int8, s_x (M,) float32)`` for exactly this ``x``, or None: quantize it here."""
        if torch.compiler.is_compiling():
            return None
        source = self.__dict__.get("input_source")
        if source is None or self.config.static or self._buffers["input_smoothing"] is not None:
            return None
        return source.quantized(x)


class W8A8Linear(_TakesHandedInput, _InferenceLinear):
    """int8 weights per output channel, int8 activations per token (dynamic) or static."""

    _float32_buffers = ("w_scale", "act_scale", "input_smoothing")

    def __init__(self, in_features: int, out_features: int, bias: bool = True, config: W8A8Config | None = None,
                 smoothing: bool = False):
        super().__init__(in_features, out_features, bias)
        self.config = config or W8A8Config()
        if not isinstance(self.config, W8A8Config):
            raise TypeError(f"config: expected W8A8Config, got {type(self.config).__name__}")
        self.register_buffer("w_q", torch.zeros(out_features, in_features, dtype=torch.int8))
        self.register_buffer("w_scale", torch.ones(out_features))
        self.register_buffer("act_scale", torch.ones(()) if self.config.static else None)
        self.register_buffer("input_smoothing", torch.ones(in_features) if smoothing else None)

    @classmethod
    def from_float(cls, linear: nn.Linear, config: W8A8Config | None = None, *, weight: torch.Tensor | None = None,
                   weight_scale: torch.Tensor | None = None, act_scale: torch.Tensor | None = None,
                   input_smoothing: torch.Tensor | None = None) -> "W8A8Linear":
        """Quantize ``linear`` (or the given effective ``weight``, e.g. masked) per output channel."""
        config = config or W8A8Config()
        if config.static and act_scale is None:
            raise ValueError("W8A8Linear.from_float: a static config needs a calibrated act_scale; calibrate first")
        module = cls(linear.in_features, linear.out_features, linear.bias is not None, config,
                     smoothing=input_smoothing is not None)
        source = linear.weight if weight is None else weight
        w_q, w_scale = quantize_per_channel(source.detach(), weight_scale)
        module.w_q.copy_(w_q)
        module.w_scale.copy_(w_scale)
        if config.static:
            module.act_scale.copy_(act_scale.detach().float().reshape(()))
        if input_smoothing is not None:
            module.input_smoothing.copy_(input_smoothing.detach().float())
        cls._copy_float_state(module, linear)
        return module.to(source.device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        handed = self._handed_input(x)
        if handed is not None:
            return self._matmul_quantized(x, *handed)
        b = self._buffers  # read directly in the forwards: nn.Module.__getattr__ costs about 1 us a buffer
        x = _smoothed(x, b["input_smoothing"])
        if self._use_kernel(x):
            return self._kernel("w8a8_matmul", x, b["w_q"], b["w_scale"], self._bias_for(x), b["act_scale"])
        return _kernels.reference.w8a8_matmul_ref(x, self.w_q, self.w_scale, self.bias, self.act_scale)

    def _matmul_quantized(self, x, xq, s_x) -> torch.Tensor:
        if self._use_kernel(x):
            b = self._buffers
            y = self._quantized_kernel("w8a8_matmul_quantized", x, xq, s_x, b["w_q"], b["w_scale"], self._bias_for(x),
                                       x.dtype)
        else:
            y = _kernels.reference.w8a8_matmul_quantized_ref(xq, s_x, self.w_q, self.w_scale, self.bias, x.dtype)
        return y.reshape(*x.shape[:-1], self.out_features)

    def dequantized_weight(self) -> torch.Tensor:
        """(N, K) float32 ``w_q * w_scale`` (smoothing factors folded back out)."""
        w = dequantize_per_channel(self.w_q, self.w_scale)
        return w if self.input_smoothing is None else w / self.input_smoothing

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"{_activation_repr(self)}")


def padded_in_features(in_features: int, group_size: int | None) -> tuple[int, int]:
    """(Kp, G): K padded to a multiple of 8 and of the group size; G = Kp for per-channel."""
    if group_size is None:
        padded = -(-in_features // 8) * 8
        return padded, padded
    step = math.lcm(group_size, 8)
    return -(-in_features // step) * step, group_size


class W4A16Linear(_InferenceLinear):
    """int4 weights with group-wise scales, fp16/bf16 activations."""

    _float32_buffers = ("scales",)

    def __init__(self, in_features: int, out_features: int, bias: bool = True, config: W4A16Config | None = None):
        super().__init__(in_features, out_features, bias)
        self.config = config or W4A16Config()
        if not isinstance(self.config, W4A16Config):
            raise TypeError(f"config: expected W4A16Config, got {type(self.config).__name__}")
        self.padded_in_features, self.group_size = padded_in_features(in_features, self.config.group_size)
        self.register_buffer("qweight", torch.zeros(self.padded_in_features // 8, out_features, dtype=torch.int32))
        self.register_buffer("scales", torch.ones(self.padded_in_features // self.group_size, out_features))

    @classmethod
    def from_float(cls, linear: nn.Linear, config: W4A16Config | None = None, *, weight: torch.Tensor | None = None,
                   weight_scale: torch.Tensor | None = None) -> "W4A16Linear":
        """Quantize ``linear`` (or ``weight``) to int4; ``weight_scale`` (N, Kp/G) e.g. learned by LSQ."""
        config = config or W4A16Config()
        module = cls(linear.in_features, linear.out_features, linear.bias is not None, config)
        source = (linear.weight if weight is None else weight).detach().float()
        pad = module.padded_in_features - module.in_features
        if pad:
            logger.info("W4A16Linear: K=%d padded to %d (group size %d) with zero channels",
                        module.in_features, module.padded_in_features, module.group_size)
            source = F.pad(source, (0, pad))
        q, scale = quantize_groupwise(source, module.group_size, weight_scale)  # (N, Kp), (N, Kp/G)
        module.qweight.copy_(pack_int4(q.T.contiguous()))
        module.scales.copy_(scale.T)
        cls._copy_float_state(module, linear)
        return module.to(source.device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._use_kernel(x):
            b = self._buffers
            return self._kernel("w4a16_matmul", x, b["qweight"], b["scales"], self.group_size, self._bias_for(x),
                                padded_features=self.padded_in_features)
        x = _pad_inputs(x, self.in_features, self.padded_in_features)
        return _kernels.reference.w4a16_matmul_ref(x, self.qweight, self.scales, self.group_size, self.bias)

    def dequantized_weight(self) -> torch.Tensor:
        """(N, K) float32 dequantized weight (padding removed)."""
        q = unpack_int4(self.qweight).T  # (N, Kp)
        return dequantize_groupwise(q, self.scales.T, self.group_size)[:, : self.in_features]

    def extra_repr(self) -> str:
        pad = f", padded_in_features={self.padded_in_features}" if self.padded_in_features != self.in_features else ""
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"group_size={self.group_size}{pad}")


class W8A16Linear(_InferenceLinear):
    """int8 weights with one scale per output channel (or per group of 128 input channels), fp16/bf16
    activations."""

    _float32_buffers = ("w_scale",)

    def __init__(self, in_features: int, out_features: int, bias: bool = True, config: W8A16Config | None = None):
        super().__init__(in_features, out_features, bias)
        self.config = config or W8A16Config()
        if not isinstance(self.config, W8A16Config):
            raise TypeError(f"config: expected W8A16Config, got {type(self.config).__name__}")
        self.padded_in_features, group_size = padded_in_features(in_features, self.config.group_size)
        self.register_buffer("w_q", torch.zeros(out_features, self.padded_in_features, dtype=torch.int8))
        groups = () if self.config.group_size is None else (self.padded_in_features // group_size,)
        self.register_buffer("w_scale", torch.ones(out_features, *groups))  # (N,) or (N, Kp/128)

    @classmethod
    def from_float(cls, linear: nn.Linear, config: W8A16Config | None = None, *, weight: torch.Tensor | None = None,
                   weight_scale: torch.Tensor | None = None) -> "W8A16Linear":
        """Quantize ``linear`` (or ``weight``) to int8; ``weight_scale`` (N,) or (N, Kp/128), e.g. learned by
        LSQ or chosen by GPTQ."""
        config = config or W8A16Config()
        module = cls(linear.in_features, linear.out_features, linear.bias is not None, config)
        source = F.pad((linear.weight if weight is None else weight).detach().float(),
                       (0, module.padded_in_features - module.in_features))
        if config.group_size is None:
            w_q, scale = quantize_per_channel(source, weight_scale)
        else:
            w_q, scale = quantize_groupwise(source, config.group_size, weight_scale, qmax=INT8_QMAX)
        module.w_q.copy_(w_q)
        module.w_scale.copy_(scale)
        cls._copy_float_state(module, linear)
        return module.to(source.device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._use_kernel(x):
            b = self._buffers
            return self._kernel("w8a16_matmul", x, b["w_q"], b["w_scale"], self._bias_for(x),
                                padded_features=self.padded_in_features)
        x = _pad_inputs(x, self.in_features, self.padded_in_features)
        return _kernels.reference.w8a16_matmul_ref(x, self.w_q, self.w_scale, self.bias)

    def dequantized_weight(self) -> torch.Tensor:
        """(N, K) float32 ``w_q * w_scale`` (padding removed)."""
        return _kernels.reference.dequantize_int8(self.w_q, self.w_scale)[:, : self.in_features]

    def extra_repr(self) -> str:
        scales = "per channel" if self.config.group_size is None else f"group_size={self.config.group_size}"
        pad = f", padded_in_features={self.padded_in_features}" if self.padded_in_features != self.in_features else ""
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"int8 weights {scales}{pad}")


class W8A8BlockLinear(_InferenceLinear):
    """Block-scaled int8 weights (one scale per 128 x 128 block), int8 activations (one dynamic scale per
    token and 128 channels)."""

    _float32_buffers = ("w_scale",)

    def __init__(self, in_features: int, out_features: int, bias: bool = True, config: W8A8BlockConfig | None = None):
        super().__init__(in_features, out_features, bias)
        self.config = config or W8A8BlockConfig()
        if not isinstance(self.config, W8A8BlockConfig):
            raise TypeError(f"config: expected W8A8BlockConfig, got {type(self.config).__name__}")
        block = self.config.block
        self.register_buffer("w_q", torch.zeros(out_features, in_features, dtype=torch.int8))
        self.register_buffer("w_scale", torch.ones(-(-out_features // block), -(-in_features // block)))

    @classmethod
    def from_float(cls, linear: nn.Linear, config: W8A8BlockConfig | None = None, *,
                   weight: torch.Tensor | None = None, weight_scale: torch.Tensor | None = None) -> "W8A8BlockLinear":
        """Quantize ``linear`` (or ``weight``, e.g. masked) in 128 x 128 blocks; ``weight_scale`` e.g. learned by LSQ."""
        module = cls(linear.in_features, linear.out_features, linear.bias is not None, config)
        source = (linear.weight if weight is None else weight).detach().float()
        w_q, scale = quantize_weight_blocks(source, weight_scale)
        module.w_q.copy_(w_q)
        module.w_scale.copy_(scale)
        cls._copy_float_state(module, linear)
        return module.to(source.device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not torch.compiler.is_compiling():  # an MLP chain hands int8 over (compress.nn.block_chain)
            tail = self.__dict__.get("chain_tail")
            handed = tail.quantized(x) if tail is not None else None
            if handed is not None:
                return self.matmul_quantized(x, *handed)
            head = self.__dict__.get("chain_head")
            if head is not None:
                return head.start(self, x)
        if self._use_kernel(x):
            b = self._buffers
            return self._kernel("w8a8_block_matmul", x, b["w_q"], b["w_scale"], self._bias_for(x))
        return _kernels.reference.w8a8_block_matmul_ref(x, self.w_q, self.w_scale, self.bias)

    def gelu_int8_output(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(yq (M, N) int8, s_y (M, ceil(N/128)))``: the exact GELU of this layer's output (rounded to x's
        dtype), quantized in 1 x 128 blocks (the next block-scaled layer's input), never written in float."""
        if self._use_kernel(x):
            b = self._buffers
            op, key = "w8a8_block_matmul_int8", (x.dtype, x.get_device())
            args = (b["w_q"], b["w_scale"], self._bias_for(x))
            call = self._kept(op, key, args) or self._keep(
                op, key, args, _kernels.launcher(f"bind_{op}")(x, *args, gelu=True))
            return call(x)
        return _kernels.reference.w8a8_block_matmul_ref(x, self.w_q, self.w_scale, self.bias, gelu=True,
                                                         out_dtype=torch.int8)

    def matmul_quantized(self, x: torch.Tensor, xq: torch.Tensor, s_x: torch.Tensor) -> torch.Tensor:
        """This layer on ``xq`` (M, K) int8 and ``s_x`` (M, ceil(K/128)) handed over for ``x``: (..., N) in x's dtype."""
        if self._use_kernel(x):
            b = self._buffers
            y = self._quantized_kernel("w8a8_block_matmul_quantized", x, xq, s_x, b["w_q"], b["w_scale"],
                                       self._bias_for(x), x.dtype)
        else:
            y = _kernels.reference.w8a8_block_matmul_quantized_ref(xq, s_x, self.w_q, self.w_scale, self.bias,
                                                                   out_dtype=x.dtype)
        return y.reshape(*x.shape[:-1], self.out_features)

    def dequantized_weight(self) -> torch.Tensor:
        """(N, K) float32 ``w_q * w_scale`` of each block."""
        return dequantize_weight_blocks(self.w_q, self.w_scale)

    def extra_repr(self) -> str:
        chain = "".join(f", {role}" for role in ("chain_head", "chain_tail") if self.__dict__.get(role) is not None)
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"int8 {self.config.block}x{self.config.block} weight blocks, 1x{self.config.block} activation "
                f"blocks{chain}")


class _BlockSparseIndices:
    """The BSR index check shared by the block-sparse modules: their forwards pass
    ``check_indices=False`` to the launchers, so indices are checked once, where they come in."""

    def check_indices(self) -> None:
        """ValueError unless ``crow_indices`` / ``col_indices`` hold the ``torch.sparse_bsr`` invariants
        (crow from 0 to nnz, non-decreasing; block columns in range and increasing within a row)."""
        if tuple(self.crow_indices.shape) != (self.out_features // self.block + 1,):
            raise ValueError(f"crow_indices: expected shape ({self.out_features // self.block + 1},), "
                             f"got {tuple(self.crow_indices.shape)}")
        if self.values.shape[0] != self.col_indices.shape[0]:
            raise ValueError(f"values: expected {self.col_indices.shape[0]} blocks (one per col_indices entry), "
                             f"got {self.values.shape[0]}")
        _kernels.check_bsr_indices(self.crow_indices, self.col_indices, self.in_features // self.block)


class BSRLinear(_BlockSparseIndices, _InferenceLinear):
    """Block-sparse weight (32x32 BSR) in the model dtype; dense activations."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, nnz: int = 0, block: int = 32):
        super().__init__(in_features, out_features, bias)
        check_bsr_shape((out_features, in_features), block)
        self.block = block
        self.register_buffer("crow_indices", torch.zeros(out_features // block + 1, dtype=torch.int32))
        self.register_buffer("col_indices", torch.zeros(nnz, dtype=torch.int32))
        self.register_buffer("values", torch.zeros(nnz, block, block))

    @classmethod
    def from_float(cls, linear: nn.Linear, config: BlockSparseConfig | None = None, *,
                   weight: torch.Tensor | None = None, mask: torch.Tensor | None = None) -> "BSRLinear":
        """Store the blocks of ``linear`` (or ``weight``) that ``mask`` keeps (or that are non-zero)."""
        block = (config or BlockSparseConfig()).block
        source = (linear.weight if weight is None else weight).detach()
        crow, col, values = dense_to_bsr(source, block, mask)
        module = cls(linear.in_features, linear.out_features, linear.bias is not None, col.numel(), block)
        module.crow_indices, module.col_indices, module.values = crow, col, values.clone()
        cls._copy_float_state(module, linear)
        return module.to(source.device)

    @property
    def nnz(self) -> int:
        return self.col_indices.numel()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._use_kernel(x):
            b = self._buffers
            values = self._in_dtype("values", b["values"], x.dtype)
            return self._kernel("bsr_matmul_parts", x, b["crow_indices"], b["col_indices"], values, self.out_features,
                                self._bias_for(x), check_indices=False)
        return _kernels.reference.bsr_matmul_ref(x, self.crow_indices, self.col_indices, self.values,
                                                  self.out_features, self.bias)

    def dequantized_weight(self) -> torch.Tensor:
        """(N, K) dense weight, absent blocks zero."""
        return bsr_to_dense(self.crow_indices, self.col_indices, self.values, (self.out_features, self.in_features))

    def extra_repr(self) -> str:
        total = (self.out_features // self.block) * (self.in_features // self.block)
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"block={self.block}, nnz_blocks={self.nnz}/{total}")


class BSRW8A8Linear(_BlockSparseIndices, _TakesHandedInput, _InferenceLinear):
    """Block-sparse (32x32 BSR) int8 weight per output channel, int8 activations per token (dynamic) or static."""

    _float32_buffers = ("w_scale", "act_scale", "input_smoothing")

    def __init__(self, in_features: int, out_features: int, bias: bool = True, config: W8A8Config | None = None,
                 nnz: int = 0, block: int = 32, smoothing: bool = False):
        super().__init__(in_features, out_features, bias)
        check_bsr_shape((out_features, in_features), block)
        self.config = config or W8A8Config()
        if not isinstance(self.config, W8A8Config):
            raise TypeError(f"config: expected W8A8Config, got {type(self.config).__name__}")
        self.block = block
        self.register_buffer("crow_indices", torch.zeros(out_features // block + 1, dtype=torch.int32))
        self.register_buffer("col_indices", torch.zeros(nnz, dtype=torch.int32))
        self.register_buffer("values", torch.zeros(nnz, block, block, dtype=torch.int8))
        self.register_buffer("w_scale", torch.ones(out_features))
        self.register_buffer("act_scale", torch.ones(()) if self.config.static else None)
        self.register_buffer("input_smoothing", torch.ones(in_features) if smoothing else None)

    @classmethod
    def from_float(cls, linear: nn.Linear, config: W8A8Config | None = None, sparse: BlockSparseConfig | None = None,
                   *, weight: torch.Tensor | None = None, mask: torch.Tensor | None = None,
                   weight_scale: torch.Tensor | None = None, act_scale: torch.Tensor | None = None,
                   input_smoothing: torch.Tensor | None = None) -> "BSRW8A8Linear":
        """Quantize as :meth:`W8A8Linear.from_float` does, then keep the blocks ``mask`` keeps (or the non-zero ones)."""
        dense = W8A8Linear.from_float(linear, config, weight=weight, weight_scale=weight_scale, act_scale=act_scale,
                                      input_smoothing=input_smoothing)
        return cls.from_w8a8(dense, (sparse or BlockSparseConfig()).block, mask)

    @classmethod
    def from_w8a8(cls, dense: W8A8Linear, block: int = 32, mask: torch.Tensor | None = None) -> "BSRW8A8Linear":
        """The same int8 weight and scales as ``dense``, its absent blocks dropped."""
        crow, col, values = dense_to_bsr(dense.w_q, block, mask)
        module = cls(dense.in_features, dense.out_features, dense.bias is not None, dense.config, col.numel(), block,
                     smoothing=dense.input_smoothing is not None).to(dense.w_q.device)
        module.crow_indices, module.col_indices, module.values = crow, col, values
        module.w_scale = dense.w_scale.clone()
        for name in ("act_scale", "input_smoothing", "bias"):
            if getattr(dense, name) is not None:
                setattr(module, name, getattr(dense, name).clone())
        module.compute_dtype_marker = dense.weight.new_empty(0)
        return module

    @property
    def nnz(self) -> int:
        return self.col_indices.numel()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        handed = self._handed_input(x)
        if handed is not None:
            return self._matmul_quantized(x, *handed)
        b = self._buffers
        x = _smoothed(x, b["input_smoothing"])
        parts = (b["crow_indices"], b["col_indices"], b["values"], b["w_scale"], self.out_features)
        if self._use_kernel(x):
            return self._kernel("bsr_w8a8_matmul_parts", x, *parts, self._bias_for(x), b["act_scale"],
                                check_indices=False)
        return _kernels.reference.bsr_w8a8_matmul_ref(x, *parts, self.bias, self.act_scale)

    def _matmul_quantized(self, x, xq, s_x) -> torch.Tensor:
        parts = (self.crow_indices, self.col_indices, self.values, self.w_scale, self.out_features)
        if self._use_kernel(x):
            y = self._quantized_kernel("bsr_w8a8_matmul_quantized", x, xq, s_x, *parts, self._bias_for(x), x.dtype)
        else:
            y = _kernels.reference.bsr_w8a8_matmul_quantized_ref(xq, s_x, *parts, self.bias, x.dtype)
        return y.reshape(*x.shape[:-1], self.out_features)

    def dequantized_weight(self) -> torch.Tensor:
        """(N, K) float32 ``w_q * w_scale``, absent blocks zero (smoothing factors folded back out)."""
        w_q = bsr_to_dense(self.crow_indices, self.col_indices, self.values, (self.out_features, self.in_features))
        w = dequantize_per_channel(w_q, self.w_scale)
        return w if self.input_smoothing is None else w / self.input_smoothing

    def extra_repr(self) -> str:
        total = (self.out_features // self.block) * (self.in_features // self.block)
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"block={self.block}, nnz_blocks={self.nnz}/{total}, {_activation_repr(self)}")


INFERENCE_MODULES = {cls.__name__: cls for cls in (W8A8Linear, W4A16Linear, W8A16Linear, W8A8BlockLinear, BSRLinear,
                                                   BSRW8A8Linear)}


def to_float(module: _InferenceLinear) -> nn.Linear:
    """A plain ``nn.Linear`` with the module's dequantized weight (float32) and bias."""
    linear = nn.Linear(module.in_features, module.out_features, bias=module.bias is not None)
    with torch.no_grad():
        linear.weight.copy_(module.dequantized_weight())
        if module.bias is not None:
            linear.bias.copy_(module.bias.float())
    return linear


def is_inference_module(module: nn.Module) -> bool:
    """True for the inference modules of this file (:data:`INFERENCE_MODULES`, kernel-backed)."""
    return isinstance(module, tuple(INFERENCE_MODULES.values()))
