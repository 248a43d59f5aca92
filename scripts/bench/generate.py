"""Generate benchmark: tokens/s of ``model.generate``, eager and compiled, against the decode harness.

    PYTHONPATH=$PWD python -m scripts.bench.generate --out benchmarks/results/generate-h100.json

For each batch size (``--batches``), model (``--models``: ``smollm2``, the real SmolLM2-135M-Instruct
from ``$SMOLLM2_DIR``; ``llama2-7b``, Llama-2-7B shapes with ``--layers`` random decoder layers;
``mixtral``, a 2-layer random Mixtral with 8 experts, top-2) and
variant (``--variants``: fp16, w8a8, w4a16, dds50, built as the decode benchmark builds them; with
``--fuse compressed``, the default, their compressed q/k/v and gate/up fused, fp16 left unfused), in that
order: greedy ``model.generate`` of ``--new-tokens`` tokens after a random ``--prompt-len`` prompt,
in each ``--modes`` (``eager``: ``transformers``' default dynamic cache; ``compiled``:
:func:`compress.eval.generate.compile_for_generate`, by default our greedy loop with one CUDA graph
replay per token, ``--compiled-loop transformers`` for transformers' loop around its compiled,
CUDA-graphed step; eager variants are timed in rounds against the fp16 model, whose paired ratio the report
uses), and the decode harness on the same model (``--no-harness`` leaves it out). First, the
host time per linear call of every inference module against ``F.linear`` on SmolLM2's shapes
(:mod:`scripts.bench.host_overhead`; ``--no-host-overhead`` leaves it out). How each figure is
measured: :mod:`scripts.bench.generate_runner`.

Output: a JSON report (``--out``, rewritten after every variant: the GPU and versions, the config,
the host-overhead table, each model / batch / variant's figures per mode, ratios to fp16 in the same
mode and of compiled generate to the harness, the targets met or not, work skipped for the time
budget and what failed) and printed tables. ``--time-budget`` (seconds): no new variant starts after
it (the rest is listed as skipped); batch sizes run outermost, so batch 1 comes first. ``--tiny``
runs tiny random models on the CPU (the modules' pure-PyTorch references, ``aot_eager``) so the
script is tested where there is no GPU. Exits 1 when anything failed.
"""
from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

import torch

from compress.eval.decode_loop import experts_reason
from compress.eval.generate import LOOPS
from scripts.bench import host_overhead
from scripts.bench.decode import environment, int_list, release_memory, write_report
from scripts.bench.decode_variants import VARIANTS, weight_bytes
from scripts.bench.decode_runner import random_prompt
from scripts.bench.generate_runner import FUSE_CHOICES, MODELS, ModelSource, bench_compiled, bench_eager, bench_harness

logger = logging.getLogger(__name__)

DEFAULT_VARIANTS = ("fp16", "w8a8", "w4a16", "dds50")
MODES = ("eager", "compiled")
DEFAULT_LLAMA_LAYERS = 8  # of 32: the compiled whole-model graph compiles in seconds, not a minute


# ---- one model, batch and variant ------------------------------------------------------------------
def bench_unit(source: ModelSource, variant: str, batch: int, args, report: dict) -> dict:
    """Build the variant, time every mode and the harness (a failing one is recorded, the others go on).
    Experts that synchronise with the host (block-sparse experts run ``QuantizedExperts``' loop:
    :func:`compress.eval.decode_loop.experts_reason`) are timed eager only: the compiled step and the
    harness's CUDA graph cannot hold them, so those modes record ``not_timed`` with the reason."""
    began = time.perf_counter()
    model = source.build(variant)
    unserved = experts_reason(model)
    result = dict(model=source.name, variant=variant, batch=batch,
                  dtype=str(source.dtype(variant)).replace("torch.", ""),
                  weight_bytes=weight_bytes(model), build_s=time.perf_counter() - began)
    prompt = random_prompt(model, batch, args.prompt_len, args.seed)
    eager_out = None
    try:
        for mode in (*args.modes, *(["harness"] if args.harness else [])):
            try:
                if mode != "eager" and unserved is not None:
                    result[mode] = dict(not_timed=unserved)
                elif mode == "eager":
                    reference = source.reference() if variant != "fp16" else None
                    result["eager"], eager_out = bench_eager(model, prompt, args, reference)
                elif mode == "compiled":
                    result["compiled"] = bench_compiled(model, prompt, args, eager_out)
                else:
                    result["harness"] = bench_harness(model, variant, batch, args)
            except Exception as error:  # noqa: BLE001 - one broken mode must not cost the others' figures
                if args.fail_fast:
                    raise
                logger.exception("%s %s batch %d: %s failed", source.name, variant, batch, mode)
                message = f"{type(error).__name__}: {error}"[:2000]
                result[mode] = dict(error=message)
                report["failed"].append(dict(model=source.name, variant=variant, batch=batch, mode=mode, error=message))
    finally:
        del model
        release_memory(args.device)
    return result


