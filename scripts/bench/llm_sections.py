"""Sections of the SmolLM2 results page (``docs/results/smollm2.md``), one per results file it reads.

* ``smollm2-<gpu>.json``: the recipes' quality file (rendered by :func:`scripts.bench.pages.quality_section`);
* ``generate-<gpu>.json`` (:mod:`scripts.bench.generate`): one run of the benchmark, or several
  separate runs on that GPU under ``runs`` (e.g. one per model), a section each: the modules' host
  time per call, then tokens/s of ``model.generate`` eager and compiled and of the decode harness,
  the ratios, the targets, and what was skipped or failed;
* ``smollm2-post-training-<gpu>.json`` (:mod:`scripts.bench.post_training`): per variant the
  perplexity after ``compress.convert`` with round-to-nearest or GPTQ, and per scheme the share of
  round-to-nearest's increase over the float model that GPTQ removes,
  ``1 - (ppl_gptq - ppl) / (ppl_rtn - ppl)``; the target (issue: at least 0.5 at g32 and g128) is
  checked where the file has the scheme;
* ``smollm2-h200.json``: under ``sweep``, the fine-tuned block-sparsity sweep (each point's perplexity
  and speed against dense, the targets: :func:`sweep_section`); under ``pruning``, the runs of
  :mod:`scripts.bench.block_pruning` (one per seed and Hessian staging, in ``runs``): per variant the
  perplexity of one-shot pruning in each run, the mean increase over the dense model, and the target
  (issue: 50% OBS blocks, alone and with W4A16 g32, no worse than llm-compressor's SparseGPT 2:4 on the
  same model and tokens).

Each section is a pure function of its JSON, like every page of :mod:`scripts.bench.pages`.
"""
from __future__ import annotations

from scripts.bench.markdown import VERDICT, plot_lines, provenance, ratio, require, table

GPTQ_SHARE_TARGET = 0.5
GPTQ_SHARE_SCHEMES = ("w4a16-g32", "w4a16-g128")


def post_training_section(name: str, data: dict) -> list[str]:
    """Round-to-nearest against GPTQ after ``compress.convert`` of the pretrained model."""
    env = require(data, "environment", name)
    dense = require(data, "dense_perplexity", name)
    variants = require(data, "variants", name)
    shares = require(data, "gptq_share_of_rtn_increase_removed", name)
    lines = ["## Post-training: round-to-nearest against GPTQ", "",
             f"`{require(data, 'model', name)}` as loaded (no fine-tuning), every decoder linear layer converted by "
             f"`compress.convert` ({data.get('dtype')}). Calibration: {require(data, 'calibration_blocks', name)} "
             f"blocks of {require(data, 'block_size', name)} tokens from the training part of WikiText-2's "
             f"`valid.txt`; perplexity on its held-back part ({require(data, 'eval_blocks', name)} blocks). "
             f"GPU: {env.get('gpu', 'none')}; torch {env.get('torch')}, Triton {env.get('triton')}.", "",
             f"Float model: perplexity {dense:.2f}.", ""]
    rows = [[variant, f"{entry['perplexity']:.2f}", f"{100 * entry['increase']:+.1f}%", f"{entry['convert_s']:.1f}"]
            for variant, entry in variants.items()]
    lines += table(["variant", "perplexity", "vs float", "convert s"], rows)
    lines += ["", "Share of round-to-nearest's increase that GPTQ removes (target: at least "
              f"{GPTQ_SHARE_TARGET:g} at g32 and g128):", ""]
    share_rows = []
    for scheme, share in shares.items():
        verdict = VERDICT[share >= GPTQ_SHARE_TARGET] if scheme in GPTQ_SHARE_SCHEMES else "-"
        share_rows.append([scheme, f"{share:.2f}", verdict])
    return lines + table(["scheme", "share removed", "target"], share_rows) + [""]


def _tokens(entry: dict | None, mode: str) -> str:
    figure = (entry or {}).get(mode)
    if figure is None:
        return "-"
    return "failed" if "error" in figure else f"{figure['tokens_per_s']:.1f}"


def _fusion(fuse) -> str:
    """How the run fused sibling layers (``--fuse``; older files hold a bool: all or none)."""
    if fuse == "compressed":
        return ("the compressed variants' q/k/v and gate/up fused into one call each (`compress.fuse_siblings`), "
                "fp16 not")
    if fuse is True or fuse == "all":
        return "q/k/v and gate/up fused into one call each in every variant, fp16 included"
    return "no layers fused"


def _compiled(loop: str) -> str:
    """What the run's compiled mode ran (``--compiled-loop``; older files: transformers' loop)."""
    if loop == "graphed":
        return ("`compress.eval.generate.compile_for_generate` (greedy calls through our loop: static cache, "
                "one compiled decoder layer, one CUDA graph replay for the prompt, padded to a power-of-two "
                "bucket, and one per token)")
    return "`compress.eval.generate.compile_for_generate` (static cache, decode step compiled with CUDA graphs)"


