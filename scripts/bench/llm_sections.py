"""Sections of the SmolLM2 results page (``docs/results/smollm2.md``), one per results file it reads.

* ``smollm2-<gpu>.json``: the recipes' quality file (:func:`scripts.bench.pages.quality_section`);
* ``smollm2-post-training-<gpu>.json`` (:mod:`scripts.bench.post_training`): per variant the
  perplexity after ``compress.convert`` with round-to-nearest or GPTQ, and per scheme the share of
  round-to-nearest's increase over the float model that GPTQ removes,
  ``1 - (ppl_gptq - ppl) / (ppl_rtn - ppl)``; the target (issue: at least 0.5 at g32 and g128) is
  checked where the file has the scheme.

Each section is a pure function of its JSON, like every page of :mod:`scripts.bench.pages`.
"""
from __future__ import annotations

from scripts.bench.markdown import require, table

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
        verdict = ("met" if share >= GPTQ_SHARE_TARGET else "**not met**") if scheme in GPTQ_SHARE_SCHEMES else "-"
        share_rows.append([scheme, f"{share:.2f}", verdict])
    return lines + table(["scheme", "share removed", "target"], share_rows) + [""]
