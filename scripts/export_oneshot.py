"""Post-training path from the command line: load a model, compress it one-shot, save it.

    python -m scripts.export_oneshot --model all-MiniLM-L6-v2 --num-labels 2 --out runs/oneshot

writes one compressed model directory per scheme (``w8a8``, ``w8a8-block``, ``w4a16``, ``w8a16``,
``sparse50``, ``sparse50-w8a8``) plus ``dense`` (the model as loaded) under ``--out``, ready for
``compress evaluate``. No training and no calibration data: weights are pruned by block magnitude
and quantized as they are (W8A8 with dynamic activation scales), so accuracy is whatever the
loaded weights give; the directories serve speed comparisons and as a starting point.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import compress
from compress import BlockSparseConfig, W4A16Config, W8A8BlockConfig, W8A8Config, W8A16Config
from compress.lightning.tasks import build_model

SCHEMES = {
    "w8a8": [W8A8Config()],
    "w8a8-block": [W8A8BlockConfig()],
    "w4a16": [W4A16Config(group_size=128)],
    "w8a16": [W8A16Config()],
    "sparse50": [BlockSparseConfig(sparsity=0.5)],
    "sparse50-w8a8": [BlockSparseConfig(sparsity=0.5), W8A8Config()],
}


def load(model_name_or_path: str, num_labels: int):
    """The model in float32; the seed makes a newly initialized head the same in every copy."""
    import torch
    from transformers import AutoModelForSequenceClassification

    torch.manual_seed(0)
    return build_model(AutoModelForSequenceClassification, model_name_or_path, None, "float32", num_labels=num_labels)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m scripts.export_oneshot", description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="all-MiniLM-L6-v2", help="local dir, hub id or all-MiniLM-L6-v2")
    parser.add_argument("--num-labels", type=int, default=2)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--schemes", default=",".join(SCHEMES), help=f"comma-separated subset of {sorted(SCHEMES)}")
    args = parser.parse_args(argv)
    names = [s for s in args.schemes.split(",") if s]
    unknown = sorted(set(names) - set(SCHEMES))
    if unknown:
        parser.error(f"--schemes: unknown {unknown}; expected a subset of {sorted(SCHEMES)}")
    compress.save_compressed(load(args.model, args.num_labels).eval(), args.out / "dense", overwrite=True,
                             float_model=True)
    for name in names:
        model = compress.convert(load(args.model, args.num_labels).eval(), SCHEMES[name])
        compress.save_compressed(model, args.out / name, overwrite=True)
        print(f"saved {args.out / name}")


if __name__ == "__main__":
    main()
