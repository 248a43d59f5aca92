"""FSDP2 for a model that compress trains: shard it after preparing it, and gather it whole to export it.

Order matters: the schedule (or the Lightning callbacks' ``setup``) swaps the targeted ``nn.Linear``
layers for :class:`compress.nn.qat.CompressedLinear` first, then :func:`fully_shard_model` applies
``torch.distributed.fsdp.fully_shard`` to each transformer block and to the model, over a 1-D mesh of
every process. Sharding first and preparing after would swap in layers whose Parameters FSDP does not
manage (:func:`compress.plan.prepare` refuses). Each Parameter (weight, bias, LSQ scale) then holds
its rows on each process (:mod:`compress.core.sharding`); masks, observers and activation scales are
buffers, which FSDP2 leaves whole, and the schedule keeps them the same on every process.

Export: :func:`gather_full_model` gathers the full state dict on rank 0's CPU
(``get_model_state_dict(full_state_dict=True, cpu_offload=True)``: one Parameter on the device at a
time) and builds a plain copy of the model from it there, with the same modules and attributes but
no FSDP (its classes, hooks and state left out), ready for :func:`compress.convert` and
:func:`compress.save_compressed`. The sharded model itself is left as it was.

Fused-experts blocks (:mod:`compress.nn.experts`) are not supported under FSDP: their layers view one
3-D Parameter, which FSDP2 would shard by expert.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Optional

import torch
from torch import nn

from compress.core.sharding import FSDPModule, fsdp_modules, is_sharded, reshard_
from compress.nn.experts import CompressedExperts
from compress.schedule import distributed

FSDP_ATTRIBUTES = ("__composable_api", "_fsdp", "_is_fsdp")  # what fully_shard adds to a module's __dict__


def check_shardable(model: nn.Module) -> None:
    """ValueError for what compress does not train under FSDP2: fused-experts blocks."""
    experts = [name for name, m in model.named_modules() if isinstance(m, CompressedExperts)]
    if experts:
        raise ValueError(f"FSDP: fused-experts blocks ({experts[:3]}) are not supported under FSDP (their expert "
                         "layers view one 3-D Parameter, which FSDP2 shards by expert); train them with DDP")


def _check_mesh(mesh) -> None:
    if mesh is None or mesh.ndim != 1:
        raise ValueError(f"fully_shard_model: expected a 1-D device mesh over every process (FSDP2 data "
                         f"parallelism), got {'None' if mesh is None else f'a {mesh.ndim}-D mesh'}")


def transformer_blocks(model: nn.Module, block_classes: Optional[Iterable[str]] = None) -> list[nn.Module]:
    """The modules to shard one by one: those whose class name is in ``block_classes`` (default: the
    model's ``_no_split_modules``, its transformer layers in ``transformers``), else the items of every
    ``nn.ModuleList``; innermost first, and none holding a Parameter it shares with a module outside it
    (tied weights must stay in one FSDP unit)."""
    names = set(block_classes if block_classes is not None else getattr(model, "_no_split_modules", None) or ())
    modules = [(n, m) for n, m in model.named_modules() if n and type(m).__name__ in names]
    if not modules:
        modules = [(f"{n}.{i}" if n else str(i), item) for n, m in model.named_modules()
                   if isinstance(m, nn.ModuleList) for i, item in enumerate(m)]
    holders: dict[int, set[str]] = {}
    for name, parameter in model.named_parameters(remove_duplicate=False):
        holders.setdefault(id(parameter), set()).add(name)

    def self_contained(prefix: str, block: nn.Module) -> bool:
        return all(all(h.startswith(prefix + ".") for h in holders[id(p)]) for p in block.parameters())

    return [m for n, m in reversed(modules) if self_contained(n, m)]


def fully_shard_model(model: nn.Module, mesh, block_classes: Optional[Iterable[str]] = None) -> nn.Module:
    """FSDP2 over ``mesh`` (1-D): ``fully_shard`` on each of :func:`transformer_blocks`, then on ``model``
    (in place; returns ``model``). Call it after the schedule or the callbacks prepared the model."""
    from torch.distributed.fsdp import fully_shard

    _check_mesh(mesh)
    check_shardable(model)
    for block in transformer_blocks(model, block_classes):
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def gather_full_model(model: nn.Module) -> Optional[nn.Module]:
    """A plain copy of the FSDP2-sharded ``model`` with whole tensors on the CPU, on rank 0; None on the
    other ranks. A collective: every rank calls it (module docstring)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    if not fsdp_modules(model):
        raise ValueError("gather_full_model: expected a model sharded by FSDP2 (fully_shard), got one that is not")
    reshard_(model)
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if not distributed.is_rank_zero():
        return None
    return _plain_copy(model, "", state, {}, {})


def _plain_class(cls: type) -> type:
    """The class ``fully_shard`` replaced (it makes ``FSDP<Name>(FSDPModule, Name)``), else ``cls``."""
    if FSDPModule is not None and issubclass(cls, FSDPModule):
        return next(base for base in cls.__bases__ if base is not FSDPModule)
    return cls


def _is_fsdp_hook(hook) -> bool:
    """Whether a module hook is one of FSDP2's (its function lives in ``torch.distributed.fsdp``)."""
    hook = getattr(hook, "hook", hook)  # torch's _WrappedHook
    hook = getattr(hook, "func", hook)  # functools.partial
    return (getattr(hook, "__module__", None) or "").startswith("torch.distributed.fsdp")


def _whole(state: dict, name: str, live: torch.Tensor) -> torch.Tensor:
    """The full tensor ``name`` from the gathered state (a copy, never the live tensor's storage)."""
    if name not in state:
        if is_sharded(live):
            raise ValueError(f"gather_full_model: the gathered state dict has no {name!r}")
        return live.detach().to("cpu", copy=True)
    tensor = state[name]
    if not is_sharded(live) and tensor.device == live.device and tensor.data_ptr() == live.data_ptr():
        return tensor.clone()
    return tensor


def _plain_copy(module: nn.Module, prefix: str, state: dict, modules: dict, parameters: dict) -> nn.Module:
    """``module`` rebuilt without FSDP: same class (unwrapped) and attributes, whole tensors from ``state``;
    shared submodules and Parameters (tied weights) stay shared (``modules`` / ``parameters``: id -> copy)."""
    if id(module) in modules:
        return modules[id(module)]
    cls = _plain_class(type(module))
    copy = cls.__new__(cls)
    modules[id(module)] = copy
    for key, value in module.__dict__.items():
        if key.startswith(FSDP_ATTRIBUTES):
            continue
        if isinstance(value, dict):  # hook tables and the like: the copy's own, FSDP's hooks left out
            value = value.copy()
            for fsdp_hook in [k for k, v in value.items() if callable(v) and _is_fsdp_hook(v)]:
                del value[fsdp_hook]
        copy.__dict__[key] = value
    copy._non_persistent_buffers_set = set(module._non_persistent_buffers_set)
    copy._parameters = {}
    for name, parameter in module._parameters.items():
        if parameter is not None and id(parameter) not in parameters:
            whole = _whole(state, prefix + name, parameter)
            parameters[id(parameter)] = nn.Parameter(whole, requires_grad=parameter.requires_grad)
        copy._parameters[name] = None if parameter is None else parameters[id(parameter)]
    copy._buffers = {name: None if buffer is None else _whole(state, prefix + name, buffer)
                     for name, buffer in module._buffers.items()}
    copy._modules = {name: None if child is None else _plain_copy(child, f"{prefix}{name}.", state, modules, parameters)
                     for name, child in module._modules.items()}
    return copy
