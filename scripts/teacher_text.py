"""Sample training blocks from a distillation teacher into a file ``LanguageModelingData(teacher_text=...)``
reads (the math and the file: :mod:`compress.lightning.teacher_text`)::

    python -m scripts.teacher_text --model runs/smollm2-wikitext-dense/float \\
        --tokenizer SmolLM2-135M-Instruct --block-size 1024 --blocks 960 \\
        --out runs/smollm2-wikitext-dense/teacher-text.safetensors

The prompts come from the training split of the data module built with the same tokenizer, block size,
validation fraction and data folder as the recipe's, so they never include validation text.
"""
from __future__ import annotations

import argparse
import logging

import torch
from transformers import AutoModelForCausalLM

from compress.lightning.data import LanguageModelingData
from compress.lightning.tasks import build_model
from compress.lightning.teacher_text import check_new_file, generate_teacher_text, save_teacher_text

logger = logging.getLogger("scripts.teacher_text")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.teacher_text", allow_abbrev=False,
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, help="the teacher: a model directory or name")
    parser.add_argument("--tokenizer", required=True, help="the data's tokenizer (as the recipe names it)")
    parser.add_argument("--block-size", type=int, required=True, help="the recipe's block_size")
    parser.add_argument("--validation-fraction", type=float, default=0.1, help="the recipe's validation_fraction")
    parser.add_argument("--data-dir", default=None, help="the recipe's data_dir (default: the local WikiText-2)")
    parser.add_argument("--blocks", type=int, required=True, help="how many blocks to sample")
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", default="float32", help="the teacher's dtype while sampling")
    parser.add_argument("--out", required=True, help="the safetensors file to write")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing file")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    check_new_file(args.out, args.overwrite)  # before minutes of sampling
    data = LanguageModelingData(tokenizer=args.tokenizer, data_dir=args.data_dir, block_size=args.block_size,
                                validation_fraction=args.validation_fraction)
    data.setup("fit")
    train_blocks = torch.tensor(data.train_set["input_ids"])
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = build_model(AutoModelForCausalLM, args.model, None, args.dtype).to(device)
    blocks = generate_teacher_text(model, train_blocks, args.blocks, args.prompt_tokens, args.temperature,
                                   args.batch_size, args.seed)
    info = {"model": args.model, "tokenizer": args.tokenizer, "block_size": args.block_size,
            "validation_fraction": args.validation_fraction, "prompt_tokens": args.prompt_tokens,
            "temperature": args.temperature, "seed": args.seed, "dtype": args.dtype}
    path = save_teacher_text(args.out, blocks, info, overwrite=args.overwrite)
    logger.info("teacher text: %d blocks of %d tokens written to %s", len(blocks), args.block_size, path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
