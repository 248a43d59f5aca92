"""Sweep the block-sparse ops (``compress_kernels.bsr``, ``compress_kernels.bsr_w8a8``): the dispatch
table's pick and its neighbours.

    python -m scripts.tune.bsr --shapes 4096x4096,4096x11008 --m 1,16,64 --sparsity 50,90 --out bsr.json
    python -m scripts.tune.bsr --int8 ...        # DDS + W8A8 (int8 blocks, per-token int8 activations)

For each weight shape K x N, block sparsity (percent of the 32x32 blocks absent) and token count M
it times the op with the config :func:`compress_kernels.bsr.dispatch.pick` (``--int8``:
:func:`compress_kernels.bsr_w8a8.dispatch.pick`) gives, and the same kernel with one launch
parameter changed (rows per tile, outputs per program, blocks per step, programs sharing a block row,
warps, stages; the dense path, taken at large M on dense layers, has no tiles of ours), each checked
against the reference (``bsr_matmul_ref`` / ``bsr_w8a8_matmul_ref``), next to cuBLAS fp16 on the dense
shape. Rows and method: :mod:`scripts.tune.sweep` (rows add ``sparsity``). Runs on a GPU; on the CPU
(Triton's interpreter, ``TRITON_INTERPRET=1``) only tiny shapes are practical.
"""
from __future__ import annotations

import argparse

import torch

from compress_kernels.bsr.dispatch import pick
from compress_kernels.bsr.op import launch
from compress_kernels.bsr_w8a8.dispatch import pick as pick_w8a8
from compress_kernels.bsr_w8a8.op import launch as launch_w8a8
from compress_kernels.common.prefetch import prefetch_allowed
from compress_kernels.reference import BSR_BLOCK, bsr_matmul_ref, bsr_w8a8_matmul_ref
from scripts.tune import sweep

TOL = {torch.float16: 5e-3, torch.bfloat16: 2e-2}  # fp32 sums in another order, the output cast


def candidates(cfg, int8: bool) -> list:
    """The pick and its neighbours on the same kernel."""
    if cfg.kernel == "dense":
        return [cfg]
    steps = {"group": sweep.halve_double(1, 16), "num_warps": sweep.halve_double(2, 8), "num_stages": sweep.stages}
    if cfg.kernel == "gemv":
        steps["block_n"] = sweep.halve_double(8, 32)
    else:
        steps.update(block_m=sweep.halve_double(16, 256), block_n=sweep.halve_double(16, 32),
                     split=sweep.halve_double(1, 8))
    return [cfg, *sweep.neighbours(cfg, steps)]


def block_parts(k: int, n: int, sparsity: int, dtype, gen, device):
    """(crow, col, values) of a random weight with round(sparsity% of the blocks) absent."""
    rows, cols = n // BSR_BLOCK, k // BSR_BLOCK
    keep = torch.ones(rows * cols, dtype=torch.bool, device=device)
    keep[torch.randperm(rows * cols, generator=gen, device=device)[: round(sparsity / 100 * rows * cols)]] = False
    keep = keep.reshape(rows, cols)
    crow = torch.zeros(rows + 1, dtype=torch.int32, device=device)
    crow[1:] = torch.cumsum(keep.sum(dim=1), 0).to(torch.int32)
    col = keep.nonzero()[:, 1].to(torch.int32).contiguous()
    shape = (col.shape[0], BSR_BLOCK, BSR_BLOCK)
    if dtype == torch.int8:
        values = torch.randint(-127, 128, shape, generator=gen, dtype=torch.int8, device=device)
    else:
        values = (torch.randn(shape, generator=gen, device=device) * 0.02).to(dtype)
    return crow, col, values


def weight_sets(k: int, n: int, m: int, sparsity: int, dtype, int8: bool, device, args) -> tuple[list, list]:
    """(sets (x, crow, col, values[, w_scale]), fp16 sets (x, w)) rotating past L2."""
    gen = torch.Generator(device=device).manual_seed(0)
    value_bytes = 1 if int8 else 2
    count = sweep.set_count(round((100 - sparsity) / 100 * n * k) * value_bytes + m * k * 2, device, args)
    sets, fp16 = [], []
    for _ in range(count):
        x = torch.randn(m, k, generator=gen, device=device).to(dtype)
        parts = block_parts(k, n, sparsity, torch.int8 if int8 else dtype, gen, device)
        scale = (torch.rand(n, generator=gen, device=device) * 1e-3 + 1e-4,) if int8 else ()
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
    sets, fp16 = weight_sets(k, n, m, sparsity, dtype, args.int8, device, args)
    nnz = sets[0][2].shape[0]
    case = {"op": "bsr_w8a8" if args.int8 else "bsr", "K": k, "N": n, "M": m, "dtype": args.dtype,
            "sparsity": sparsity}
    if args.int8:
        picked = pick_w8a8(m, n, k, nnz, device)
        run = lambda cfg, s: launch_w8a8(s[0], *s[1:4], s[4], n, config=cfg)  # noqa: E731
        reference = lambda s: bsr_w8a8_matmul_ref(s[0], *s[1:4], s[4], n)  # noqa: E731
    else:
        picked = pick(m, n, k, nnz, device, prefetch_allowed(sets[0][3]))
        run = lambda cfg, s: launch(s[0], *s[1:4], n, config=cfg)  # noqa: E731
        reference = lambda s: bsr_matmul_ref(s[0], *s[1:4], n)  # noqa: E731
    return sweep.time_case(case, candidates(picked, args.int8), picked, sets, run, reference, TOL[dtype], fp16, args)


def percent(text: str) -> list[int]:
    """``--sparsity``: comma-separated percentages 0..100."""
    values = [int(v) for v in text.split(",")] if text.replace(",", "").isdigit() else []
    if not values or max(values) > 100:
        raise argparse.ArgumentTypeError(f"expected percentages 0..100 separated by commas, got {text!r}")
    return values


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sparsity", type=percent, default=percent("50,90"), help="percent of blocks absent")
    parser.add_argument("--int8", action="store_true", help="sweep DDS + W8A8 (int8 blocks) instead of DDS")


def main(argv=None) -> list[dict]:
    return sweep.run("bsr", __doc__.splitlines()[0], "4096x4096,4096x11008,11008x4096,8192x8192", "1,16,64,256,2048",
                     sweep_case, argv, add_arguments)


if __name__ == "__main__":
    main()
