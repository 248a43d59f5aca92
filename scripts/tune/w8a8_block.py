"""Sweep block-scaled W8A8 (``compress_kernels.w8a8_block``): the dispatch table's pick and its neighbours.

    python -m scripts.tune.w8a8_block --shapes 4096x4096,8192x28672 --m 1,16,64,2048 --out w8a8-block.json

For each weight shape K x N and token count M it times ``w8a8_block_matmul``'s path with the config
:func:`compress_kernels.w8a8_block.dispatch.pick` gives, and the same path with one launch parameter
changed (row and column tile, K split, warps, stages; TMA tiles run unsplit and 128 wide), each checked
against ``compress_kernels.reference.w8a8_block_matmul_ref``, next to cuBLAS fp16. ``--int8-out``
times the int8 + 1 x 128-scale output with the GELU epilogue (the up-projection of a linked MLP chain;
128-wide tiles only). Rows and method: :mod:`scripts.tune.sweep`.
Runs on a GPU; on the CPU (Triton's interpreter, ``TRITON_INTERPRET=1``) only tiny shapes are practical.
"""
from __future__ import annotations

import argparse

import torch

from compress_kernels.reference import dequantize_act_blocks, w8a8_block_matmul_ref
from compress_kernels.w8a8.tma import tma_ready
from compress_kernels.w8a8_block.dispatch import pick
from compress_kernels.w8a8_block.op import launch
from scripts.tune import sweep

TOL = {torch.float16: 1e-3, torch.bfloat16: 1e-2}  # the reference's integers: fp32 order and the output cast
INT8_TOL = 1e-2  # an int8 output against the reference's: an integer may move by one (GELU's last fp32 bit)


def candidates(cfg, int8_out: bool = False) -> list:
    """The pick and its neighbours on the same path."""
    steps = {"num_warps": sweep.halve_double(2, 8), "num_stages": sweep.stages}
    if cfg.path == "tiled":
        steps.update(block_m=sweep.halve_double(16, 128), split_k=sweep.halve_double(1, 16))
        if not int8_out:
            steps["block_n"] = sweep.halve_double(32, 256)
    else:
        steps["block_m"] = sweep.halve_double(64, 256)
    return [cfg, *sweep.neighbours(cfg, steps)]


def weight_sets(k: int, n: int, m: int, dtype, device, args) -> tuple[list, list]:
    """(block-scaled sets (x, w_q, w_scale, bias), fp16 sets (x, w)) rotating past L2."""
    gen = torch.Generator(device=device).manual_seed(0)
    count = sweep.set_count(n * k + m * k * 2, device, args)
    sets, fp16 = [], []
    for _ in range(count):
        x = torch.randn(m, k, generator=gen, device=device).to(dtype)
        w_q = torch.randint(-127, 128, (n, k), generator=gen, dtype=torch.int8, device=device)
        w_scale = torch.rand(-(-n // 128), -(-k // 128), generator=gen, device=device) * 1e-3 + 1e-4
        sets.append((x, w_q, w_scale, torch.randn(n, generator=gen, device=device).to(dtype)))
        fp16.append((x.half(), (torch.randn(n, k, generator=gen, device=device) * 0.02).half()))
    return sets, fp16


def sweep_case(k: int, n: int, m: int, args, device) -> list[dict]:
    dtype = sweep.DTYPES[args.dtype]
    sets, fp16 = weight_sets(k, n, m, dtype, device, args)
    picked = pick(m, n, k, device, int8_out=args.int8_out, tma_ok=tma_ready(sets[0][1]))
    case = {"op": "w8a8_block", "K": k, "N": n, "M": m, "dtype": args.dtype, "int8_out": args.int8_out}
    if args.int8_out:  # compared de-quantized: the GELU's last fp32 bit may move an integer by one
        def run(cfg, s):
            return dequantize_act_blocks(*launch(s[0], None, *s[1:], True, torch.int8, dtype, config=cfg))

        def reference(s):
            return dequantize_act_blocks(*w8a8_block_matmul_ref(*s, gelu=True, out_dtype=torch.int8))

        tol = INT8_TOL
    else:
        def run(cfg, s):
            return launch(s[0], None, *s[1:], False, dtype, config=cfg)

        def reference(s):
            return w8a8_block_matmul_ref(*s)

        tol = TOL[dtype]
    return sweep.time_case(case, candidates(picked, args.int8_out), picked, sets, run, reference, tol, fp16, args)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--int8-out", action="store_true", help="time the int8 output with the GELU epilogue")


def main(argv=None) -> list[dict]:
    return sweep.run("w8a8_block", __doc__.splitlines()[0], "4096x4096,4096x11008,11008x4096,8192x28672",
                     "1,16,64,256,2048", sweep_case, argv, add_arguments)


if __name__ == "__main__":
    main()
