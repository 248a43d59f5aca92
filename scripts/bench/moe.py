"""MoE benchmark: Mixtral-shaped MoE layers, float (transformers' own experts) against ours, loop and grouped.

    python -m scripts.bench.moe --out benchmarks/results/moe-h200.json
    python -m scripts.bench.moe --models mixtral-layer --tokens 1,8 --variants float,w4a16-grouped   # a subset
    python -m scripts.bench.moe --cpu-check        # tiny shapes on the CPU (the references), for the plumbing test

Models (``transformers`` ``MixtralConfig`` with seeded random weights, built offline on the device, bf16):

* ``mixtral-layer``: one sparse MoE block (router and experts) of Mixtral-7B's shape: hidden 4096,
  intermediate 14336, 8 experts, top-2;
* ``small-model``: the two MoE blocks of a 2-layer Mixtral with hidden 2048, intermediate 7168, 8 experts,
  top-2, applied one after the other (the model's MoE work per forward).

Each is timed at ``--tokens`` tokens (1, 8 and 64: decode; 512: a prefill) on random hidden states (the
router picks the experts, as in the model), in these variants:

* ``float``: ``transformers``' experts as the model runs them (its default ``experts_implementation``, recorded
  in ``config``; ``grouped_mm`` where it can run); ``float-loop``: its eager loop (``"eager"``);
* ``<scheme>-loop``, ``<scheme>-grouped`` (scheme ``w4a16`` in groups of 128, ``w8a8`` dynamic, ``w8a16`` per
  channel): the block converted by ``compress.convert``; ``-loop`` keeps ``QuantizedExperts`` on its loop
  (``set_grouped(False)``: two kernel calls per expert hit and a host synchronisation), ``-grouped`` runs the
  grouped kernels (:mod:`compress_kernels.moe`).

Timing: :func:`compress.eval.timing.rotation_ms` with one input set: the call captured in a CUDA graph and
replayed under ``triton.testing.do_bench`` (median; L2 flushed before each replay), except the loops,
which synchronise with the host and are timed eagerly (``graph`` false). Each record also has
``rel_err_vs_float`` (its output against ``float``'s on the same input) and, for grouped variants,
``rel_err_vs_loop``; float and grouped variants ``experts_ms`` and ``experts_share``: the experts alone on
the same routed inputs (:func:`run_experts`, timed the same way), over the whole call (router and all), the
share of the time the expert kernels take. ``ratios``: float ms / variant ms per model and token count.
``targets``: W4A16 grouped >= 2.5x float at 1-8 tokens and >= 1.0x at 512; W8A8 grouped >= 1.6x at 1-8 and
>= 1.2x at 512.
Output: the JSON report (``--out``, rewritten after each model) and a printed table. ``--cpu-check``: tiny
shapes in fp32 on the CPU, where every module runs its reference; for the plumbing test.
"""
from __future__ import annotations

import argparse
import copy
import gc
import logging
import time
from pathlib import Path

import torch

import compress
from compress import W4A16Config, W8A8Config, W8A16Config
from compress.eval.timing import rotation_ms
from compress.nn.experts import QuantizedExperts
from scripts.bench.decode import environment, int_list, write_report

logger = logging.getLogger(__name__)

MODELS = {  # name -> (hidden, intermediate, experts, top-k, MoE layers)
    "mixtral-layer": (4096, 14336, 8, 2, 1),
    "small-model": (2048, 7168, 8, 2, 2),
}
CPU_MODELS = {"mixtral-layer": (64, 96, 4, 2, 1), "small-model": (32, 64, 4, 2, 2)}
TOKENS, CPU_TOKENS = [1, 8, 64, 512], [1, 3]
SCHEMES = {"w4a16": W4A16Config(128), "w8a8": W8A8Config(), "w8a16": W8A16Config()}
VARIANTS = ("float", "float-loop", "w4a16-loop", "w4a16-grouped", "w8a8-loop", "w8a8-grouped", "w8a16-loop",
            "w8a16-grouped")
DEFAULT_VARIANTS = ("float", "float-loop", "w4a16-loop", "w4a16-grouped", "w8a8-loop", "w8a8-grouped",
                    "w8a16-grouped")
TARGETS = [  # (variant, token counts, least ratio to float)
    ("w4a16-grouped", (1, 8), 2.5), ("w4a16-grouped", (512,), 1.0),
    ("w8a8-grouped", (1, 8), 1.6), ("w8a8-grouped", (512,), 1.2),
]
SEED = 0