# ---- report ----------------------------------------------------------------------------------------
def ratios(results: list[dict]) -> dict:
    """{model: {batch: {variant: ratios}}}: each mode's tokens/s over fp16's in that mode (eager: the
    paired ratio of rounds against fp16, the separate runs' ratio kept as ``eager_vs_fp16_unpaired``),
    and compiled generate over the harness and over eager generate (this run's figures only)."""
    speed = {(r["model"], r["batch"], r["variant"], mode): r[mode]["tokens_per_s"]
             for r in results for mode in (*MODES, "harness") if "tokens_per_s" in r.get(mode, {})}
    table: dict = {}
    paired = {(r["model"], r["batch"], r["variant"]): r["eager"]["vs_fp16_paired"]
              for r in results if "vs_fp16_paired" in r.get("eager", {})}
    for (model, batch, variant, mode), tps in speed.items():
        row = table.setdefault(model, {}).setdefault(str(batch), {}).setdefault(variant, {})
        base = speed.get((model, batch, "fp16", mode))
        if base:
            row[f"{mode}_vs_fp16"] = tps / base
        if mode == "eager" and (model, batch, variant) in paired:  # timed in rounds against fp16: robust to host drift
            row["eager_vs_fp16_unpaired"] = row.get("eager_vs_fp16")
            row["eager_vs_fp16"] = paired[(model, batch, variant)]
        if mode == "compiled":
            for other in ("harness", "eager"):
                if (model, batch, variant, other) in speed:
                    row[f"compiled_vs_{other}"] = tps / speed[(model, batch, variant, other)]
    return table


def _all(values: list[float], ok) -> bool | None:
    return None if not values else all(ok(v) for v in values)


def targets(table: dict) -> dict:
    """The issue's targets, judged on this run's ratios (None when a figure is missing)."""
    rows = [(model, batch, variant, row) for model, batches in table.items() for batch, variants in batches.items()
            for variant, row in variants.items()]

    def figures(key, model=None, batch=None, variant=None):
        return [row[key] for m, b, v, row in rows if key in row and v != "fp16" and model in (None, m)
                and batch in (None, b) and variant in (None, v)]

    def llama_b1(variant):
        found = figures("compiled_vs_fp16", "llama2-7b", "1", variant)
        return found[0] if found else None

    w4, w8 = llama_b1("w4a16"), llama_b1("w8a8")
    return {
        "eager generate no slower than fp16 (every model, batch, variant)":
            _all(figures("eager_vs_fp16"), lambda r: r >= 1.0),
        "compiled generate within 10% of the harness (every model, batch, variant)":
            _all([row["compiled_vs_harness"] for *_, row in rows if "compiled_vs_harness" in row], lambda r: r >= 0.9),
        "llama2-7b w4a16 >= 2.0x fp16 (batch 1, compiled)": None if w4 is None else w4 >= 2.0,
        "llama2-7b w8a8 >= 1.5x fp16 (batch 1, compiled)": None if w8 is None else w8 >= 1.5,
        "smollm2 every variant faster than fp16 (batch 1, eager)":
            _all(figures("eager_vs_fp16", "smollm2", "1"), lambda r: r > 1.0),
        "smollm2 every variant faster than fp16 (batch 1, compiled)":
            _all(figures("compiled_vs_fp16", "smollm2", "1"), lambda r: r > 1.0),
        "mixtral every variant faster than fp16 (batch 1 and 8, compiled)":
            _all(figures("compiled_vs_fp16", "mixtral"), lambda r: r > 1.0),
    }


def _cell(entry: dict | None, ratio: float | None) -> str:
    if not entry:
        return "- | -"
    if "tokens_per_s" not in entry:
        return "failed | -"
    return f"{entry['tokens_per_s']:.1f} | {'-' if ratio is None else f'{ratio:.2f}x'}"


