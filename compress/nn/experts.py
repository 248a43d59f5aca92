"""MoE experts: the fused 3-D expert weights of ``transformers`` models, compressed expert by expert.

Layout taken (``transformers`` 5.x ``@use_experts_implementation`` with its default flags: Mixtral,
OLMoE, Qwen2-MoE, Qwen3-MoE, DeepSeek-V3, ...): an experts module holds ``gate_up_proj`` (E, 2I, H)
and ``down_proj`` (E, H, I) Parameters and ``act_fn``; the tokens routed to expert ``e`` compute::

    gate, up = (x @ gate_up_proj[e].T).chunk(2, dim=-1)
    y = (act_fn(gate) * up) @ down_proj[e].T            (then * routing weight, summed over top-k)

so ``gate_up_proj[e]`` (N=2I, K=H) and ``down_proj[e]`` (N=H, K=I) are two linear layers per expert.
Other layouts (weights transposed, biases, interleaved gate/up, no gate, a post-expert norm, a custom
gating: GPT-OSS, Aria, Nemotron-H) are reported by :func:`experts_layout_problem` and left dense.

Training: :class:`CompressedExperts` keeps the original Parameters (an optimizer built before the swap
keeps working) and holds one :class:`ExpertLinear` per expert and matrix (``gate_up.<e>``,
``down.<e>``): a :class:`compress.nn.qat.CompressedLinear` whose ``weight`` is the view
``parameter[e]``, so each expert gets exactly that layer's math (fake quantization, its own
(N/32, K/32) block mask, LSQ scales) and every callback that walks ``compressed_layers`` finds it.
The masks stacked are (E, N/32, K/32) (:meth:`CompressedExperts.masks`); one gradient hook per 3-D
Parameter zeroes the gradient of every expert's pruned blocks.

Inference: :class:`QuantizedExperts` holds per-expert inference modules (``W8A8Linear``,
``W4A16Linear``, ``W8A16Linear``, ``BSRLinear``, ``BSRW8A8Linear``, ``BSRW4A16Linear``, or ``nn.Linear``
for an expert left dense), saved and loaded as such. Two paths:

* grouped (:mod:`compress.nn.grouped_experts`): when every expert of both matrices is the same W4A16, W8A8
  (dynamic) or W8A16 module with one layout and ``act_fn`` is SiLU, the block stacks each quantized buffer
  over experts (the experts' own buffers become views of the stack: no second copy, the saved format
  unchanged) and its forward is ``compress_kernels.moe_<scheme>``: routing on the device, one launch per
  projection for all experts (SwiGLU in the gate/up epilogue), the top-k sum in one more; no host
  synchronisation, so it captures in a CUDA graph and compiles whole. ``grouped_scheme`` says which.
* loop (:func:`route_to_experts`, ``transformers``' eager loop) for anything else: experts of mixed kinds,
  left dense, block-sparse, another activation. Cost: one kernel call per matrix for each expert that got
  tokens, the gather / ``index_add_``, and a host synchronisation per forward to list the experts hit.

Block-sparse experts (``BSRLinear``, ``BSRW8A8Linear``, ``BSRW4A16Linear``) stay on the loop: each expert
has its own block pattern (its own ``crow_indices`` / ``col_indices`` and number of blocks), so a grouped
launch would need per-expert index tables and a tile schedule that follows each expert's kept blocks; the
dense grouped kernels cannot read them, and stacking them densely would give up the sparsity the experts
were pruned for. That is left for a later round.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from compress.core.sparsity import block_grid
from compress.nn.grouped_experts import GROUPED_BUFFERS, group_experts, grouped_current, grouped_forward
from compress.nn.qat import CompressedLinear, split_configs

# The flags of transformers' use_experts_implementation, with the values this module takes.
_STANDARD_FLAGS = {"is_transposed": False, "has_bias": False, "has_gate": True, "is_concatenated": True,
                   "has_post_expert_norm": False}
_FLAG_MEANINGS = {"is_transposed": "weights stored transposed (E, K, N)", "has_bias": "expert biases",
                  "has_gate": "no gate (up_proj only)", "is_concatenated": "gate and up rows interleaved",
                  "has_post_expert_norm": "a norm after each expert"}


def is_fused_experts(module: nn.Module) -> bool:
    """Whether ``module`` holds fused 3-D expert weights (a 3-D ``down_proj`` Parameter)."""
    down = module._parameters.get("down_proj")
    return down is not None and down.dim() == 3 and not isinstance(module, (CompressedExperts, QuantizedExperts))


def experts_layout_problem(module: nn.Module) -> str | None:
    """None when ``module`` is a fused-experts block in the layout of the module docstring, else why not."""
    for flag, standard in _STANDARD_FLAGS.items():
        if getattr(module, flag, standard) != standard:
            return f"{_FLAG_MEANINGS[flag]} ({flag}={not standard})"
    apply_gate = getattr(type(module), "_apply_gate", None)
    if apply_gate is not None and apply_gate.__name__ != "_default_apply_gate":
        return f"a custom gating ({type(module).__name__}._apply_gate)"
    gate_up, down = module._parameters.get("gate_up_proj"), module._parameters.get("down_proj")
    if gate_up is None or gate_up.dim() != 3 or down is None or down.dim() != 3:
        return "expected 3-D gate_up_proj and down_proj Parameters"
    experts, two_i, hidden = gate_up.shape
    if down.shape != (experts, hidden, two_i // 2) or two_i % 2:
        return (f"gate_up_proj {tuple(gate_up.shape)} and down_proj {tuple(down.shape)} are not (E, 2I, H) and "
                "(E, H, I)")
    if not callable(getattr(module, "act_fn", None)):
        return "no act_fn"
    return None


def route_to_experts(hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor,
                     num_experts: int, gate_up, down, act_fn) -> torch.Tensor:
    """``transformers``' eager experts loop, with ``gate_up[e]`` / ``down[e]`` as the expert's layers.

    hidden_states (T, H); top_k_index, top_k_weights (T, k); returns (T, H) in hidden_states' dtype.
    An index equal to ``num_experts`` (expert-parallel sentinel) is skipped, as transformers does."""
    final = torch.zeros_like(hidden_states)
    with torch.no_grad():
        expert_mask = F.one_hot(top_k_index, num_classes=num_experts + 1).permute(2, 1, 0)
        expert_hit = torch.greater(expert_mask.sum(dim=(-1, -2)), 0).nonzero()
    for hit in expert_hit.tolist():
        expert = hit[0]
        if expert == num_experts:
            continue
        top_k_pos, token_idx = torch.where(expert_mask[expert])
        gate, up = gate_up[expert](hidden_states[token_idx]).chunk(2, dim=-1)
        out = down[expert](act_fn(gate) * up) * top_k_weights[token_idx, top_k_pos, None]
        final.index_add_(0, token_idx, out.to(final.dtype))
    return final


class ExpertLinear(CompressedLinear):
    """Expert ``expert`` of a 3-D weight (E, N, K) as a :class:`CompressedLinear`: ``weight`` is the
    view ``experts_weight[expert]`` (not a Parameter of this module: :class:`CompressedExperts` owns it)."""

    def __init__(self, experts_weight: nn.Parameter, expert: int, configs=()):
        nn.Module.__init__(self)
        if experts_weight.dim() != 3 or not 0 <= expert < experts_weight.shape[0]:
            raise ValueError(f"ExpertLinear: expected a 3-D (E, N, K) weight and an expert in [0, E), got shape "
                             f"{tuple(experts_weight.shape)} and expert {expert}")
        self.out_features, self.in_features = experts_weight.shape[1:]
        self.expert = expert
        self.link(experts_weight)
        self.register_parameter("bias", None)
        self._init_state()
        self.add_configs(configs)

    def link(self, experts_weight: nn.Parameter) -> None:
        """Point at ``experts_weight`` (kept outside ``_parameters``: saved and optimized once, by the owner)."""
        self.__dict__["experts_weight"] = experts_weight

    @property
    def weight(self) -> torch.Tensor:
        return self.__dict__["experts_weight"][self.expert]

    @property
    def weight_parameter(self) -> nn.Parameter:
        return self.__dict__["experts_weight"]

    def weight_grad(self) -> torch.Tensor | None:
        grad = self.__dict__["experts_weight"].grad
        return None if grad is None else grad[self.expert]

    def _init_sparse(self, config) -> None:
        """As CompressedLinear's, without a gradient hook on the view: the owner hooks the 3-D Parameter."""
        self.sparse_config = config
        grid = block_grid((self.out_features, self.in_features), config.block)
        self.mask = torch.ones(grid, dtype=torch.bool, device=self.weight.device)

    def to_float(self) -> nn.Linear:
        """An ``nn.Linear`` holding a copy of this expert's masked weight (an expert exported dense)."""
        self.apply_mask_()
        linear = nn.Linear(self.in_features, self.out_features, bias=False, device="meta")
        linear.weight = nn.Parameter(self.weight.detach().clone())
        return linear

    def extra_repr(self) -> str:
        return f"expert={self.expert}, " + super().extra_repr()


