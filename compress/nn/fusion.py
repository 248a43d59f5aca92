"""Sibling fusion: linear layers that read the same input run as one wider matmul.

Attention's query, key and value projections read the same hidden states, and so do a gated MLP's
``gate_proj`` and ``up_proj``. At small batch each of our kernels costs mostly fixed time (the
launch, W8A8's activation-quantization pre-pass, a split-K reduce), not bytes, so one launch with
N = N_q + N_k + N_v costs much less than three. :func:`fuse_siblings` rewrites a model in place:

* **A group** is a parent module's children named as one entry of :data:`SIBLING_NAMES` (e.g.
  ``("q_proj", "k_proj", "v_proj")``), all of one kind with the same ``in_features``: all
  ``W8A8Linear`` (same config, same static activation scale and smoothing factors, as siblings
  calibrated on one input have), all ``W4A16Linear`` (same group size), all ``W8A16Linear`` (same
  config), all ``W8A8BlockLinear`` (same config, every member's N a multiple of 128, so the weight
  scale blocks stack), all ``BSRLinear`` (same block), all ``BSRW8A8Linear`` (both rules), all
  ``BSRW4A16Linear`` (same block and config), or, only with ``dense=True``, all ``nn.Linear``. Other groups
  are left as they are.
* **The fused module** is one module of that kind whose output rows are the members' rows, stacked
  in the group's order, so output ``n`` of member ``i`` is row ``N_1 + ... + N_{i-1} + n``:
  W8A8, W8A16 and W8A8Block ``w_q`` / ``w_scale`` / ``bias`` are concatenated along N (dim 0); W4A16 ``qweight``
  (K/8, N) and ``scales`` (K/G, N) along dim 1; BSR block rows are appended (``crow_indices`` of
  member ``i`` shifted by the blocks of the members before it; BSR-W4A16's per-block ``scales`` with
  their blocks). Each output element is the same
  dot product as before; only the tile shape the wider N gets (and so the order of a split
  reduction) may differ.
* **Each member** becomes a :class:`SiblingOutput` that returns its columns of the fused output.
  The group (:class:`SiblingGroup`, holding the fused module) is registered on the parent as
  ``fused_<name>_<name>...``, so ``model.to(...)`` and the state dict see the fused tensors once.

The model's own forward is not changed. The first member called with an input ``x`` runs the fused
module once and keeps the other members' slices; a member called with that same tensor object
takes its slice and drops it. A member called with another input, or twice, runs the fused module
on its own input and uses its slice (correct, just not faster), e.g. cross-attention's key and
value on encoder states. Once every member has taken its slice nothing is held, so no tensor
outlives the forward: this works in eager mode, under CUDA graph capture and under
``torch.compile`` (the bookkeeping is attribute writes that dynamo replays).

A fused model's state dict differs from the saved layout: ``compress.save_compressed`` refuses a
fused model (:func:`is_fused` tells); :func:`unfuse_siblings` splits every group back into its
members (rows ``N_1 + ... + N_{i-1}`` onwards of the fused module; a member that had no bias gets a
zero one when a sibling had one), after which the model saves as before.
"""
from __future__ import annotations

import logging

import torch
from torch import nn

from compress.nn.inference import (BSRLinear, BSRW4A16Linear, BSRW8A8Linear, W4A16Linear, W8A8BlockLinear, W8A8Linear,
                                   W8A16Linear)

logger = logging.getLogger(__name__)

SIBLING_NAMES = (
    ("q_proj", "k_proj", "v_proj"),  # Llama, Mistral, Qwen, ... attention
    ("query", "key", "value"),  # BERT-style attention (all-MiniLM-L6-v2)
    ("gate_proj", "up_proj"),  # gated MLP (Llama)
)


class _Pending:
    """A group's bookkeeping between its members' calls: the input the slices came from, and the slices
    not taken yet. A plain object, so each write is a plain attribute write, not ``nn.Module.__setattr__``
    (which checks parameters, buffers and submodules first: eager decoding makes hundreds a token)."""

    def __init__(self, slices: tuple):
        self.input: torch.Tensor | None = None
        self.slices = slices


class SiblingGroup(nn.Module):
    """The fused module of one group and the slices its members have not taken yet."""

    def __init__(self, fused: nn.Module, names: tuple[str, ...], sizes: tuple[int, ...]):
        super().__init__()
        if len(names) != len(sizes) or sum(sizes) != fused.out_features:
            raise ValueError(f"SiblingGroup: expected one size per name summing to the fused out_features "
                             f"{fused.out_features}, got names {names} and sizes {sizes}")
        self.fused, self.names, self.sizes = fused, tuple(names), tuple(sizes)
        self._state = _Pending((None,) * len(sizes))

    def output(self, index: int, x: torch.Tensor) -> torch.Tensor:
        """Member ``index``'s output for ``x``: its pending slice if ``x`` is the input it came from."""
        state = self._state
        pending = state.slices
        if state.input is not x or pending[index] is None:
            pending = tuple(self.fused(x).split(self.sizes, dim=-1))
        result = pending[index]
        pending = pending[:index] + (None,) + pending[index + 1:]
        state.input = None if all(p is None for p in pending) else x
        state.slices = pending
        return result

    def extra_repr(self) -> str:
        return f"names={self.names}, sizes={self.sizes}"


