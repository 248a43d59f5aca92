"""Block-scaled MLP chain benchmark: up-projection -> GELU -> down-projection, fused against separate calls.

    python -m scripts.bench.block_chain --out benchmarks/results/block-chain-h100.json

An MLP of hidden size H and intermediate size F on x (M, H) fp16, both projections block-scaled int8
(1 x 128 activation and 128 x 128 weight scales, biases in fp16), timed four ways on the same inputs:

* ``fused``: the up-projection writes ``gelu`` of its output as int8 + 1 x 128 scales in its epilogue
  (``w8a8_block_matmul(x, ..., out_dtype=torch.int8, gelu=True)``), the down-projection reads them
  (``x_scale=s_y``): what a linked chain runs (:mod:`compress.nn.block_chain`);
* ``separate``: three calls, the up-projection with an int8 output (no GELU), ``gelu_int8_blocks``,
  the down-projection from int8;
* ``float``: the up-projection's float output, ``F.gelu`` on it, the down-projection quantizing it
  again: the unlinked modules' path;
* ``cublas_fp16``: ``F.linear``, ``F.gelu``, ``F.linear`` in fp16 on the dequantized weights.

Timing: :func:`compress.eval.timing.rotation_ms` as in the kernel benchmark (weight and input sets
rotated past L2, the rotation captured in one CUDA graph, ``do_bench`` median). Each record has
``ratio_vs_fused`` (its ms / fused ms); the target is ``fused`` ahead of ``separate`` and ``float`` at
every shape and M. Each variant is first checked against the reference chain on its first 64 rows
(``rel_err``).
``--cpu-check`` runs the harness on tiny shapes with the references, for the plumbing tests.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import compress_kernels
from compress.eval.timing import rotation_ms
from compress_kernels import reference
from scripts.bench.kernel_sweep import CHECK_ROWS, n_sets, rel_error
from scripts.bench.kernels import environment, parse_ints
from scripts.bench.decode import write_report

SHAPES = [(384, 1536), (768, 3072), (4096, 11008), (8192, 28672)]  # (hidden H, intermediate F)
MS = [1, 16, 64, 256, 2048, 8192]
CPU_SHAPES, CPU_MS = [(128, 256)], [1, 16]
VARIANTS = ("fused", "separate", "float", "cublas_fp16")


def make_mlp(h: int, f: int, gen: torch.Generator, device) -> dict:
    """One weight set: block-quantized up (F, H) and down (H, F) projections, fp16 biases, the fp16 weights."""
    mlp = {}
    for name, (n, k) in (("up", (f, h)), ("down", (h, f))):
        w = torch.randn(n, k, generator=gen, device=device) * k ** -0.5
        w_q, w_scale = reference.quantize_weight_blocks_ref(w)
        mlp[name] = (w_q, w_scale, (torch.randn(n, generator=gen, device=device) * 0.1).half())
        mlp[f"{name}_fp16"] = reference.dequantize_weight_blocks(w_q, w_scale).half()
    return mlp


def mlp_bytes(mlp: dict) -> int:
    return sum(t.numel() * t.element_size() for v in mlp.values() for t in (v if isinstance(v, tuple) else (v,)))


def variant_call(variant: str, cpu: bool):
    """``(x, mlp) -> y`` for one variant: the kernels on the GPU, the references on the CPU."""
    block = reference.w8a8_block_matmul_ref if cpu else compress_kernels.w8a8_block_matmul

    def quantized(xq, s_x, w_q, w_scale, bias, **kw):
        if cpu:
            return reference.w8a8_block_matmul_quantized_ref(xq, s_x, w_q, w_scale, bias, **kw)
        return compress_kernels.w8a8_block_matmul(xq, w_q, w_scale, bias, x_scale=s_x, **kw)

    gelu_int8 = reference.gelu_int8_blocks_ref if cpu else compress_kernels.gelu_int8_blocks

    def fused(x, mlp):
        yq, s_y = block(x, *mlp["up"], gelu=True, out_dtype=torch.int8)
        return quantized(yq, s_y, *mlp["down"], out_dtype=x.dtype)

    def separate(x, mlp):
        yq, s_y = block(x, *mlp["up"], out_dtype=torch.int8)
        return quantized(*gelu_int8(yq, s_y, x.dtype), *mlp["down"], out_dtype=x.dtype)

    def unfused_float(x, mlp):
        return block(F.gelu(block(x, *mlp["up"])), *mlp["down"])

    def cublas(x, mlp):
        return F.linear(F.gelu(F.linear(x, mlp["up_fp16"], mlp["up"][2])), mlp["down_fp16"], mlp["down"][2])

    return {"fused": fused, "separate": separate, "float": unfused_float, "cublas_fp16": cublas}[variant]


def reference_chain(x, mlp):
    """The float chain on the block-scaled layers (references): what ``fused`` and ``float`` compute."""
    hidden = reference.w8a8_block_matmul_ref(x, *mlp["up"], gelu=True)
    return reference.w8a8_block_matmul_ref(hidden, *mlp["down"])


def bench_shape(h, f, ms, variants, rotate_mb, cpu, warmup_ms, rep_ms) -> list[dict]:
    device = torch.device("cpu" if cpu else "cuda")
    gen = torch.Generator(device=device).manual_seed(h * 100003 + f)
    first = make_mlp(h, f, gen, device)
    sets = [first] + [make_mlp(h, f, gen, device) for _ in range(n_sets(mlp_bytes(first), rotate_mb) - 1)]
    records = []
    for m in ms:
        xs = [torch.randn(m, h, generator=gen, device=device).half() for _ in range(min(len(sets), 8))]
        want = reference_chain(xs[0][:CHECK_ROWS], sets[0])  # the first rows: keeps the reference cheap
        for variant in variants:
            call = variant_call(variant, cpu)
            got = call(xs[0], sets[0])[:CHECK_ROWS]  # computed at this M, so with this M's tiles
            record = {"variant": variant, "H": h, "F": f, "M": m, "rel_err": rel_error(got, want)}
            calls = [(lambda x=xs[i % len(xs)], mlp=sets[i]: call(x, mlp)) for i in range(len(sets))]
            ms_per_call, graphed = rotation_ms(calls, not cpu, warmup_ms, rep_ms, device=device)
            records.append({**record, "ms": ms_per_call, "graph": graphed, "sets": len(sets)})
    return records


def add_ratios(results) -> None:
    """``ratio_vs_fused``: a variant's ms / the fused chain's ms at the same (H, F, M) (> 1: fused is faster)."""
    fused = {(r["H"], r["F"], r["M"]): r["ms"] for r in results if r["variant"] == "fused"}
    for r in results:
        if (key := (r["H"], r["F"], r["M"])) in fused:
            r["ratio_vs_fused"] = r["ms"] / fused[key]


def targets(results) -> list[dict]:
    """Fused ahead of each unfused int8 variant at every point: met when every ratio is > 1."""
    out = []
    for variant in ("separate", "float"):
        cells = [r for r in results if r["variant"] == variant and "ratio_vs_fused" in r]
        worst = min(cells, key=lambda r: r["ratio_vs_fused"], default=None)
        out.append({"target": f"fused chain faster than {variant}", "cells": len(cells),
                    "worst": None if worst is None else round(worst["ratio_vs_fused"], 3),
                    "worst_at": None if worst is None else f"{worst['H']}x{worst['F']} M={worst['M']}",
                    "met": None if not cells else all(r["ratio_vs_fused"] > 1 for r in cells)})
    return out


def parse_shapes(text):
    try:
        return [tuple(int(v) for v in item.lower().split("x")) for item in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--shapes: expected HxF[,HxF...] like 4096x11008, got {text!r}")


def build_parser():
    p = argparse.ArgumentParser(prog="python -m scripts.bench.block_chain", description=__doc__.split("\n")[0])
    p.add_argument("--shapes", type=parse_shapes, default=None, help="HxF list (hidden x intermediate)")
    p.add_argument("--m", type=parse_ints, default=None, help="M values, e.g. 1,16,2048")
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, of {', '.join(VARIANTS)}")
    p.add_argument("--out", type=Path, default=None, help="write the JSON results here")
    p.add_argument("--rotate-mb", type=float, default=200.0)
    p.add_argument("--warmup-ms", type=float, default=10.0)
    p.add_argument("--rep-ms", type=float, default=40.0)
    p.add_argument("--cpu-check", action="store_true", help="tiny shapes on the CPU with the references")
    return p


def main(argv=None) -> dict:
    args = build_parser().parse_args(argv)
    variants = [v for v in args.variants.split(",") if v]
    if not variants or any(v not in VARIANTS for v in variants):
        raise SystemExit(f"--variants: expected some of {', '.join(VARIANTS)}, got {args.variants!r}")
    if not args.cpu_check and not torch.cuda.is_available():
        raise SystemExit("scripts.bench.block_chain: no CUDA GPU here; use --cpu-check for the plumbing test")
    shapes = args.shapes or (CPU_SHAPES if args.cpu_check else SHAPES)
    ms = args.m or (CPU_MS if args.cpu_check else MS)
    rotate_mb = 0.1 if args.cpu_check else args.rotate_mb
    started = time.monotonic()
    results = [r for h, f in shapes
               for r in bench_shape(h, f, ms, variants, rotate_mb, args.cpu_check, args.warmup_ms, args.rep_ms)]
    add_ratios(results)
    env = environment(args.cpu_check)
    env.update(seconds=round(time.monotonic() - started, 1), rotate_mb=rotate_mb, cpu_check=args.cpu_check)
    report = {"environment": env, "results": results, "targets": targets(results)}
    for r in results:
        print(f"{r['H']:>6}x{r['F']:<6} M={r['M']:<5} {r['variant']:<12} {r['ms'] * 1e3:9.1f} us  "
              f"x{r.get('ratio_vs_fused', float('nan')):.2f} of fused  rel_err {r['rel_err']:.1e}")
    for t in report["targets"]:
        print(f"{'MET ' if t['met'] else 'MISS' if t['met'] is False else '  - '} {t['target']}: worst {t['worst']} "
              f"at {t['worst_at']}")
    write_report(args.out, report)
    return report


if __name__ == "__main__":
    main()