def build_model(name: str, cpu: bool, device, dtype):
    """A ``MixtralForCausalLM`` with the model's MoE shape and seeded random weights, on ``device``."""
    import transformers

    hidden, inter, experts, top_k, layers = (CPU_MODELS if cpu else MODELS)[name]
    config = transformers.MixtralConfig(hidden_size=hidden, intermediate_size=inter, num_local_experts=experts,
                                        num_experts_per_tok=top_k, num_hidden_layers=layers, vocab_size=128,
                                        num_attention_heads=max(1, hidden // 128), num_key_value_heads=1,
                                        head_dim=min(128, hidden), max_position_embeddings=1024)
    torch.manual_seed(SEED)
    with torch.device(device):
        model = transformers.MixtralForCausalLM(config)
    return model.to(dtype).eval()


def moe_blocks(model) -> list[torch.nn.Module]:
    return [layer.mlp for layer in model.model.layers]


def variant_blocks(variant: str, model, float_implementation: str) -> list[torch.nn.Module]:
    """The MoE blocks that run ``variant``: the float model's own, set to ``float_implementation`` (``float``) or
    to ``"eager"`` (``float-loop``), or converted copies of them."""
    if variant.startswith("float"):
        model.set_experts_implementation("eager" if variant == "float-loop" else float_implementation)
        return moe_blocks(model)
    scheme, path = variant.split("-")
    blocks = [compress.convert(copy.deepcopy(block), {"*": SCHEMES[scheme]}) for block in moe_blocks(model)]
    for block in blocks:
        experts = block.experts
        assert isinstance(experts, QuantizedExperts), type(experts)
        assert experts.set_grouped(path == "grouped") == (scheme if path == "grouped" else None), experts.extra_repr()
    return blocks



def run_blocks(blocks, x):
    for block in blocks:
        x = block(x)
    return x


def experts_inputs(blocks, x) -> list[tuple]:
    """Per block, the experts' inputs on this forward: (hidden (T, H), top-k ids, top-k weights), each block fed
    the one before's output, routed by its own router (``block.gate``)."""
    inputs = []
    for block in blocks:
        flat = x.reshape(-1, x.shape[-1])
        _, weights, ids = block.gate(flat)
        inputs.append((flat, ids, weights))
        x = block(x)
    return inputs


def run_experts(blocks, inputs):
    """The experts alone on routed inputs (:func:`experts_inputs`): what the grouped kernels run."""
    return [block.experts(*args) for block, args in zip(blocks, inputs)]


def rel_error(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.double() - ref.double()).norm() / ref.double().norm().clamp_min(1e-30))


@torch.no_grad()
def bench_model(name: str, variants, tokens_list, args, device, dtype) -> tuple[list[dict], str]:
    """The records of every variant and token count of model ``name``, and the float experts implementation."""
    model = build_model(name, args.cpu_check, device, dtype)
    float_implementation = model.config._experts_implementation  # what transformers picked for this model
    hidden = model.config.hidden_size
    gen = torch.Generator(device=device).manual_seed(SEED + 1)
    inputs = {t: torch.randn(1, t, hidden, generator=gen, device=device).to(dtype) for t in tokens_list}
    outputs, records = {}, []
    for variant in variants:
        began = time.perf_counter()
        blocks = variant_blocks(variant, model, float_implementation)
        build_s = time.perf_counter() - began
        for tokens in tokens_list:
            x = inputs[tokens]
            y = run_blocks(blocks, x)
            outputs[variant, tokens] = y
            captures = not variant.endswith("loop") and not args.cpu_check and not args.no_graph
            ms, graphed = rotation_ms([lambda: run_blocks(blocks, x)], captures, args.warmup_ms, args.rep_ms,
                                      device=device)
            record = dict(model=name, variant=variant, tokens=tokens, ms=ms, graph=graphed, build_s=round(build_s, 2))
            if not variant.endswith("loop"):  # the experts' share: routing done, the experts alone, timed alike
                routed = experts_inputs(blocks, x)
                experts_ms, _ = rotation_ms([lambda: run_experts(blocks, routed)], captures, args.warmup_ms,
                                            args.rep_ms, device=device)
                record.update(experts_ms=experts_ms, experts_share=experts_ms / ms)
            if ("float", tokens) in outputs:
                record["rel_err_vs_float"] = rel_error(y, outputs["float", tokens])
            loop = (variant.replace("grouped", "loop"), tokens)
            if variant.endswith("grouped") and loop in outputs:
                record["rel_err_vs_loop"] = rel_error(y, outputs[loop])
            records.append(record)
            print(f"{name:<14} {variant:<14} T={tokens:<4} {ms * 1e3:10.1f} us  graph={graphed}", flush=True)
        if not variant.startswith("float"):
            del blocks
            release(device)
    return records, float_implementation


