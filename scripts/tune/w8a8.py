"""Sweep W8A8 (``compress_kernels.w8a8``): the dispatch table's pick and its neighbours, per shape and M.

    python -m scripts.tune.w8a8 --shapes 4096x4096,8192x28672 --m 1,16,64,2048 --out w8a8.json

For each weight shape K x N and token count M it times ``w8a8_matmul``'s path with the config
:func:`compress_kernels.w8a8.dispatch.pick` gives, and the same path with one launch parameter changed
(tile width, K split, warps, stages; no K split for TMA tiles), each checked against
``compress_kernels.reference.w8a8_matmul_ref`` (dynamic per-token activation scales), next to cuBLAS
fp16. Rows and method: :mod:`scripts.tune.sweep`. Runs on a GPU; on the CPU (Triton's interpreter,
``TRITON_INTERPRET=1``) only tiny shapes are practical.
"""
from __future__ import annotations

import torch

from compress_kernels.reference import w8a8_matmul_ref
from compress_kernels.w8a8.dispatch import pick
from compress_kernels.w8a8.op import launch
from compress_kernels.w8a8.tma import tma_ready
from scripts.tune import sweep

TOL = {torch.float16: 1e-3, torch.bfloat16: 1e-2}  # the reference's integers: fp32 rounding and the output cast


def candidates(cfg) -> list:
    """The pick and its neighbours on the same path."""
    steps = {"block_n": sweep.halve_double(8 if cfg.path == "gemv" else 16, 256),
             "num_warps": sweep.halve_double(2, 8), "num_stages": sweep.stages}
    if cfg.path != "tma":  # TMA tiles run unsplit
        steps["split_k"] = sweep.halve_double(1, 16)
    return [cfg, *sweep.neighbours(cfg, steps)]


def weight_sets(k: int, n: int, m: int, dtype, device, args) -> tuple[list, list]:
    """(W8A8 sets (x, w_q, w_scale), fp16 sets (x, w)) rotating past L2."""
    gen = torch.Generator(device=device).manual_seed(0)
    count = sweep.set_count(n * k + m * k * 2, device, args)
    sets, fp16 = [], []
    for _ in range(count):
        x = torch.randn(m, k, generator=gen, device=device).to(dtype)
        w_q = torch.randint(-127, 128, (n, k), generator=gen, dtype=torch.int8, device=device)
        w_scale = torch.rand(n, generator=gen, device=device) * 1e-3 + 1e-4
        sets.append((x, w_q, w_scale))
        fp16.append((x.half(), (torch.randn(n, k, generator=gen, device=device) * 0.02).half()))
    return sets, fp16


def sweep_case(k: int, n: int, m: int, args, device) -> list[dict]:
    dtype = sweep.DTYPES[args.dtype]
    sets, fp16 = weight_sets(k, n, m, dtype, device, args)
    picked = pick(m, n, k, device, tma_ok=tma_ready(sets[0][1]))
    case = {"op": "w8a8", "K": k, "N": n, "M": m, "dtype": args.dtype}
    return sweep.time_case(case, candidates(picked), picked, sets,
                           lambda cfg, s: launch(s[0], s[1], s[2], config=cfg),
                           lambda s: w8a8_matmul_ref(*s), TOL[dtype], fp16, args)


def main(argv=None) -> list[dict]:
    return sweep.run("w8a8", __doc__.splitlines()[0], "4096x4096,4096x11008,11008x4096,8192x28672", "1,16,64,256,2048",
                     sweep_case, argv)


if __name__ == "__main__":
    main()
