"""End-to-end decode benchmark: tokens/s of a Llama-2-7B-shaped model, dense against every compressed variant.

    python -m scripts.bench.decode --out benchmarks/results/decode-h100.json
    python -m scripts.bench.decode --variants fp16,w8a16,int8-aten,w8a8 --out decode-w8a16.json  # W8A16 alone

A ``LlamaForCausalLM`` with Llama-2-7B shapes (``--layers`` decoder layers, 32 by default) and
seeded random weights decodes greedily: a random prompt of ``--prompt-len`` tokens is prefilled,
then ``--steps`` single-token decode steps are timed at each ``--batch``; tokens/s = batch * steps
/ time, the median of ``--repeats`` runs. The model and the variants (``--variants``; fp16, ours
and PyTorch's tinygemm int4 and int8 weight-only anchors) are in :mod:`scripts.bench.decode_variants`,
the harness (static KV cache, ``torch.compile`` of the decoder layer, one CUDA graph per decode step,
timed by :mod:`compress.eval.timing`) in :mod:`scripts.bench.decode_runner`. Every variant is built from
the same seeded weights, one at a time (freed after), with its sibling linears fused first
(``compress.nn.fusion.fuse_siblings(model, dense=True)``: ``q/k/v`` and ``gate/up``, so a step runs 4
matmuls per layer in every variant and the ratios compare kernels, not layouts). Every variant but
``fp16-eager`` runs in the same compiled and captured harness.

Output: a JSON report (``--out``, rewritten after every variant: the GPU and versions, the config,
each variant's figures per batch, ratios to ``fp16`` and to ``fp16-eager`` in this run, the batch-1
targets met or not, variants skipped for the time budget and variants that failed) and a printed
table. ``--tiny`` decodes a tiny Llama on the CPU (pure-PyTorch reference path of the modules,
``torch.compile`` with the ``aot_eager`` backend, no graph), so the harness is tested where there
is no GPU. Exits 1 when a variant failed.
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import json
import logging
import os
import platform
import sys
import time
from pathlib import Path

import torch

from compress.nn.fusion import fuse_siblings
from scripts.bench.decode_runner import bench_batch
from scripts.bench.decode_variants import ALL_VARIANTS, VARIANTS, build_model, llama_config, weight_bytes

logger = logging.getLogger(__name__)


def bench_variant(name: str, config, args) -> dict:
    """Build the variant from the seeded weights, time every batch size, free everything."""
    variant = VARIANTS[name]
    began = time.perf_counter()
    model = build_model(config, variant.dtype, args.device, args.seed)
    fuse_siblings(model, dense=True)
    if variant.apply is not None:
        variant.apply(model, args.seed)
    build_s = time.perf_counter() - began
    result = dict(variant=name, dtype=str(variant.dtype).replace("torch.", ""), build_s=build_s,
                  compiled=variant.compiled, weight_bytes=weight_bytes(model), batches=[])
    try:
        for batch in args.batch:
            figures = bench_batch(model, variant, batch, args)
            # decoder weights streamed per second: how close a step is to the memory-bandwidth floor
            figures["decoder_weight_tb_per_s"] = result["weight_bytes"] / (figures["ms_per_step"] * 1e-3) / 1e12
            result["batches"].append(figures)
            reset_compiler()
    finally:
        del model
        release_memory(args.device)
    return result


def reset_compiler() -> None:
    """Forget compiled graphs and their counters (each variant and batch compiles afresh)."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()


@contextlib.contextmanager
def strict_recompiles():
    """Fail loudly, not fall back to eager, if the layers ever stop sharing their graph (restored after)."""
    config = torch._dynamo.config
    if not hasattr(config, "fail_on_recompile_limit_hit"):
        yield
        return
    previous = config.fail_on_recompile_limit_hit
    config.fail_on_recompile_limit_hit = True
    try:
        yield
    finally:
        config.fail_on_recompile_limit_hit = previous


def release_memory(device: torch.device) -> None:
    """Drop compiled graphs and free what the last variant left on ``device``."""
    reset_compiler()
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


# ---- report --------------------------------------------------------------------------------------
def environment(device: torch.device) -> dict:
    """Versions, the device and (on CUDA) the GPU's name and SM count."""
    import transformers
    import triton

    info = dict(torch=torch.__version__, triton=triton.__version__, transformers=transformers.__version__,
                python=platform.python_version(), device=str(device))
    if device.type == "cuda":
        info.update(gpu=torch.cuda.get_device_name(device), cuda=torch.version.cuda,
                    sm_count=torch.cuda.get_device_properties(device).multi_processor_count)
    return info