class SiblingOutput(nn.Module):
    """Stands where member ``index`` of a :class:`SiblingGroup` was; returns its output columns."""

    def __init__(self, group: SiblingGroup, index: int):
        super().__init__()
        object.__setattr__(self, "group", group)  # not a submodule: the parent owns the group
        self.index = index
        self.in_features, self.out_features = group.fused.in_features, group.sizes[index]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.group.output(self.index, x)

    def extra_repr(self) -> str:
        return f"{self.group.names[self.index]} of the fused group, out_features={self.out_features}"


# ---- concatenation along N, one function per module kind -----------------------------------------
def _stacked_bias(members) -> torch.Tensor | None:
    """The members' biases along N (zeros for a member without one), or None if none has a bias."""
    present = [m.bias for m in members if m.bias is not None]
    if not present:
        return None
    like = present[0]
    return torch.cat([like.new_zeros(m.out_features) if m.bias is None else m.bias.to(like.dtype) for m in members])


def _same_optional(tensors) -> bool:
    first = tensors[0]
    if first is None:
        return all(t is None for t in tensors)
    return all(t is not None and t.shape == first.shape and torch.equal(t, first) for t in tensors)


def _w8a8_mismatch(members) -> str | None:
    """Why W8A8 members cannot share one activation quantization, or None."""
    if any(m.config != members[0].config for m in members):
        return "different W8A8 configs"
    if not _same_optional([m.act_scale for m in members]):
        return "different static activation scales"
    if not _same_optional([m.input_smoothing for m in members]):
        return "different smoothing factors"
    return None


def _copy_activation_scales(target: nn.Module, source: nn.Module) -> None:
    """``act_scale`` and ``input_smoothing`` of a W8A8 module onto another (when present)."""
    if source.act_scale is not None:
        target.act_scale = source.act_scale.clone()
    if source.input_smoothing is not None:
        target.input_smoothing = source.input_smoothing.clone()


def _concat_w8a8(members) -> W8A8Linear | str:
    if (reason := _w8a8_mismatch(members)) is not None:
        return reason
    first = members[0]
    bias = _stacked_bias(members)
    fused = W8A8Linear(first.in_features, sum(m.out_features for m in members), bias is not None, first.config,
                       smoothing=first.input_smoothing is not None).to(first.w_q.device)
    fused.w_q = torch.cat([m.w_q for m in members])
    fused.w_scale = torch.cat([m.w_scale for m in members])
    _copy_activation_scales(fused, first)
    fused.bias = bias
    return fused


def _concat_w4a16(members) -> W4A16Linear | str:
    first = members[0]
    if any(m.config != first.config or m.padded_in_features != first.padded_in_features for m in members):
        return "different W4A16 group sizes"
    bias = _stacked_bias(members)
    fused = W4A16Linear(first.in_features, sum(m.out_features for m in members), bias is not None,
                        first.config).to(first.qweight.device)
    fused.qweight = torch.cat([m.qweight for m in members], dim=1)
    fused.scales = torch.cat([m.scales for m in members], dim=1)
    fused.bias = bias
    return fused


def _concat_int8_rows(members, module_cls, what: str):
    """``module_cls`` (W8A16 or block-scaled W8A8: ``w_q`` and ``w_scale`` by output rows) holding the
    members' rows in order, or why not (the members' configs differ)."""
    first = members[0]
    if any(m.config != first.config for m in members):
        return f"different {what} configs"
    bias = _stacked_bias(members)
    fused = module_cls(first.in_features, sum(m.out_features for m in members), bias is not None,
                       first.config).to(first.w_q.device)
    fused.w_q = torch.cat([m.w_q for m in members])
    fused.w_scale = torch.cat([m.w_scale for m in members])
    fused.bias = bias
    return fused


def _concat_w8a16(members) -> W8A16Linear | str:
    return _concat_int8_rows(members, W8A16Linear, "W8A16")


def _concat_w8a8_block(members) -> W8A8BlockLinear | str:
    block = members[0].config.block
    if any(m.out_features % block for m in members):
        return f"out_features not all multiples of {block} (the weight scale blocks would not stack)"
    return _concat_int8_rows(members, W8A8BlockLinear, "W8A8Block")