class CompressedExperts(nn.Module):
    """Training module for a fused-experts block (module docstring); shares the block's Parameters.

    ``gate_up`` / ``down``: ``nn.ModuleList`` of E :class:`ExpertLinear`; ``gate_up_proj`` /
    ``down_proj``: the original 3-D Parameters (same names, so the state dict keeps their keys)."""

    MATRICES = {"gate_up": "gate_up_proj", "down": "down_proj"}  # layer list -> 3-D Parameter

    def __init__(self, experts: nn.Module, configs=()):
        problem = experts_layout_problem(experts)
        if problem is not None:
            raise ValueError(f"CompressedExperts: expected a fused-experts block in the standard layout, got "
                             f"{type(experts).__name__} with {problem}")
        super().__init__()
        self.num_experts, self.intermediate_dim, self.hidden_dim = experts.down_proj.shape[0], \
            experts.down_proj.shape[2], experts.down_proj.shape[1]
        self.gate_up_proj, self.down_proj = experts.gate_up_proj, experts.down_proj
        self.act_fn = experts.act_fn
        self.__dict__["original"] = experts  # given back by to_float; not a submodule (no second state)
        self.gate_up = nn.ModuleList(ExpertLinear(self.gate_up_proj, e) for e in range(self.num_experts))
        self.down = nn.ModuleList(ExpertLinear(self.down_proj, e) for e in range(self.num_experts))
        for layers, parameter_name in self.MATRICES.items():
            parameter = getattr(self, parameter_name)
            if parameter.requires_grad:
                parameter.register_hook(lambda grad, layers=layers: self._masked_gradient(layers, grad))
        self.add_configs(configs)

    def layers(self) -> list[ExpertLinear]:
        return [*self.gate_up, *self.down]

    def add_configs(self, configs) -> None:
        """Add the configs to every expert layer (ValueError for a conflict, before any layer changes)."""
        quant, sparse = split_configs(configs)
        first = self.down[0]
        split_configs([c for c in (first.quant_config, quant, first.sparse_config, sparse) if c is not None])
        for layer in self.layers():
            layer.add_configs(configs)

    def _masked_gradient(self, layers: str, grad: torch.Tensor) -> torch.Tensor:
        """The gradient hook of a 3-D Parameter: zero every expert's pruned blocks (none without masks)."""
        if getattr(self, layers)[0].mask is None:
            return grad
        return grad * self.element_masks(layers).to(grad.dtype)

    def element_masks(self, layers: str) -> torch.Tensor:
        """(E, N, K) bool element masks of ``"gate_up"`` or ``"down"`` (all True without a sparse config)."""
        experts = getattr(self, layers)
        if experts[0].mask is None:
            return torch.ones_like(getattr(self, self.MATRICES[layers]), dtype=torch.bool)
        return torch.stack([layer._element_mask() for layer in experts])

    def masks(self, layers: str) -> torch.Tensor | None:
        """(E, N/32, K/32) block masks of ``"gate_up"`` or ``"down"``; None without a sparse config."""
        experts = getattr(self, layers)
        return None if experts[0].mask is None else torch.stack([layer.mask for layer in experts])

    @torch.no_grad()
    def apply_mask_(self) -> None:
        for layer in self.layers():
            layer.apply_mask_()

    def _apply(self, fn, recurse=True):
        result = super()._apply(fn, recurse)
        for layers, parameter_name in self.MATRICES.items():  # a cast may have replaced the Parameters
            for layer in getattr(self, layers):
                layer.link(getattr(self, parameter_name))
        return result

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor):
        return route_to_experts(hidden_states, top_k_index, top_k_weights, self.num_experts, self.gate_up, self.down,
                                self.act_fn)

    def to_float(self) -> nn.Module:
        """The original experts module holding the (masked) Parameters."""
        self.apply_mask_()
        original = self.__dict__["original"]
        original.gate_up_proj, original.down_proj = self.gate_up_proj, self.down_proj
        return original

    def to_inference(self) -> "QuantizedExperts":
        """A :class:`QuantizedExperts` of the modules now in ``gate_up`` / ``down`` (export swaps each
        :class:`ExpertLinear` for its inference module first)."""
        left = [f"gate_up.{e}" for e, m in enumerate(self.gate_up) if isinstance(m, ExpertLinear)]
        left += [f"down.{e}" for e, m in enumerate(self.down) if isinstance(m, ExpertLinear)]
        if left:
            raise ValueError("to_inference: expected every expert layer exported first, "
                             f"got training layers {left[:4]}")
        return QuantizedExperts(self.act_fn, list(self.gate_up), list(self.down))

    def extra_repr(self) -> str:
        return (f"num_experts={self.num_experts}, hidden_dim={self.hidden_dim}, "
                f"intermediate_dim={self.intermediate_dim}")