def format_table(results: list[dict], table: dict) -> str:
    """Markdown: one row per model, batch and variant; tokens/s and ratios per mode."""
    lines = ["| model | batch | variant | eager tok/s | vs fp16 | compiled tok/s | vs fp16 | harness tok/s | vs fp16 "
             "| compiled / harness | compile s |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        row = table.get(r["model"], {}).get(str(r["batch"]), {}).get(r["variant"], {})
        cells = " | ".join(_cell(r.get(mode), row.get(f"{mode}_vs_fp16")) for mode in (*MODES, "harness"))
        vs_harness = row.get("compiled_vs_harness")
        compile_s = r.get("compiled", {}).get("compile_s")
        lines.append(f"| {r['model']} | {r['batch']} | {r['variant']} | {cells} | "
                     f"{'-' if vs_harness is None else f'{vs_harness:.2f}x'} | "
                     f"{'-' if compile_s is None else f'{compile_s:.0f}'} |")
    return "\n".join(lines)


def finish_report(report: dict, out: Path | None, started: float) -> None:
    """Recompute ratios and target verdicts, stamp the elapsed time, write the JSON."""
    report["ratios"] = ratios(report["results"])
    report["targets"] = targets(report["ratios"])
    report["elapsed_s"] = time.perf_counter() - started
    write_report(out, report)


# ---- command line ----------------------------------------------------------------------------------
def name_list(allowed: tuple[str, ...]):
    """An argparse type: comma-separated names, each one of ``allowed``."""
    def parse(text: str) -> list[str]:
        names = [v.strip() for v in text.split(",") if v.strip()]
        if not names or any(n not in allowed for n in names):
            raise argparse.ArgumentTypeError(f"expected names from {', '.join(allowed)}, got {text!r}")
        return names
    return parse


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m scripts.bench.generate", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", type=name_list(MODELS), default=list(MODELS), help=", ".join(MODELS))
    parser.add_argument("--variants", type=name_list(tuple(VARIANTS)), default=list(DEFAULT_VARIANTS),
                        help=f"default {','.join(DEFAULT_VARIANTS)}; any of {', '.join(VARIANTS)}")
    parser.add_argument("--modes", type=name_list(MODES), default=list(MODES), help=", ".join(MODES))
    parser.add_argument("--batches", type=int_list, default=None, help="batch sizes (default 1,8; 1,2 with --tiny)")
    parser.add_argument("--new-tokens", type=int, default=None, help="tokens generated per sequence (64; 3 tiny)")
    parser.add_argument("--prompt-len", type=int, default=None, help="prompt tokens (default 16; 4 with --tiny)")
    parser.add_argument("--layers", type=int, default=None,
                        help=f"llama2-7b decoder layers (default {DEFAULT_LLAMA_LAYERS}; 2 with --tiny)")
    parser.add_argument("--repeats", type=int, default=3, help="timed generate calls per figure (median)")
    parser.add_argument("--eager-rounds", type=int, default=None,
                        help="rounds of eager generate against fp16 per compressed variant (median ratio; 9; "
                             "1 tiny): eager calls are host-bound, and single calls of the same work vary by 2x")
    parser.add_argument("--no-harness", dest="harness", action="store_false", help="skip the decode harness")
    parser.add_argument("--no-host-overhead", dest="host_overhead", action="store_false",
                        help="skip the per-call host time of the modules")
    parser.add_argument("--host-overhead-calls", type=int, default=None, help="calls per figure (200; 3 tiny)")
    parser.add_argument("--fuse", choices=FUSE_CHOICES, default="compressed",
                        help="sibling fusion of q/k/v and gate/up: compressed layers only (default, the README's "
                             "inference step; fp16 as transformers builds it), all (fp16 too, as the decode "
                             "benchmark) or none")
    parser.add_argument("--compiled-loop", choices=LOOPS, default="graphed",
                        help="compiled mode: our CUDA-graph loop behind model.generate (default) or transformers' "
                             "loop around its compiled step")
    parser.add_argument("--no-fullgraph", dest="fullgraph", action="store_false",
                        help="compile generate's step allowing graph breaks (default fullgraph on CUDA)")
    parser.add_argument("--compile-backend", default=None, help="torch.compile backend (inductor; aot_eager on CPU)")
    parser.add_argument("--compile-mode", default=None,
                        help="torch.compile mode of generate's step (default reduce-overhead on CUDA)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tiny", action="store_true", help="tiny random models for CPU smoke tests")
    parser.add_argument("--device", default=None, help="cuda (default when available) or cpu")
    parser.add_argument("--time-budget", type=float, default=420.0,
                        help="seconds; variants not started by then are skipped (and listed as skipped)")
    parser.add_argument("--fail-fast", action="store_true", help="stop at the first failure")
    parser.add_argument("--out", type=Path, default=None, help="JSON report path")
    return finish_args(parser, parser.parse_args(argv))