def _stacked_block_rows(members) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """BSR parts (crow, col, values) of the members' block rows appended in order."""
    crows, offset = [members[0].crow_indices[:1]], 0
    for m in members:
        crows.append(m.crow_indices[1:] + offset)
        offset += m.nnz
    return torch.cat(crows), torch.cat([m.col_indices for m in members]), torch.cat([m.values for m in members])


def _concat_bsr(members) -> BSRLinear | str:
    first = members[0]
    if any(m.block != first.block for m in members):
        return "different block sizes"
    crow, col, values = _stacked_block_rows(members)
    bias = _stacked_bias(members)
    fused = BSRLinear(first.in_features, sum(m.out_features for m in members), bias is not None, col.numel(),
                      first.block).to(first.values.device)
    fused.crow_indices, fused.col_indices, fused.values = crow, col, values
    fused.bias = bias
    return fused


def _concat_bsr_w8a8(members) -> BSRW8A8Linear | str:
    first = members[0]
    if any(m.block != first.block for m in members):
        return "different block sizes"
    if (reason := _w8a8_mismatch(members)) is not None:
        return reason
    crow, col, values = _stacked_block_rows(members)
    bias = _stacked_bias(members)
    fused = BSRW8A8Linear(first.in_features, sum(m.out_features for m in members), bias is not None, first.config,
                          col.numel(), first.block, smoothing=first.input_smoothing is not None).to(first.values.device)
    fused.crow_indices, fused.col_indices, fused.values = crow, col, values
    fused.w_scale = torch.cat([m.w_scale for m in members])
    _copy_activation_scales(fused, first)
    fused.bias = bias
    return fused


def _concat_bsr_w4a16(members) -> BSRW4A16Linear | str:
    first = members[0]
    if any(m.block != first.block or m.config != first.config for m in members):
        return "different block sizes or W4A16 configs"
    crow, col, values = _stacked_block_rows(members)
    bias = _stacked_bias(members)
    fused = BSRW4A16Linear(first.in_features, sum(m.out_features for m in members), bias is not None, first.config,
                           col.numel(), first.block).to(first.values.device)
    fused.crow_indices, fused.col_indices, fused.values = crow, col, values
    fused.scales = torch.cat([m.scales for m in members])  # one row per stored block, as values
    fused.bias = bias
    return fused


def _concat_linear(members) -> nn.Linear:
    first = members[0]
    bias = _stacked_bias(members)
    fused = nn.Linear(first.in_features, sum(m.out_features for m in members), bias=bias is not None,
                      device=first.weight.device, dtype=first.weight.dtype)
    with torch.no_grad():
        fused.weight.copy_(torch.cat([m.weight for m in members]))
        if bias is not None:
            fused.bias.copy_(bias)
    return fused


_CONCAT = {W8A8Linear: _concat_w8a8, W4A16Linear: _concat_w4a16, W8A16Linear: _concat_w8a16, BSRLinear: _concat_bsr,
           BSRW8A8Linear: _concat_bsr_w8a8, BSRW4A16Linear: _concat_bsr_w4a16, W8A8BlockLinear: _concat_w8a8_block}


def fuse_members(members: list[nn.Module], dense: bool = False) -> nn.Module | str:
    """The fused module of ``members``, or a string saying why they cannot be fused."""
    kind = type(members[0])
    if any(type(m) is not kind for m in members):
        return f"mixed kinds {sorted({type(m).__name__ for m in members})}"
    if any(m.in_features != members[0].in_features for m in members):
        return "different in_features"
    devices = {t.device for m in members for t in (*m.parameters(recurse=False), *m.buffers(recurse=False))}
    if len(devices) > 1:
        return f"members on different devices {sorted(map(str, devices))}"
    if kind is nn.Linear:
        return _concat_linear(members) if dense else "dense layers (dense=False)"
    if kind not in _CONCAT:
        return f"{kind.__name__} has no fused form"
    return _CONCAT[kind](members)


