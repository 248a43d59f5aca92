"""Lightning data modules for the recipes: SST-2, WikiText-2 and scikit-learn's handwritten digits.

Every module yields batches as dicts of tensors that a ``transformers`` model takes as keyword
arguments (``input_ids``, ``attention_mask``, ``labels``, ...), so the tasks in
:mod:`compress.lightning.tasks` call ``model(**batch)``.

* :class:`TextClassificationData`: sentence classification (default SST-2). Local TSV files
  ``train.tsv`` / ``dev.tsv`` with a header ``sentence<TAB>label`` and no quoting, read with
  ``load_dataset("csv", delimiter="\\t", quoting=3)`` from ``$COMPRESS_DATA_DIR/sst2``; without
  that directory, the hub's ``glue/sst2`` (a directory missing a file is refused). The evaluation split
  is the dev set (``validation`` on the hub). Tokenized to at most ``max_length`` tokens, padded per batch.
* :class:`LanguageModelingData`: causal language modelling (default WikiText-2). Local
  ``$COMPRESS_DATA_DIR/wikitext-2/valid.txt`` is split by lines into train / validation (the last
  ``validation_fraction`` of the lines is the validation split, so no article straddles both by
  shuffling); without it, the hub's ``wikitext/wikitext-2-raw-v1``. The text is tokenized, joined
  and cut into blocks of ``block_size`` tokens (the remainder is dropped); ``labels`` = ``input_ids``
  (the model shifts them).
* :class:`DigitsData`: the 1,797 8x8 handwritten digits bundled with scikit-learn (pixel values
  0..16). Each image is a sequence ``[CLS] p_0 ... p_63`` of 65 tokens with token id
  ``pixel + NUM_SPECIAL_TOKENS`` (vocabulary 17 + 2 specials), for a tiny Bert built from a
  config: real data, offline, CPU-sized.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader

from compress.lightning.paths import MINILM_NAME, data_root, resolve_model_source

log = logging.getLogger(__name__)


def _check_positive_int(name: str, value, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name}: expected a positive int{' or None' if allow_none else ''}, got {value!r}")


def _check_fraction(name: str, value: float) -> None:
    if not isinstance(value, (int, float)) or not 0.0 < value < 1.0:
        raise ValueError(f"{name}: expected a fraction in (0, 1), got {value!r}")


def local_data_set(name: str, files: tuple[str, ...]) -> Path | None:
    """``<data root>/<name>`` (:func:`~compress.lightning.paths.data_root`) when that directory exists, else
    None (the caller loads the hub's copy). An existing one must hold ``files``: a half-copied data set is
    refused, never quietly replaced by the hub's."""
    folder = data_root() / name
    if not folder.is_dir():
        return None
    missing = [file for file in files if not (folder / file).is_file()]
    if missing:
        root = "$COMPRESS_DATA_DIR" if os.environ.get("COMPRESS_DATA_DIR") else "the default data root"
        raise FileNotFoundError(f"{folder} (the {name} data set under {root}): expected the files {list(files)}, "
                                f"missing {missing}")
    return folder


def load_tokenizer(name_or_path: str):
    """A fast ``transformers`` tokenizer from a directory, hub id, ``.gguf`` file, ``"all-MiniLM-L6-v2"`` or
    ``"SmolLM2-135M-Instruct"`` (:mod:`compress.lightning.paths`)."""
    from transformers import AutoTokenizer

    source = resolve_model_source(name_or_path)
    return AutoTokenizer.from_pretrained(source.path, **source.from_pretrained_kwargs())


def _subset(dataset, max_samples: int | None, seed: int):
    """A seeded random subset of ``max_samples`` rows (the whole set when None or larger)."""
    if max_samples is None or max_samples >= len(dataset):
        return dataset
    return dataset.shuffle(seed=seed).select(range(max_samples))


class _DictData(pl.LightningDataModule):
    """Shared loader plumbing: ``self.train_set`` / ``self.eval_set`` and a collate function."""

    def __init__(self, batch_size: int, eval_batch_size: int | None, num_workers: int):
        super().__init__()
        _check_positive_int("batch_size", batch_size)
        _check_positive_int("eval_batch_size", eval_batch_size, allow_none=True)
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 0:
            raise ValueError(f"num_workers: expected an int >= 0, got {num_workers!r}")
        self.batch_size = batch_size
        self.eval_batch_size = eval_batch_size or batch_size
        self.num_workers = num_workers
        self.train_set = None
        self.eval_set = None
        self.collate_fn = None

    def _loader(self, dataset, batch_size: int, shuffle: bool) -> DataLoader:
        if dataset is None:
            raise RuntimeError(f"{type(self).__name__}: call setup() before asking for a dataloader")
        return DataLoader(
            dataset,
            batch_size=batch_size,
            shuffle=shuffle,
            num_workers=self.num_workers,
            collate_fn=self.collate_fn,
            persistent_workers=self.num_workers > 0,
        )

    def train_dataloader(self) -> DataLoader:
        return self._loader(self.train_set, self.batch_size, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.eval_set, self.eval_batch_size, shuffle=False)


class TextClassificationData(_DictData):
    """Sentence classification from local TSV files or the hub (default: SST-2).

    ``data_dir`` holds ``train.tsv`` and ``dev.tsv``; when None, ``$COMPRESS_DATA_DIR/sst2`` is used
    if it exists, else the hub data set ``hub_dataset``/``hub_config`` (splits ``train`` and
    ``validation``). ``max_train_samples`` / ``max_eval_samples`` take seeded random subsets.
    """

    def __init__(
        self,
        tokenizer: str = MINILM_NAME,
        data_dir: str | None = None,
        hub_dataset: str = "glue",
        hub_config: str | None = "sst2",
        text_column: str = "sentence",
        label_column: str = "label",
        max_length: int = 64,
        batch_size: int = 32,
        eval_batch_size: int | None = None,
        max_train_samples: int | None = None,
        max_eval_samples: int | None = None,
        num_workers: int = 0,
        seed: int = 42,
    ):
        super().__init__(batch_size, eval_batch_size, num_workers)
        _check_positive_int("max_length", max_length)
        _check_positive_int("max_train_samples", max_train_samples, allow_none=True)
        _check_positive_int("max_eval_samples", max_eval_samples, allow_none=True)
        self.tokenizer_name = tokenizer
        self.data_dir = data_dir
        self.hub_dataset, self.hub_config = hub_dataset, hub_config
        self.text_column, self.label_column = text_column, label_column
        self.max_length = max_length
        self.max_train_samples, self.max_eval_samples = max_train_samples, max_eval_samples
        self.seed = seed

    def local_dir(self) -> Path | None:
        """The directory of local TSV files to read, or None to use the hub."""
        if self.data_dir is not None:
            path = Path(self.data_dir).expanduser()
            if not (path / "train.tsv").is_file() or not (path / "dev.tsv").is_file():
                raise FileNotFoundError(f"data_dir: expected train.tsv and dev.tsv in {path}")
            return path
        return local_data_set("sst2", ("train.tsv", "dev.tsv"))

    def _load_raw(self):
        """A ``DatasetDict`` with ``train`` and ``validation`` splits."""
        from datasets import load_dataset

        local = self.local_dir()
        if local is None:
            log.info("no local SST-2 files; loading %s/%s from the hub", self.hub_dataset, self.hub_config)
            return load_dataset(self.hub_dataset, self.hub_config)
        files = {"train": str(local / "train.tsv"), "validation": str(local / "dev.tsv")}
        return load_dataset("csv", data_files=files, delimiter="\t", quoting=3)

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        from transformers import DataCollatorWithPadding

        raw = self._load_raw()
        for column in (self.text_column, self.label_column):
            if column not in raw["train"].column_names:
                raise ValueError(f"column {column!r} not in the data set; columns: {raw['train'].column_names}")
        tokenizer = load_tokenizer(self.tokenizer_name)
        self.train_set = self._prepare(_subset(raw["train"], self.max_train_samples, self.seed), tokenizer)
        self.eval_set = self._prepare(_subset(raw["validation"], self.max_eval_samples, self.seed), tokenizer)
        self.collate_fn = DataCollatorWithPadding(tokenizer, return_tensors="pt")

    def _prepare(self, split, tokenizer):
        def tokenize(rows):
            encoded = tokenizer(rows[self.text_column], truncation=True, max_length=self.max_length)
            encoded["labels"] = rows[self.label_column]
            return encoded

        return split.map(tokenize, batched=True, remove_columns=split.column_names)


class LanguageModelingData(_DictData):
    """Causal language modelling on fixed-length token blocks (default: WikiText-2).

    Local ``<data_dir>/valid.txt`` (default ``$COMPRESS_DATA_DIR/wikitext-2``) is split by lines: the
    first ``1 - validation_fraction`` of the lines train, the rest validate. Without local text, the
    hub data set ``hub_dataset``/``hub_config`` with its own ``train`` / ``validation`` splits.
    """

    def __init__(
        self,
        tokenizer: str = MINILM_NAME,
        data_dir: str | None = None,
        file_name: str = "valid.txt",
        hub_dataset: str = "wikitext",
        hub_config: str | None = "wikitext-2-raw-v1",
        block_size: int = 128,
        validation_fraction: float = 0.1,
        batch_size: int = 8,
        eval_batch_size: int | None = None,
        max_train_blocks: int | None = None,
        max_eval_blocks: int | None = None,
        num_workers: int = 0,
        seed: int = 42,
    ):
        super().__init__(batch_size, eval_batch_size, num_workers)
        _check_positive_int("block_size", block_size)
        _check_fraction("validation_fraction", validation_fraction)
        _check_positive_int("max_train_blocks", max_train_blocks, allow_none=True)
        _check_positive_int("max_eval_blocks", max_eval_blocks, allow_none=True)
        self.tokenizer_name = tokenizer
        self.data_dir, self.file_name = data_dir, file_name
        self.hub_dataset, self.hub_config = hub_dataset, hub_config
        self.block_size = block_size
        self.validation_fraction = validation_fraction
        self.max_train_blocks, self.max_eval_blocks = max_train_blocks, max_eval_blocks
        self.seed = seed

    def local_file(self) -> Path | None:
        """The local text file to split, or None to use the hub."""
        if self.data_dir is not None:
            path = Path(self.data_dir).expanduser() / self.file_name
            if not path.is_file():
                raise FileNotFoundError(f"data_dir: expected the text file {path}")
            return path
        folder = local_data_set("wikitext-2", (self.file_name,))
        return None if folder is None else folder / self.file_name

    def _load_raw(self):
        """A ``DatasetDict`` with ``train`` and ``validation`` splits of raw ``text`` lines."""
        from datasets import DatasetDict, load_dataset

        local = self.local_file()
        if local is None:
            log.info("no local WikiText file; loading %s/%s from the hub", self.hub_dataset, self.hub_config)
            return load_dataset(self.hub_dataset, self.hub_config)
        lines = load_dataset("text", data_files={"lines": str(local)})["lines"]
        n_train = int(round(len(lines) * (1.0 - self.validation_fraction)))
        return DatasetDict(
            train=lines.select(range(n_train)),
            validation=lines.select(range(n_train, len(lines))),
        )

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        from transformers import default_data_collator

        raw = self._load_raw()
        tokenizer = load_tokenizer(self.tokenizer_name)
        train = self._to_blocks(raw["train"], tokenizer)
        evaluation = self._to_blocks(raw["validation"], tokenizer)
        self.train_set = _subset(train, self.max_train_blocks, self.seed)
        self.eval_set = _subset(evaluation, self.max_eval_blocks, self.seed)
        if len(self.train_set) == 0 or len(self.eval_set) == 0:
            raise ValueError(
                f"block_size={self.block_size} leaves an empty split "
                f"(train {len(self.train_set)} blocks, validation {len(self.eval_set)} blocks)"
            )
        self.collate_fn = default_data_collator

    def _to_blocks(self, split, tokenizer):
        """Tokenize every line, join them and cut into ``block_size`` blocks (remainder dropped)."""
        block = self.block_size

        def tokenize(rows):
            return tokenizer(rows["text"], add_special_tokens=False)

        def group(rows):
            ids = [token for line in rows["input_ids"] for token in line]
            usable = len(ids) // block * block
            blocks = [ids[i : i + block] for i in range(0, usable, block)]
            return {"input_ids": blocks, "attention_mask": [[1] * block for _ in blocks], "labels": blocks}

        tokens = split.map(tokenize, batched=True, remove_columns=split.column_names)
        # one call over the whole split, so blocks cross line boundaries as in the standard recipe
        return tokens.map(group, batched=True, batch_size=None, remove_columns=tokens.column_names)


class DigitsData(_DictData):
    """scikit-learn's 8x8 handwritten digits as 65-token sequences for sequence classification.

    Token ids: 0 = [PAD], 1 = [CLS], ``pixel + 2`` for pixel values 0..16 (vocabulary 19). The split
    into train / validation is stratified and seeded.
    """

    PAD_ID, CLS_ID = 0, 1
    NUM_SPECIAL_TOKENS = 2
    NUM_PIXEL_VALUES = 17
    VOCAB_SIZE = NUM_SPECIAL_TOKENS + NUM_PIXEL_VALUES
    SEQ_LEN = 65
    NUM_CLASSES = 10

    def __init__(
        self,
        batch_size: int = 32,
        eval_batch_size: int | None = None,
        validation_fraction: float = 0.2,
        max_train_samples: int | None = None,
        num_workers: int = 0,
        seed: int = 0,
    ):
        super().__init__(batch_size, eval_batch_size, num_workers)
        _check_fraction("validation_fraction", validation_fraction)
        _check_positive_int("max_train_samples", max_train_samples, allow_none=True)
        self.validation_fraction = validation_fraction
        self.max_train_samples = max_train_samples
        self.seed = seed

    @classmethod
    def encode(cls, pixels: torch.Tensor) -> torch.Tensor:
        """(B, 64) pixel values 0..16 -> (B, 65) token ids ``[CLS] p_0+2 ... p_63+2``."""
        if pixels.dim() != 2 or pixels.shape[1] != cls.SEQ_LEN - 1:
            raise ValueError(f"pixels: expected shape (B, {cls.SEQ_LEN - 1}), got {tuple(pixels.shape)}")
        if pixels.min() < 0 or pixels.max() >= cls.NUM_PIXEL_VALUES:
            raise ValueError(f"pixels: expected values in [0, {cls.NUM_PIXEL_VALUES - 1}]")
        cls_column = torch.full((pixels.shape[0], 1), cls.CLS_ID, dtype=torch.long)
        return torch.cat([cls_column, pixels.long() + cls.NUM_SPECIAL_TOKENS], dim=1)

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        from datasets import Dataset
        from sklearn.datasets import load_digits
        from sklearn.model_selection import train_test_split

        digits = load_digits()
        pixels = torch.as_tensor(digits.data, dtype=torch.long)  # (1797, 64), values 0..16
        tokens = self.encode(pixels)
        labels = torch.as_tensor(digits.target, dtype=torch.long)
        train_idx, eval_idx = train_test_split(
            list(range(len(labels))),
            test_size=self.validation_fraction,
            random_state=self.seed,
            stratify=labels.numpy(),
        )
        if self.max_train_samples is not None:
            train_idx = train_idx[: self.max_train_samples]

        def build(indices):
            index = torch.as_tensor(indices)
            rows = {
                "input_ids": tokens[index],
                "attention_mask": torch.ones(len(index), self.SEQ_LEN, dtype=torch.long),
                "labels": labels[index],
            }
            return Dataset.from_dict({k: v.numpy() for k, v in rows.items()}).with_format("torch")

        self.train_set, self.eval_set = build(train_idx), build(eval_idx)
