"""Kernel benchmark: our Triton kernels against PyTorch's anchors, side by side, in one run on one GPU.

    python -m scripts.bench.kernels --out benchmarks/results/kernels-h100.json

What is timed and how: :mod:`scripts.bench.kernel_sweep` (every op at every weight shape K x N and
M; anchors from :mod:`scripts.bench.anchors`; the timing method of
:func:`compress.eval.timing.rotation_ms`). This module adds the ratios and the targets and writes
the report.

Ratios (``ratio_vs_cublas``) are cuBLAS fp16 ms / op ms on the same shape and M in the same run (>1
means faster than cuBLAS); ``ours_dds_*`` also get ``ratio_vs_torch_bsr`` (the torch BSR anchor at
the same sparsity) and ``ours_w8a8`` / ``ours_w4a16_g128`` / ``ours_w8a16`` ``ratio_vs_anchor``
(``torch._int_mm`` W8A8 / tinygemm int4 / ``torch._weight_int8pack_mm``, measured up to M = 256), and
``ours_w8a8_block`` ``ratio_vs_anchor`` (its ``torch._int_mm`` pipeline, one GEMM per K block) and
``ratio_vs_w8a8`` (our per-channel W8A8, ``ours_w8a8``: the cost of the finer scales).
Targets: the minimal ratios below, per M range and shapes; a target is met when every measured cell
meets it, and the report keeps the worst cell. W8A16 reads half of fp16's weight bytes, so at small M
it can be at most 2x faster than cuBLAS fp16; at large M both are tensor-core bound.

Block-scaled W8A8 alone (cuBLAS fp16, our per-channel W8A8, the ``torch._int_mm`` pipeline and ours)::

    python -m scripts.bench.kernels --kernels 'ours_w8a8,ours_w8a8_block,torch_int_mm_w8a8*' \
        --out benchmarks/results/kernels-w8a8-block-h100.json

The W8A16 comparison alone (cuBLAS fp16, PyTorch's int8 weight-only op and ours, per channel and
per group of 128), in one run::

    python -m scripts.bench.kernels --kernels 'ours_w8a16*,torch_weight_int8pack_w8a16' \
        --out benchmarks/results/kernels-w8a16-h100.json

Targets added after a run are judged on its stored timings with ``--retarget FILE`` (no GPU; the
timings stay as measured)::

    python -m scripts.bench.kernels --retarget benchmarks/results/kernels-h200.json

Output: a JSON file (``--out``: ``environment`` with the GPU, versions and settings, ``results``
one record per op, shape and M, with ``fraction_of_limit`` at M <= 16 and M >= 2048 as
:mod:`scripts.bench.kernel_limits` defines it, ``targets``) and a printed table; ``python -m scripts.bench.pages``
turns the committed JSON into the results page. ``--cpu-check`` runs the whole harness on tiny
shapes on the CPU (anchors' CPU branches, our kernels' references), so the plumbing is tested in CI.
"""
from __future__ import annotations

import argparse
import json
import logging
import platform
import time
from pathlib import Path

import torch

from scripts.bench import kernel_sweep
from scripts.bench.decode import write_report
from scripts.bench.kernel_limits import SMALL_M_GOAL, add_limits
from scripts.bench.kernel_sweep import SPARSITIES, SweepOptions

GRAPH_EVERY_M = 1 << 30  # settings.graph_max_m when every M is captured in graphs (0: --no-graph)