def finish_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.Namespace:
    """Fill the defaults that depend on ``--tiny`` and the device; validate."""
    args.device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if args.device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is available")
    on_cuda = args.device.type == "cuda"
    defaults = dict(batches=([1, 2], [1, 8]), new_tokens=(3, 64), prompt_len=(4, 16),
                    layers=(2, DEFAULT_LLAMA_LAYERS), host_overhead_calls=(3, 200), eager_rounds=(1, 9))
    for name, (tiny, full) in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, tiny if args.tiny else full)
    args.compile_backend = args.compile_backend or ("inductor" if on_cuda else "aot_eager")
    args.fullgraph = args.fullgraph and on_cuda  # on the CPU the BSR reference builds sparse tensors: breaks
    for name in ("new_tokens", "prompt_len", "layers", "repeats", "host_overhead_calls", "eager_rounds"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name.replace('_', '-')}: expected a positive int, got {getattr(args, name)}")
    if not args.tiny and not on_cuda:
        logger.warning("real-size models on %s will be very slow; use --tiny for a smoke test", args.device)
    return args


def run(args: argparse.Namespace) -> dict:
    """The whole benchmark; returns (and writes after every variant) the report."""
    report = dict(benchmark="generate", environment=environment(args.device),
                  config={k: (str(v) if isinstance(v, (torch.device, Path)) else v) for k, v in vars(args).items()},
                  host_overhead=[], results=[], skipped=[], failed=[])
    started = time.perf_counter()
    if args.host_overhead:
        shapes = ((64, 64), (64, 128)) if args.tiny else host_overhead.SMOLLM2_SHAPES
        report["host_overhead"] = host_overhead.measure(args.device, calls=args.host_overhead_calls, shapes=shapes)
        finish_report(report, args.out, started)
    sources: dict[str, ModelSource | None] = {}
    for batch in args.batches:
        for model in args.models:
            for variant in args.variants:
                run_unit(sources, model, variant, batch, args, report, started)
    finish_report(report, args.out, started)
    return report


def run_unit(sources: dict, model: str, variant: str, batch: int, args, report: dict, started: float) -> None:
    """One model / variant / batch, unless the budget is spent or the model could not be loaded."""
    unit = dict(model=model, variant=variant, batch=batch)
    if time.perf_counter() - started > args.time_budget:
        report["skipped"].append(dict(unit, reason=f"time budget of {args.time_budget:.0f} s spent"))
        return
    if model not in sources:
        try:
            sources[model] = ModelSource(model, args)
        except Exception as error:  # noqa: BLE001 - e.g. no SmolLM2 GGUF here: the other model still runs
            if args.fail_fast:
                raise
            logger.exception("model %s could not be loaded", model)
            sources[model] = None
            report["failed"].append(dict(model=model, error=f"{type(error).__name__}: {error}"[:2000]))
    if sources[model] is None:
        report["skipped"].append(dict(unit, reason="the model could not be loaded (see failed)"))
        return
    logger.info("%s %s batch %d ...", model, variant, batch)
    report["results"].append(bench_unit(sources[model], variant, batch, args, report))
    finish_report(report, args.out, started)


def main(argv=None) -> dict:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    args = parse_args(argv)
    report = run(args)
    if report["host_overhead"]:
        print(host_overhead.format_table(report["host_overhead"]))
    print(format_table(report["results"], report["ratios"]))
    for target, ok in report["targets"].items():
        print(f"target {target}: {'n/a' if ok is None else ('met' if ok else 'NOT met')}")
    for skipped in report["skipped"]:
        print(f"skipped {skipped['model']} {skipped['variant']} batch {skipped['batch']}: {skipped['reason']}")
    for failed in report["failed"]:
        where = " ".join(str(failed[k]) for k in ("model", "variant", "batch", "mode") if k in failed)
        print(f"FAILED {where}: {failed['error'][:300]}")
    return report


if __name__ == "__main__":
    sys.exit(1 if main()["failed"] else 0)
