"""Training-aware compression in a plain PyTorch loop: a tiny Bert learns the digits while its linear
layers are pruned to 50% of their 32x32 blocks (movement scores, cubic schedule) and then fine-tuned
with W8A8 fake quantization; the export then computes what the trained model computes.

    python -m scripts.examples.plain_loop [--steps 150] [--checkpoint run.pt --save-every 50] [--resume]
                                          [--export-dir out/digits] [--log-every 10]

The loop is ordinary PyTorch; the schedule adds two calls per step (``before_optimizer_step`` for the
movement scores, ``step`` after ``optimizer.step()``) and ``finish`` at the end. ``--checkpoint`` saves
the model, the optimizer and the schedule in one file every ``--save-every`` steps; ``--resume``
continues from it, as the uninterrupted run would have. Offline. Every ``--log-every`` steps it prints
the step, the mean loss of those steps, the phase (dense, pruning, pruned, W8A8 QAT) and the seconds so
far; at the end, the held-out accuracy of the trained model and of its export, and their largest logit
difference.
"""
from __future__ import annotations

import argparse
import time
from collections import Counter
from pathlib import Path

import torch

import compress
from compress import W8A8Config
from scripts.examples.digits import collate, digit_samples, logits_and_accuracy, tiny_bert


def build(steps: int, seed: int = 0):
    """(model, schedule): pruning over the middle of training, W8A8 QAT for its last quarter."""
    model = tiny_bert(seed)
    schedule = compress.CompressionSchedule(
        model,
        pruning=compress.PruningSchedule(sparsity=0.5, start_step=steps // 5, end_step=steps * 3 // 5,
                                         frequency=max(1, steps // 20), score="movement"),
        quantization=compress.QuantizationSchedule(W8A8Config(), start_step=steps * 3 // 4))
    return model, schedule


def batches(samples, batch_size: int, seed: int):
    """Shuffled batches forever, the same order for a seed (a resumed run skips what it has seen)."""
    generator = torch.Generator().manual_seed(seed)
    while True:
        for indices in torch.randperm(len(samples), generator=generator).split(batch_size):
            yield collate([samples[i] for i in indices])


def phase(schedule, step: int) -> str:
    """What the schedule does at ``step``: dense, pruning (masks being raised), pruned, or W8A8 QAT."""
    if schedule.quantization is not None and step >= schedule.quantization.start_step:
        return "W8A8 QAT"
    pruning = schedule.pruning
    if pruning is None or step < pruning.start_step:
        return "dense"
    return "pruning" if step < pruning.end_step else "pruned"


def train(steps: int = 150, batch_size: int = 32, checkpoint: Path | None = None, save_every: int = 0,
          resume: bool = False, seed: int = 0, log_every: int = 10):
    """Train to ``steps`` optimizer steps (resuming from ``checkpoint`` if asked), printing progress every
    ``log_every`` steps (0: never); returns (model, schedule)."""
    model, schedule = build(steps, seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    if resume:
        saved = torch.load(checkpoint, weights_only=True)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        schedule.load_state_dict(saved["schedule"])
    data = batches(digit_samples("train", seed), batch_size, seed)
    for _ in range(schedule.global_step):  # the batches the saved run already took
        next(data)
    model.train()
    started, losses = time.perf_counter(), []
    while schedule.global_step < steps:
        loss = model(**next(data)).loss
        loss.backward()
        schedule.before_optimizer_step(optimizer)  # movement scores read the gradients
        optimizer.step()
        schedule.step()                            # masks back to zero; the next step's pruning / QAT
        optimizer.zero_grad()
        losses.append(loss.item())
        if log_every and schedule.global_step % log_every == 0:
            print(f"step {schedule.global_step}/{steps}: loss {sum(losses) / len(losses):.3f} "
                  f"({phase(schedule, schedule.global_step - 1)}), {time.perf_counter() - started:.0f} s", flush=True)
            losses = []
        if checkpoint is not None and save_every and schedule.global_step % save_every == 0:
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                        "schedule": schedule.state_dict()}, checkpoint)
    schedule.finish()  # final masks, fake quantization on (no GPTQ configured: no calibration data needed)
    return model, schedule


def export_and_compare(model) -> dict:
    """Convert the trained model in place; its held-out accuracy and logits before and after, printed."""
    test = digit_samples("test")
    trained_logits, trained_accuracy = logits_and_accuracy(model, test)
    compress.convert(model)
    exported_logits, exported_accuracy = logits_and_accuracy(model, test)
    result = {"trained_accuracy": trained_accuracy, "exported_accuracy": exported_accuracy,
              "max_logit_difference": (trained_logits - exported_logits).abs().max().item(),
              "exported_layers": exported_layer_counts(model)}
    print(f"accuracy on {len(test)} held-out digits: trained (fake-quantized, pruned) {trained_accuracy:.3f}, "
          f"exported {exported_accuracy:.3f}; largest logit difference {result['max_logit_difference']:.2e}; "
          f"exported layers {result['exported_layers']}")
    return result


def exported_layer_counts(model) -> dict[str, int]:
    """{inference module class name: how many} in a converted model."""
    kinds = (compress.W8A8Linear, compress.W4A16Linear, compress.BSRLinear, compress.BSRW8A8Linear)
    return dict(Counter(type(m).__name__ for m in model.modules() if isinstance(m, kinds)))


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m scripts.examples.plain_loop", description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--checkpoint", type=Path, help="file for model + optimizer + schedule state")
    parser.add_argument("--save-every", type=int, default=0, help="save --checkpoint every N steps (0: never)")
    parser.add_argument("--resume", action="store_true", help="continue from --checkpoint")
    parser.add_argument("--export-dir", type=Path, help="save the compressed model here (compress.save_compressed)")
    parser.add_argument("--log-every", type=int, default=10, help="print progress every N steps (0: never)")
    args = parser.parse_args(argv)
    if args.resume and args.checkpoint is None:
        parser.error("--resume needs --checkpoint")
    if args.log_every < 0:
        parser.error(f"--log-every: expected a number of steps >= 0, got {args.log_every}")
    model, _ = train(args.steps, args.batch_size, args.checkpoint, args.save_every, args.resume,
                     log_every=args.log_every)
    result = export_and_compare(model)
    if args.export_dir is not None:
        print(f"saved to {compress.save_compressed(model, args.export_dir, overwrite=True)}")
    return result


if __name__ == "__main__":
    main()
