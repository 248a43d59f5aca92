"""Host time per call of each inference module at M = 1, against ``F.linear`` of the same shape.

A decode step of a small model is host-bound in eager mode: each linear call costs its Python and
launch work, while its kernel runs for a few microseconds. Here each module's forward is called
``calls`` times back to back on one token, ``x`` (1, 1, K) fp16, with one device synchronisation
after the last call only, so the figure (wall time / calls) is the host time per call wherever that
exceeds the kernel's time (every SmolLM2 shape). Shapes default to SmolLM2-135M's (K x N: q/o
576x576, k/v 576x192, gate/up 576x1536, down 1536x576), random weights; modules are built as
``compress.convert`` builds them (W4A16 groups of 128, W8A16 per channel, block-scaled W8A8, block-sparse at
50% with random 32x32 blocks, alone, with W8A8 and with W4A16 in groups of 128).

Per module kind two figures: ``forward_us``, the module as models call it (bound kernel calls in
eager mode, :mod:`compress.nn.inference`), and ``public_launcher_us``, the public
``compress_kernels.<op>`` on the same buffers (full validation and the custom op's dispatch on every
call: the path the modules took before). On the CPU the modules run the pure-PyTorch references and
the launcher figure is absent (it needs CUDA or the interpreter).
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from compress.configs import W4A16Config, W8A8BlockConfig, W8A8Config, W8A16Config
from compress.core.sparsity import block_mask
from compress.eval.timing import host_ms, synchronize
from compress.nn.inference import (BSRLinear, BSRW4A16Linear, BSRW8A8Linear, W4A16Linear, W8A8BlockLinear, W8A8Linear,
                                   W8A16Linear)

SMOLLM2_SHAPES = ((576, 576), (576, 192), (576, 1536), (1536, 576))  # (K, N) of q/o, k/v, gate/up, down
STATIC_SCALE = 0.02


def random_mask(linear: nn.Linear, seed: int = 0) -> torch.Tensor:
    """A 50% block mask from random block scores (speed only, like the decode variants' masks)."""
    generator = torch.Generator().manual_seed(seed)
    return block_mask(torch.rand(linear.weight.shape, generator=generator), 0.5).to(linear.weight.device)


MODULES: dict[str, Callable[[nn.Linear], nn.Module]] = {
    "w8a8": lambda linear: W8A8Linear.from_float(linear, W8A8Config()),
    "w8a8-static": lambda linear: W8A8Linear.from_float(linear, W8A8Config("static"),
                                                        act_scale=torch.tensor(STATIC_SCALE)),
    "w4a16": lambda linear: W4A16Linear.from_float(linear, W4A16Config(128)),
    "w8a16": lambda linear: W8A16Linear.from_float(linear, W8A16Config()),
    "w8a8-block": lambda linear: W8A8BlockLinear.from_float(linear, W8A8BlockConfig()),
    "dds50": lambda linear: BSRLinear.from_float(linear, mask=random_mask(linear)),
    "dds50-w8a8": lambda linear: BSRW8A8Linear.from_float(linear, mask=random_mask(linear)),
    "dds50-w4a16": lambda linear: BSRW4A16Linear.from_float(linear, W4A16Config(128), mask=random_mask(linear)),
}


def public_call(module: nn.Module, x: torch.Tensor) -> Callable[[], torch.Tensor] | None:
    """A call of the public launcher with ``module``'s buffers (what its forward called before bound calls)."""
    import compress_kernels as kernels

    bias = module.bias
    if isinstance(module, W8A8Linear):
        return lambda: kernels.w8a8_matmul(x, module.w_q, module.w_scale, bias, module.act_scale)
    if isinstance(module, W4A16Linear):
        xp = nn.functional.pad(x, (0, module.padded_in_features - module.in_features))
        return lambda: kernels.w4a16_matmul(xp, module.qweight, module.scales, module.group_size, bias)
    if isinstance(module, W8A16Linear):
        xp = nn.functional.pad(x, (0, module.padded_in_features - module.in_features))
        return lambda: kernels.w8a16_matmul(xp, module.w_q, module.w_scale, bias)
    if isinstance(module, W8A8BlockLinear):
        return lambda: kernels.w8a8_block_matmul(x, module.w_q, module.w_scale, bias)
    parts = (module.crow_indices, module.col_indices, module.values)
    if isinstance(module, BSRW4A16Linear):
        return lambda: kernels.bsr_w4a16_matmul(x, *parts, module.scales, module.out_features, bias,
                                                module.tile_rows, check_indices=False)
    if isinstance(module, BSRW8A8Linear):
        return lambda: kernels.bsr_w8a8_matmul_parts(x, *parts, module.w_scale, module.out_features, bias,
                                                     module.act_scale, check_indices=False)
    return lambda: kernels.bsr_matmul_parts(x, *parts, module.out_features, bias, module.tile_rows, check_indices=False)


def us_per_call(work: Callable[[], object], device: torch.device, calls: int, warmup: int = 10) -> float:
    """Wall microseconds per call of ``calls`` back-to-back calls, synchronised once after the last."""
    for _ in range(warmup):
        work()
    synchronize(device)
    return host_ms(lambda: ([work() for _ in range(calls)], synchronize(device))) / calls * 1e3


@torch.no_grad()
def measure_shape(k: int, n: int, device: torch.device, dtype: torch.dtype, calls: int, kinds=tuple(MODULES)) -> dict:
    """``{k, n, linear_us, modules: {kind: {forward_us, public_launcher_us}}}`` for one (K, N) at M = 1."""
    torch.manual_seed(0)
    linear = nn.Linear(k, n, bias=False).to(device)
    x = torch.randn(1, 1, k, device=device, dtype=dtype)
    dense = linear.to(dtype)
    row = dict(k=k, n=n, linear_us=us_per_call(lambda: dense(x), device, calls), modules={})
    for kind in kinds:
        module = MODULES[kind](nn.Linear(k, n, bias=False).to(device)).to(dtype)
        figures = dict(forward_us=us_per_call(lambda: module(x), device, calls))
        if device.type == "cuda":
            figures["public_launcher_us"] = us_per_call(public_call(module, x), device, calls)
        row["modules"][kind] = figures
    return row


def measure(device: torch.device, dtype: torch.dtype = torch.float16, calls: int = 200,
            shapes=SMOLLM2_SHAPES, kinds=tuple(MODULES)) -> list[dict]:
    """:func:`measure_shape` for every (K, N) of ``shapes``."""
    return [measure_shape(k, n, device, dtype, calls, kinds) for k, n in shapes]


def format_table(rows: list[dict]) -> str:
    """Markdown: one row per shape and module kind, microseconds per call and the ratio to ``F.linear``."""
    lines = ["| K x N | module | forward us/call | vs F.linear | public launcher us/call |", "|---|---|---|---|---|"]
    for row in rows:
        lines.append(f"| {row['k']}x{row['n']} | F.linear | {row['linear_us']:.1f} | 1.00x | - |")
        for kind, fig in row["modules"].items():
            public = fig.get("public_launcher_us")
            public_cell = "-" if public is None else f"{public:.1f}"
            lines.append(f"| {row['k']}x{row['n']} | {kind} | {fig['forward_us']:.1f} | "
                         f"{fig['forward_us'] / row['linear_us']:.2f}x | {public_cell} |")
    return "\n".join(lines)
