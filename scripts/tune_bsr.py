"""Tune the DDS kernel's launch table (``kernels.bsr.choose_config``) on a GPU (``--int8``: the sparse
W8A8 kernel's, ``kernels.bsr_w8a8.pick_config``).

For each (K x N, M, sparsity) it times the current ``choose_config`` pick and a grid of candidate
``BsrConfig`` s with the benchmark's timing (``scripts/bench_kernels.py``: rotated weight sets,
CUDA graphs at small M, ``do_bench`` medians), checks each candidate against the dense result, and
prints / writes (``--out``) the best candidate per case next to the current pick and cuBLAS fp16.
The table in ``choose_config`` is then edited by hand from that output. It times the block kernels
themselves: at M >= 2048 the launchers densify layers that keep >= 40% of their blocks
(``kernels.bsr_densify``), so there the table matters for sparser layers only.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bench_kernels as bk  # noqa: E402
from compress_kernels import bsr_w8a8  # noqa: E402
from compress_kernels.bsr import BsrConfig, choose_config, launch_bsr  # noqa: E402
from compress_kernels.reference import bsr_w8a8_matmul_ref  # noqa: E402


PREFETCH_SIZES = (8192, 32768, 131072, 2**20)  # bytes per program (--prefetch)


def candidates(m: int) -> list[BsrConfig]:
    """Candidate configs for an M bucket (kept small: each one is a Triton compile)."""
    if m <= 4:
        return ([BsrConfig("gemv", 1, bn, g, w, s) for bn in (8, 16, 32) for g in (4, 8, 16)
                 for w, s in ((4, 2), (4, 3), (8, 2))]
                + [BsrConfig("gemm", 16, 32, g, 4, 3, split) for g in (4, 8) for split in (1, 2, 4, 8)])
    if m <= 16:
        return ([BsrConfig("gemm", 16, bn, g, 4, s) for bn in (16, 32) for g in (2, 4, 8) for s in (2, 3, 4)]
                + [BsrConfig("gemv", 1, bn, 8, 4, 2) for bn in (8, 16, 32)]
                + [BsrConfig("gemm", 16, 32, g, 4, 3, split) for g in (4, 8) for split in (2, 4, 8)])
    if m <= 64:
        return ([BsrConfig("gemm", bm, bn, g, 4, s) for bm in (16, 32, 64) for bn in (16, 32) for g in (2, 4, 8)
                 for s in (3, 4)]
                + [BsrConfig("gemm", bm, 32, g, 4, 3, split) for bm in (32, 64) for g in (2, 4) for split in (2, 4, 8)])
    if m <= 256:
        return ([BsrConfig("gemm", bm, 32, g, w, 3) for bm in (64, 128) for g in (1, 2, 4) for w in (4, 8)]
                + [BsrConfig("gemm", 128, 32, g, 4, 3, split) for g in (2, 4) for split in (2, 4)])
    return ([BsrConfig("gemm", bm, 32, g, w, s) for bm in (128, 256) for g in (1, 2, 4) for w in (4, 8)
             for s in (3, 4)]
            + [BsrConfig("gemm", bm, 32, g, w, 3) for bm in (64, 128) for g in (8,) for w in (4, 8)]
            + [BsrConfig("gemm", 64, 32, g, 4, 3) for g in (2, 4)])


def int8_candidates(m: int) -> list[BsrConfig]:
    """Candidates of the sparse W8A8 kernel: tensor-core tiles only (>= 16 rows), split at M <= 64."""
    if m <= 16:
        return ([BsrConfig("gemm", 16, bn, g, 4, s) for bn in (16, 32) for g in (2, 4, 8) for s in (3, 4)]
                + [BsrConfig("gemm", 16, 32, g, 4, 3, split) for g in (2, 4, 8) for split in (2, 4, 8)])
    if m <= 64:
        return ([BsrConfig("gemm", bm, bn, g, 4, 3) for bm in (16, 32, 64) for bn in (16, 32) for g in (2, 4, 8)]
                + [BsrConfig("gemm", bm, 32, 4, 4, 3, split) for bm in (16, 32, 64) for split in (2, 4)])
    return [c for c in candidates(m) if c.split == 1] + [BsrConfig("gemm", 32, 32, 4, 4, 3)]


def run_config(x, ws, y, cfg, int8: bool) -> None:
    """One launch of the fp16 DDS kernel, or (``int8``) of the sparse W8A8 kernel, into ``y``."""
    if int8:
        bsr_w8a8.launch(x, ws["crow"], ws["col"], ws["values"], ws["w_scale"], None, None, y, cfg)
    else:
        launch_bsr(x, ws["crow"], ws["col"], ws["values"], None, y, cfg)


def time_config(cfg, sets, xs, n, use_graph, warmup_ms, rep_ms, int8=False):
    outs = [torch.empty(xs[0].shape[0], n, device="cuda", dtype=torch.float16) for _ in range(len(sets))]

    def make(i):
        return lambda: run_config(xs[i % len(xs)], sets[i], outs[i], cfg, int8)

    return bk.time_gpu([make(i) for i in range(len(sets))], use_graph, warmup_ms, rep_ms)[0]


def reference(x, ws, n, k, int8):
    """fp32 (fp16 kernel) or the W8A8 reference's (int8 kernel) result for the rows of ``x``."""
    if int8:
        return bsr_w8a8_matmul_ref(x, ws["crow"], ws["col"], ws["values"], ws["w_scale"], n)
    dense = torch.sparse_bsr_tensor(ws["crow"], ws["col"], ws["values"].float(), size=(n, k)).to_dense()
    return x.float() @ dense.T


