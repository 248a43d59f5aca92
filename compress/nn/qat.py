"""Training module: a fake-quantized and block-masked ``nn.Linear`` (QAT and gradual pruning).

``CompressedLinear.from_float(linear, configs)`` shares ``linear``'s ``weight`` / ``bias``
Parameters (an optimizer built before the swap keeps working) and holds:

* ``from_conv1d`` (bool attribute): the layer was a transformers ``Conv1D`` (GPT-2 family), taken
  with a transposed copy of its weight, (N, K), and its own bias (:mod:`compress.nn.conv1d`; an
  optimizer must be built after the swap); :meth:`to_float` then gives a ``Conv1D`` back.
* ``mask`` (N/32, K/32) bool buffer when a :class:`BlockSparseConfig` is present (all True until
  a pruning step sets it), else None. The forward uses ``W * expand(mask)``; a gradient hook zeroes
  the gradient of pruned weights and :meth:`apply_mask_` (called after every optimizer step by the
  pruning schedule) writes exact zeros, so AdamW's momentum and weight decay cannot revive them.
* ``observer`` (:mod:`compress.core.observers`) and ``act_scale`` () float32 buffer for W8A8 layers;
  ``act_scale`` 0 means "not calibrated"; ``input_smoothing`` (K,) float32 buffer (SmoothQuant
  factors that no norm absorbed; ones by default).
* ``weight_scale`` Parameter when the quant config asks for ``learnable_scale`` (LSQ), with a
  ``scale_initialized`` buffer so a resumed run does not re-initialise it.
* After GPTQ (:meth:`set_quantized_weight`): ``weight`` holds the dequantized values ``q * s`` and
  ``weight_scale`` their scales ``s`` (the LSQ Parameter takes them, else a float32 buffer of that
  name), so the fake-quantized forward and the export both give back exactly GPTQ's ``q`` and ``s``.
* ``fake_quant_enabled`` (bool attribute): off until a QAT schedule (or ``prepare(..., fake_quant=True)``,
  or :func:`compress.convert`'s post-training path) switches it on.

Under FSDP2 (``fully_shard`` after the swap) ``weight`` and an LSQ ``weight_scale`` are row shards
(:mod:`compress.core.sharding`) outside the forward, whole inside it; ``mask`` and the other buffers
stay whole on every process. What runs outside the forward works on this process's rows:
:meth:`apply_mask_` zeroes them, :meth:`local_masked_weight` hands them to scoring and GPTQ, an
LSQ scale is initialised row by row (a row's scale depends on that row only; a block-scaled W8A8
layer's 128 x 128 block scales from block maxima taken over every process's rows), and
:meth:`set_quantized_weight` takes GPTQ's rows. The gradient hook registered on the weight does not
survive sharding; the forward's ``weight * mask`` already gives pruned weights a zero gradient.

Forward (the numerical contract: the exported module computes the same function)::

    w = weight * mask                                  (when masked)
    x = x / input_smoothing                            (when smoothed)
    W8A8:  y = fq_token(x) @ fq_channel(w).T + b       (fq = quantize-dequantize in float32)
    W4A16: y = x @ fq_group(w).T + b                   (int4, groups of G)
    W8A16: y = x @ fq_channel(w).T + b                 (int8; fq_group with groups of 128)
    W8A8Block: y = fq_1x128(x) @ fq_128x128(w).T + b   (int8 in [-127, 127], compress.core.block_quant)
    y in x's dtype
"""
from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from torch import nn

from compress.configs import BlockSparseConfig, QuantConfig, is_config
from compress.core import block_quant
from compress.core.block_quant import fake_quantize_act_blocks, fake_quantize_weight_blocks
from compress.core.float32 import Float32Buffers
from compress.core.observers import Observer, make_observer
from compress.core.quant import (
    fake_quantize_groupwise,
    fake_quantize_per_channel,
    fake_quantize_per_token,
    group_scale,
    per_channel_scale,
    safe_scale,
)
from compress.core.sharding import is_sharded, local_rows, local_tensor, max_over_shards_, rows_to_full
from compress.core.sparsity import block_grid, expand_mask
from compress.nn.conv1d import conv1d_from_linear, is_conv1d, linear_from_conv1d

