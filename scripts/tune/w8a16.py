"""Sweep W8A16 (``compress_kernels.w8a16``): the dispatch table's pick and its neighbours, per shape and M.

    python -m scripts.tune.w8a16 --shapes 4096x4096,8192x28672 --m 1,16,64,2048 --group 0 --out w8a16.json

For each weight shape K x N and token count M it times ``w8a16_matmul``'s path with the config
:func:`compress_kernels.w8a16.dispatch.pick` gives for the scale grouping, and the same path with one
launch parameter changed (tile width, K split, warps, stages; the one-row kernel prefetches its next tile
itself and has no stages to tune), each checked against ``compress_kernels.reference.w8a16_matmul_ref``,
next to cuBLAS fp16. Rows and method: :mod:`scripts.tune.sweep` (rows add ``group``). Runs on a GPU; on
the CPU (Triton's interpreter, ``TRITON_INTERPRET=1``) only tiny shapes are practical.
"""
from __future__ import annotations

import argparse

import torch

from compress_kernels.reference import W8A16_GROUP_SIZE, w8a16_matmul_ref
from compress_kernels.common.device import sm_count
from compress_kernels.w8a16.dispatch import (GEMV_GROUPED_PROGRAMS_PER_SM, GEMV_MIN_PROGRAMS_PER_SM, LARGE_M,
                                             TileConfig, gemv_block_k, gemv_split_k, pick)
from compress_kernels.w8a16.op import launch
from scripts.tune import sweep

TOL = {torch.float16: 2e-3, torch.bfloat16: 1e-2}  # grouped tiles round the dequantized weight to x's dtype


def candidates(cfg, m: int, n: int, k: int, grouped: bool, device) -> list:
    """The pick and its neighbours on the same path (with groups, a K tile stays inside one group), plus
    the neighbouring paths: for the one-row kernel, wider tiles with the K split the table would give
    them (8 or 16 KiB of weights per step); from ``LARGE_M`` rows, the tiles and the dequantize + cuBLAS
    path against each other."""
    if cfg.path == "dequant":  # the dequantize pass's tile (0: its defaults) and warps, and the tiles
        tiles = [cfg._replace(block_n=64, block_k=128), cfg._replace(block_n=64, block_k=128, num_warps=8)]
        if not grouped:
            tiles.append(cfg._replace(block_n=16, block_k=512))
        return [cfg, *tiles, TileConfig(128, 128, 64, num_warps=8, num_stages=4)]
    steps = {"block_n": sweep.halve_double(4 if cfg.path == "gemv" else 16, 256), "split_k": sweep.halve_double(1, 32),
             "num_warps": sweep.halve_double(1, 8)}
    if cfg.path == "tiled":
        steps.update(num_stages=sweep.stages, block_m=sweep.halve_double(16, 256))
    deepest_k = W8A16_GROUP_SIZE if grouped else 4096  # the one-row kernel's K step stays inside a scale group
    if cfg.path == "gemv":
        steps.update(block_k=sweep.halve_double(32, deepest_k))
    out = [cfg, *sweep.neighbours(cfg, steps)]
    if cfg.path == "gemv":
        sms = sm_count(device)
        deepest = gemv_block_k(k, deepest_k)
        per_sm = GEMV_GROUPED_PROGRAMS_PER_SM if grouped else GEMV_MIN_PROGRAMS_PER_SM
        for block_n in (16, 32, 64):  # 8 KiB of weights per step (the per-channel pick's) or 16 KiB
            for step_bytes in (8192, 16384):
                block_k = min(deepest, step_bytes // block_n)
                wider = gemv_split_k(m, n, k, cfg._replace(block_n=block_n, block_k=block_k, split_k=1), sms, per_sm)
                if wider not in out:
                    out.append(wider)
    if cfg.path == "tiled" and m >= LARGE_M:
        out.append(TileConfig(0, 0, 0, path="dequant"))
    return out


def weight_sets(k: int, n: int, m: int, grouped: bool, dtype, device, args) -> tuple[list, list]:
    """(W8A16 sets (x, w_q, w_scale), fp16 sets (x, w)) rotating past L2."""
    gen = torch.Generator(device=device).manual_seed(0)
    count = sweep.set_count(n * k + m * k * 2, device, args)
    groups = (k // W8A16_GROUP_SIZE,) if grouped else ()
    sets, fp16 = [], []
    for _ in range(count):
        x = torch.randn(m, k, generator=gen, device=device).to(dtype)
        w_q = torch.randint(-128, 128, (n, k), generator=gen, dtype=torch.int8, device=device)
        w_scale = torch.rand(n, *groups, generator=gen, device=device) * 1e-3 + 1e-4
        sets.append((x, w_q, w_scale))
        fp16.append((x.half(), (torch.randn(n, k, generator=gen, device=device) * 0.02).half()))
    return sets, fp16


def sweep_case(k: int, n: int, m: int, args, device) -> list[dict]:
    dtype = sweep.DTYPES[args.dtype]
    grouped = args.group == W8A16_GROUP_SIZE
    if k % 8 or (grouped and k % W8A16_GROUP_SIZE):
        raise SystemExit(f"--shapes: expected K a multiple of 8 (of {W8A16_GROUP_SIZE} with --group "
                         f"{W8A16_GROUP_SIZE}), got K = {k}")
    sets, fp16 = weight_sets(k, n, m, grouped, dtype, device, args)
    picked = pick(m, n, k, grouped, device)
    case = {"op": "w8a16", "K": k, "N": n, "M": m, "dtype": args.dtype, "group": args.group or "channel"}
    return sweep.time_case(case, candidates(picked, m, n, k, grouped, device), picked, sets,
                           lambda cfg, s: launch(*s, config=cfg), lambda s: w8a16_matmul_ref(*s), TOL[dtype], fp16,
                           args)


def group_size(text: str) -> int:
    """``--group``: 0 for one scale per output channel, or 128."""
    value = sweep.parse_ints(text)[0] if text != "0" else 0
    if value not in (0, W8A16_GROUP_SIZE):
        raise argparse.ArgumentTypeError(f"expected 0 (per channel) or {W8A16_GROUP_SIZE}, got {text!r}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--group", type=group_size, default=0, help="0 = per channel (default) or 128")


def main(argv=None) -> list[dict]:
    return sweep.run("w8a16", __doc__.splitlines()[0], "4096x4096,4096x11008,11008x4096,8192x28672",
                     "1,2,16,64,256,2048", sweep_case, argv, add_arguments)


if __name__ == "__main__":
    main()
