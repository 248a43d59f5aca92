"""Sweep the block-sparse ops (``compress_kernels.bsr``, ``compress_kernels.bsr_w8a8``): the dispatch
table's pick and its neighbours.

    python -m scripts.tune.bsr --shapes 4096x4096,4096x11008 --m 1,16,64 --sparsity 50,90 --out bsr.json
    python -m scripts.tune.bsr --int8 ...        # DDS + W8A8 (int8 blocks, per-token int8 activations)
    python -m scripts.tune.bsr --int4 ...        # DDS + W4A16 (int4 blocks, a scale per row of a block)
    python -m scripts.tune.bsr --tile-rows 4 ... # DDS on blocks pruned in tiles of 4 block rows

For each weight shape K x N, block sparsity (percent of the 32x32 blocks absent) and token count M
it times the op with the config :func:`compress_kernels.bsr.dispatch.pick` gives (``--int8``:
:func:`compress_kernels.bsr_w8a8.dispatch.pick`; ``--int4``: :func:`compress_kernels.bsr_w4a16.dispatch.pick`),
and the same kernel with one launch parameter changed (rows per tile, outputs per program, blocks per step,
programs sharing a block row, warps, stages; the int4 one-row kernel also on a grid of outputs, blocks per
step and sharing, and up to 64 rows the int4 planes kernel on a grid of tiles, blocks per step, warps and
sharing; past 16 rows int4 blocks both ways, de-quantized for the DDS op and the int4 tiles with their
neighbours; the dense path, taken at large M on dense layers, has no tiles of ours), each checked
against the reference (``bsr_matmul_ref`` / ``bsr_w8a8_matmul_ref`` / ``bsr_w4a16_matmul_ref``), next to
cuBLAS fp16 on the dense shape. With ``--tile-rows R`` the blocks are absent in tiles of R block rows x one
block column (``BlockSparseConfig(tile_rows=R)``), the pick is the table's for that pattern, and the tile
kernel (:mod:`compress_kernels.bsr.tile_gemm`) is timed on a grid of rows per tile, blocks per step, warps
and stages beside it, whichever kernel the table picks (the line between them is what this tunes). Rows
and method: :mod:`scripts.tune.sweep` (rows add ``sparsity`` and ``tile_rows``). Runs on a GPU; on the CPU
(Triton's interpreter, ``TRITON_INTERPRET=1``) only tiny shapes are practical.
"""
from __future__ import annotations

import argparse
import dataclasses

import torch

from compress_kernels.bsr.dispatch import BsrConfig, pick
from compress_kernels.bsr.indices import TILE_ROWS
from compress_kernels.bsr.op import launch
from compress_kernels.bsr_w4a16.dispatch import DEQUANT, tile_pick
from compress_kernels.bsr_w4a16.dispatch import pick as pick_w4a16
from compress_kernels.bsr_w4a16.op import launch as launch_w4a16
from compress_kernels.bsr_w4a16.planes import ROW_TILES
from compress_kernels.bsr_w8a8.dispatch import pick as pick_w8a8
from compress_kernels.bsr_w8a8.op import launch as launch_w8a8
from compress_kernels.common.prefetch import prefetch_allowed
from compress_kernels.reference import BSR_BLOCK, bsr_matmul_ref, bsr_w4a16_matmul_ref, bsr_w8a8_matmul_ref
from scripts.tune import sweep

TOL = {torch.float16: 5e-3, torch.bfloat16: 2e-2}  # fp32 sums in another order, the output cast


def candidates(cfg, int4: bool = False) -> list:
    """The pick and its neighbours on the same kernel; for the int4 one-row kernel, also every outputs per
    program x blocks per step x split of a block row (4 warps)."""
    if cfg.kernel in ("dense", "dequant", "tiles"):  # the tile kernel's grid: tile_candidates
        return [cfg]
    if cfg.kernel == "gemv" and int4:
        grid = [dataclasses.replace(cfg, block_n=bn, group=g, split=sp, num_warps=4)
                for bn in (8, 16, 32) for g in (4, 8, 16) for sp in (1, 2, 4, 8)]
        return [cfg, *[c for c in dict.fromkeys(grid + sweep.neighbours(cfg, {"num_warps": sweep.halve_double(2, 8),
                                                                                  "num_stages": sweep.stages}))
                       if c != cfg]]
    steps = {"group": sweep.halve_double(1, 16), "num_warps": sweep.halve_double(2, 8), "num_stages": sweep.stages}
    if cfg.kernel == "planes":  # four blocks a 16-deep dot: 4 or 8 blocks a step
        steps.update(group=sweep.halve_double(4, 8), block_n=sweep.halve_double(16, 32), split=sweep.halve_double(1, 8))
    elif cfg.kernel == "gemv":
        steps["block_n"] = sweep.halve_double(8, 32)
    else:
        steps.update(block_m=sweep.halve_double(16, 256), block_n=sweep.halve_double(16, 32),
                     split=sweep.halve_double(1, 8))
    return [cfg, *sweep.neighbours(cfg, steps)]


