"""Training-aware compression under the ``transformers`` Trainer: the task and schedule of
``scripts.examples.plain_loop`` (a tiny Bert on the digits, 50% block pruning by movement, then W8A8
QAT), driven by :class:`compress.integrations.hf_trainer.CompressionCallback`.

    python -m scripts.examples.hf_trainer --output-dir runs/digits-trainer [--steps 150] [--save-steps 50]
                                          [--resume]

The Trainer writes its checkpoints to ``--output-dir``; each holds ``compression_schedule.pt`` beside
the model's weights, so ``--resume`` (``trainer.train(resume_from_checkpoint=True)``) continues the
pruning schedule where it stopped. About 30 s on 2 CPU cores, offline (needs ``accelerate``, which the
Trainer requires).
"""
from __future__ import annotations

import argparse
from pathlib import Path

from compress.integrations.hf_trainer import CompressionCallback
from scripts.examples.digits import collate, digit_samples
from scripts.examples.plain_loop import build, export_and_compare


def train(output_dir: Path, steps: int = 150, batch_size: int = 32, save_steps: int = 50, resume: bool = False,
          seed: int = 0):
    """Train with the Trainer to ``steps`` steps; returns (model, schedule)."""
    from transformers import Trainer, TrainingArguments

    model, schedule = build(steps, seed)
    args = TrainingArguments(output_dir=str(output_dir), max_steps=steps, per_device_train_batch_size=batch_size,
                             learning_rate=1e-3, weight_decay=0.01, lr_scheduler_type="constant", save_strategy="steps",
                             save_steps=save_steps, logging_steps=max(1, steps // 5), report_to="none", use_cpu=True,
                             seed=seed, disable_tqdm=True)
    trainer = Trainer(model=model, args=args, train_dataset=digit_samples("train", seed), data_collator=collate,
                      callbacks=[CompressionCallback(schedule)])
    trainer.train(resume_from_checkpoint=True if resume else None)  # on_train_end: schedule.finish()
    return model, schedule


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m scripts.examples.hf_trainer", description=__doc__.split("\n")[0])
    parser.add_argument("--output-dir", type=Path, required=True, help="the Trainer's checkpoints")
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--save-steps", type=int, default=50)
    parser.add_argument("--resume", action="store_true", help="continue from the last checkpoint in --output-dir")
    args = parser.parse_args(argv)
    model, _ = train(args.output_dir, args.steps, args.batch_size, args.save_steps, args.resume)
    result = export_and_compare(model)
    return result


if __name__ == "__main__":
    main()
