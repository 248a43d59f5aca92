"""The examples' task: scikit-learn's bundled 8x8 handwritten digits, classified by a tiny Bert built
from a ``transformers`` config (offline, no download).

Each image is a sequence of 65 tokens: ``[CLS]`` (id 1), then its 64 pixel values 0..16 as ids 2..18
(0 is padding, unused: every sequence is full). 1,437 training and 360 held-out images (a seeded,
stratified split). The Bert has 2 layers of width 128 and an MLP of 512, so every linear layer it
compresses is 128 x 128, 512 x 128 or 128 x 512: multiples of 32 (blocks) and 128 (W4A16 groups).
"""
from __future__ import annotations

import torch

SEQ_LEN, VOCAB_SIZE, NUM_CLASSES = 65, 19, 10
CLS_ID, FIRST_PIXEL_ID = 1, 2


def digit_samples(split: str, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    """One ``{"input_ids": (65,), "attention_mask": (65,), "labels": ()}`` per image of ``split``
    (``"train"`` or ``"test"``)."""
    if split not in ("train", "test"):
        raise ValueError(f"split: expected 'train' or 'test', got {split!r}")
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    pixels = torch.as_tensor(digits.data, dtype=torch.long)
    ids = torch.cat([torch.full((len(pixels), 1), CLS_ID), pixels + FIRST_PIXEL_ID], dim=1)
    labels = torch.as_tensor(digits.target, dtype=torch.long)
    train, test = train_test_split(range(len(labels)), test_size=0.2, random_state=seed, stratify=digits.target)
    return [{"input_ids": ids[i], "attention_mask": torch.ones(SEQ_LEN, dtype=torch.long), "labels": labels[i]}
            for i in (train if split == "train" else test)]


def collate(samples: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    return {key: torch.stack([sample[key] for sample in samples]) for key in samples[0]}


def tiny_bert(seed: int = 0):
    """A freshly initialised 2-layer ``BertForSequenceClassification`` for the digits."""
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(seed)
    config = BertConfig(vocab_size=VOCAB_SIZE, hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=512, max_position_embeddings=128, type_vocab_size=1, pad_token_id=0,
                        initializer_range=0.1, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                        num_labels=NUM_CLASSES)
    return BertForSequenceClassification(config)


@torch.no_grad()
def logits_and_accuracy(model, samples: list[dict[str, torch.Tensor]], batch_size: int = 120):
    """(logits (N, 10), accuracy) of ``model`` in eval mode over ``samples``."""
    was_training = model.training
    model.eval()
    logits = torch.cat([model(**collate(samples[i:i + batch_size])).logits for i in range(0, len(samples), batch_size)])
    model.train(was_training)
    labels = torch.stack([sample["labels"] for sample in samples])
    return logits, (logits.argmax(dim=-1) == labels).float().mean().item()
