"""int8 MLP chains: a block-scaled up-projection hands ``gelu`` of its output to the down-projection in int8.

In a BERT-style MLP (``intermediate.dense -> GELU -> output.dense``) with both projections
:class:`compress.nn.inference.W8A8BlockLinear`, the down-projection quantizes its input in 1 x 128 blocks
before its GEMM. The up-projection's kernel can instead apply the GELU and that quantization in its
epilogue (``compress_kernels.w8a8_block_matmul(..., out_dtype=torch.int8, gelu=True)``), and the
down-projection's GEMM reads the int8 values and scales (``x_scale=...``): two launches instead of three,
and the (M, intermediate) activation is written and read once, in int8, never in float.

:func:`link_block_chains` finds the chains by running one forward pass with hooks: an up-projection
whose output tensor object is the input of an exact GELU module (``nn.GELU()`` or ``transformers``'
``GELUActivation``), whose output tensor object is the input of another ``W8A8BlockLinear``. For each it
makes a :class:`BlockChain`, given to both projections as a plain attribute (``chain_head`` /
``chain_tail``, not submodules: the state dict does not change), and replaces the GELU module by a
:class:`ChainedGELU` holding the chain.

At run time the head computes ``(yq, s_y)`` and returns a placeholder of the output's shape and dtype:
an expanded NaN scalar (no memory), standing for the float output nobody writes. The
:class:`ChainedGELU` returns that same object (the GELU already ran), and the tail, called with it,
takes ``(yq, s_y)``. Anything else that reads the placeholder gets NaN, never plausible numbers: so the
link is checked when it is made, by running the example forward again linked and comparing with the
unlinked outputs; a model where something else reads the up-projection's output is unlinked again and
logged. A ChainedGELU called with any other tensor computes the exact GELU as before; under
``torch.compile`` nothing is handed over (the head computes its float output). The integers the tail
reads are those the unlinked model's down-projection computes from the GELU's output (both round the
values to the activation dtype first), so on the CPU (reference functions) a linked model gives the
unlinked model's outputs bit for bit, and on the GPU up to the GELU's last fp32 bit.
"""
from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from torch import nn

from compress.nn.input_quant import _is_exact_gelu
from compress.nn.inference import W8A8BlockLinear

logger = logging.getLogger(__name__)

LINK_CHECK_TOLERANCE = 1e-2  # relative error of a linked model's outputs against the unlinked ones


class BlockChain:
    """One linked up-projection -> GELU -> down-projection, and the int8 output in flight between them."""

    def __init__(self):
        self._pending: tuple | None = None  # (placeholder, yq, s_y)

    def start(self, up: W8A8BlockLinear, x: torch.Tensor) -> torch.Tensor:
        """The head's forward: keep ``gelu(up(x))`` in int8 and return the placeholder standing for ``up(x)``."""
        yq, s_y = up.gelu_int8_output(x)
        placeholder = torch.full((), float("nan"), dtype=x.dtype, device=x.device)
        placeholder = placeholder.expand(*x.shape[:-1], up.out_features)
        self._pending = (placeholder, yq, s_y)
        return placeholder

    def passes(self, t: torch.Tensor) -> bool:
        """Whether ``t`` is the placeholder in flight (the GELU then passes it on unchanged)."""
        return self._pending is not None and self._pending[0] is t

    def quantized(self, x: torch.Tensor):
        """``(yq, s_y)`` when ``x`` is the placeholder in flight (taken once), else None."""
        if not self.passes(x):
            return None
        _, yq, s_y = self._pending
        self._pending = None
        return yq, s_y


class ChainedGELU(nn.Module):
    """The exact GELU between the two projections of a :class:`BlockChain`: passes the chain's placeholder
    on (the head applied the GELU in its epilogue), computes ``F.gelu`` on anything else."""

    def __init__(self, chain: BlockChain, original: nn.Module):
        super().__init__()
        self.__dict__["chain"] = chain  # not a submodule, not state
        self.__dict__["original"] = original  # the GELU module it stands for (put back by unlink_block_chains)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not torch.compiler.is_compiling() and self.chain.passes(x):
            return x
        return F.gelu(x)


