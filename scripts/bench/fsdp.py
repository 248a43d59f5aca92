"""One recipe trained under FSDP2, DDP and on one GPU: peak memory per GPU, step time, the export's metrics.

    python -m scripts.bench.fsdp --recipe recipes/minilm-sst2-sparse50-w8a8-fsdp.yaml --steps 1000 \\
        --out $OUT/fsdp-bench [--modes fsdp ddp single] [--edit BlockPruning.start_step=200 ...]

Each mode is one ``compress run`` (a command of its own: Lightning starts the second rank by running
it again), one after the other, for ``--steps`` optimizer steps, without validation or checkpoints during
training:

* ``fsdp``: the recipe's trainer as written (``ModelParallelStrategy`` on 2 GPUs);
* ``ddp``: ``strategy: ddp`` on 2 GPUs, the same batch per GPU;
* ``single``: one GPU with the per-GPU batch doubled, so every mode takes the same samples per step.

Each run gets a copy of the recipe in ``<out>/<mode>/recipe.yaml`` with the ``--edit`` changes
(``Callback.arg=value`` or a dotted path, as :mod:`scripts.edit_recipe` takes them; e.g. a pruning
schedule that fits in ``--steps``), its own Export ``dirpath`` and a
:class:`scripts.bench.training_probe.TrainingProbe`, which records each rank's peak GPU memory and
step times. ``compress run`` then evaluates the run's float weights and its export on the recipe's
validation split on rank 0 (``report.json``).

``<out>/fsdp-bench.json``: per mode the command, its exit status and wall time, per rank the peak
memory allocated and reserved (GiB), the median and mean step time after ``--warmup`` steps, samples
per second, and the metrics of the float weights and of the export; plus the environment. It is
written again after each mode, so a run stopped early keeps the modes done. A mode that fails is
recorded with its exit status (its log: ``<out>/<mode>/run.log``) and the others still run.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import yaml

from compress.lightning.recipe_yaml import load_recipe, load_yaml
from scripts.edit_recipe import set_value
from scripts.bench.decode import write_report

MODES = ("fsdp", "ddp", "single")
PROBE = "scripts.bench.training_probe.TrainingProbe"
GIB = 2 ** 30


def per_gpu_batch(recipe: dict) -> int:
    """The recipe's ``data.init_args.batch_size`` (the batch of one GPU)."""
    try:
        return int(recipe["data"]["init_args"]["batch_size"])
    except (KeyError, TypeError) as error:
        raise ValueError("the recipe needs data.init_args.batch_size (the batch per GPU), "
                         f"got none ({error})") from None


def mode_overrides(mode: str, recipe: dict, steps: int, out: Path) -> list[str]:
    """The ``compress run`` overrides of one mode (module docstring)."""
    common = [f"--trainer.max_steps={steps}", "--trainer.limit_val_batches=0", "--trainer.enable_progress_bar=false",
              "--trainer.enable_checkpointing=false", f"--compress.output_dir={out}"]
    if mode == "fsdp":
        return common
    if mode == "ddp":
        return [*common, "--trainer.strategy=ddp", "--trainer.devices=2"]
    if mode == "single":
        return [*common, "--trainer.strategy=auto", "--trainer.devices=1",
                f"--data.init_args.batch_size={2 * per_gpu_batch(recipe)}"]
    raise ValueError(f"mode: expected one of {MODES}, got {mode!r}")


def recipe_copy(recipe: dict, out: Path, edits: list[str]) -> dict:
    """``recipe`` with ``edits`` (KEY=VALUE) applied, the Export writing to ``<out>/compressed`` and a
    TrainingProbe writing to ``<out>/probe``."""
    copy = yaml.safe_load(yaml.safe_dump(recipe))
    for edit in edits:
        key, sep, value = edit.partition("=")
        if not sep:
            raise ValueError(f"--edit: expected KEY=VALUE, got {edit!r}")
        set_value(copy, key, load_yaml(value, f"--edit {key}"))
    callbacks = copy.setdefault("trainer", {}).setdefault("callbacks", []) or []
    exports = [cb for cb in callbacks if str(cb.get("class_path", "")).endswith(".Export")]
    if not exports:
        raise ValueError("the recipe has no Export callback: the benchmark evaluates the export")
    for export in exports:
        export.setdefault("init_args", {})["dirpath"] = str(out / "compressed")
    copy["trainer"]["callbacks"] = [*callbacks, {"class_path": PROBE, "init_args": {"path": str(out / "probe")}}]
    return copy