def tune_case(k, n, m, pct, args):
    kind = "bsr_int8" if args.int8 else "bsr"
    gen = torch.Generator(device="cuda").manual_seed(k + n + pct)
    first = bk.make_weight_set(kind, k, n, gen, torch.device("cuda"), pct)
    count = bk.n_sets(bk.weight_bytes(first) + m * (k + n) * 2, args.rotate_mb)
    sets = [first] + [bk.make_weight_set(kind, k, n, gen, torch.device("cuda"), pct) for _ in range(count - 1)]
    xs = [torch.randn(m, k, device="cuda", dtype=torch.float16) for _ in range(min(count, 4))]
    ref = reference(xs[0][:64], first, n, k, args.int8)
    use_graph = m <= bk.GRAPH_MAX_M
    dense_sets = [torch.randn(n, k, device="cuda", dtype=torch.float16) for _ in range(bk.n_sets(n * k * 2, args.rotate_mb))]
    cublas = bk.time_gpu([lambda w=w: F.linear(xs[0], w) for w in dense_sets], use_graph, args.warmup_ms, args.rep_ms)[0]
    rows = []
    if args.int8:  # the sparse W8A8 kernel: one gemm kernel
        current = bsr_w8a8.pick_config(m, n, k, first["col"].shape[0])
        cands = int8_candidates(m)
    else:
        current = choose_config(m, n, k, first["col"].shape[0])
        cands = candidates(m)
    if args.prefetch:  # the current pick with its programs' stored blocks prefetched into L2 at the start
        cands = [dataclasses.replace(current, prefetch=size) for size in PREFETCH_SIZES]
    for cfg in dict.fromkeys([current] + cands):
        try:
            y = torch.empty(xs[0][:64].shape[0], n, device="cuda", dtype=torch.float16)
            run_config(xs[0][:64].contiguous(), first, y, cfg, args.int8)
            err = bk.rel_error(y, ref)
            ms = (time_config(cfg, sets, xs, n, use_graph, args.warmup_ms, args.rep_ms, args.int8)
                  if err < 5e-3 else float("nan"))
        except Exception as e:  # an invalid config (e.g. out of shared memory): skip it
            ms, err = float("nan"), f"{type(e).__name__}: {str(e)[:80]}"
        rows.append({"config": cfg.__dict__, "ms": ms, "rel_err": err, "current": cfg == current})
    ok = [r for r in rows if r["ms"] == r["ms"]]
    best = min(ok, key=lambda r: r["ms"]) if ok else None
    cur = rows[0]
    return {"K": k, "N": n, "M": m, "sparsity": pct, "cublas_ms": cublas, "current": cur, "best": best,
            "all": rows}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shapes", type=bk.parse_shapes, default=[(4096, 4096), (8192, 28672)])
    p.add_argument("--m", type=bk.parse_ints, default=[1, 16, 64, 256, 2048, 8192])
    p.add_argument("--sparsity", type=bk.parse_ints, default=[50, 90])
    p.add_argument("--rotate-mb", type=float, default=200.0)
    p.add_argument("--warmup-ms", type=float, default=5.0)
    p.add_argument("--rep-ms", type=float, default=20.0)
    p.add_argument("--time-budget-s", type=float, default=200.0)
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--int8", action="store_true", help="tune the sparse W8A8 kernel (kernels/bsr_w8a8.py) instead")
    p.add_argument("--prefetch", action="store_true", help="time the current pick with L2 prefetch sizes only")
    args = p.parse_args(argv)
    started = time.monotonic()
    results = []
    for m in args.m:
        for k, n in args.shapes:
            for pct in args.sparsity:
                if time.monotonic() - started > args.time_budget_s:
                    print(f"time budget spent: skipped {k}x{n} M={m} {pct}%")
                    continue
                r = tune_case(k, n, m, pct, args)
                results.append(r)
                best = r["best"] or {"ms": float("nan"), "config": None}
                print(f"{k}x{n} M={m} {pct}%: cuBLAS {r['cublas_ms']:.4f} ms | current {r['current']['ms']:.4f} ms "
                      f"({r['cublas_ms'] / r['current']['ms']:.2f}x) | best {best['ms']:.4f} ms "
                      f"({r['cublas_ms'] / best['ms']:.2f}x) {best['config']}", flush=True)
                torch.cuda.empty_cache()
    if args.out is not None:
        args.out.write_text(json.dumps(results, indent=1, default=str))


if __name__ == "__main__":
    main()
