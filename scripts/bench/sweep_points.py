"""Fold one joint ``compress evaluate`` report into the block-sparsity sweep of a results file.

    python -m scripts.bench.sweep_points --report runs/sweep/report.json --commit abc1234 \\
        --results benchmarks/results/smollm2-h200.json --note "..." --plot runs/sweep/report.png

The sweep (``<results>["sweep"]``, rendered by :func:`scripts.bench.llm_sections.sweep_section`) holds
the dense model and one entry per point (``blocks-25``, ``blocks-50-w8a8``, ...). The report compares
saved models on one device with the dense model first (named ``dense``). Each report model whose
name is a point replaces that point's perplexity, latency per batch, linear weight bytes and
compression, and is marked measured by ``compress evaluate`` at ``--commit``; the dense entry takes the
report's dense model. A point the sweep lacks is added with ``--new-point NAME=RECIPE``. A point the
report does not hold keeps its figures; where it has latencies, they were timed in another run, so
the dense latencies of that run (the old dense entry's, unless the point already names its own)
stay with it as ``dense_latency_ms``: a speed-up is only ever a ratio of two timings of one run.
With ``--plot``, the report's accuracy-against-speed plot is copied beside the results pages
(``docs/results/<results name>-sweep.png``) and the sweep names it (``plot``), so its page shows it.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
from pathlib import Path

from compress.eval.report import read_json
from scripts.bench.decode import write_report


def latencies(model) -> dict[str, float]:
    """``{"batch size": ms}`` of one report model."""
    return {str(p.batch_size): p.latency_ms for p in model.latency}


def fold(sweep: dict, report_path: Path, commit: str, note: str, new_points: dict[str, str] | None = None) -> dict:
    """The sweep with the report's models in place of its dense entry and the points they name;
    ``new_points`` (name -> recipe) are added first."""
    report = read_json(report_path)
    base = report.baseline
    if base.name != "dense":
        raise ValueError(f"{report_path}: expected the dense model first (named 'dense'), got {base.name!r}")
    sweep.setdefault("points", [])
    points = {point["name"]: point for point in sweep["points"]}
    for name, recipe in (new_points or {}).items():
        if name in points:
            raise ValueError(f"--new-point {name}: the sweep already has that point")
        points[name] = {"name": name, "recipe": recipe}
        sweep["points"].append(points[name])
    unknown = [m.name for m in report.models[1:] if m.name not in points]
    if unknown:
        raise ValueError(f"{report_path}: models {unknown} are not points of the sweep (expected some of "
                         f"{sorted(points)})")
    old_dense_ms = sweep["dense"]["latency_ms"]
    measured = {m.name: m for m in report.models[1:]}
    for name, point in points.items():
        model = measured.get(name)
        if model is None:
            if "latency_ms" in point:
                point.setdefault("dense_latency_ms", dict(old_dense_ms))
                point.setdefault("commit", sweep.get("commit"))
            continue
        point.pop("dense_latency_ms", None)
        point.update({"perplexity": model.metrics["perplexity"], "measured_by": "compress evaluate",
                      "latency_ms": latencies(model), "linear_weight_bytes": model.linear_weight_bytes,
                      "compression": model.compression, "commit": commit})
    sweep["dense"] = {"perplexity": base.metrics["perplexity"], "latency_ms": latencies(base),
                      "linear_weight_bytes": base.linear_weight_bytes}
    sweep.update({"commit": commit, "environment": dict(report.environment), "latency_mode": report.latency_mode,
                  "note": note})
    return sweep


def store_plot(source: Path, destination: Path) -> None:
    """Copy the report's plot to ``destination`` atomically (a temporary file, then a rename)."""
    if source.suffix != ".png" or not source.is_file():
        raise ValueError(f"--plot: expected the report's .png plot, got {source}")
    partial = destination.with_name(destination.name + ".partial")
    shutil.copyfile(source, partial)
    os.replace(partial, destination)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.bench.sweep_points", description=__doc__.split("\n")[0])
    parser.add_argument("--report", type=Path, required=True, help="a compress evaluate report.json, dense first")
    parser.add_argument("--commit", required=True, help="the commit the report measured")
    parser.add_argument("--results", type=Path, required=True, help="the results file with a 'sweep' entry")
    parser.add_argument("--note", default="", help="how the points were measured (replaces the sweep's note)")
    parser.add_argument("--new-point", nargs="*", default=[], help="NAME=RECIPE: a point the sweep does not have yet")
    parser.add_argument("--plot", type=Path, help="the report's plot (report.png) to show with the sweep")
    parser.add_argument("--plot-dir", type=Path, default=Path("docs/results"),
                        help="where the plot goes, from the repository root (default: docs/results)")
    args = parser.parse_args(argv)
    new_points = dict(item.partition("=")[::2] for item in args.new_point)
    if any(not name or not recipe for name, recipe in new_points.items()):
        parser.error(f"--new-point: expected NAME=RECIPE, got {args.new_point}")
    data = json.loads(args.results.read_text())
    if "sweep" not in data:
        parser.error(f"{args.results}: expected a 'sweep' entry, found keys {sorted(data)}")
    data["sweep"] = fold(data["sweep"], args.report, args.commit, args.note, new_points)
    if args.plot is not None:
        destination = args.plot_dir / f"{args.results.stem}-sweep.png"
        store_plot(args.plot, destination)
        data["sweep"]["plot"] = destination.as_posix()
    write_report(args.results, data)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