def release(device) -> None:
    gc.collect()
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()


def add_ratios(results) -> dict:
    """``{model: {tokens: {variant: float ms / variant ms}}}`` (> 1: faster than float), also set on each record."""
    base = {(r["model"], r["tokens"]): r["ms"] for r in results if r["variant"] == "float"}
    table: dict = {}
    for r in results:
        if (key := (r["model"], r["tokens"])) in base:
            r["ratio_vs_float"] = base[key] / r["ms"]
            table.setdefault(r["model"], {}).setdefault(str(r["tokens"]), {})[r["variant"]] = round(
                r["ratio_vs_float"], 3)
    return table


def targets(results) -> list[dict]:
    """One verdict per target over every model measured: met when each of its cells reaches the ratio."""
    out = []
    for variant, tokens, least in TARGETS:
        cells = [r for r in results if r["variant"] == variant and r["tokens"] in tokens and "ratio_vs_float" in r]
        worst = min(cells, key=lambda r: r["ratio_vs_float"], default=None)
        out.append({"target": f"{variant} >= {least}x float at {'-'.join(map(str, tokens))} tokens",
                    "cells": len(cells), "worst": None if worst is None else round(worst["ratio_vs_float"], 3),
                    "worst_at": None if worst is None else f"{worst['model']} T={worst['tokens']}",
                    "met": None if not cells else all(r["ratio_vs_float"] >= least for r in cells)})
    return out


def build_parser():
    p = argparse.ArgumentParser(prog="python -m scripts.bench.moe", description=__doc__.split("\n")[0])
    p.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {', '.join(MODELS)}")
    p.add_argument("--variants", default=",".join(DEFAULT_VARIANTS), help=f"comma-separated, of {', '.join(VARIANTS)}")
    p.add_argument("--tokens", type=int_list, default=None, help="token counts, e.g. 1,8,64,512")
    p.add_argument("--out", type=Path, default=None, help="write the JSON report here")
    p.add_argument("--warmup-ms", type=float, default=25.0)
    p.add_argument("--rep-ms", type=float, default=100.0)
    p.add_argument("--no-graph", action="store_true", help="time every variant eagerly")
    p.add_argument("--cpu-check", action="store_true", help="tiny shapes on the CPU (references), fp32")
    return p


def main(argv=None) -> dict:
    args = build_parser().parse_args(argv)
    models = [m for m in args.models.split(",") if m]
    variants = [v for v in args.variants.split(",") if v]
    if not models or any(m not in MODELS for m in models):
        raise SystemExit(f"--models: expected some of {', '.join(MODELS)}, got {args.models!r}")
    if not variants or any(v not in VARIANTS for v in variants):
        raise SystemExit(f"--variants: expected some of {', '.join(VARIANTS)}, got {args.variants!r}")
    if not args.cpu_check and not torch.cuda.is_available():
        raise SystemExit("scripts.bench.moe: no CUDA GPU here; use --cpu-check for the plumbing test")
    variants = sorted(variants, key=lambda v: (v != "float", v.endswith("grouped")))  # float, loops, then grouped
    device = torch.device("cpu" if args.cpu_check else "cuda")
    dtype = torch.float32 if args.cpu_check else torch.bfloat16
    tokens = args.tokens or (CPU_TOKENS if args.cpu_check else TOKENS)
    shapes = CPU_MODELS if args.cpu_check else MODELS
    config = {"models": {m: dict(zip(("hidden", "intermediate", "experts", "top_k", "moe_layers"), shapes[m]))
                         for m in models},
              "tokens": tokens, "dtype": str(dtype).replace("torch.", ""), "variants": variants,
              "schemes": {s: c.to_dict() for s, c in SCHEMES.items()}, "seed": SEED}
    report = {"environment": environment(device), "config": config, "results": [], "ratios": {}, "targets": []}
    started = time.monotonic()
    for model in models:
        records, float_implementation = bench_model(model, variants, tokens, args, device, dtype)
        report["results"] += records
        config["models"][model]["float_experts_implementation"] = float_implementation
        report["ratios"] = add_ratios(report["results"])
        report["targets"] = targets(report["results"])
        report["environment"]["seconds"] = round(time.monotonic() - started, 1)
        write_report(args.out, report)
        release(device)
    for t in report["targets"]:
        verdict = "MET " if t["met"] else "MISS" if t["met"] is False else "  - "
        print(f"{verdict} {t['target']}: worst {t['worst']} at {t['worst_at']}")
    return report


if __name__ == "__main__":
    main()