@torch.no_grad()
def find_block_chains(model: nn.Module, example_inputs: dict) -> list[tuple[str, str, str]]:
    """``(up, gelu, down)`` module names seen chained in one forward of ``model(**example_inputs)``."""
    names = {id(m): name for name, m in model.named_modules()}
    up_outputs: dict[int, tuple[str, torch.Tensor]] = {}
    gelu_outputs: dict[int, tuple[str, str, torch.Tensor]] = {}
    chains: list[tuple[str, str, str]] = []

    def after_linear(module, _args, output):
        up_outputs[id(output)] = (names[id(module)], output)

    def after_gelu(module, args, output):
        seen = up_outputs.get(id(args[0])) if args else None
        if seen is not None and seen[1] is args[0]:
            gelu_outputs[id(output)] = (seen[0], names[id(module)], output)

    def before_linear(module, args):
        seen = gelu_outputs.get(id(args[0])) if args else None
        if seen is not None and seen[2] is args[0]:
            chain = (seen[0], seen[1], names[id(module)])
            if chain not in chains:
                chains.append(chain)

    hooks = []
    for module in model.modules():
        if isinstance(module, W8A8BlockLinear):
            hooks += [module.register_forward_hook(after_linear), module.register_forward_pre_hook(before_linear)]
        elif _is_exact_gelu(module):
            hooks.append(module.register_forward_hook(after_gelu))
    try:
        model(**example_inputs)
    finally:
        for hook in hooks:
            hook.remove()
    return chains


def _outputs(model: nn.Module, example_inputs: dict) -> list[torch.Tensor]:
    """The float tensors of one forward's output (a tensor, a tuple / list, or a dict-like model output)."""
    out = model(**example_inputs)
    if isinstance(out, torch.Tensor):
        values = [out]
    elif isinstance(out, (tuple, list)):
        values = out
    else:  # a transformers ModelOutput or another mapping
        values = out.values() if hasattr(out, "values") else []
    return [v.detach().float() for v in values if isinstance(v, torch.Tensor) and v.is_floating_point()]


def _close(linked: list[torch.Tensor], unlinked: list[torch.Tensor]) -> bool:
    """Same outputs: finite where the unlinked ones are, and within :data:`LINK_CHECK_TOLERANCE`."""
    if len(linked) != len(unlinked):
        return False
    for got, want in zip(linked, unlinked):
        if got.shape != want.shape or not torch.equal(torch.isfinite(got), torch.isfinite(want)):
            return False
        finite = torch.isfinite(want)
        error = (got[finite] - want[finite]).norm() / want[finite].norm().clamp(min=1e-12)
        if error > LINK_CHECK_TOLERANCE:
            return False
    return True


def _replace_everywhere(model: nn.Module, old: nn.Module, new: nn.Module) -> None:
    for parent in list(model.modules()):
        for child_name, child in list(parent.named_children()):
            if child is old:
                setattr(parent, child_name, new)


def unlink_block_chains(model: nn.Module) -> int:
    """Undo :func:`link_block_chains`: the original GELU modules back, no chain attributes; returns how many
    chains there were."""
    count = 0
    for module in list(model.modules()):
        if isinstance(module, ChainedGELU):
            _replace_everywhere(model, module, module.original)
            count += 1
        if isinstance(module, W8A8BlockLinear):
            module.__dict__.pop("chain_head", None)
            module.__dict__.pop("chain_tail", None)
    return count


@torch.no_grad()
def link_block_chains(model: nn.Module, example_inputs: dict) -> int:
    """Link every up-projection -> GELU -> down-projection of block-scaled layers in ``model`` (module
    docstring); returns the number of chains. Runs ``model(**example_inputs)`` (``no_grad``) to find them
    and twice more to check the linked model against the unlinked one. Linking again first unlinks."""
    unlink_block_chains(model)  # linking twice links the same chains once
    chains = find_block_chains(model, example_inputs)
    if not chains:
        logger.info("link_block_chains: no W8A8BlockLinear -> GELU -> W8A8BlockLinear chain found")
        return 0
    unlinked = _outputs(model, example_inputs)
    modules = dict(model.named_modules())
    for up, gelu, down in chains:
        chain = BlockChain()
        modules[up].__dict__["chain_head"] = chain
        modules[down].__dict__["chain_tail"] = chain
        _replace_everywhere(model, modules[gelu], ChainedGELU(chain, modules[gelu]))
    if not _close(_outputs(model, example_inputs), unlinked):
        unlink_block_chains(model)
        logger.warning("link_block_chains: the linked model's outputs differ from the unlinked model's (something "
                       "else reads an up-projection's output); left unlinked")
        return 0
    logger.info("link_block_chains: %d MLP chains hand int8 over (e.g. %s -> %s)", len(chains), chains[0][0],
                chains[0][2])
    return len(chains)


def linked_chains(model: nn.Module) -> int:
    """How many block-scaled layers of ``model`` start a linked chain."""
    return sum(isinstance(m, W8A8BlockLinear) and m.__dict__.get("chain_head") is not None for m in model.modules())
