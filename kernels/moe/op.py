"""Grouped MoE experts: one launch per projection for all experts, routing on the device, custom ops.

A ``transformers`` fused-experts layer (Mixtral, Qwen-MoE, OLMoE, DeepSeek, ...) computes, for token t
and its k experts ``topk_ids[t]`` with weights ``topk_weights[t]``::

    out[t] = sum_j topk_weights[t, j] * down_e(SwiGLU(gate_up_e(x[t])))          e = topk_ids[t, j]

with ``gate_up_e`` (2I, H) (gate rows first, then up) and ``down_e`` (H, I) compressed like the dense
layers (the contract: ``reference.moe_w4a16_ref``, ``moe_w8a8_ref``, ``moe_w8a16_ref``). A call is four
to six launches whatever the number of experts hit, with no host synchronisation, so it captures in a
CUDA graph and compiles whole:

1. routing (:mod:`~compress_kernels.moe.routing`): the T k (token, slot) pairs sorted by expert, each
   expert's rows padded to BLOCK_M;
2. (W8A8) x quantized per token (:func:`compress_kernels.common.quantize.quantize_rows`);
3. gate/up for every expert (:mod:`~compress_kernels.moe.w4a16` or, one row per program,
   :mod:`~compress_kernels.moe.w4a16_fma`; :mod:`~.w8a8`, :mod:`~.w8a16`) with the SwiGLU in its epilogue,
   into an activation buffer (blocks x BLOCK_M, I) in x's dtype;
4. (W8A8) the activation quantized per routed row (:func:`compress_kernels.moe.w8a8.quantize_routed_rows`);
5. down for every expert, fp32 partials (SPLIT_K, T k, H);
6. the top-k weighted sum into (T, H) in x's dtype (:mod:`~compress_kernels.moe.combine`).

Weights are the per-expert inference modules' buffers stacked over experts (E first), so a checkpoint's
numbers are unchanged; K may be padded as those modules pad it (x then meets zero weights)::

    W4A16  gate_up_qweight (E, Kh/8, 2I) int32, gate_up_scales (E, Kh/G, 2I); down_qweight (E, Ki/8, H),
           down_scales (E, Ki/G, H); fp32 or x's dtype; G in {32, 64, 128} or Kh / Ki (per channel),
           read from the shapes; Kh = H padded to a multiple of 8 and G, Ki = I likewise
    W8A8   gate_up_w_q (E, 2I, H) int8, gate_up_w_scale (E, 2I) fp32; down_w_q (E, H, I), down_w_scale (E, H)
    W8A16  gate_up_w_q (E, 2I, Kh) int8, gate_up_w_scale (E, 2I) or (E, 2I, Kh/128), fp32 or x's dtype;
           down likewise over Ki; Kh = H padded to a multiple of 8 (of 128 with groups)

x (T, H) fp16 / bf16; ``topk_ids`` (T, k) int32 / int64, an id outside [0, E) adds nothing (``transformers``'
expert-parallel sentinel); ``topk_weights`` (T, k) any float dtype. ``moe_<scheme>`` validates and calls the
custom op ``torch.ops.compress_kernels.moe_experts`` (the scheme its first argument; with a fake implementation
for ``torch.compile``);
``bind_moe_<scheme>`` validates once and returns a :class:`BoundMoE`, which checks only the per-call inputs
and in eager mode launches directly, through launch plans (:mod:`compress_kernels.common.plans`).
"""
from __future__ import annotations

import torch

from compress_kernels.common.bound import launches_directly
from compress_kernels.common.checks import check_activation, check_same_device, check_shape, check_tensor
from compress_kernels.common.plans import LaunchPlans
from compress_kernels.common.quantize import quantize_rows
from compress_kernels.moe.combine import combine_topk
from compress_kernels.moe.dispatch import MoeConfig, cached_pick
from compress_kernels.moe.routing import route_pairs
from compress_kernels.moe.w4a16 import launch_w4a16
from compress_kernels.moe.w4a16_fma import launch_w4a16_fma
from compress_kernels.moe.w8a8 import launch_w8a8, quantize_routed_rows
from compress_kernels.moe.w8a16 import launch_w8a16
from compress_kernels.reference import W8A16_GROUP_SIZE

W4A16_GROUP_SIZES = (32, 64, 128)
WEIGHT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def _validate_routing(x, topk_ids, topk_weights) -> None:
    check_activation(x)
    if x.dim() != 2 or x.shape[1] == 0:
        raise ValueError(f"x: expected shape (T, H) with H >= 1, got {tuple(x.shape)}")
    check_tensor("topk_ids", topk_ids, (torch.int32, torch.int64), ndim=2)
    if topk_ids.shape[0] != x.shape[0] or topk_ids.shape[1] == 0:
        raise ValueError(f"topk_ids: expected shape ({x.shape[0]}, k) with k >= 1 (one row per token of x), got "
                         f"{tuple(topk_ids.shape)}")
    check_tensor("topk_weights", topk_weights, WEIGHT_DTYPES, ndim=2)
    check_shape("topk_weights", topk_weights, tuple(topk_ids.shape))
    check_same_device(x, topk_ids=topk_ids, topk_weights=topk_weights)


