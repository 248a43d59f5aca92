"""The MoE results page's section (``docs/results/moe.md``), from the MoE benchmark's JSON (``moe-<gpu>.json``,
written by :mod:`scripts.bench.moe`).

Input: ``environment`` (gpu, versions), ``config`` (``models``: name -> hidden, intermediate, experts, top_k,
moe_layers, float_experts_implementation; ``dtype``; ``tokens``), ``results`` (one record per model, variant and
token count: ``ms``, ``graph``, ``ratio_vs_float`` = float ms / this ms in the same run, ``rel_err_vs_float``,
``rel_err_vs_loop`` for grouped variants), ``targets`` (one verdict per target) and optionally ``provenance``.

Per model one table: a row per variant, a column per token count, each cell ``us (ratio to float)``; where the
run timed the experts alone (``experts_ms``, ``experts_share``), their time and share of the call; then the
largest relative errors per variant and the targets.
"""
from __future__ import annotations

from scripts.bench.markdown import VERDICT, provenance, ratio, require, table


def model_setup(name: str, shape: dict, dtype: str) -> str:
    layers = shape.get("moe_layers", 1)
    what = "one sparse MoE block" if layers == 1 else f"{layers} sparse MoE blocks applied in turn"
    return (f"`{name}`: {what}, hidden {shape['hidden']}, intermediate {shape['intermediate']}, "
            f"{shape['experts']} experts, top-{shape['top_k']}, {dtype}, seeded random weights; float experts "
            f"run as transformers' `{shape.get('float_experts_implementation')}`.")


def cell(record: dict | None) -> str:
    if record is None:
        return "-"
    us = f"{1e3 * record['ms']:.1f}"
    return us if record["variant"] == "float" else f"{us} ({ratio(record.get('ratio_vs_float'))})"


def error_text(values: list) -> str:
    present = [v for v in values if v is not None]
    return "-" if not present else f"{max(present):.1e}"


def model_rows(results: list[dict], tokens: list[int]) -> tuple[list[list[str]], list[list[str]]]:
    """(speed rows: variant, then a cell per token count; error rows: variant, largest error vs float / loop)."""
    by_key = {(r["variant"], r["tokens"]): r for r in results}
    variants = list(dict.fromkeys(r["variant"] for r in results))
    speed = [[v] + [cell(by_key.get((v, t))) for t in tokens] for v in variants]
    errors = [[v, error_text([r.get("rel_err_vs_float") for r in results if r["variant"] == v]),
               error_text([r.get("rel_err_vs_loop") for r in results if r["variant"] == v])]
              for v in variants if v != "float"]
    return speed, errors


def share_rows(results: list[dict], tokens: list[int]) -> list[list[str]]:
    """A row per variant with ``experts_ms``: us of the experts alone (their share of the call) per token count."""
    by_key = {(r["variant"], r["tokens"]): r for r in results}
    variants = [v for v in dict.fromkeys(r["variant"] for r in results)
                if any("experts_ms" in r for r in results if r["variant"] == v)]

    def share(record: dict | None) -> str:
        if record is None or "experts_ms" not in record:
            return "-"
        return f"{1e3 * record['experts_ms']:.1f} ({100 * record['experts_share']:.0f}%)"

    return [[v] + [share(by_key.get((v, t))) for t in tokens] for v in variants]


def moe_section(name: str, report: dict) -> list[str]:
    env = require(report, "environment", name)
    config = require(report, "config", name)
    results = require(report, "results", name)
    tokens = list(config.get("tokens") or sorted({r["tokens"] for r in results}))
    lines = [f"## {env.get('gpu')}", "",
             f"torch {env.get('torch')}, Triton {env.get('triton')}, transformers {env.get('transformers')}, "
             f"CUDA {env.get('cuda')}.{provenance(report)}", ""]
    for model, shape in require(config, "models", name).items():
        rows = [r for r in results if r["model"] == model]
        if not rows:
            continue
        speed, errors = model_rows(rows, tokens)
        lines += [f"### {model}", "", model_setup(model, shape, config.get("dtype")), "",
                  "Cells: us per call (float time / this time).", ""]
        lines += table(["variant"] + [f"{t} token{'s' if t != 1 else ''}" for t in tokens], speed)
        shares = share_rows(rows, tokens)
        if shares:
            lines += ["", "The experts alone on the same routed inputs: us (share of the whole call).", ""]
            lines += table(["variant"] + [f"{t} token{'s' if t != 1 else ''}" for t in tokens], shares)
        lines += ["", "Largest relative error of the output over the token counts:", ""]
        lines += table(["variant", "vs float", "vs the same scheme's loop"], errors) + [""]
    verdicts = [[t["target"], "-" if t.get("worst") is None else f"{t['worst']:.2f}x ({t.get('worst_at')})",
                 VERDICT[t.get("met")]] for t in require(report, "targets", name)]
    return lines + ["### Targets", ""] + table(["target", "worst cell", "status"], verdicts) + [""]


MOE_INTRO = ("Mixtral-shaped MoE layers, float against ours, in one run per GPU (`python -m scripts.bench.moe`). "
             "`float`: transformers' experts as the model runs them; `float-loop`: its eager loop over experts; "
             "`<scheme>-loop`: `QuantizedExperts` on its loop (two kernel calls per expert hit and a host "
             "synchronisation, timed eagerly); `<scheme>-grouped`: the grouped kernels (`compress_kernels.moe`: "
             "routing on the device, gate/up in one launch with SwiGLU in its epilogue, down in one launch, one "
             "top-k combine), captured in a CUDA graph. `w4a16`: int4 in groups of 128; `w8a8`: int8 weights and "
             "dynamic per-token int8 activations; `w8a16`: int8 per channel. Medians of "
             "`triton.testing.do_bench` with L2 flushed before each replay. In `small-model` the second block's "
             "router sees the first block's output, so quantization error can change which experts a token "
             "takes: its errors against float (and a grouped variant's against its loop) are larger than one "
             "block's.")
