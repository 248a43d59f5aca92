"""The task metrics, one class per head, shared by training and evaluation so both score the same way.

* :class:`ClassificationMetrics`: accuracy and F1 over logits (B, C) and labels (B,) (torchmetrics;
  binary F1 of the positive class for two labels, macro F1 otherwise);
* :class:`PerplexityMetrics`: ``exp(sum of token losses / number of predicted tokens)``, from the
  model's mean token loss weighted by the batch's predicted tokens (labels other than -100 after
  the one-token shift).

The tasks of :mod:`compress.lightning.tasks` log them on the validation split while training;
:mod:`compress.eval.evaluate` computes them on saved models (:func:`metrics_for` picks the class
from the model's head).
"""
from __future__ import annotations

import torch
import torchmetrics
from torch import nn


class ClassificationMetrics(nn.Module):
    """Accuracy and F1 over batches of logits (B, C) and labels (B,)."""

    primary = "accuracy"
    higher_is_better = True

    def __init__(self, num_labels: int):
        super().__init__()
        if num_labels == 2:
            self.accuracy = torchmetrics.classification.BinaryAccuracy()
            self.f1 = torchmetrics.classification.BinaryF1Score()
        else:
            self.accuracy = torchmetrics.classification.MulticlassAccuracy(num_classes=num_labels, average="micro")
            self.f1 = torchmetrics.classification.MulticlassF1Score(num_classes=num_labels, average="macro")
        self.num_labels = num_labels

    def update(self, outputs, batch: dict) -> None:
        logits = outputs.logits.float()
        predictions = logits.argmax(dim=-1)
        self.accuracy.update(predictions, batch["labels"])
        self.f1.update(predictions, batch["labels"])

    def compute(self) -> dict[str, float]:
        return {"accuracy": float(self.accuracy.compute()), "f1": float(self.f1.compute())}

    def reset(self) -> None:
        self.accuracy.reset()
        self.f1.reset()


class PerplexityMetrics(nn.Module):
    """Perplexity from the model's mean token loss, weighted by the number of predicted tokens."""

    primary = "perplexity"
    higher_is_better = False

    def __init__(self):
        super().__init__()
        self.token_loss = torchmetrics.MeanMetric()

    @staticmethod
    def predicted_tokens(batch: dict) -> int:
        """Tokens with a next-token target: the shifted labels that are not -100."""
        return int((batch["labels"][:, 1:] != -100).sum())

    def update(self, outputs, batch: dict) -> None:
        self.token_loss.update(outputs.loss.detach().float(), weight=self.predicted_tokens(batch))

    def compute(self) -> dict[str, float]:
        mean_loss = self.token_loss.compute()
        return {"loss": float(mean_loss), "perplexity": float(torch.exp(mean_loss))}

    def reset(self) -> None:
        self.token_loss.reset()


def metrics_for(model: nn.Module) -> nn.Module:
    """The metrics matching a loaded ``transformers`` model's head."""
    kind = type(model).__name__
    if kind.endswith("ForSequenceClassification"):
        return ClassificationMetrics(int(model.config.num_labels))
    if kind.endswith("ForCausalLM"):
        return PerplexityMetrics()
    raise ValueError(f"no metrics for {kind}: expected a *ForSequenceClassification or *ForCausalLM model")