logger = logging.getLogger(__name__)


def split_configs(configs) -> tuple[QuantConfig | None, BlockSparseConfig | None]:
    """(quant config or None, sparse config or None) from one config or a list; rejects conflicts."""
    items = list(configs) if isinstance(configs, (list, tuple)) else [configs]
    quant, sparse = None, None
    for item in items:
        if not is_config(item):
            raise TypeError(f"configs: expected W8A8Config, W4A16Config, W8A16Config, W8A8BlockConfig or "
                            f"BlockSparseConfig items, "
                            f"got {type(item).__name__}")
        if isinstance(item, BlockSparseConfig):
            if sparse is not None and sparse != item:
                raise ValueError(f"configs: at most one BlockSparseConfig per layer, got {sparse} and {item}")
            sparse = item
        else:
            if quant is not None and quant != item:
                raise ValueError(f"configs: at most one quantization config per layer, got {quant} and {item}")
            quant = item
    return quant, sparse


class CompressedLinear(Float32Buffers, nn.Linear):
    """Fake-quantized, block-masked linear layer for training (see the module docstring).

    ``act_scale``, ``input_smoothing`` and a GPTQ ``weight_scale`` buffer stay float32 when the model
    is cast (``.half()``).
    """

    _float32_buffers = ("act_scale", "input_smoothing", "weight_scale")

    def __init__(self, in_features: int, out_features: int, bias: bool = True, configs=(), device=None, dtype=None):
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        self._init_state()
        self.add_configs(configs)

    @classmethod
    def from_float(cls, linear: nn.Module, configs) -> "CompressedLinear":
        """Wrap ``linear`` sharing its Parameters (no copy). A transformers ``Conv1D`` is taken as the
        linear layer it is: a transposed copy of its weight, its own bias (:func:`linear_from_conv1d`)."""
        from_conv1d = is_conv1d(linear)
        if from_conv1d:
            linear = linear_from_conv1d(linear)
        if not isinstance(linear, nn.Linear):
            raise TypeError(f"from_float: expected an nn.Linear or a transformers Conv1D, got {type(linear).__name__}")
        module = cls.__new__(cls)
        nn.Module.__init__(module)
        module.in_features, module.out_features = linear.in_features, linear.out_features
        module.weight = linear.weight
        module.register_parameter("bias", linear.bias)
        module._init_state()
        module.from_conv1d = from_conv1d
        module.add_configs(configs)
        return module

    def _init_state(self) -> None:
        self.from_conv1d = False
        self.quant_config, self.sparse_config = None, None
        self.fake_quant_enabled = False
        self.observing = False
        self.register_buffer("mask", None)
        self.register_buffer("act_scale", None)
        self.register_buffer("input_smoothing", None)
        self.register_buffer("scale_initialized", None)
        self.observer: Observer | None = None
        self.weight_scale: torch.Tensor | None = None  # LSQ Parameter, GPTQ's scales (buffer) or None
        self.weight_quantized = False  # True once set_quantized_weight put the weight on its grid

    # ---- configuration ---------------------------------------------------------------------------
    def add_configs(self, configs) -> None:
        """Add quant / sparse configs (idempotent for equal configs, ValueError for conflicts)."""
        quant, sparse = split_configs(configs)
        split_configs([c for c in (self.quant_config, quant, self.sparse_config, sparse) if c is not None])
        if sparse is not None and self.sparse_config is None:
            self._init_sparse(sparse)
        if quant is not None and self.quant_config is None:
            self._init_quant(quant)

    def _init_sparse(self, config: BlockSparseConfig) -> None:
        self.sparse_config = config
        grid = block_grid((self.out_features, self.in_features), config.block)
        self.mask = torch.ones(grid, dtype=torch.bool, device=self.weight.device)
        if self.weight.requires_grad:
            self.weight.register_hook(self._mask_gradient)

    def _init_quant(self, config) -> None:
        self.quant_config = config
        device = self.weight.device
        if config.observes_activations:
            self.observer = make_observer(config.observer, self.in_features, config.percentile).to(device)
            self.act_scale = torch.zeros((), device=device)
            self.input_smoothing = torch.ones(self.in_features, device=device)
        if config.learnable_scale:
            self.weight_scale = nn.Parameter(self._absmax_weight_scale())
            self.scale_initialized = torch.zeros((), dtype=torch.bool, device=device)

    # ---- weights -----------------------------------------------------------------------------------
    def _element_mask(self) -> torch.Tensor:
        return expand_mask(self.mask, (self.out_features, self.in_features), self.sparse_config.block)

    def _element_mask_rows(self, rows: slice) -> torch.Tensor:
        """Rows ``rows`` of the element mask, expanded from the block rows they reach only."""
        block = self.sparse_config.block
        first, last = rows.start // block, -(-rows.stop // block)
        blocks = expand_mask(self.mask[first:last], ((last - first) * block, self.in_features), block)
        return blocks[rows.start - first * block: rows.stop - first * block]

    def _mask_gradient(self, grad: torch.Tensor) -> torch.Tensor:
        return grad if self.mask is None else grad * self._element_mask().to(grad.dtype)

    @property
    def weight_parameter(self) -> nn.Parameter:
        """The Parameter the optimizer updates for this layer's weight (``weight`` itself; an expert's
        layer answers its 3-D Parameter, :class:`compress.nn.experts.ExpertLinear`)."""
        return self.weight

    def weight_grad(self) -> torch.Tensor | None:
        """The gradient of ``weight`` (N, K), None before a backward."""
        return self.weight.grad

    def masked_weight(self) -> torch.Tensor:
        """``weight * mask`` (differentiable; the plain weight without a mask)."""
        if self.mask is None:
            return self.weight
        return self.weight * self._element_mask().to(self.weight.dtype)

    def local_masked_weight(self) -> tuple[torch.Tensor, slice]:
        """(the rows of ``weight * mask`` this process holds, detached; which rows they are): all rows
        unless the weight is an FSDP2 shard (module docstring)."""
        rows = local_rows(self.weight)
        weight = local_tensor(self.weight).detach()
        if self.mask is None:
            return weight, rows
        return weight * self._element_mask_rows(rows).to(weight.dtype), rows

    def _absmax_weight_scale(self) -> torch.Tensor:
        """The absmax scales of this process's rows of ``weight_scale`` (all rows without FSDP): (R,) per
        channel, (R, Kp/G) per group; block-scaled W8A8: its rows of the (N/128, K/128) block scales."""
        w, rows = self.local_masked_weight()
        config = self.quant_config
        if config.weight_scales == "block":
            return self._block_weight_scale(w, rows)
        if config.weight_scales == "channel":
            return per_channel_scale(w)
        padded, group_size = config.padding(self.in_features)
        return group_scale(F.pad(w, (0, padded - self.in_features)), group_size, config.qmax)

    def _block_weight_scale(self, w: torch.Tensor, rows: slice) -> torch.Tensor:
        """Block-scaled W8A8's (N/128, K/128) absmax scales from this process's rows ``w`` of the masked
        weight: their block maxima, the maximum over every process's (a 128-row block may span shards),
        then this process's rows of the scales (all of them without FSDP)."""
        absmax = max_over_shards_(block_quant.weight_block_absmax(w, rows.start, self.out_features), self.weight)
        scale = safe_scale(absmax, block_quant.QMAX)
        return scale if self.weight_scale is None else scale[local_rows(self.weight_scale)]

    def _fake_quantize_groups(self, w: torch.Tensor) -> torch.Tensor:
        """Group-wise fake quantization (int4, or int8 for W8A16), K zero-padded to the group size as the
        export does."""
        padded, group_size = self.quant_config.padding(self.in_features)
        w_padded = F.pad(w, (0, padded - self.in_features))
        w_fq = fake_quantize_groupwise(w_padded, group_size, self.weight_scale, self.quant_config.qmax)
        return w_fq[:, : self.in_features]

    @torch.no_grad()
    def set_mask(self, mask: torch.Tensor, zero_weights: bool = True) -> None:
        """Install a block mask (N/32, K/32) and zero the pruned weights (``zero_weights=False``: keep
        them for GPTQ, which zeroes them itself; the forward masks them either way)."""
        if self.mask is None:
            raise ValueError("set_mask: this layer has no BlockSparseConfig; prepare it with one first")
        if mask.shape != self.mask.shape:
            raise ValueError(f"set_mask: expected a block mask of shape {tuple(self.mask.shape)}, "
                             f"got {tuple(mask.shape)}")
        self.mask.copy_(mask.to(torch.bool))
        if zero_weights:
            self.apply_mask_()

    @torch.no_grad()
    def apply_mask_(self) -> None:
        """Write exact zeros into the pruned weights (call after every optimizer step); under FSDP2 into
        this process's rows of them."""
        if self.mask is not None:
            weight = local_tensor(self.weight)
            weight.mul_(self._element_mask_rows(local_rows(self.weight)).to(weight.dtype))

    @torch.no_grad()
    def set_quantized_weight(self, weight: torch.Tensor, scale: torch.Tensor) -> None:
        """Hold a weight already on the quantization grid (GPTQ's ``q * s``, (N, K)) and its scales.

        ``scale``: (N,) for W8A8 and per-channel W8A16, (N, Kp/G) for W4A16 and grouped W8A16. A learnable
        scale takes the values (marked
        initialised); otherwise they become the ``weight_scale`` buffer.

        Under FSDP2 both are this process's rows (``local_rows(self.weight)``) and every process calls
        this for the same layers in the same order: a scale buffer, whole on every process, is
        gathered from all processes' rows.
        """
        if self.quant_config is None:
            raise ValueError("set_quantized_weight: this layer has no quantization config")
        target = local_tensor(self.weight)
        if weight.shape != target.shape:
            raise ValueError(f"set_quantized_weight: expected a weight of shape {tuple(target.shape)} (the rows this "
                             f"process holds), got {tuple(weight.shape)}")
        target.copy_(weight.to(target.dtype))
        scale = scale.detach().float().to(target.device)
        if isinstance(self.weight_scale, nn.Parameter):
            local_tensor(self.weight_scale).copy_(scale)
            self.scale_initialized.fill_(True)
        else:
            scale = rows_to_full(scale, self.weight) if is_sharded(self.weight) else scale
            if "weight_scale" not in self._buffers:
                del self.weight_scale
            self.register_buffer("weight_scale", scale)
        self.weight_quantized = True

    # ---- quantization state --------------------------------------------------------------------------
    def enable_fake_quant(self, on: bool = True) -> None:
        """Switch fake quantization on/off; a learnable scale is initialised from the weight once."""
        if on and self.quant_config is None:
            raise ValueError("enable_fake_quant: this layer has no quantization config")
        self.fake_quant_enabled = bool(on)
        if on and self.scale_initialized is not None and not bool(self.scale_initialized):
            with torch.no_grad():
                local_tensor(self.weight_scale).copy_(self._absmax_weight_scale())
                self.scale_initialized.fill_(True)

    def observe(self, on: bool = True) -> None:
        """Feed the inputs of the following forwards to the observer (W8A8 layers only)."""
        if on and self.observer is None:
            raise ValueError("observe: only W8A8 layers have an activation observer")
        self.observing = bool(on)

    def freeze_observer(self) -> None:
        """Stop observing; a static W8A8 layer takes ``observer.scale()`` as its ``act_scale``."""
        self.observing = False
        if self.observer is not None and self.quant_config.static:
            self.act_scale.copy_(self.observer.scale())

    def replace_observer(self, kind: str, percentile: float = 99.99) -> None:
        """Swap the observer kind, keeping the statistics seen so far (same buffer layout)."""
        if self.observer is None:
            raise ValueError("replace_observer: only W8A8 layers have an activation observer")
        new = make_observer(kind, self.in_features, percentile).to(self.act_scale.device)
        new.load_state_dict(self.observer.state_dict())
        self.observer = new

    @property
    def calibrated(self) -> bool:
        return self.act_scale is not None and bool(self.act_scale > 0)

    def static_act_scale(self) -> torch.Tensor | None:
        """The calibrated static scale, or None for dynamic (or not yet calibrated) layers."""
        if self.quant_config is not None and self.quant_config.static and self.calibrated:
            return self.act_scale
        return None

    def smoothing(self) -> torch.Tensor | None:
        """SmoothQuant factors held by this layer, None when they are all one."""
        if self.input_smoothing is None or bool((self.input_smoothing == 1).all()):
            return None
        return self.input_smoothing

    # ---- forward --------------------------------------------------------------------------------------
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        smoothing = self.smoothing()
        if smoothing is not None:
            x = (x.float() / smoothing).to(x.dtype)
        if self.observing:
            self.observer.update(x)
        w = self.masked_weight()
        if not self.fake_quant_enabled:
            return F.linear(x, w, self.bias)
        bias = None if self.bias is None else self.bias.float()
        config = self.quant_config
        if config.weight_scales == "block":
            w_fq = fake_quantize_weight_blocks(w, self.weight_scale)
            return F.linear(fake_quantize_act_blocks(x), w_fq, bias).to(x.dtype)
        if config.activation_scales in ("token", "tensor"):  # W8A8: per token, or the calibrated static scale
            static = self.static_act_scale()
            if config.static and static is None:
                logger.debug("%s: static W8A8 layer not calibrated yet; fake-quantizing per token", type(self).__name__)
            x_fq = fake_quantize_per_token(x, static)
        else:
            x_fq = x.float()
        if config.weight_scales == "channel":
            w_fq = fake_quantize_per_channel(w, self.weight_scale)
        else:
            w_fq = self._fake_quantize_groups(w)
        return F.linear(x_fq, w_fq, bias).to(x.dtype)

    def to_float(self) -> nn.Module:
        """A plain ``nn.Linear`` sharing this layer's Parameters (the masked zeros stay in the weight);
        for a layer that was a ``Conv1D``, a ``Conv1D`` again (the weight a transposed copy, the bias
        shared), so a saved float model keeps the layout its architecture rebuilds."""
        self.apply_mask_()
        if self.from_conv1d:
            return conv1d_from_linear(self.weight, self.bias)
        linear = nn.Linear(self.in_features, self.out_features, bias=self.bias is not None, device="meta")
        linear.weight, linear.bias = self.weight, self.bias
        return linear

    def extra_repr(self) -> str:
        parts = [super().extra_repr()] + (["from Conv1D"] if self.from_conv1d else [])
        if self.quant_config is not None:
            parts.append(f"quant={self.quant_config}, fake_quant={'on' if self.fake_quant_enabled else 'off'}")
        if self.sparse_config is not None:
            parts.append(f"block_sparsity={1.0 - self.mask.float().mean().item():.3f}")
        return ", ".join(parts)


def compressed_layers(model: nn.Module) -> dict[str, "CompressedLinear"]:
    """``{name: layer}`` of every :class:`CompressedLinear` in ``model`` (the prepared layers)."""
    return {name: m for name, m in model.named_modules() if isinstance(m, CompressedLinear)}