def planes_candidates(m: int) -> list[BsrConfig]:
    """The int4 planes kernel's grid up to 64 rows: rows per program (each tile under M and the fewest holding
    it) x 16 / 32 outputs x 4 / 8 blocks a step x 2 / 4 warps x 1 / 2 / 4 programs sharing a block row x 2 / 3
    stages."""
    rows = dict.fromkeys([r for r in ROW_TILES if r < m] + [next((r for r in ROW_TILES if r >= m), ROW_TILES[-1])])
    return [BsrConfig("planes", bm, bn, group, warps, stages, split=split)
            for bm in rows for bn in (16, 32) for group in (4, 8) for warps in (2, 4) for split in (1, 2, 4)
            for stages in (2, 3)]


def tile_candidates(tile_rows: int) -> list[BsrConfig]:
    """The tile kernel's grid for tiles of ``tile_rows`` block rows: 64 / 128 rows, 4 / 8 warps, 6 / 8 stages
    (256 rows and 4 stages lost everywhere on an H200)."""
    return [BsrConfig("tiles", bm, tile_rows * BSR_BLOCK, 1, warps, stages)
            for bm in (64, 128) for warps in (4, 8) for stages in (6, 8)]


def block_parts(k: int, n: int, sparsity: int, dtype, gen, device, tile_rows: int = 1):
    """(crow, col, values) of a random weight with round(sparsity% of the blocks) absent, in tiles of
    ``tile_rows`` block rows x one block column (the last tile may be shorter)."""
    rows, cols = n // BSR_BLOCK, k // BSR_BLOCK
    tiles = -(-rows // tile_rows)
    keep = torch.ones(tiles * cols, dtype=torch.bool, device=device)
    keep[torch.randperm(tiles * cols, generator=gen, device=device)[: round(sparsity / 100 * tiles * cols)]] = False
    keep = keep.reshape(tiles, cols).repeat_interleave(tile_rows, dim=0)[:rows]
    crow = torch.zeros(rows + 1, dtype=torch.int32, device=device)
    crow[1:] = torch.cumsum(keep.sum(dim=1), 0).to(torch.int32)
    col = keep.nonzero()[:, 1].to(torch.int32).contiguous()
    shape = (col.shape[0], BSR_BLOCK, BSR_BLOCK)
    if dtype == torch.int8:
        values = torch.randint(-127, 128, shape, generator=gen, dtype=torch.int8, device=device)
    elif dtype == torch.int32:  # int4: 8 nibbles a word, 4 words a block row
        values = torch.randint(-2**31, 2**31 - 1, (*shape[:2], BSR_BLOCK // 8), generator=gen, dtype=torch.int32,
                               device=device)
    else:
        values = (torch.randn(shape, generator=gen, device=device) * 0.02).to(dtype)
    return crow, col, values


def weight_sets(k: int, n: int, m: int, sparsity: int, dtype, args, device) -> tuple[list, list]:
    """(sets (x, crow, col, values[, scales]), fp16 sets (x, w)) rotating past L2."""
    gen = torch.Generator(device=device).manual_seed(0)
    value_bytes = 1 if args.int8 else 0.5 if args.int4 else 2
    count = sweep.set_count(round((100 - sparsity) / 100 * n * k * value_bytes) + m * k * 2, device, args)
    sets, fp16 = [], []
    for _ in range(count):
        x = torch.randn(m, k, generator=gen, device=device).to(dtype)
        parts = block_parts(k, n, sparsity, torch.int8 if args.int8 else torch.int32 if args.int4 else dtype, gen,
                            device, args.tile_rows)
        if args.int8:  # a scale per output channel
            scale = (torch.rand(n, generator=gen, device=device) * 1e-3 + 1e-4,)
        elif args.int4:  # a scale per row of each stored block
            scale = (torch.rand(parts[1].shape[0], BSR_BLOCK, generator=gen, device=device) * 1e-2 + 1e-3,)
        else:
            scale = ()
        sets.append((x, *parts, *scale))
        fp16.append((x.half(), (torch.randn(n, k, generator=gen, device=device) * 0.02).half()))
    return sets, fp16


def sweep_case(k: int, n: int, m: int, args, device) -> list[dict]:
    """The rows of one shape and M at every ``--sparsity``."""
    if k % BSR_BLOCK or n % BSR_BLOCK:
        raise SystemExit(f"--shapes: expected K and N multiples of {BSR_BLOCK}, got {k}x{n}")
    return [row for sparsity in args.sparsity for row in sweep_sparsity(k, n, m, sparsity, args, device)]


def sweep_sparsity(k: int, n: int, m: int, sparsity: int, args, device) -> list[dict]:
    dtype = sweep.DTYPES[args.dtype]
    sets, fp16 = weight_sets(k, n, m, sparsity, dtype, args, device)
    nnz = sets[0][2].shape[0]
    case = {"op": "bsr_w8a8" if args.int8 else "bsr_w4a16" if args.int4 else "bsr", "K": k, "N": n, "M": m,
            "dtype": args.dtype, "sparsity": sparsity, "tile_rows": args.tile_rows}
    if args.int4:
        picked = pick_w4a16(m, n, k, nnz, device)
        run = lambda cfg, s: launch_w4a16(s[0], *s[1:4], s[4], n, config=cfg)  # noqa: E731
        reference = lambda s: bsr_w4a16_matmul_ref(s[0], *s[1:4], s[4], n)  # noqa: E731
    elif args.int8:
        picked = pick_w8a8(m, n, k, nnz, device)
        run = lambda cfg, s: launch_w8a8(s[0], *s[1:4], s[4], n, config=cfg)  # noqa: E731
        reference = lambda s: bsr_w8a8_matmul_ref(s[0], *s[1:4], s[4], n)  # noqa: E731
    else:
        picked = pick(m, n, k, nnz, device, prefetch_allowed(sets[0][3]), args.tile_rows)
        run = lambda cfg, s: launch(s[0], *s[1:4], n, tile_rows=args.tile_rows, config=cfg)  # noqa: E731
        reference = lambda s: bsr_matmul_ref(s[0], *s[1:4], n)  # noqa: E731
    configs = candidates(picked, args.int4)
    if args.int4 and m > 16:  # both sides of the de-quantized path's row
        configs += [c for c in (DEQUANT, *candidates(tile_pick(m, n, k, nnz, device), True)) if c not in configs]
    if args.int4 and m <= 64:  # the planes kernel's grid, whichever kernel the table picks
        configs += [c for c in planes_candidates(m) if c not in configs]
    if args.tile_rows > 1:
        configs += [c for c in tile_candidates(args.tile_rows) if c not in configs]
    return sweep.time_case(case, configs, picked, sets, run, reference, TOL[dtype], fp16, args)


def percent(text: str) -> list[int]:
    """``--sparsity``: comma-separated percentages 0..100."""
    values = [int(v) for v in text.split(",")] if text.replace(",", "").isdigit() else []
    if not values or max(values) > 100:
        raise argparse.ArgumentTypeError(f"expected percentages 0..100 separated by commas, got {text!r}")
    return values


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sparsity", type=percent, default=percent("50,90"), help="percent of blocks absent")
    values = parser.add_mutually_exclusive_group()
    values.add_argument("--int8", action="store_true", help="sweep DDS + W8A8 (int8 blocks) instead of DDS")
    values.add_argument("--int4", action="store_true", help="sweep DDS + W4A16 (int4 blocks) instead of DDS")
    values.add_argument("--tile-rows", type=int, choices=TILE_ROWS, default=1,
                        help="DDS on blocks absent in tiles of this many block rows (and the tile kernel's grid)")


def main(argv=None) -> list[dict]:
    return sweep.run("bsr", __doc__.splitlines()[0], "4096x4096,4096x11008,11008x4096,8192x8192", "1,16,64,256,2048",
                     sweep_case, argv, add_arguments)


if __name__ == "__main__":
    main()
