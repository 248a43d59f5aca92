"""The grouped path of :class:`compress.nn.experts.QuantizedExperts`: each weight stacked over experts, one
kernel launch per projection for all of them.

When every expert layer of a block is the same kind of inference module the grouped kernels take
(:data:`GROUPED_KINDS`: ``W4A16Linear``, ``W8A8Linear`` with dynamic activation scales and no SmoothQuant
factors, ``W8A16Linear``) with one layout (group size, padding, scale dtype), no bias, all on one device,
and the block's ``act_fn`` is SiLU, the forward calls ``compress_kernels.moe_<scheme>``
(:mod:`compress_kernels.moe.op`): routing on the device, gate/up with the SwiGLU in its epilogue, down,
the top-k weighted sum; four to six launches whatever the experts hit and no host synchronisation, so
a CUDA graph captures it and ``torch.compile(fullgraph=True)`` traces it. Anything else (kinds mixed,
experts left dense or block-sparse, another activation) keeps the loop of
:func:`compress.nn.experts.route_to_experts` (:func:`grouped_problem` says why).

Memory layout. The kernels take each quantized buffer with the experts first (W4A16 ``qweight`` (E, Kp/8, 2I)
and ``scales`` (E, Kp/G, 2I) for gate/up, (E, Ki/8, H) and (E, Ki/G, H) for down; W8A8 / W8A16 ``w_q``
(E, N, K) and ``w_scale`` (E, N) or (E, N, K/128)). :func:`group_experts` stacks each buffer once and
makes every expert's own buffer the view ``stacked[e]``: the weights are held once, and the per-expert
modules, the state dict (its keys and values) and so the saved format are what they were. The stacked
tensors are non-persistent buffers of the block (:data:`GROUPED_BUFFERS`, never saved), so ``torch.compile``
and CUDA-graph trees see them as the module's static tensors. A cast or move (``_apply``) moves each
expert's view on its own, so the block re-stacks after it; so it does after ``load_state_dict`` (with
``assign=True`` the experts' buffers are replaced), and an eager forward that finds an expert's buffer
replaced (compared by identity, E x 4 checks) re-stacks before it runs.

On CUDA fp16 / bf16 inputs the forward calls the kernels (in eager mode through a call bound once to the
stacked weights, ``bind_moe_<scheme>``); elsewhere it runs the same op's pure-PyTorch reference
(``reference.moe_<scheme>_ref``, every expert on every token, no data-dependent shapes), logged once.
"""
from __future__ import annotations

import torch
from torch import nn

from compress._kernels import (bind_moe_w4a16, bind_moe_w8a8, bind_moe_w8a16, moe_w4a16, moe_w8a8, moe_w8a16,
                               reference)
from compress.nn.inference import W4A16Linear, W8A8Linear, W8A16Linear
from compress.nn.inference.base import _log_once, kernels_run

# inference module -> (scheme, its quantized buffers in the order the op takes them)
GROUPED_KINDS = {W4A16Linear: ("w4a16", ("qweight", "scales")), W8A8Linear: ("w8a8", ("w_q", "w_scale")),
                 W8A16Linear: ("w8a16", ("w_q", "w_scale"))}
GROUPED_BUFFERS = ("grouped_gate_up", "grouped_gate_up_scales", "grouped_down", "grouped_down_scales")
OPS = {"w4a16": (moe_w4a16, bind_moe_w4a16, reference.moe_w4a16_ref),
       "w8a8": (moe_w8a8, bind_moe_w8a8, reference.moe_w8a8_ref),
       "w8a16": (moe_w8a16, bind_moe_w8a16, reference.moe_w8a16_ref)}
_CACHES = ("_grouped_sources", "_bound_moe")  # the block's caches of the grouped path (dropped on regrouping)


def is_silu(act_fn: nn.Module) -> bool:
    """``act_fn`` is SiLU: ``nn.SiLU`` or ``transformers``' ``SiLUActivation`` (what ``ACT2FN["silu"]`` gives)."""
    cls = type(act_fn)
    transformers_silu = cls.__name__ == "SiLUActivation" and cls.__module__.startswith("transformers")
    return isinstance(act_fn, nn.SiLU) or transformers_silu


def _layout(module: nn.Module, names: tuple[str, str]) -> tuple:
    """What must agree between the experts of one matrix: the buffers' shapes, dtypes and device."""
    return tuple((tuple(module._buffers[n].shape), module._buffers[n].dtype, module._buffers[n].device) for n in names)