class QuantizedExperts(nn.Module):
    """Inference module for a fused-experts block: per expert, its ``gate_up`` (N=2I, K=H) and ``down``
    (N=H, K=I) inference modules (or ``nn.Linear`` for a matrix left dense), run by the grouped kernels
    or by the loop (module docstring). ``grouped_scheme``: ``"w4a16"``, ``"w8a8"``, ``"w8a16"`` or None (loop)."""

    def __init__(self, act_fn: nn.Module, gate_up: list[nn.Module], down: list[nn.Module]):
        super().__init__()
        if not gate_up or len(gate_up) != len(down):
            raise ValueError(f"QuantizedExperts: expected as many gate_up as down modules (at least one), got "
                             f"{len(gate_up)} and {len(down)}")
        self.num_experts = len(gate_up)
        self.hidden_dim, self.intermediate_dim = gate_up[0].in_features, down[0].in_features
        for e, (first, second) in enumerate(zip(gate_up, down)):
            shapes = ((first.out_features, first.in_features), (second.out_features, second.in_features))
            want = ((2 * self.intermediate_dim, self.hidden_dim), (self.hidden_dim, self.intermediate_dim))
            if shapes != want:
                raise ValueError(f"QuantizedExperts: expert {e}: expected gate_up and down of (N, K) {want}, "
                                 f"got {shapes}")
        self.act_fn = act_fn
        self.gate_up, self.down = nn.ModuleList(gate_up), nn.ModuleList(down)
        self.grouped_scheme: str | None = None
        self.allow_grouped = True  # False: always the loop (set_grouped)
        group_experts(self)
        self.register_load_state_dict_post_hook(_group_after_load)

    @classmethod
    def empty_like(cls, experts: nn.Module) -> "QuantizedExperts":
        """A skeleton for loading: ``experts``' act_fn and, per expert, meta ``nn.Linear`` placeholders that
        the saved inference modules replace (a dense expert's weight is assigned from the checkpoint)."""
        problem = experts_layout_problem(experts)
        if problem is not None:
            raise ValueError(f"QuantizedExperts: expected a fused-experts block in the standard layout, got "
                             f"{type(experts).__name__} with {problem}")
        count, hidden, intermediate = experts.down_proj.shape

        def placeholder(k: int, n: int) -> nn.Linear:
            return nn.Linear(k, n, bias=False, device="meta")

        return cls(experts.act_fn, [placeholder(hidden, 2 * intermediate) for _ in range(count)],
                   [placeholder(intermediate, hidden) for _ in range(count)])

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor):
        if self.grouped_scheme is not None and not torch.compiler.is_compiling() and not grouped_current(self):
            group_experts(self)  # an expert's buffer was replaced since the stacking: stack again
        if self.grouped_scheme is not None:
            return grouped_forward(self, hidden_states, top_k_index, top_k_weights)
        return route_to_experts(hidden_states, top_k_index, top_k_weights, self.num_experts, self.gate_up, self.down,
                                self.act_fn)

    def set_grouped(self, enabled: bool) -> str | None:
        """Allow the grouped path (the default) or keep this block on the loop (e.g. to time or debug one
        against the other); returns ``grouped_scheme``."""
        self.allow_grouped = bool(enabled)
        return group_experts(self)

    def regroup(self) -> str | None:
        """Decide the path again and stack the experts' buffers for the grouped one (after changing experts by
        hand; casts, moves and ``load_state_dict`` do it themselves); returns ``grouped_scheme``."""
        return group_experts(self)

    def _apply(self, fn, recurse=True):
        stacked = {name: self._buffers.pop(name) for name in GROUPED_BUFFERS if name in self._buffers}
        try:
            return super()._apply(fn, recurse)  # moves each expert's view on its own
        finally:
            if stacked and grouped_current(self):  # nothing was replaced (a cast that leaves integers as they are)
                self._buffers.update(stacked)
            else:
                group_experts(self)

    def extra_repr(self) -> str:
        kinds = sorted({type(m).__name__ for m in (*self.gate_up, *self.down)})
        path = f"grouped {self.grouped_scheme}" if self.grouped_scheme else "loop"
        return (f"num_experts={self.num_experts}, hidden_dim={self.hidden_dim}, "
                f"intermediate_dim={self.intermediate_dim}, modules={kinds}, path={path}")


def _group_after_load(module: QuantizedExperts, incompatible_keys) -> None:
    """``load_state_dict`` post-hook: the experts' buffers may have been replaced (``assign=True``)."""
    group_experts(module)


def compressed_experts(model: nn.Module) -> dict[str, CompressedExperts]:
    """``{name: module}`` of every :class:`CompressedExperts` in ``model``."""
    return {name: m for name, m in model.named_modules() if isinstance(m, CompressedExperts)}


def experts_module_name(layer_name: str) -> str:
    """The experts module's name for an :class:`ExpertLinear` named ``<experts>.gate_up.<e>``."""
    return layer_name.rsplit(".", 2)[0]
