"""A model-quality results file (``benchmarks/results/<family>-<gpu>.json``) from one ``compress evaluate`` report.

    python -m scripts.bench.quality_family --report runs/smollm2-wikitext-compare/report.json \\
        --recipe-prefix recipes/smollm2-wikitext- --commit abc1234 \\
        --targets w8a8-qat=1 w4a16-qat=3 w4a16-gptq=8 w8a16-ptq=1 sparse50=15 sparse50-w8a8=18 \\
        --description "..." --out benchmarks/results/smollm2-h100.json

The report (:mod:`compress.eval.report`) compares saved models on one device, the dense baseline
first. Each of its models becomes one run of the schema :mod:`scripts.bench.pages` reads: variant =
the model's name in the report, recipe = ``<recipe-prefix><variant>.yaml``, the primary metric's
value, ``steps`` = that recipe's ``trainer.max_steps`` (0: post-training only), ``latency_ms`` per
batch and the baseline's as ``dense_latency_ms`` (same report, same device), ``counts_for`` both the
metric and the speed figure, ``source`` (commit, report path, model dir) and no note. One seed: the
recipes' ``seed_everything``. Targets: ``variant=limit``, in percent for a perplexity (lower is
better) and in points for an accuracy.

``--rerun variant=REPORT``: a recipe whose settings changed after the joint report, run again on its
own (``compress run``: its report holds the run's float weights and the compressed model). That
run counts for the metric (its note: ``--rerun-note``); the joint report's run of the variant then
counts only for speed (note: ``--speed-note``), since the same layers run the same kernels.

``--add variant=REPORT``: a variant the joint report does not hold (a recipe added after it), run on
its own (``compress run``: the report's baseline is that run's float model); it counts for the metric
only, as a rerun does (its latencies, against that report's baseline, are kept; note: ``--add-note``).
"""
from __future__ import annotations

import argparse
from pathlib import Path

from compress.eval.report import read_json
from compress.lightning.recipe_yaml import load_recipe
from scripts.bench.decode import write_report


def recipe_facts(path: Path) -> tuple[int, int]:
    """(``seed_everything``, ``trainer.max_steps``) of a recipe file."""
    if not path.is_file():
        raise FileNotFoundError(f"expected the recipe {path} (from --recipe-prefix and the report's model name)")
    recipe = load_recipe(path)
    return int(recipe.get("seed_everything", 0)), int(recipe.get("trainer", {}).get("max_steps", -1))


def parse_targets(items: list[str]) -> dict[str, float]:
    targets = {}
    for item in items:
        variant, sep, limit = item.partition("=")
        if not sep or not variant:
            raise ValueError(f"--targets: expected variant=limit, got {item!r}")
        targets[variant] = float(limit)
    return targets


def family(report_path: Path, recipe_prefix: str, commit: str, targets: dict[str, float], name: str,
           description: str) -> dict:
    """The results file's content (see the module docstring)."""
    report = read_json(report_path)
    base = report.baseline
    if base.name != "dense":
        raise ValueError(f"{report_path}: expected the dense model first (named 'dense'), got {base.name!r}")
    metric = base.primary_metric
    dense_ms = {str(p.batch_size): round(p.latency_ms, 4) for p in base.latency}
    runs = []
    for model in report.models:
        recipe = Path(f"{recipe_prefix}{model.name}.yaml")
        seed, steps = recipe_facts(recipe)
        runs.append({
            "variant": model.name, "recipe": str(recipe), "seed": seed, metric: model.metrics[metric],
            "steps": steps, "latency_ms": {str(p.batch_size): round(p.latency_ms, 4) for p in model.latency},
            "dense_latency_ms": dense_ms, "linear_weight_bytes": model.linear_weight_bytes,
            "counts_for": ["metric", "speed"],
            "source": {"commit": commit, "report": str(report_path), "model": model.source or model.name},
            "note": "",
        })
    return {"family": name, "description": description, "gpu": report.device, "environment":
            {k: v for k, v in report.environment.items() if k != "gpu"}, "metric": metric,
            "higher_is_better": base.higher_is_better, "targets": targets,
            "target_unit": "points" if base.higher_is_better else "percent", "runs": runs}


def check_targets(data: dict) -> None:
    """Every target names a variant with a run."""
    variants = {r["variant"] for r in data["runs"]}
    unknown = sorted(set(data["targets"]) - variants)
    if unknown:
        raise ValueError(f"--targets: {unknown} have no run (variants: {sorted(variants)})")