def run_mode(mode: str, recipe: dict, args) -> dict:
    """Train, export and evaluate one mode; returns its command, exit status and wall time."""
    out = Path(args.out) / mode
    out.mkdir(parents=True, exist_ok=True)
    config = out / "recipe.yaml"
    config.write_text(yaml.safe_dump(recipe_copy(recipe, out, args.edit)))
    command = [sys.executable, "-m", "compress.cli", "run", "--config", str(config), "--overwrite",
               *mode_overrides(mode, recipe, args.steps, out)]  # a re-run replaces the mode's earlier results
    started = time.perf_counter()
    with open(out / "run.log", "w") as log:
        status = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT).returncode
    return {"command": command, "returncode": status, "wall_s": round(time.perf_counter() - started, 1)}


def probe_summary(probe_dir: Path, warmup: int, samples_per_step: int) -> dict:
    """Per rank peak memory (GiB) and step times from the TrainingProbe files."""
    ranks = [json.loads(p.read_text()) for p in sorted(probe_dir.glob("rank*.json"))]
    if not ranks:
        return {}
    summary = {"device": ranks[0]["device"], "ranks": len(ranks), "peak_allocated_gib": [], "peak_reserved_gib": []}
    for rank in ranks:
        for key in ("allocated", "reserved"):
            value = rank[f"peak_{key}_bytes"]
            summary[f"peak_{key}_gib"].append(None if value is None else round(value / GIB, 3))
    times = ranks[0]["step_seconds"][warmup:]  # every rank waits for the others each step
    if times:
        median = statistics.median(times)
        summary.update(steps_timed=len(times), step_ms_median=round(1e3 * median, 2),
                       step_ms_mean=round(1e3 * statistics.fmean(times), 2),
                       samples_per_s=round(samples_per_step / median, 1))
    return summary


def report_metrics(report_path: Path) -> dict:
    """{"float": metrics, "export": metrics} from ``compress run``'s report.json (empty if there is none)."""
    if not report_path.is_file():
        return {}
    models = json.loads(report_path.read_text())["models"]
    return {"float": models[0]["metrics"], "export": models[1]["metrics"] if len(models) > 1 else None}


def environment() -> dict:
    import lightning
    import torch

    env = {"torch": torch.__version__, "lightning": lightning.__version__, "gpus": torch.cuda.device_count()}
    if torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name(0)
    return env


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipe", required=True, help="a recipe whose trainer runs FSDP2 on 2 GPUs")
    parser.add_argument("--steps", type=int, required=True, help="optimizer steps per run")
    parser.add_argument("--out", required=True, help="output directory (runs, logs, fsdp-bench.json)")
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    parser.add_argument("--edit", nargs="*", default=[], help="KEY=VALUE changes of the recipe copy")
    parser.add_argument("--warmup", type=int, default=20, help="steps left out of the step time")
    args = parser.parse_args(argv)
    if args.steps <= args.warmup:
        parser.error(f"--steps ({args.steps}) must exceed --warmup ({args.warmup})")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    recipe = load_recipe(args.recipe)
    samples_per_step = 2 * per_gpu_batch(recipe)
    result = {"recipe": args.recipe, "steps": args.steps, "warmup": args.warmup, "edits": args.edit,
              "samples_per_step": samples_per_step, "environment": environment(), "modes": {}}
    for mode in args.modes:
        entry = run_mode(mode, recipe, args)
        out = Path(args.out) / mode
        entry.update(probe_summary(out / "probe", args.warmup, samples_per_step),
                     metrics=report_metrics(out / "report.json"))
        result["modes"][mode] = entry
        write_report(Path(args.out, "fsdp-bench.json"), result)
        print(f"{mode}: {json.dumps({k: v for k, v in entry.items() if k != 'command'})}", flush=True)
    return 0 if all(entry["returncode"] == 0 for entry in result["modes"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
