"""One-shot pruning of a causal LM, ours and llm-compressor's, on the same model and tokens: perplexity.

Ours: ``compress.convert(copy of the model, plan, calibration_data=batches)`` on every linear layer the
default plan targets (``lm_head`` and embeddings stay dense), 32x32 blocks:

* ``blocks-{s}-magnitude`` / ``-activation``: the lowest-scoring blocks by mean |w|, or by mean
  ``|w_ij| * ||x_j||`` (calibration inputs' channel norms),
* ``blocks-{s}-obs``: second-order (OBS) blocks with the kept weights compensated, layer by layer,
* ``blocks-50-obs-w4a16-g32`` / ``-w8a8``: OBS 50%, then GPTQ of the survivors in the same pass,
* ``blocks-50-obs-tiles4`` / ``blocks-50-activation-tiles4``: OBS / activation-weighted 50% in tiles of 4
  block rows x one block column (``BlockSparseConfig(tile_rows=4)``, the large-M tile kernel's pattern).

The peer (``--peer``; llm-compressor, installed for this benchmark only, never a dependency):
``oneshot`` with ``SparseGPTModifier`` at 2:4 and at 50% unstructured and ``WandaPruningModifier`` at
2:4, on the model directory itself (so it also checks that the directory is a plain float checkpoint)
and the same calibration batches, its sequential pipeline on ``model.layers``.

Calibration: the first ``--calibration-batches`` batches of the data module's training loader
(WikiText-2's ``valid.txt`` less its held-back tenth, the recipes' split; the shuffle seeded by
``--seed``); perplexity: the held-back tenth, as ``compress evaluate`` reports it. On a GPU the
models run in fp16 (our inference modules call the Triton kernels), pruning in fp32::

    python -m scripts.bench.block_pruning --model runs/smollm2-wikitext-dense/float --peer --out pruning.json

The JSON is one run; the results page reads the runs appended to ``pruning.runs`` of
``benchmarks/results/smollm2-<gpu>.json``.
"""
from __future__ import annotations

import argparse
import copy
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

import compress
from compress.configs import BlockSparseConfig, W4A16Config, W8A8Config
from compress.eval.evaluate import environment
from compress.lightning.data import load_tokenizer
from scripts.bench.decode import write_report
from scripts.bench.post_training import add_data_arguments, perplexity, set_up

PEERS = ("sparsegpt-2of4", "sparsegpt-50-unstructured", "wanda-2of4")


def our_variants(sparsities: list[float]) -> dict[str, list]:
    """{name: configs} of our one-shot variants (module docstring)."""
    found = {}
    for s in sparsities:
        tag = f"{100 * s:g}"
        obs = BlockSparseConfig(s, algorithm="obs")
        found[f"blocks-{tag}-obs"] = [obs]
        if s == 0.5:
            found[f"blocks-{tag}-obs-w4a16-g32"] = [obs, W4A16Config(group_size=32, algorithm="gptq")]
            found[f"blocks-{tag}-obs-w8a8"] = [obs, W8A8Config(algorithm="gptq")]
            found[f"blocks-{tag}-magnitude"] = [BlockSparseConfig(s)]
            found[f"blocks-{tag}-activation"] = [BlockSparseConfig(s, score="activation")]
            found[f"blocks-{tag}-obs-tiles4"] = [BlockSparseConfig(s, algorithm="obs", tile_rows=4)]
            found[f"blocks-{tag}-activation-tiles4"] = [BlockSparseConfig(s, score="activation", tile_rows=4)]
    return found


def peer_recipe(name: str):
    """The llm-compressor modifier for a peer variant (imported here: a benchmark-only install)."""
    from llmcompressor.modifiers.pruning import SparseGPTModifier, WandaPruningModifier

    targets, ignore = ["Linear"], ["re:.*lm_head"]
    if name == "sparsegpt-2of4":
        return SparseGPTModifier(sparsity=0.5, mask_structure="2:4", targets=targets, ignore=ignore)
    if name == "sparsegpt-50-unstructured":
        return SparseGPTModifier(sparsity=0.5, mask_structure="0:0", targets=targets, ignore=ignore)
    if name == "wanda-2of4":
        return WandaPruningModifier(sparsity=0.5, mask_structure="2:4", targets=targets, ignore=ignore)
    raise ValueError(f"peer variant: expected one of {PEERS}, got {name!r}")