def own_run(variant: str, path: Path, metric: str, facts: dict) -> dict:
    """The run of ``variant``'s compressed model in the report ``path`` (one besides its baseline), with
    ``facts`` (recipe, seed, steps, counts_for, source, note) and the report's own baseline latencies."""
    report = read_json(path)
    compressed = [m for m in report.models if m is not report.baseline]
    if len(compressed) != 1:
        raise ValueError(f"{variant}: expected {path} to hold one compressed model besides the baseline, got "
                         f"{[m.name for m in compressed]}")
    model = compressed[0]
    return {"variant": variant, **{k: facts[k] for k in ("recipe", "seed", "steps")}, metric: model.metrics[metric],
            "latency_ms": {str(p.batch_size): round(p.latency_ms, 4) for p in model.latency},
            "dense_latency_ms": {str(p.batch_size): round(p.latency_ms, 4) for p in report.baseline.latency},
            "linear_weight_bytes": model.linear_weight_bytes, "counts_for": facts["counts_for"],
            "source": {**facts["source"], "report": str(path), "model": model.source or model.name},
            "note": facts["note"]}


def apply_adds(data: dict, adds: dict[str, Path], recipe_prefix: str, commit: str, note: str) -> None:
    """Append each added variant's run (module docstring), in place."""
    known = {r["variant"] for r in data["runs"]}
    for variant, path in adds.items():
        if variant in known:
            raise ValueError(f"--add {variant}: the joint report already holds it (use --rerun)")
        recipe = Path(f"{recipe_prefix}{variant}.yaml")
        seed, steps = recipe_facts(recipe)
        data["runs"].append(own_run(variant, path, data["metric"], {
            "recipe": str(recipe), "seed": seed, "steps": steps, "counts_for": ["metric"],
            "source": {"commit": commit}, "note": note}))


def apply_reruns(data: dict, reruns: dict[str, Path], commit: str, rerun_note: str, speed_note: str) -> None:
    """Add each rerun's compressed model as the variant's metric run (module docstring), in place."""
    metric = data["metric"]
    for variant, path in reruns.items():
        joint = [r for r in data["runs"] if r["variant"] == variant]
        if len(joint) != 1:
            raise ValueError(f"--rerun {variant}: expected one run of it in the joint report, found {len(joint)}")
        first = joint[0]
        run = own_run(variant, path, metric, {**{k: first[k] for k in ("recipe", "seed", "steps")},
                                              "counts_for": ["metric"], "source": {"commit": commit},
                                              "note": rerun_note})
        first["counts_for"], first["note"] = ["speed"], speed_note
        data["runs"].append(run)


def parse_reports(option: str, items: list[str]) -> dict[str, Path]:
    """``["variant=report.json", ...]`` -> {variant: Path}."""
    found = {}
    for item in items:
        variant, sep, path = item.partition("=")
        if not sep or not variant or not path:
            raise ValueError(f"{option}: expected variant=report.json, got {item!r}")
        found[variant] = Path(path)
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.bench.quality_family", description=__doc__.split("\n")[0])
    parser.add_argument("--report", type=Path, required=True, help="a compress evaluate report.json, dense first")
    parser.add_argument("--recipe-prefix", required=True, help="recipe path of a variant = prefix + name + .yaml")
    parser.add_argument("--commit", required=True, help="the commit the runs measured")
    parser.add_argument("--targets", nargs="*", default=[], help="variant=limit (percent or points)")
    parser.add_argument("--family", required=True, help="the family's name (the page's)")
    parser.add_argument("--description", required=True, help="one sentence: model, data, how it was measured")
    parser.add_argument("--rerun", nargs="*", default=[], help="variant=report.json of a recipe run again on its own")
    parser.add_argument("--rerun-commit", default=None, help="the commit the reruns measured")
    parser.add_argument("--rerun-note", default="", help="the note on each rerun")
    parser.add_argument("--speed-note", default="", help="the note on a rerun variant's joint-report run")
    parser.add_argument("--add", nargs="*", default=[], help="variant=report.json of a variant the joint report lacks")
    parser.add_argument("--add-commit", default=None, help="the commit the added runs measured")
    parser.add_argument("--add-note", default="", help="the note on each added run")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    data = family(args.report, args.recipe_prefix, args.commit, parse_targets(args.targets), args.family,
                  args.description)
    reruns, adds = parse_reports("--rerun", args.rerun), parse_reports("--add", args.add)
    if reruns and not (args.rerun_commit and args.rerun_note and args.speed_note):
        raise ValueError("--rerun needs --rerun-commit, --rerun-note and --speed-note")
    if adds and not (args.add_commit and args.add_note):
        raise ValueError("--add needs --add-commit and --add-note")
    apply_reruns(data, reruns, args.rerun_commit, args.rerun_note, args.speed_note)
    apply_adds(data, adds, args.recipe_prefix, args.add_commit, args.add_note)
    check_targets(data)
    write_report(args.out, data)
    print(f"wrote {args.out}: {len(data['runs'])} runs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