def grouped_problem(act_fn: nn.Module, gate_up: nn.ModuleList, down: nn.ModuleList) -> str | None:
    """None when the grouped kernels can run the block, else why the loop runs it."""
    kinds = {type(m) for m in (*gate_up, *down)}
    if len(kinds) != 1:
        return f"experts of several kinds ({sorted(k.__name__ for k in kinds)})"
    kind = kinds.pop()
    if kind not in GROUPED_KINDS:
        return f"{kind.__name__} experts (the grouped kernels take {sorted(k.__name__ for k in GROUPED_KINDS)})"
    if not is_silu(act_fn):
        return f"act_fn {type(act_fn).__name__} (the grouped kernels apply SiLU)"
    _, names = GROUPED_KINDS[kind]
    for matrix in (gate_up, down):
        first = _layout(matrix[0], names)
        for module in matrix:
            if module.bias is not None:
                return "expert biases"
            if kind is W8A8Linear and (module.act_scale is not None or module.input_smoothing is not None):
                return "static activation scales or SmoothQuant factors"
            if _layout(module, names) != first:
                return "experts whose buffers differ in shape, dtype or device"
    if any(b.is_meta for b in gate_up[0]._buffers.values() if b is not None):
        return "weights on the meta device"
    if _layout(gate_up[0], names)[0][2] != _layout(down[0], names)[0][2]:
        return "gate/up and down on different devices"
    return None


def _drop_grouped(block: nn.Module) -> None:
    for name in GROUPED_BUFFERS:
        block._buffers.pop(name, None)
    for name in _CACHES:
        block.__dict__.pop(name, None)
    block.grouped_scheme = None


def group_experts(block: nn.Module) -> str | None:
    """Stack ``block``'s expert buffers (module docstring) when the grouped kernels can run it; returns the
    scheme, or None (the loop runs it). Done again from scratch on every call."""
    _drop_grouped(block)
    if not getattr(block, "allow_grouped", True) or grouped_problem(block.act_fn, block.gate_up, block.down):
        return None
    scheme, names = GROUPED_KINDS[type(block.gate_up[0])]
    sources = []
    with torch.no_grad():
        for matrix, buffers in ((block.gate_up, GROUPED_BUFFERS[:2]), (block.down, GROUPED_BUFFERS[2:])):
            for name, grouped in zip(names, buffers):
                stacked = torch.stack([module._buffers[name] for module in matrix])
                for e, module in enumerate(matrix):
                    module._buffers[name] = stacked[e]
                    for cache in module._CACHES:  # bound calls and dtype copies of the replaced buffers
                        module.__dict__.pop(cache, None)
                    sources.append((module._buffers, name, module._buffers[name]))
                block.register_buffer(grouped, stacked, persistent=False)
    block.grouped_scheme = scheme
    block.__dict__["_grouped_sources"] = tuple(sources)
    return scheme


def grouped_current(block: nn.Module) -> bool:
    """True while every expert buffer is still the view :func:`group_experts` made (none was replaced)."""
    for buffers, name, tensor in block.__dict__.get("_grouped_sources", ()):  # a loop: this runs on every forward
        if buffers.get(name) is not tensor:
            return False
    return True


def grouped_forward(block: nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                    top_k_weights: torch.Tensor) -> torch.Tensor:
    """The block's forward on the grouped path: the op on CUDA fp16 / bf16 inputs, else its reference."""
    op, bind, ref = OPS[block.grouped_scheme]
    b = block._buffers
    weights = (b["grouped_gate_up"], b["grouped_gate_up_scales"], b["grouped_down"], b["grouped_down_scales"])
    if not kernels_run(hidden_states.device, hidden_states.dtype):
        x = hidden_states
        _log_once(type(block).__name__, f"input on {x.device.type}" if not x.is_cuda else f"input dtype {x.dtype}")
        return ref(hidden_states, top_k_index, top_k_weights, *weights)
    if torch.compiler.is_compiling():  # the custom op in the graph
        return op(hidden_states, top_k_index, top_k_weights, *weights)
    key = (hidden_states.dtype, hidden_states.device, weights)
    kept = block.__dict__.get("_bound_moe")
    if kept is None or kept[0][:2] != key[:2] or any(p is not q for p, q in zip(kept[0][2], weights)):
        kept = block.__dict__["_bound_moe"] = (key, bind(hidden_states, top_k_index, top_k_weights, *weights))
    return kept[1](hidden_states, top_k_index, top_k_weights)