# DDS targets: minimal ratio to cuBLAS fp16, by sparsity and M range (inclusive bounds).
DDS_TARGETS = {
    90: [((1, 16), 4.0), ((64, 64), 3.0), ((2048, None), 4.0)],
    50: [((1, 16), 1.6), ((64, 64), 1.4), ((2048, None), 1.5)],
}
BIG_LLM_SHAPES = ((4096, 11008), (11008, 4096), (8192, 8192), (8192, 28672))  # K x N
LARGE_SHAPES = ((4096, 4096),) + BIG_LLM_SHAPES  # every shape with K, N >= 4096
# W4A16 / W8A8 / W8A16 targets: (kernel, label, M range, shapes (None: every shape), minimal ratio to cuBLAS fp16).
QUANT_TARGETS = [
    ("ours_w4a16_g128", "W4A16 g128", (1, 16), BIG_LLM_SHAPES, 2.5),
    ("ours_w4a16_g128", "W4A16 g128", (1, 16), ((4096, 4096),), 2.0),
    ("ours_w4a16_g128", "W4A16 g128", (64, 64), None, 1.5),
    ("ours_w4a16_g128", "W4A16 g128", (2048, None), None, 0.85),
    ("ours_w8a8", "W8A8", (1, 16), LARGE_SHAPES, 1.6),
    ("ours_w8a8", "W8A8", (64, 64), None, 1.3),
    ("ours_w8a8", "W8A8", (2048, None), None, 1.4),
    ("ours_w8a16", "W8A16", (1, 1), LARGE_SHAPES, 1.8),  # issue #27's targets
    ("ours_w8a16", "W8A16", (16, 16), LARGE_SHAPES, 1.6),
    ("ours_w8a16", "W8A16", (2048, None), None, 0.95),
    ("ours_w8a8_block", "W8A8 block-scaled", (1, 16), LARGE_SHAPES, 1.5),  # issue #25's targets
    ("ours_w8a8_block", "W8A8 block-scaled", (2048, None), None, 1.5),
    ("ours_dds_tiles4_50", "DDS 50% in tiles of 4 block rows", (2048, None), LARGE_SHAPES, 1.4),  # issue #43's
    ("ours_dds_tiles4_75", "DDS 75% in tiles of 4 block rows", (2048, None), LARGE_SHAPES, 2.2),  # (K, N >= 4096)
    ("ours_w4a16_g128", "W4A16 g128 near the limit", (1, 1), BIG_LLM_SHAPES, 3.0),
    ("ours_w8a16", "W8A16 near the limit", (1, 16), LARGE_SHAPES, 1.7),
    ("ours_w8a8", "W8A8 near the limit", (1, 16), LARGE_SHAPES, 1.7),
    ("ours_dds_50", "DDS 50% near the limit", (1, 16), LARGE_SHAPES, 1.7),
    ("ours_dds_90", "DDS 90% near the limit", (1, 1), LARGE_SHAPES, 6.0),
    ("ours_dds_50", "DDS 50% free blocks", (2048, None), LARGE_SHAPES, 1.1),
]
# ours vs another of ours at the same shape and M: (kernel, peer, label, M range, shapes, minimal ratio peer ms /
# kernel ms)
PEER_TARGETS = [("ours_w8a8_block", "ours_w8a8", "W8A8 block-scaled vs our per-channel W8A8", (2048, None),
                 LARGE_SHAPES, 0.9)]  # issue #43's (K, N >= 4096)
# ours vs the matching PyTorch anchor at every shape and M
ANCHOR_OF = {"ours_w4a16_g128": "tinygemm_int4_g128", "ours_w8a8": "torch_int_mm_w8a8",
             "ours_w8a16": "torch_weight_int8pack_w8a16", "ours_w8a8_block": "torch_int_mm_w8a8_block"}


def add_ratios(results) -> None:
    """ratio = cuBLAS ms / op ms at the same (K, N, M); also ours vs torch BSR and vs the anchor."""
    by_key = {(r["kernel"], r["K"], r["N"], r["M"]): r for r in results if "ms" in r}
    for r in results:
        if "ms" not in r:
            continue
        base = by_key.get(("cublas_fp16", r["K"], r["N"], r["M"]))
        if base is not None:
            r["ratio_vs_cublas"] = base["ms"] / r["ms"]
        if r["kernel"].startswith("ours_dds_"):
            anchor = by_key.get((f"torch_bsr_{r['sparsity']}", r["K"], r["N"], r["M"]))
            if anchor is not None:
                r["ratio_vs_torch_bsr"] = anchor["ms"] / r["ms"]
        if r["kernel"] in ANCHOR_OF:
            anchor = by_key.get((ANCHOR_OF[r["kernel"]], r["K"], r["N"], r["M"]))
            if anchor is not None:
                r["ratio_vs_anchor"] = anchor["ms"] / r["ms"]
        for kernel, peer, *_ in PEER_TARGETS:
            if r["kernel"] == kernel and (other := by_key.get((peer, r["K"], r["N"], r["M"]))) is not None:
                r[f"ratio_vs_{peer.removeprefix('ours_')}"] = other["ms"] / r["ms"]


# ---- targets and reports -----------------------------------------------------------------------
def _m_label(lo, hi):
    return f"M<={hi}" if lo == 1 else (f"M={lo}" if lo == hi else f"M>={lo}")


def _where(shapes) -> str:
    return "every shape" if shapes is None else ", ".join(f"{k}x{n}" for k, n in shapes)