def ratios(results: list[dict]) -> dict:
    """{batch: {variant: {vs_fp16, vs_fp16_eager}}} from tokens/s measured in this run."""
    speed = {(r["variant"], b["batch"]): b["tokens_per_s"] for r in results for b in r["batches"]}
    table: dict = {}
    for (variant, batch), tps in speed.items():
        row = table.setdefault(str(batch), {}).setdefault(variant, {})
        for base in ("fp16", "fp16-eager"):
            if (base, batch) in speed:
                row[f"vs_{base.replace('-', '_')}"] = tps / speed[(base, batch)]
    return table


def targets(ratio_table: dict) -> dict:
    """The issue's batch-1 targets, judged on this run's ratios (None when a figure is missing)."""
    row = ratio_table.get("1", {})

    def vs_fp16(variant):
        return row.get(variant, {}).get("vs_fp16")

    w4, anchor, w8, dds90 = vs_fp16("w4a16"), vs_fp16("int4-aten"), vs_fp16("w8a8"), vs_fp16("dds90")
    w8a16, int8_anchor = vs_fp16("w8a16"), vs_fp16("int8-aten")
    return {
        "w4a16 >= 2.0x fp16 (batch 1)": None if w4 is None else w4 >= 2.0,
        "w4a16 ahead of int4-aten (batch 1)": None if w4 is None or anchor is None else w4 > anchor,
        "w8a8 >= 1.5x fp16 (batch 1)": None if w8 is None else w8 >= 1.5,
        "dds90 >= 3x fp16 (batch 1)": None if dds90 is None else dds90 >= 3.0,
        "w8a16 >= 1.7x fp16 (batch 1)": None if w8a16 is None else w8a16 >= 1.7,
        "w8a16 ahead of int8-aten (batch 1)": None if w8a16 is None or int8_anchor is None else w8a16 > int8_anchor,
    }


def format_table(results: list[dict], ratio_table: dict) -> str:
    """A Markdown table: one row per variant and batch, tokens/s and the ratios."""
    lines = ["| variant | batch | tokens/s | ms/step | vs fp16 | vs fp16 eager | weights GB | graph |",
             "|---|---|---|---|---|---|---|---|"]
    for r in results:
        for b in r["batches"]:
            row = ratio_table.get(str(b["batch"]), {}).get(r["variant"], {})
            rel = " | ".join(f"{row[k]:.2f}x" if k in row else "-" for k in ("vs_fp16", "vs_fp16_eager"))
            lines.append(f"| {r['variant']} | {b['batch']} | {b['tokens_per_s']:.1f} | {b['ms_per_step']:.3f} | "
                         f"{rel} | "
                         f"{r['weight_bytes'] / 1e9:.2f} | {'yes' if b['cuda_graph'] else 'no'} |")
    return "\n".join(lines)


def write_report(path: Path | None, report: dict) -> None:
    """Write ``report`` as JSON to ``path`` (if given) through a temporary file, so a reader never sees half."""
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(report, indent=2) + "\n")
    os.replace(tmp, path)


# ---- command line --------------------------------------------------------------------------------
def int_list(text: str) -> list[int]:
    """``"1,8"`` -> ``[1, 8]``; positive integers only."""
    values = [int(v) for v in text.split(",") if v.strip()]
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected comma-separated positive ints, got {text!r}")
    return values


def variant_list(text: str) -> list[str]:
    """``"fp16,w4a16"`` -> ``["fp16", "w4a16"]``; names from :data:`VARIANTS` only."""
    names = [v.strip() for v in text.split(",") if v.strip()]
    unknown = [n for n in names if n not in VARIANTS]
    if not names or unknown:
        raise argparse.ArgumentTypeError(f"expected variants from {', '.join(ALL_VARIANTS)}, got {text!r}")
    return names


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m scripts.bench.decode", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=None, help="decoder layers (default 32; 2 with --tiny)")
    parser.add_argument("--batch", type=int_list, default=None, help="batch sizes (default 1,8; 1,2 with --tiny)")
    parser.add_argument("--variants", type=variant_list, default=list(ALL_VARIANTS), help=", ".join(ALL_VARIANTS))
    parser.add_argument("--steps", type=int, default=None, help="timed decode steps (default 128; 4 with --tiny)")
    parser.add_argument("--prompt-len", type=int, default=None, help="prompt tokens (default 16; 4 with --tiny)")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per figure (median reported)")
    parser.add_argument("--warmup", type=int, default=3,
                        help="decode steps before timing (and before a CUDA graph capture: at least 3)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tiny", action="store_true", help="tiny Llama for CPU smoke tests")
    parser.add_argument("--device", default=None, help="cuda (default when available) or cpu")
    parser.add_argument("--compile-backend", default=None, help="torch.compile backend (inductor; aot_eager on CPU)")
    parser.add_argument("--compile-mode", default=None, help="torch.compile mode (default: inductor's default)")
    parser.add_argument("--time-budget", type=float, default=float("inf"),
                        help="seconds; variants not started by then are skipped (and listed as skipped)")
    parser.add_argument("--fail-fast", action="store_true", help="stop at the first failing variant")
    parser.add_argument("--out", type=Path, default=None, help="JSON report path")
    args = parser.parse_args(argv)
    return finish_args(parser, args)