def generate_section(name: str, data: dict) -> list[str]:
    """``model.generate`` eager and compiled against the decode harness (:mod:`scripts.bench.generate`)."""
    env, config = require(data, "environment", name), require(data, "config", name)
    ratios = require(data, "ratios", name)
    lines = [f"## Generate: {', '.join(config['models'])}", "",
             f"Greedy `model.generate` of {config['new_tokens']} tokens after a {config['prompt_len']}-token prompt, "
             f"median of {config['repeats']} calls; eager = transformers' dynamic cache (a variant's ratio: the median "
             f"over {config.get('eager_rounds', config['repeats'])} rounds that time fp16 then the variant, as the "
             "host's speed drifts between runs), compiled = "
             + _compiled(config.get("compiled_loop", "transformers")) + ", "
             "harness = the decode benchmark's own loop on the same model; " + _fusion(config.get("fuse"))
             + (f"; the Llama-2-7B shape with {config['layers']} decoder layers" if "llama2-7b" in config["models"]
                else "") + f". GPU: {env.get('gpu')}; torch {env.get('torch')}, Triton {env.get('triton')}, "
             f"transformers {env.get('transformers')}." + provenance(data), ""]
    host = data.get("host_overhead") or []
    if host:
        variants = list(dict.fromkeys(v for row in host for v in row["modules"]))
        lines += ["Host time per call at M = 1 on SmolLM2's layer shapes (us, the module's forward with no wait "
                  "for the GPU, against `F.linear`):", ""]
        lines += table(["K x N", "F.linear"] + variants,
                       [[f"{row['k']}x{row['n']}", f"{row['linear_us']:.1f}"]
                        + [f"{row['modules'][v]['forward_us']:.1f}" if v in row["modules"] else "-" for v in variants]
                        for row in host])
        lines.append("")
    rows = []
    for entry in require(data, "results", name):
        r = ratios.get(entry["model"], {}).get(str(entry["batch"]), {}).get(entry["variant"], {})
        rows.append([entry["model"], str(entry["batch"]), entry["variant"],
                     _tokens(entry, "eager"), ratio(r.get("eager_vs_fp16")),
                     _tokens(entry, "compiled"), ratio(r.get("compiled_vs_fp16")),
                     _tokens(entry, "harness"), ratio(r.get("harness_vs_fp16")), ratio(r.get("compiled_vs_harness"))])
    lines += table(["model", "batch", "variant", "eager tok/s", "vs fp16", "compiled tok/s", "vs fp16",
                    "harness tok/s", "vs fp16", "compiled / harness"], rows)
    lines += ["", "Targets:", ""] + [f"- {target}: {VERDICT[met]}" for target, met in data.get("targets", {}).items()]
    skipped = data.get("skipped") or []
    if skipped:
        lines += ["", "Not run: " + "; ".join(f"{s['model']} {s['variant']} batch {s['batch']} ({s['reason']})"
                                            for s in skipped) + "."]
    for failure in data.get("failed") or []:
        lines += ["", f"Failed: {failure['model']} {failure['variant']} batch {failure['batch']} {failure['mode']}: "
                      f"{failure['error'].splitlines()[0]}"]
    return lines + [""]


def generate_sections(name: str, data: dict) -> list[str]:
    """:func:`generate_section` of the file's one run, or of each run under ``runs``, in order."""
    if "runs" not in data:
        return generate_section(name, data)
    runs = data["runs"]
    if not isinstance(runs, list) or not runs:
        raise ValueError(f"{name}: expected 'runs' to be a non-empty list of generate benchmark runs, got {runs!r}")
    return [line for index, run in enumerate(runs) for line in generate_section(f"{name} runs[{index}]", run)]


PRUNING_TARGET_VARIANTS = ("blocks-50-obs", "blocks-50-obs-w4a16-g32")
PRUNING_ANCHOR = "sparsegpt-2of4"
CURRENT_STAGES = "per block and input group"  # how the Hessian passes stage layers when they prune, today