def run_peer(name: str, model_dir: str, tokenizer: str, batches: list[dict], device: torch.device) -> torch.nn.Module:
    """llm-compressor's one-shot pruning of the model directory on our calibration batches."""
    from llmcompressor import oneshot

    loader = torch.utils.data.DataLoader([{k: b[k].cpu() for k in ("input_ids", "attention_mask")}
                                          for b in batches], batch_size=None)
    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).to(device)
    return oneshot(model=model, processor=load_tokenizer(tokenizer), dataset=loader, recipe=peer_recipe(name),
                   num_calibration_samples=len(batches), pipeline="sequential")


def zero_fraction(model: torch.nn.Module) -> float:
    """Share of exact zeros among the decoder layers' linear weights (the pruned ones)."""
    zeros = total = 0
    for name, module in model.named_modules():
        weight = getattr(module, "weight", None)
        if ".layers." in name and isinstance(module, torch.nn.Linear) and weight is not None:
            zeros += int((weight == 0).sum())
            total += weight.numel()
    return zeros / max(total, 1)


def run(args) -> dict:
    device, dtype, data, batches, base, dense = set_up(args)
    print(f"dense perplexity {dense:.3f}", flush=True)
    results = {}
    report = {"environment": environment(device), "model": args.model, "dtype": str(dtype).removeprefix("torch."),
              "calibration_blocks": sum(len(b["input_ids"]) for b in batches), "block_size": args.block_size,
              "seed": args.seed, "eval_blocks": len(data.val_dataloader().dataset), "dense_perplexity": dense,
              "stages": "per block and input group", "variants": results}
    chosen = {name: configs for name, configs in our_variants(args.sparsities).items()
              if not args.only or name in args.only}
    for name, configs in chosen.items():
        start = time.perf_counter()
        model = compress.convert(copy.deepcopy(base).to(device), {"model.layers.*": configs}, calibration_data=batches)
        results[name] = _entry(model, data, device, dtype, dense, time.perf_counter() - start)
        results[name]["configs"] = [c.to_dict() for c in configs]
        _print(name, results[name])
        write_report(args.out, report)  # after each variant, so a run cut short keeps what it measured
    for name in PEERS if args.peer else ():
        start = time.perf_counter()
        model = run_peer(name, args.model, args.tokenizer or args.model, batches, device)
        seconds = time.perf_counter() - start
        results[name] = {"zero_fraction": zero_fraction(model), **_entry(model, data, device, dtype, dense, seconds)}
        _print(name, results[name])
        write_report(args.out, report)
    return report


def _entry(model, data, device, dtype, dense: float, seconds: float) -> dict:
    value = perplexity(model, data, device, dtype)
    return {"perplexity": value, "increase": value / dense - 1.0, "prune_s": seconds}


def _print(name: str, entry: dict) -> None:
    print(f"{name:28s} perplexity {entry['perplexity']:10.3f} ({100 * entry['increase']:+8.1f}%)  "
          f"{entry['prune_s']:6.1f} s", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.bench.block_pruning", description=__doc__.split("\n")[0],
                                     allow_abbrev=False)
    parser.add_argument("--model", default="runs/smollm2-wikitext-dense/float", help="a model directory or name")
    parser.add_argument("--tokenizer", default="SmolLM2-135M-Instruct", help="tokenizer name or path")
    parser.add_argument("--sparsities", type=lambda s: [float(v) for v in s.split(",")],
                        default=[0.25, 0.375, 0.5, 0.625])
    add_data_arguments(parser)
    parser.add_argument("--only", type=lambda s: [v for v in s.split(",") if v], default=None,
                        help="run only these of our variants "
                             "(comma-separated names, e.g. blocks-50-obs,blocks-50-magnitude)")
    parser.add_argument("--peer", action="store_true", help="also run llm-compressor's SparseGPT and Wanda")
    parser.add_argument("--out", type=Path, default=None, help="write the JSON results here")
    args = parser.parse_args(argv)
    run(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