def evaluate_targets(results) -> list[dict]:
    """Targets per kernel and M range: worst ratio over the shapes, met when every cell is."""
    out = []
    for kernel, label, (lo, hi), shapes, need in QUANT_TARGETS:
        cells = [r for r in results if r["kernel"] == kernel and "ratio_vs_cublas" in r and r["M"] >= lo
                 and (hi is None or r["M"] <= hi) and (shapes is None or (r["K"], r["N"]) in shapes)]
        out.append(_target_row(f"{label} vs cuBLAS fp16, {_m_label(lo, hi)} ({_where(shapes)})", f">= {need}x", cells,
                               "ratio_vs_cublas", need))
    for kernel, peer, label, (lo, hi), shapes, need in PEER_TARGETS:
        key = f"ratio_vs_{peer.removeprefix('ours_')}"
        cells = [r for r in results if r["kernel"] == kernel and key in r and r["M"] >= lo
                 and (hi is None or r["M"] <= hi) and (r["K"], r["N"]) in shapes]
        out.append(_target_row(f"{label}, {_m_label(lo, hi)} ({_where(shapes)})", f">= {need}x", cells, key, need))
    # issue #43: each of our kernels within SMALL_M_GOAL of its limit (:mod:`scripts.bench.kernel_limits`)
    ours = sorted({r["kernel"] for r in results if r["kernel"].startswith("ours_")})
    for kernel in ours:
        cells = [r for r in results if r["kernel"] == kernel and "fraction_of_limit" in r and r["M"] <= 16
                 and (r["K"], r["N"]) in LARGE_SHAPES]
        if cells:
            out.append(_target_row(f"{kernel}: fraction of its limit, M<=16 (K, N >= 4096)",
                                   f">= {SMALL_M_GOAL:.0%}", cells, "fraction_of_limit", SMALL_M_GOAL)
                       | {"unit": "fraction"})
    for kernel, anchor in ANCHOR_OF.items():
        cells = [r for r in results if r["kernel"] == kernel and "ratio_vs_anchor" in r]
        out.append(_target_row(f"{kernel} vs {anchor}, every shape and M", "> 1x", cells, "ratio_vs_anchor",
                               1.0, strict=True))
    for pct, ranges in DDS_TARGETS.items():
        for (lo, hi), need in ranges:
            cells = [r for r in results if r["kernel"] == f"ours_dds_{pct}" and "ratio_vs_cublas" in r
                     and r["M"] >= lo and (hi is None or r["M"] <= hi)]
            out.append(_target_row(f"DDS {pct}% vs cuBLAS fp16, {_m_label(lo, hi)}", f">= {need}x", cells,
                                   "ratio_vs_cublas", need))
    for pct in SPARSITIES:
        cells = [r for r in results if r["kernel"] == f"ours_dds_{pct}" and "ratio_vs_torch_bsr" in r]
        out.append(_target_row(f"DDS {pct}% vs torch bsr_dense_mm, every shape and M", "> 1x", cells,
                               "ratio_vs_torch_bsr", 1.0, strict=True))
    return out


def _target_row(name, goal, cells, key, need, strict=False):
    if not cells:
        return {"target": name, "goal": goal, "cells": 0, "met": None}
    worst = min(cells, key=lambda r: r[key])
    passed = [r for r in cells if (r[key] > need if strict else r[key] >= need)]
    return {"target": name, "goal": goal, "cells": len(cells), "cells_met": len(passed),
            "worst": round(worst[key], 3), "worst_at": f"{worst['K']}x{worst['N']} M={worst['M']}",
            "met": len(passed) == len(cells)}


def environment(cpu: bool) -> dict:
    import triton

    env = {"torch": torch.__version__, "triton": triton.__version__, "cuda": torch.version.cuda,
           "python": platform.python_version(), "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    if not cpu and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        env.update(gpu=props.name, sm_count=props.multi_processor_count,
                   memory_gib=round(props.total_memory / 2**30, 1))
    else:
        env["gpu"] = None
    return env


def format_table(results) -> str:
    """Plain-text table: one line per (shape, M), ms of cuBLAS then every kernel's ratio to it."""
    names = list(dict.fromkeys(r["kernel"] for r in results))
    head = f"{'K x N':>12} {'M':>5} {'cuBLAS ms':>10} " + " ".join(f"{n[:15]:>15}" for n in names if n != "cublas_fp16")
    lines = [head]
    cells = {(r["kernel"], r["K"], r["N"], r["M"]): r for r in results}
    for k, n, m in dict.fromkeys((r["K"], r["N"], r["M"]) for r in results):
        base = cells.get(("cublas_fp16", k, n, m), {})
        row = f"{f'{k}x{n}':>12} {m:>5} {base.get('ms', float('nan')):>10.4f} "
        row += " ".join(f"{_ratio_text(cells.get((name, k, n, m))):>15}" for name in names if name != "cublas_fp16")
        lines.append(row)
    return "\n".join(lines)


def _ratio_text(r):
    if r is None:
        return "-"
    if "ratio_vs_cublas" in r:
        return f"{r['ratio_vs_cublas']:.2f}x"
    return "err" if "error" in r else "-"