def pruning_section(name: str, data: dict) -> list[str]:
    """One-shot pruning of the fine-tuned dense model: ours and llm-compressor's, run by run. Our variants'
    means count only runs at today's Hessian stages (:data:`CURRENT_STAGES`); older runs stay as columns."""
    runs = require(data, "runs", name)
    first = runs[-1]
    env = require(first, "environment", name)
    lines = ["## One-shot pruning: 32x32 blocks against llm-compressor", "",
             f"`{require(first, 'model', name)}` (the dense recipe's model), every decoder linear layer pruned "
             f"one-shot ({first.get('dtype')} evaluation). Calibration: {require(first, 'calibration_blocks', name)} "
             f"blocks of {require(first, 'block_size', name)} tokens from the training part of WikiText-2's "
             f"`valid.txt`, drawn by the seed; perplexity on its held-back part "
             f"({require(first, 'eval_blocks', name)} blocks). Hessian stages: per role (one pass per layer role "
             f"over all blocks) or {CURRENT_STAGES} (what the code does now). "
             f"GPU: {env.get('gpu', 'none')}; torch {env.get('torch')}, Triton {env.get('triton')}.", ""]
    if data.get("note"):
        lines += [data["note"], ""]
    lines += [f"Dense model: perplexity {require(first, 'dense_perplexity', name):.2f}.", ""]
    names = list(dict.fromkeys(v for run in runs for v in require(run, "variants", name)))
    means, rows = {}, []
    for variant in names:
        entries = [run["variants"].get(variant) for run in runs]
        peer = not variant.startswith("blocks-")
        counted = [e for e, run in zip(entries, runs) if e is not None
                   and (peer or run.get("stages", CURRENT_STAGES) == CURRENT_STAGES)]
        mean = "-"
        if counted:
            means[variant] = sum(e["perplexity"] for e in counted) / len(counted)
            change = 100 * (means[variant] / first["dense_perplexity"] - 1)
            mean = f"{means[variant]:.2f} ({change:+.1f}%)"
        rows.append([variant] + [f"{e['perplexity']:.2f} ({e['prune_s']:.0f} s)" if e else "-" for e in entries]
                    + [mean])
    headers = [f"seed {require(run, 'seed', name)}, {run.get('stages', CURRENT_STAGES)}"
               + (f" (`{run['commit']}`)" if run.get("commit") else "") for run in runs]
    lines += table(["variant"] + headers + ["mean today vs dense"], rows)
    notes = [f"- seed {run['seed']}, {run.get('stages', CURRENT_STAGES)}: {run['note']}"
             for run in runs if run.get("note")]
    if notes:
        lines += [""] + notes
    if PRUNING_ANCHOR in means:
        anchor = means[PRUNING_ANCHOR]
        lines += ["", f"Target: one-shot 50% blocks, alone and with W4A16 g32, no worse than {PRUNING_ANCHOR} "
                      f"({anchor:.2f}):", ""]
        lines += table(["variant", "mean perplexity", "target"],
                       [[v, f"{means[v]:.2f}" if v in means else "-",
                         VERDICT[(means[v] <= anchor) if v in means else None]]
                        for v in PRUNING_TARGET_VARIANTS])
    return lines + [""]


SWEEP_TARGETS = {"blocks-25": 0.08, "blocks-50": 0.40, "blocks-50-w8a8": 0.45}  # perplexity increase allowed vs dense


def sweep_section(name: str, data: dict) -> list[str]:
    """The fine-tuned block-sparsity sweep: perplexity and speed of each point against the dense model.

    A point timed in another run than the dense entry carries that run's dense latencies
    (``dense_latency_ms``); its speed-up is against those.
    """
    dense = require(data, "dense", name)
    env = require(data, "environment", name)
    lines = ["## Block sparsity sweep: fine-tuned 32x32 blocks, with and without quantization", "",
             f"{require(data, 'description', name)} GPU: {env.get('gpu')}; torch {env.get('torch')}, Triton "
             f"{env.get('triton')}; code `{data.get('commit')}`.", ""]
    if data.get("note"):
        lines += [data["note"], ""]
    base = dense["latency_ms"]
    rows = [["dense", "-", f"{dense['perplexity']:.2f}", "-", f"{base['1']:.3f}", f"{base['8']:.3f}",
             f"{dense['linear_weight_bytes'] / 2**20:.1f}"]]
    points = {}
    for point in require(data, "points", name):
        points[point["name"]] = point
        speed, own_base = point.get("latency_ms") or {}, point.get("dense_latency_ms", base)
        cells = [f"{speed[b]:.3f} ({own_base[b] / speed[b]:.2f}x)" if b in speed else "not measured"
                 for b in ("1", "8")]
        weights = point.get("linear_weight_bytes")
        rows.append([point["name"], point["recipe"], f"{point['perplexity']:.2f}",
                     f"{100 * (point['perplexity'] / dense['perplexity'] - 1):+.1f}%", *cells,
                     "-" if weights is None else f"{weights / 2**20:.1f}"])
    lines += table(["point", "recipe", "perplexity", "vs dense", "ms @ bs=1 (x dense)", "ms @ bs=8 (x dense)",
                    "linear weights MiB"], rows)
    lines += ["", "Targets (perplexity against dense, mean of two seeds; one seed so far):", ""]
    target_rows = []
    for variant, allowed in SWEEP_TARGETS.items():
        point = points.get(variant)
        increase = None if point is None else point["perplexity"] / dense["perplexity"] - 1
        target_rows.append([variant, f"within +{100 * allowed:.0f}%",
                            "-" if increase is None else f"{100 * increase:+.1f}%",
                            VERDICT[None if increase is None else increase <= allowed]])
    return lines + table(["point", "target", "seed 0", "status"], target_rows) + plot_lines(data) + [""]
