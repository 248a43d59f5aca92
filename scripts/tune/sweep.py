"""What the three kernel sweeps share: arguments, neighbouring configs, timing, the reference check, JSON rows.

A sweep takes weight shapes K x N and token counts M. For each case it times the dispatch table's pick
and a few neighbouring configs of the same path (one launch parameter changed: tile width, K split,
warps, stages), checks each output against the op's reference, and times ``F.linear`` in fp16
(cuBLAS) on the same shapes as the baseline. Timing is the project's one harness,
:func:`compress.eval.timing.rotation_ms`: each call of the rotation uses its own input set (weights
and activations), and enough sets that together they exceed the device's L2 ``--rotate-l2`` times,
so no weight is read from L2 by the next call. Every case gives one JSON row per config::

    {"op", "K", "N", "M", "dtype", <op fields>, "config": {...}, "picked": bool, "ms": float | None,
     "graph": bool, "rel_err": float | None, "ok": bool, "error": str | None,
     "fp16_ms": float, "ratio_vs_fp16": float | None}

``ratio_vs_fp16`` is fp16 time / config time (above 1: faster than cuBLAS). A config that fails to
compile or launch gets ``ms`` None and its ``error``; ``ok`` says whether its output is within the
op's tolerance of the reference.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F

from compress.eval.timing import rotation_ms
from compress_kernels.common.device import l2_bytes

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


def parse_ints(text: str) -> list[int]:
    """``"1,16,64"`` -> [1, 16, 64] (positive integers)."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def parse_shapes(text: str) -> list[tuple[int, int]]:
    """``"4096x4096,4096x11008"`` -> [(4096, 4096), (4096, 11008)] as (K, N)."""
    shapes = []
    for item in text.split(","):
        parts = item.strip().lower().split("x")
        if len(parts) != 2 or not all(p.isdigit() and int(p) > 0 for p in parts):
            raise argparse.ArgumentTypeError(f"expected shapes KxN separated by commas, got {item!r} in {text!r}")
        shapes.append((int(parts[0]), int(parts[1])))
    return shapes


def argument_parser(op: str, description: str, shapes: str, ms: str) -> argparse.ArgumentParser:
    """The options every sweep takes; ``shapes`` and ``ms`` are the defaults of ``--shapes`` and ``--m``."""
    parser = argparse.ArgumentParser(prog=f"python -m scripts.tune.{op}", description=description)
    parser.add_argument("--shapes", type=parse_shapes, default=parse_shapes(shapes), help=f"KxN,... (default {shapes})")
    parser.add_argument("--m", type=parse_ints, default=parse_ints(ms), help=f"token counts M (default {ms})")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="fp16", help="activation dtype (default fp16)")
    parser.add_argument("--out", type=Path, default=None, help="write the JSON rows here")
    parser.add_argument("--rotate-l2", type=float, default=4.0, help="input sets span this many times L2 (default 4)")
    parser.add_argument("--max-sets", type=int, default=16, help="at most this many input sets (default 16)")
    parser.add_argument("--warmup-ms", type=float, default=10.0)
    parser.add_argument("--rep-ms", type=float, default=40.0)
    return parser


def run(op: str, description: str, shapes: str, ms: str, sweep_case: Callable, argv=None,
        add_arguments: Callable[[argparse.ArgumentParser], None] | None = None) -> list[dict]:
    """The command line of the sweep ``python -m scripts.tune.<op>``: parse ``argv`` (the common options,
    ``add_arguments``' own), then ``sweep_case(k, n, m, args, device)`` for every shape and M, report the
    rows and return them."""
    parser = argument_parser(op, description, shapes, ms)
    if add_arguments is not None:
        add_arguments(parser)
    args = parser.parse_args(argv)
    check_common(args)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    rows = [row for k, n in args.shapes for m in args.m for row in sweep_case(k, n, m, args, device)]
    report(rows, args)
    return rows


def check_common(args: argparse.Namespace) -> None:
    """Refuse option values no sweep can run with (argparse types check the lists)."""
    if args.max_sets < 1:
        raise SystemExit(f"--max-sets: expected at least 1, got {args.max_sets}")
    if args.rotate_l2 <= 0 or args.warmup_ms < 0 or args.rep_ms <= 0:
        raise SystemExit(f"--rotate-l2 and --rep-ms: expected > 0, --warmup-ms >= 0; got {args.rotate_l2}, "
                         f"{args.rep_ms}, {args.warmup_ms}")