# ---- command line ------------------------------------------------------------------------------

def parse_shapes(text):
    shapes = []
    for item in text.split(","):
        try:
            k, n = (int(v) for v in item.lower().split("x"))
        except ValueError:
            raise argparse.ArgumentTypeError(f"--shapes: expected KxN[,KxN...] like 4096x11008, got {item!r}")
        shapes.append((k, n))
    return shapes


def parse_ints(text):
    try:
        return [int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}")


def build_parser():
    p = argparse.ArgumentParser(prog="python -m scripts.bench.kernels", description=__doc__.split("\n")[0])
    p.add_argument("--kernels", default="*", help="comma-separated names or globs (e.g. 'ours_dds_*,torch_bsr_*')")
    p.add_argument("--shapes", type=parse_shapes, default=None, help="KxN list, e.g. 4096x4096,8192x28672")
    p.add_argument("--m", type=parse_ints, default=None, help="M values, e.g. 1,16,2048")
    p.add_argument("--out", type=Path, default=None, help="write the JSON results here")
    p.add_argument("--rotate-mb", type=float, default=200.0, help="bytes of weights+inputs to rotate over")
    p.add_argument("--warmup-ms", type=float, default=10.0)
    p.add_argument("--rep-ms", type=float, default=40.0)
    p.add_argument("--time-budget-s", type=float, default=540.0, help="skip what is left after this long")
    p.add_argument("--no-graph", action="store_true", help="never use CUDA graphs")
    p.add_argument("--cpu-check", action="store_true", help="tiny shapes on the CPU with reference ops")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--list", action="store_true", help="print the kernel names and exit")
    p.add_argument("--retarget", type=Path, default=None, metavar="JSON",
                   help="re-evaluate the targets of a stored run (and of its further runs) from its timings; no GPU")
    return p


def derive(report: dict) -> None:
    """What a run's figures give from its timings: ratios, fractions of the limit, targets (in place)."""
    results = report["results"]
    add_ratios(results)
    add_limits(results, report["environment"].get("gpu"))
    report["targets"] = evaluate_targets(results)


def retarget(path: Path) -> dict:
    """A stored report (and each further run it keeps) derived again from its own timings, so a target
    added after the run is judged on it; the timings stay as measured and the file is replaced atomically."""
    report = json.loads(path.read_text())
    for run in [report, *report.get("runs", [])]:
        derive(run)
    write_report(path, report)
    return report


def main(argv=None) -> dict:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    names = [s.name for s in kernel_sweep.kernel_specs()]
    if args.list:
        print("\n".join(names))
        return {}
    report = retarget(args.retarget) if args.retarget is not None else _measure(args, names)
    print(format_table(report["results"]))
    for t in report["targets"]:
        print(f"{'MET ' if t['met'] else 'MISS' if t['met'] is False else '  - '} {t['target']}: {t['goal']}, "
              f"worst {t.get('worst')} at {t.get('worst_at')}")
    write_report(args.out, report)
    return report


def _measure(args, names) -> dict:
    """Run the sweep the arguments ask for; the report with ratios and targets."""
    if args.cpu_check:
        shapes, ms = args.shapes or kernel_sweep.CPU_SHAPES, args.m or kernel_sweep.CPU_MS
    else:
        if not torch.cuda.is_available():
            raise SystemExit("scripts.bench.kernels: no CUDA GPU here; use --cpu-check for the plumbing test")
        shapes, ms = args.shapes or kernel_sweep.SHAPES, args.m or kernel_sweep.MS
    opts = SweepOptions(kernels=kernel_sweep.select(names, args.kernels.split(",")), shapes=shapes, ms=ms,
                        rotate_mb=kernel_sweep.CPU_ROTATE_MB if args.cpu_check else args.rotate_mb,
                        warmup_ms=args.warmup_ms, rep_ms=args.rep_ms, time_budget_s=args.time_budget_s,
                        graphs=not args.no_graph, cpu=args.cpu_check)
    started = time.monotonic()
    results = kernel_sweep.run_sweep(opts, progress=not args.no_progress)
    env = environment(args.cpu_check)
    env["sweep_seconds"] = round(time.monotonic() - started, 1)
    env["settings"] = {"rotate_mb": opts.rotate_mb, "warmup_ms": opts.warmup_ms, "rep_ms": opts.rep_ms,
                       "graph_max_m": GRAPH_EVERY_M if opts.graphs else 0, "cpu_check": opts.cpu}
    report = {"environment": env, "results": results}
    derive(report)
    return report


if __name__ == "__main__":
    main()