def _fused_gate_up(name: str, weight, n_dim: int) -> tuple[int, int]:
    """(E, I) of a fused gate/up weight whose dim ``n_dim`` holds 2I outputs."""
    experts, two_i = weight.shape[0], weight.shape[n_dim]
    if experts == 0 or two_i == 0 or two_i % 2:
        raise ValueError(f"{name}: expected at least one expert and an even number 2I > 0 of gate/up outputs "
                         f"(gate rows, then up rows), got shape {tuple(weight.shape)}")
    return experts, two_i // 2


def _check_int4(prefix: str, qweight, scales, experts: int, n: int, k: int, x) -> None:
    """``{prefix}_qweight`` (E, Kp/8, N) int32 and ``{prefix}_scales`` (E, Kp/G, N), K padded as W4A16Linear pads it."""
    check_tensor(f"{prefix}_qweight", qweight, (torch.int32,), ndim=3)
    kp = qweight.shape[1] * 8
    check_shape(f"{prefix}_qweight", qweight, (experts, kp // 8, n))
    check_tensor(f"{prefix}_scales", scales, (torch.float32, x.dtype), ndim=3)
    groups = scales.shape[1]
    group = kp // groups if groups and kp % groups == 0 else 0
    per_channel = group == kp and kp == _round_up(k, 8)
    grouped = group in W4A16_GROUP_SIZES and kp == _round_up(k, group)
    if not (per_channel or grouped):
        raise ValueError(f"{prefix}_scales: expected one row per 32, 64 or 128 input channels of K = {k} padded to "
                         f"a multiple of the group (or one row, per channel, K padded to a multiple of 8), got "
                         f"{groups} rows for {prefix}_qweight's {kp} channels")
    check_shape(f"{prefix}_scales", scales, (experts, groups, n))
    check_same_device(x, **{f"{prefix}_qweight": qweight, f"{prefix}_scales": scales})


def _check_int8(prefix: str, w_q, w_scale, experts: int, n: int, k: int, x, weight_only: bool) -> None:
    """``{prefix}_w_q`` (E, N, Kp) int8 and ``{prefix}_w_scale`` (E, N) (W8A16 also (E, N, Kp/128))."""
    check_tensor(f"{prefix}_w_q", w_q, (torch.int8,), ndim=3)
    kp = w_q.shape[2]
    check_tensor(f"{prefix}_w_scale", w_scale, (torch.float32, x.dtype) if weight_only else (torch.float32,))
    grouped = weight_only and w_scale.dim() == 3
    if not weight_only:
        want_k = k
    else:
        want_k = _round_up(k, W8A16_GROUP_SIZE if grouped else 8)
    check_shape(f"{prefix}_w_q", w_q, (experts, n, want_k))
    check_shape(f"{prefix}_w_scale", w_scale, (experts, n, kp // W8A16_GROUP_SIZE) if grouped else (experts, n))
    check_same_device(x, **{f"{prefix}_w_q": w_q, f"{prefix}_w_scale": w_scale})


def _validate_w4a16(x, topk_ids, topk_weights, gate_up_qweight, gate_up_scales, down_qweight, down_scales) -> None:
    _validate_routing(x, topk_ids, topk_weights)
    check_tensor("gate_up_qweight", gate_up_qweight, (torch.int32,), ndim=3)
    experts, inter = _fused_gate_up("gate_up_qweight", gate_up_qweight, 2)
    _check_int4("gate_up", gate_up_qweight, gate_up_scales, experts, 2 * inter, x.shape[1], x)
    _check_int4("down", down_qweight, down_scales, experts, x.shape[1], inter, x)


def _validate_int8(x, topk_ids, topk_weights, gate_up_w_q, gate_up_w_scale, down_w_q, down_w_scale,
                   weight_only: bool) -> None:
    _validate_routing(x, topk_ids, topk_weights)
    check_tensor("gate_up_w_q", gate_up_w_q, (torch.int8,), ndim=3)
    experts, inter = _fused_gate_up("gate_up_w_q", gate_up_w_q, 1)
    _check_int8("gate_up", gate_up_w_q, gate_up_w_scale, experts, 2 * inter, x.shape[1], x, weight_only)
    _check_int8("down", down_w_q, down_w_scale, experts, x.shape[1], inter, x, weight_only)


def _groups(scheme: str, gate_up_scales, down_scales, gate_up_k: int, down_k: int) -> tuple[int, int]:
    """The dispatch's scale groups of the two projections (W4A16: G; W8A16: 128 or 0; W8A8: 0)."""
    if scheme == "w4a16":
        return gate_up_k // gate_up_scales.shape[1], down_k // down_scales.shape[1]
    if scheme == "w8a16":
        return (W8A16_GROUP_SIZE if gate_up_scales.dim() == 3 else 0), (W8A16_GROUP_SIZE if down_scales.dim() == 3
                                                                         else 0)
    return 0, 0


def launch(scheme: str, x, topk_ids, topk_weights, weights: tuple, config: MoeConfig | None = None) -> torch.Tensor:
    """The grouped layer (module docstring) on validated inputs: (T, H) in x's dtype. ``weights``: the
    scheme's (gate_up, gate_up scales, down, down scales); ``config``: the tiles (else the dispatch's)."""
    tokens, hidden = x.shape
    out = torch.empty((tokens, hidden), dtype=x.dtype, device=x.device)
    if tokens == 0:
        return out
    gate_up, gate_up_scales, down, down_scales = weights
    top_k = topk_ids.shape[1]
    experts = gate_up.shape[0]
    if scheme == "w4a16":
        inter, gate_up_k, down_k = gate_up.shape[2] // 2, gate_up.shape[1] * 8, down.shape[1] * 8
    else:
        inter, gate_up_k, down_k = gate_up.shape[1] // 2, gate_up.shape[2], down.shape[2]
    groups = _groups(scheme, gate_up_scales, down_scales, gate_up_k, down_k)
    cfg = config or cached_pick(scheme, tokens * top_k, experts, hidden, gate_up_k, down_k, *groups, x.device)
    routing = route_pairs(topk_ids, experts, cfg.block_m)
    act = torch.empty((routing.sorted_pairs.shape[0], inter), dtype=x.dtype, device=x.device)
    partials = torch.empty((cfg.down.split_k, tokens * top_k, hidden), dtype=torch.float32, device=x.device)
    if scheme == "w4a16":
        project = launch_w4a16_fma if cfg.block_m == 1 else launch_w4a16  # one row per program, or tiles
        project(x, gate_up, gate_up_scales, act, routing, cfg.gate_up, gated=True)
        project(act, down, down_scales, partials, routing, cfg.down, gated=False)
    elif scheme == "w8a16":
        launch_w8a16(x, gate_up, gate_up_scales, act, routing, cfg.gate_up, gated=True)
        launch_w8a16(act, down, down_scales, partials, routing, cfg.down, gated=False)
    else:
        xq, s_x = quantize_rows(x)
        launch_w8a8(xq, s_x, gate_up, gate_up_scales, act, routing, cfg.gate_up, gated=True)
        aq, s_a = quantize_routed_rows(act, routing)
        launch_w8a8(aq, s_a, down, down_scales, partials, routing, cfg.down, gated=False)
    return combine_topk(partials, topk_ids, topk_weights, experts, out)


# ---- custom op -------------------------------------------------------------------------------------------
def _validate(scheme: str, x, topk_ids, topk_weights, *weights) -> None:
    """The checks of ``scheme``'s layer (ValueError on an unknown scheme)."""
    if scheme == "w4a16":
        _validate_w4a16(x, topk_ids, topk_weights, *weights)
    elif scheme in ("w8a8", "w8a16"):
        _validate_int8(x, topk_ids, topk_weights, *weights, weight_only=scheme == "w8a16")
    else:
        raise ValueError(f"scheme: expected 'w4a16', 'w8a8' or 'w8a16', got {scheme!r}")


@torch.library.custom_op("compress_kernels::moe_experts", mutates_args=())
def _moe_experts_op(scheme: str, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
                    gate_up_w: torch.Tensor, gate_up_scale: torch.Tensor, down_w: torch.Tensor,
                    down_scale: torch.Tensor) -> torch.Tensor:
    weights = (gate_up_w, gate_up_scale, down_w, down_scale)
    _validate(scheme, x, topk_ids, topk_weights, *weights)
    return launch(scheme, x, topk_ids, topk_weights, weights)


@_moe_experts_op.register_fake
def _moe_experts_fake(scheme, x, topk_ids, topk_weights, gate_up_w, gate_up_scale, down_w, down_scale):
    _validate(scheme, x, topk_ids, topk_weights, gate_up_w, gate_up_scale, down_w, down_scale)
    return x.new_empty(x.shape)


def _moe(scheme: str, x, topk_ids, topk_weights, *weights) -> torch.Tensor:
    _validate(scheme, x, topk_ids, topk_weights, *weights)
    return torch.ops.compress_kernels.moe_experts(scheme, x, topk_ids, topk_weights, *weights)


# ---- public calls -----------------------------------------------------------------------------------------
def moe_w4a16(x, topk_ids, topk_weights, gate_up_qweight, gate_up_scales, down_qweight, down_scales) -> torch.Tensor:
    """The grouped W4A16 experts layer (module docstring): x (T, H) fp16 / bf16 -> (T, H) in x's dtype."""
    return _moe("w4a16", x, topk_ids, topk_weights, gate_up_qweight, gate_up_scales, down_qweight, down_scales)


def moe_w8a8(x, topk_ids, topk_weights, gate_up_w_q, gate_up_w_scale, down_w_q, down_w_scale) -> torch.Tensor:
    """The grouped W8A8 experts layer (module docstring; dynamic per-token activation scales)."""
    return _moe("w8a8", x, topk_ids, topk_weights, gate_up_w_q, gate_up_w_scale, down_w_q, down_w_scale)


def moe_w8a16(x, topk_ids, topk_weights, gate_up_w_q, gate_up_w_scale, down_w_q, down_w_scale) -> torch.Tensor:
    """The grouped W8A16 experts layer (module docstring)."""
    return _moe("w8a16", x, topk_ids, topk_weights, gate_up_w_q, gate_up_w_scale, down_w_q, down_w_scale)


class BoundMoE:
    """``compress_kernels.moe_<scheme>(x, topk_ids, topk_weights, *weights)`` with the weights validated once, for
    inputs of x's dtype, device and H (what :class:`compress_kernels.common.bound.BoundMatmul` is to a matmul)."""

    __slots__ = ("scheme", "weights", "dtype", "device", "hidden", "plans")

    def __init__(self, scheme: str, weights: tuple, x: torch.Tensor):
        self.scheme, self.weights = scheme, weights
        self.dtype, self.device, self.hidden = x.dtype, x.device, x.shape[-1]
        self.plans = LaunchPlans(lambda x, ids, w: launch(scheme, x, ids, w, weights))

    def check(self, x, topk_ids, topk_weights) -> None:
        """TypeError / ValueError unless the inputs are of the bound dtype, device and H."""
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"x: expected a torch.Tensor, got {type(x).__name__}")
        if x.dtype != self.dtype:
            raise TypeError(f"x: expected dtype {self.dtype} (moe_{self.scheme} was bound for it), got {x.dtype}")
        if x.device != self.device:
            raise ValueError(f"x: expected device {self.device} (where moe_{self.scheme} was bound), got {x.device}")
        if x.dim() != 2 or x.shape[1] != self.hidden:
            raise ValueError(f"x: expected shape (T, {self.hidden}), got {tuple(x.shape)}")
        _validate_routing(x, topk_ids, topk_weights)

    def __call__(self, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> torch.Tensor:
        if type(x) is torch.Tensor and not x.requires_grad and not torch.compiler.is_compiling():
            y = self.plans.replay_known(x, topk_ids, topk_weights)  # input layouts checked and recorded before
            if y is not None:
                return y
        self.check(x, topk_ids, topk_weights)
        if launches_directly(x):
            return self.plans(x, topk_ids, topk_weights)
        return torch.ops.compress_kernels.moe_experts(self.scheme, x, topk_ids, topk_weights, *self.weights)


def _bind(scheme: str, x, topk_ids, topk_weights, *weights) -> BoundMoE:
    _validate(scheme, x, topk_ids, topk_weights, *weights)
    return BoundMoE(scheme, weights, x)


def bind_moe_w4a16(x, topk_ids, topk_weights, gate_up_qweight, gate_up_scales, down_qweight, down_scales) -> BoundMoE:
    """:func:`moe_w4a16` validated now, against these inputs, and bound to the weights."""
    return _bind("w4a16", x, topk_ids, topk_weights, gate_up_qweight, gate_up_scales, down_qweight, down_scales)


def bind_moe_w8a8(x, topk_ids, topk_weights, gate_up_w_q, gate_up_w_scale, down_w_q, down_w_scale) -> BoundMoE:
    """:func:`moe_w8a8` validated now, against these inputs, and bound to the weights."""
    return _bind("w8a8", x, topk_ids, topk_weights, gate_up_w_q, gate_up_w_scale, down_w_q, down_w_scale)


def bind_moe_w8a16(x, topk_ids, topk_weights, gate_up_w_q, gate_up_w_scale, down_w_q, down_w_scale) -> BoundMoE:
    """:func:`moe_w8a16` validated now, against these inputs, and bound to the weights."""
    return _bind("w8a16", x, topk_ids, topk_weights, gate_up_w_q, gate_up_w_scale, down_w_q, down_w_scale)
