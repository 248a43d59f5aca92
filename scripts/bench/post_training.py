"""Post-training quantization of a pretrained causal LM: perplexity of round-to-nearest against GPTQ.

Each variant is ``compress.convert(copy of the model, config, calibration_data=batches)`` on every
linear layer the default plan targets (``lm_head`` and embeddings stay dense), with
``algorithm="rtn"`` and ``algorithm="gptq"``: W8A8 (dynamic per-token activations), W8A16 (one
scale per output channel) and W4A16 at each ``--group-sizes`` (GPTQ with activation order, its
default, and also without it at the largest). Calibration: the first ``--calibration-batches``
training batches of the data module (for the default WikiText-2, the first 90% of ``valid.txt``;
the loader's shuffle seeded by ``--seed``, so a run is repeatable); perplexity: its validation
blocks (the held-back 10%), the numbers ``compress evaluate`` reports. The model runs in fp16 on a
GPU (the inference modules call our kernels; calibration and GPTQ in fp32) and in fp32 on the CPU
(the references).

The JSON holds, per variant, the perplexity and its increase over the dense model, and per scheme
the share of round-to-nearest's increase that GPTQ removes, ``1 - (ppl_gptq - ppl) / (ppl_rtn - ppl)``
(issue target for SmolLM2: at least 0.5 at g32 and g128)::

    python -m scripts.bench.post_training --model SmolLM2-135M-Instruct \\
        --out benchmarks/results/smollm2-post-training-h100.json
"""
from __future__ import annotations

import argparse
import copy
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

import compress
from compress.configs import W4A16Config, W8A8Config, W8A16Config
from compress.eval.evaluate import cast_for_inference, environment, evaluate_metrics
from compress.lightning.data import LanguageModelingData
from compress.lightning.tasks import build_model
from scripts.bench.decode import write_report


def variants(group_sizes: list[int]) -> dict[str, object]:
    """{name: config} of every compressed variant, round-to-nearest and GPTQ side by side."""
    found = {"w8a8-rtn": W8A8Config(), "w8a8-gptq": W8A8Config(algorithm="gptq"),
             "w8a16-rtn": W8A16Config(), "w8a16-gptq": W8A16Config(algorithm="gptq")}
    for size in group_sizes:
        found[f"w4a16-g{size}-rtn"] = W4A16Config(group_size=size)
        found[f"w4a16-g{size}-gptq"] = W4A16Config(group_size=size, algorithm="gptq")
    largest = max(group_sizes)
    found[f"w4a16-g{largest}-gptq-natural-order"] = W4A16Config(group_size=largest, algorithm="gptq",
                                                                gptq_act_order=False)
    return found


def perplexity(model, data: LanguageModelingData, device: torch.device, dtype: torch.dtype) -> float:
    model = cast_for_inference(model, device, dtype)
    return float(evaluate_metrics(model, data.val_dataloader(), device)["perplexity"])


def calibration_batches(data: LanguageModelingData, count: int, device: torch.device) -> list[dict]:
    """The first ``count`` batches of the data module's (seeded) training loader, on ``device``."""
    batches = []
    for batch in data.train_dataloader():
        if len(batches) == count:
            break
        batches.append({k: v.to(device) for k, v in batch.items()})
    return batches


def gptq_share(results: dict[str, dict], dense: float) -> dict[str, float]:
    """Per scheme with both variants: the share of round-to-nearest's perplexity increase GPTQ removes."""
    shares = {}
    for name, entry in results.items():
        if not name.endswith("-rtn") or name.replace("-rtn", "-gptq") not in results:
            continue
        rtn_increase = entry["perplexity"] - dense
        gptq_increase = results[name.replace("-rtn", "-gptq")]["perplexity"] - dense
        shares[name.removesuffix("-rtn")] = 1.0 - gptq_increase / rtn_increase if rtn_increase > 0 else float("nan")
    return shares


def set_up(args) -> tuple:
    """(device, dtype, data module, calibration batches, the float model, its perplexity) of a run:
    ``args`` names the model, tokenizer, blocks, batches and the seed of the loader's shuffle."""
    torch.manual_seed(args.seed)  # the training loader's shuffle: which blocks calibrate
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.float16 if device.type == "cuda" else torch.float32
    data = LanguageModelingData(tokenizer=args.tokenizer or args.model, block_size=args.block_size,
                                batch_size=args.batch_size, max_eval_blocks=args.max_eval_blocks)
    data.setup("fit")
    batches = calibration_batches(data, args.calibration_batches, device)
    base = build_model(AutoModelForCausalLM, args.model, None, "float32").eval()
    dense = perplexity(copy.deepcopy(base), data, device, dtype)
    return device, dtype, data, batches, base, dense


def run(args) -> dict:
    device, dtype, data, batches, base, dense = set_up(args)
    results = {}
    chosen = {name: config for name, config in variants(args.group_sizes).items()
              if not args.only or name.startswith(tuple(args.only))}
    for name, config in chosen.items():
        start = time.perf_counter()
        model = compress.convert(copy.deepcopy(base).to(device), config, calibration_data=batches)
        convert_s = time.perf_counter() - start
        value = perplexity(model, data, device, dtype)
        results[name] = {"perplexity": value, "increase": value / dense - 1.0, "convert_s": convert_s,
                         "config": config.to_dict()}
        print(f"{name:28s} perplexity {value:8.3f} ({100 * (value / dense - 1):+6.1f}%)  convert {convert_s:5.1f} s",
              flush=True)
    return {"environment": environment(device), "model": args.model, "dtype": str(dtype).removeprefix("torch."),
            "calibration_blocks": sum(len(b["input_ids"]) for b in batches), "block_size": args.block_size,
            "seed": args.seed,
            "eval_blocks": len(data.val_dataloader().dataset), "dense_perplexity": dense, "variants": results,
            "gptq_share_of_rtn_increase_removed": gptq_share(results, dense)}


def add_data_arguments(parser: argparse.ArgumentParser) -> None:
    """The options :func:`set_up` reads besides the model and tokenizer: calibration and evaluation data."""
    parser.add_argument("--calibration-batches", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--block-size", type=int, default=1024)
    parser.add_argument("--max-eval-blocks", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0, help="seeds the shuffle that picks the calibration blocks")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.bench.post_training", description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="SmolLM2-135M-Instruct", help="a model name, directory or .gguf file")
    parser.add_argument("--tokenizer", default=None, help="tokenizer name or path (default: the model's)")
    parser.add_argument("--group-sizes", type=lambda s: [int(v) for v in s.split(",")], default=[32, 64, 128])
    add_data_arguments(parser)
    parser.add_argument("--only", type=lambda s: [v for v in s.split(",") if v], default=None,
                        help="run only the variants whose names start with one of these (e.g. w8a16,w8a8-gptq)")
    parser.add_argument("--out", type=Path, default=None, help="write the JSON results here")
    args = parser.parse_args(argv)
    result = run(args)
    print(f"dense perplexity {result['dense_perplexity']:.3f}; GPTQ share of RTN's increase removed: "
          + ", ".join(f"{k} {v:.2f}" for k, v in result["gptq_share_of_rtn_increase_removed"].items()))
    write_report(args.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