def finish_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.Namespace:
    """Fill the defaults that depend on ``--tiny`` and the device; validate."""
    args.device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if args.device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is available")
    args.layers = args.layers or (2 if args.tiny else 32)
    args.batch = args.batch or ([1, 2] if args.tiny else [1, 8])
    args.steps = args.steps or (4 if args.tiny else 128)
    args.prompt_len = args.prompt_len or (4 if args.tiny else 16)
    args.compile_backend = args.compile_backend or ("inductor" if args.device.type == "cuda" else "aot_eager")
    for name in ("layers", "steps", "prompt_len", "repeats"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name.replace('_', '-')}: expected a positive int, got {getattr(args, name)}")
    if args.warmup < 1:
        parser.error(f"--warmup: expected at least 1 (the compile happens there), got {args.warmup}")
    if not args.tiny and args.device.type != "cuda":
        logger.warning("the 7B-shaped model on %s will be very slow; use --tiny for a smoke test", args.device)
    return args


def run(args: argparse.Namespace) -> dict:
    """The whole benchmark; returns (and writes after every variant) the report."""
    config = llama_config(args.layers, args.tiny, args.prompt_len + args.steps + args.warmup + 2)
    report = dict(benchmark="decode", environment=environment(args.device),
                  config=dict(layers=args.layers, tiny=args.tiny, batch=args.batch, steps=args.steps,
                              prompt_len=args.prompt_len, repeats=args.repeats, warmup=args.warmup, seed=args.seed,
                              compile_backend=args.compile_backend, compile_mode=args.compile_mode,
                              fused_siblings=True,
                              model={k: getattr(config, k) for k in ("hidden_size", "intermediate_size",
                                                                   "num_attention_heads", "vocab_size")}),
                  results=[], skipped=[], failed=[])
    reset_compiler()
    started = time.perf_counter()
    with strict_recompiles():
        run_variants(args, config, report, started)
    finish_report(report, args.out, started)
    return report


def run_variants(args: argparse.Namespace, config, report: dict, started: float) -> None:
    """Bench each variant in turn, writing the report after each one."""
    for name in args.variants:
        if time.perf_counter() - started > args.time_budget:
            report["skipped"].append(dict(variant=name, reason=f"time budget of {args.time_budget:.0f} s spent"))
            continue
        logger.info("variant %s ...", name)
        try:
            report["results"].append(bench_variant(name, config, args))
        except Exception as error:  # noqa: BLE001 - one broken variant must not cost the others' figures
            if args.fail_fast:
                raise
            logger.exception("variant %s failed", name)
            report["failed"].append(dict(variant=name, error=f"{type(error).__name__}: {error}"[:2000]))
            release_memory(args.device)
        finish_report(report, args.out, started)


def finish_report(report: dict, out: Path | None, started: float) -> None:
    """Recompute ratios and target verdicts, stamp the elapsed time, write the JSON."""
    report["ratios"] = ratios(report["results"])
    report["targets"] = targets(report["ratios"])
    report["elapsed_s"] = time.perf_counter() - started
    write_report(out, report)


def main(argv=None) -> dict:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    args = parse_args(argv)
    report = run(args)
    print(format_table(report["results"], report["ratios"]))
    for target, ok in report["targets"].items():
        print(f"target {target}: {'n/a' if ok is None else ('met' if ok else 'NOT met')}")
    for skipped in report["skipped"]:
        print(f"skipped {skipped['variant']}: {skipped['reason']}")
    for failed in report["failed"]:
        print(f"FAILED {failed['variant']}: {failed['error'][:300]}")
    return report


if __name__ == "__main__":
    sys.exit(1 if main()["failed"] else 0)