def fuse_siblings(model: nn.Module, dense: bool = False) -> int:
    """Fuse every group of sibling layers of ``model`` in place (module docstring); returns how many."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model: expected an nn.Module, got {type(model).__name__}")
    fused_groups = 0
    for parent_name, parent in list(model.named_modules()):
        for names in SIBLING_NAMES:
            members = [parent._modules.get(name) for name in names]
            if any(m is None or isinstance(m, SiblingOutput) for m in members):
                continue  # not this group's names, or fused already
            fused = fuse_members(members, dense)
            if isinstance(fused, str):
                if "dense=False" not in fused:
                    logger.info("fuse_siblings: %s.%s left unfused: %s",
                                parent_name or "<model>", "/".join(names), fused)
                continue
            group = SiblingGroup(fused, names, tuple(m.out_features for m in members))
            parent.add_module("fused_" + "_".join(names), group)
            for index, name in enumerate(names):
                setattr(parent, name, SiblingOutput(group, index))
            fused_groups += 1
    logger.info("fuse_siblings: %d groups fused", fused_groups)
    return fused_groups


# ---- splitting a fused module back into its members --------------------------------------------
def _stored_blocks(fused: nn.Module, start: int, stop: int) -> slice:
    """The stored blocks (positions in ``col_indices``) of output rows ``[start, stop)`` (multiples of the block)."""
    first_row, last_row = start // fused.block, stop // fused.block
    return slice(int(fused.crow_indices[first_row]), int(fused.crow_indices[last_row]))


def _block_rows(fused: nn.Module, start: int, stop: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """BSR parts (crow, col, values) of output rows ``[start, stop)`` (multiples of the block)."""
    blocks = _stored_blocks(fused, start, stop)
    crow = (fused.crow_indices[start // fused.block:stop // fused.block + 1] - blocks.start).contiguous()
    return crow, fused.col_indices[blocks].clone(), fused.values[blocks].clone()


def _row_slice(fused: nn.Module, start: int, stop: int) -> nn.Module:
    """Output rows ``[start, stop)`` of a fused module, as a module of the same kind."""
    bias = None if fused.bias is None else fused.bias[start:stop].clone()
    if isinstance(fused, W8A8Linear):
        part = W8A8Linear(fused.in_features, stop - start, bias is not None, fused.config,
                          smoothing=fused.input_smoothing is not None).to(fused.w_q.device)
        part.w_q, part.w_scale = fused.w_q[start:stop].clone(), fused.w_scale[start:stop].clone()
        _copy_activation_scales(part, fused)
    elif isinstance(fused, W4A16Linear):
        part = W4A16Linear(fused.in_features, stop - start, bias is not None, fused.config).to(fused.qweight.device)
        part.qweight = fused.qweight[:, start:stop].contiguous()
        part.scales = fused.scales[:, start:stop].contiguous()
    elif isinstance(fused, W8A16Linear):
        part = W8A16Linear(fused.in_features, stop - start, bias is not None, fused.config).to(fused.w_q.device)
        part.w_q, part.w_scale = fused.w_q[start:stop].clone(), fused.w_scale[start:stop].clone()
    elif isinstance(fused, W8A8BlockLinear):  # start is a multiple of the block (members were)
        block = fused.config.block
        part = W8A8BlockLinear(fused.in_features, stop - start, bias is not None, fused.config).to(fused.w_q.device)
        part.w_q = fused.w_q[start:stop].clone()
        part.w_scale = fused.w_scale[start // block: -(-stop // block)].clone()
    elif isinstance(fused, (BSRLinear, BSRW8A8Linear, BSRW4A16Linear)):
        crow, col, values = _block_rows(fused, start, stop)
        if isinstance(fused, BSRLinear):
            part = BSRLinear(fused.in_features, stop - start, bias is not None, col.numel(), fused.block)
        elif isinstance(fused, BSRW4A16Linear):
            part = BSRW4A16Linear(fused.in_features, stop - start, bias is not None, fused.config, col.numel(),
                                  fused.block)
            part.scales = fused.scales[_stored_blocks(fused, start, stop)].clone()
        else:
            part = BSRW8A8Linear(fused.in_features, stop - start, bias is not None, fused.config, col.numel(),
                                 fused.block, smoothing=fused.input_smoothing is not None)
            part.w_scale = fused.w_scale[start:stop].clone()
            _copy_activation_scales(part, fused)
        part = part.to(fused.values.device)
        part.crow_indices, part.col_indices, part.values = crow, col, values
    else:  # nn.Linear
        part = nn.Linear(fused.in_features, stop - start, bias=bias is not None, device=fused.weight.device,
                         dtype=fused.weight.dtype)
        with torch.no_grad():
            part.weight.copy_(fused.weight[start:stop])
            if bias is not None:
                part.bias.copy_(bias)
        return part
    part.bias = bias
    return part


def unfuse_siblings(model: nn.Module) -> int:
    """Split every :class:`SiblingGroup` of ``model`` back into its members, in place; returns how many."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model: expected an nn.Module, got {type(model).__name__}")
    count = 0
    for parent in list(model.modules()):
        for attr, group in list(parent._modules.items()):
            if not isinstance(group, SiblingGroup):
                continue
            start = 0
            for name, size in zip(group.names, group.sizes):
                setattr(parent, name, _row_slice(group.fused, start, start + size))
                start += size
            delattr(parent, attr)
            count += 1
    return count


def is_fused(model: nn.Module) -> bool:
    """True if ``model`` holds any :class:`SiblingGroup`."""
    return any(isinstance(m, SiblingGroup) for m in model.modules())
