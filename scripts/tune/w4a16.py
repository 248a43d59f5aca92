"""Sweep W4A16 (``compress_kernels.w4a16``): the dispatch table's pick and its neighbours, per shape and M.

    python -m scripts.tune.w4a16 --shapes 4096x4096,8192x28672 --m 1,16,64 --group 128 --out w4a16.json

For each weight shape K x N and token count M it times ``w4a16_matmul``'s path with the config
:func:`compress_kernels.w4a16.dispatch.pick` gives for the group size and scale dtype, and the same
path with one launch parameter changed (tile width, K split, warps, stages, within what the path
takes: the whole-K-strip kernel runs unsplit, the dequantize path has no tiles of ours), each checked
against ``compress_kernels.reference.w4a16_matmul_ref``, next to cuBLAS fp16. Rows and method:
:mod:`scripts.tune.sweep` (rows add ``group`` and ``scales``). Runs on a GPU; on the CPU (Triton's
interpreter, ``TRITON_INTERPRET=1``) only tiny shapes are practical.
"""
from __future__ import annotations

import argparse

import torch

from compress_kernels.reference import w4a16_matmul_ref
from compress_kernels.w4a16.dispatch import pick
from compress_kernels.w4a16.op import GROUP_SIZES, launch
from scripts.tune import sweep

TOL = {torch.float16: 2e-3, torch.bfloat16: 1e-2}  # the weight rounded to x's dtype, the output cast


def candidates(cfg) -> list:
    """The pick and its neighbours on the same path."""
    if cfg.path == "dequant":
        return [cfg]
    steps = {"block_n": sweep.halve_double(8 if cfg.path in ("wholek", "fma") else 16, 256),
             "num_warps": sweep.halve_double(1, 8)}
    if cfg.path != "wholek":  # the whole K strip: one split, one stage
        steps.update(split_k=sweep.halve_double(1, 32), num_stages=sweep.stages)
    return [cfg, *sweep.neighbours(cfg, steps)]


def weight_sets(k: int, n: int, m: int, group: int, dtype, scale_dtype, device, args) -> tuple[list, list]:
    """(W4A16 sets (x, qweight, scales), fp16 sets (x, w)) rotating past L2."""
    gen = torch.Generator(device=device).manual_seed(0)
    count = sweep.set_count(k * n // 2 + m * k * 2, device, args)
    sets, fp16 = [], []
    for _ in range(count):
        x = torch.randn(m, k, generator=gen, device=device).to(dtype)
        qweight = torch.randint(-2**31, 2**31 - 1, (k // 8, n), generator=gen, dtype=torch.int32, device=device)
        scales = (torch.rand(k // group, n, generator=gen, device=device) * 1e-2 + 1e-3).to(scale_dtype)
        sets.append((x, qweight, scales))
        fp16.append((x.half(), (torch.randn(n, k, generator=gen, device=device) * 0.02).half()))
    return sets, fp16


def sweep_case(k: int, n: int, m: int, args, device) -> list[dict]:
    dtype = sweep.DTYPES[args.dtype]
    group = k if args.group == 0 else args.group
    if k % 8 or k % group:
        raise SystemExit(f"--shapes: expected K a multiple of 8 and of the group size {group}, got K = {k}")
    scale_dtype = torch.float32 if args.scales == "fp32" else dtype
    sets, fp16 = weight_sets(k, n, m, group, dtype, scale_dtype, device, args)
    picked = pick(m, n, k, group, sets[0][2].element_size(), device)
    case = {"op": "w4a16", "K": k, "N": n, "M": m, "dtype": args.dtype, "group": group, "scales": args.scales}
    return sweep.time_case(case, candidates(picked), picked, sets,
                           lambda cfg, s: launch(s[0], s[1], s[2], group, config=cfg),
                           lambda s: w4a16_matmul_ref(s[0], s[1], s[2], group), TOL[dtype], fp16, args)


def group_size(text: str) -> int:
    """``--group``: 32, 64, 128, or 0 for one group per channel (G = K)."""
    value = sweep.parse_ints(text)[0] if text != "0" else 0
    if value not in (0, *GROUP_SIZES):
        raise argparse.ArgumentTypeError(f"expected one of {GROUP_SIZES} or 0 (per channel), got {text!r}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--group", type=group_size, default=128, help="32, 64, 128 or 0 = per channel (default 128)")
    parser.add_argument("--scales", choices=("fp32", "act"), default="fp32",
                        help="scale dtype: fp32 or the activations' dtype (default fp32)")


def main(argv=None) -> list[dict]:
    return sweep.run("w4a16", __doc__.splitlines()[0], "4096x4096,4096x11008,11008x4096,8192x28672", "1,2,16,64,256",
                     sweep_case, argv, add_arguments)


if __name__ == "__main__":
    main()