def set_count(set_bytes: int, device: torch.device, args: argparse.Namespace) -> int:
    """Input sets so that together they span ``--rotate-l2`` times the device's L2 (1 to ``--max-sets``)."""
    wanted = math.ceil(args.rotate_l2 * l2_bytes(device) / max(set_bytes, 1))
    return max(1, min(args.max_sets, wanted))


def rel_error(y: torch.Tensor, ref: torch.Tensor) -> float:
    """||y - ref|| / ||ref|| in float64 (NaN in y gives NaN, which fails every bound)."""
    denom = ref.double().norm()
    diff = (y.double() - ref.double()).norm()
    return float(diff / denom) if denom > 0 else float(diff)


def neighbours(cfg, steps: dict[str, Callable[[Any], list]]) -> list:
    """Configs one field away from ``cfg``: for each field, each value ``steps[field](value)`` proposes
    (duplicates and ``cfg`` itself left out). Works for NamedTuples and frozen dataclasses."""
    replace = cfg._replace if hasattr(cfg, "_replace") else (lambda **kw: dataclasses.replace(cfg, **kw))
    out = []
    for field, propose in steps.items():
        for value in propose(getattr(cfg, field)):
            candidate = replace(**{field: value})
            if candidate != cfg and candidate not in out:
                out.append(candidate)
    return out


def halve_double(low: int, high: int) -> Callable[[int], list[int]]:
    """Proposals value / 2 and value * 2 kept within [low, high]."""
    return lambda v: [c for c in (v // 2, v * 2) if low <= c <= high]


def stages(v: int) -> list[int]:
    """Proposals one pipeline stage fewer (at least 1) and one more."""
    return [c for c in (v - 1, v + 1) if c >= 1]


def as_dict(cfg) -> dict:
    return cfg._asdict() if hasattr(cfg, "_asdict") else dataclasses.asdict(cfg)


def time_case(case: dict, configs: list, picked, sets: list, run: Callable, reference: Callable, tol: float,
              fp16_sets: list, args: argparse.Namespace) -> list[dict]:
    """JSON rows of one case: each config of ``configs`` (``picked`` among them) run as ``run(cfg, set)``
    over the rotation ``sets``, checked against ``reference(sets[0])``; the fp16 baseline on ``fp16_sets``
    (pairs (x, w))."""
    fp16_ms, _ = rotation_ms([lambda s=s: F.linear(*s) for s in fp16_sets], True, args.warmup_ms, args.rep_ms)
    ref = reference(sets[0])
    rows = []
    for cfg in configs:
        row = {**case, "config": as_dict(cfg), "picked": cfg == picked, "fp16_ms": fp16_ms}
        try:
            err = rel_error(run(cfg, sets[0]), ref)
            ms, graph = rotation_ms([lambda s=s: run(cfg, s) for s in sets], True, args.warmup_ms, args.rep_ms)
            row.update(ms=ms, graph=graph, rel_err=err, ok=err <= tol, error=None, ratio_vs_fp16=fp16_ms / ms)
        except Exception as exc:  # noqa: BLE001 - a config that cannot compile or launch is a row, not the end
            row.update(ms=None, graph=False, rel_err=None, ok=False, error=f"{type(exc).__name__}: {exc}"[:300],
                       ratio_vs_fp16=None)
        rows.append(row)
    return rows


def report(rows: list[dict], args: argparse.Namespace) -> None:
    """Print one line per row and write the rows as JSON to ``--out`` (if given)."""
    for r in rows:
        timing = f"{r['ms'] * 1e3:9.1f} us  x{r['ratio_vs_fp16']:.2f} fp16" if r["ms"] is not None else r["error"]
        mark = "*" if r["picked"] else " "  # the dispatch table's pick
        config = " ".join(f"{key}={value}" for key, value in r["config"].items())
        print(f"{mark} {r['op']} {r['K']}x{r['N']} M={r['M']} {config}: {timing}{'' if r['ok'] else '  (not ok)'}")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(rows, indent=1))
