"""Data modules on the real local SST-2 / WikiText-2 files (small subsets) and on the digits."""
import pytest
import torch

from compress.lightning.data import DigitsData, LanguageModelingData, TextClassificationData
from compress.lightning.paths import data_root

needs_sst2 = pytest.mark.skipif(not (data_root() / "sst2" / "dev.tsv").is_file(), reason="no local SST-2")
needs_wikitext = pytest.mark.skipif(
    not (data_root() / "wikitext-2" / "valid.txt").is_file(), reason="no local WikiText-2"
)


@needs_sst2
def test_sst2_local_subset_batches():
    data = TextClassificationData(max_train_samples=40, max_eval_samples=24, max_length=16, batch_size=8)
    data.setup("fit")
    assert len(data.train_set) == 40 and len(data.eval_set) == 24
    batch = next(iter(data.train_dataloader()))
    assert batch["input_ids"].shape[0] == 8 and batch["input_ids"].shape[1] <= 16
    assert batch["attention_mask"].shape == batch["input_ids"].shape
    assert set(batch["labels"].tolist()) <= {0, 1}


@needs_sst2
def test_sst2_eval_split_is_the_whole_dev_file():
    data = TextClassificationData(max_train_samples=8, max_length=8)
    data.setup("validate")
    dev_rows = sum(1 for _ in open(data_root() / "sst2" / "dev.tsv")) - 1  # minus the header
    assert len(data.eval_set) == dev_rows


def test_sst2_reads_compress_data_dir(tmp_path, monkeypatch):
    sst2 = tmp_path / "sst2"
    sst2.mkdir()
    rows = ["sentence\tlabel", 'a "quoted" fine film \t1', "dull and 'flat \t0", "great fun \t1"]
    (sst2 / "train.tsv").write_text("\n".join(rows) + "\n")
    (sst2 / "dev.tsv").write_text("\n".join(rows[:3]) + "\n")
    monkeypatch.setenv("COMPRESS_DATA_DIR", str(tmp_path))
    data = TextClassificationData(max_length=16, batch_size=4)
    assert data.local_dir() == sst2
    data.setup()
    assert len(data.train_set) == 3 and len(data.eval_set) == 2  # quotes are text, not CSV quoting
    batch = next(iter(data.val_dataloader()))
    assert batch["labels"].tolist() == [1, 0]


def test_a_half_copied_local_data_set_is_refused_not_replaced_by_the_hub(tmp_path, monkeypatch):
    monkeypatch.setenv("COMPRESS_DATA_DIR", str(tmp_path))
    assert TextClassificationData().local_dir() is None  # no sst2/ there: the hub's copy
    assert LanguageModelingData().local_file() is None
    (tmp_path / "sst2").mkdir()
    (tmp_path / "sst2" / "train.tsv").write_text("sentence\tlabel\n")
    (tmp_path / "wikitext-2").mkdir()
    with pytest.raises(FileNotFoundError, match=r"sst2 \(the sst2 data set under \$COMPRESS_DATA_DIR\): expected the "
                                                r"files \['train.tsv', 'dev.tsv'\], missing \['dev.tsv'\]"):
        TextClassificationData().local_dir()
    with pytest.raises(FileNotFoundError, match=r"wikitext-2 data set .* missing \['valid.txt'\]"):
        LanguageModelingData().local_file()
    (tmp_path / "wikitext-2" / "valid.txt").write_text("a line\n")
    assert LanguageModelingData().local_file() == tmp_path / "wikitext-2" / "valid.txt"


def test_text_classification_rejects_bad_options(tmp_path):
    with pytest.raises(ValueError, match="max_length"):
        TextClassificationData(max_length=0)
    with pytest.raises(ValueError, match="batch_size"):
        TextClassificationData(batch_size=-1)
    with pytest.raises(FileNotFoundError, match="train.tsv"):
        TextClassificationData(data_dir=str(tmp_path)).local_dir()


@needs_wikitext
def test_wikitext_blocks_and_split():
    data = LanguageModelingData(block_size=32, max_train_blocks=16, validation_fraction=0.1, batch_size=4)
    data.setup()
    assert len(data.train_set) == 16 and len(data.eval_set) > 16
    batch = next(iter(data.train_dataloader()))
    assert batch["input_ids"].shape == (4, 32)
    assert torch.equal(batch["labels"], batch["input_ids"])
    assert bool(batch["attention_mask"].all())


def test_wikitext_local_split_by_lines(tmp_path):
    lines = [f"line {i} " + "word " * 20 for i in range(10)]
    (tmp_path / "valid.txt").write_text("\n".join(lines) + "\n")
    data = LanguageModelingData(data_dir=str(tmp_path), block_size=8, validation_fraction=0.2)
    raw = data._load_raw()
    assert len(raw["train"]) == 8 and len(raw["validation"]) == 2
    assert raw["validation"][0]["text"].startswith("line 8")
    with pytest.raises(ValueError, match="validation_fraction"):
        LanguageModelingData(validation_fraction=1.0)


def test_digits_encoding():
    pixels = torch.tensor([[0] * 63 + [16]])
    tokens = DigitsData.encode(pixels)
    assert tokens.shape == (1, DigitsData.SEQ_LEN)
    assert tokens[0, 0] == DigitsData.CLS_ID
    assert tokens[0, 1] == DigitsData.NUM_SPECIAL_TOKENS and tokens[0, -1] == DigitsData.VOCAB_SIZE - 1
    with pytest.raises(ValueError, match="values"):
        DigitsData.encode(torch.full((1, 64), 17))
    with pytest.raises(ValueError, match="shape"):
        DigitsData.encode(torch.zeros(1, 8))


def test_digits_split_is_stratified_and_seeded():
    first, second = DigitsData(batch_size=64, seed=3), DigitsData(batch_size=64, seed=3)
    first.setup()
    second.setup()
    assert len(first.train_set) + len(first.eval_set) == 1797
    assert torch.equal(first.eval_set[:]["labels"], second.eval_set[:]["labels"])
    counts = torch.bincount(first.eval_set[:]["labels"], minlength=10)
    assert int(counts.min()) >= 30  # every digit in the validation split (about 36 each)
    batch = next(iter(first.train_dataloader()))
    assert batch["input_ids"].shape == (64, DigitsData.SEQ_LEN)
    assert int(batch["input_ids"].max()) < DigitsData.VOCAB_SIZE


def test_tokenizer_of_a_gguf_model_is_read_from_the_gguf_file(monkeypatch, tmp_path):
    import transformers

    from compress.lightning import paths
    from compress.lightning.data import load_tokenizer

    gguf = tmp_path / "model.Q4_1.gguf"
    gguf.write_bytes(b"GGUF")
    calls = []
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained",
                        lambda path, **kwargs: calls.append((path, kwargs)) or "tokenizer")
    monkeypatch.setattr(paths.importlib.util, "find_spec", lambda name, *args: object())  # gguf, accelerate
    assert load_tokenizer(str(gguf)) == "tokenizer"
    assert load_tokenizer("some/hub-id") == "tokenizer"
    assert calls == [(str(tmp_path), {"gguf_file": "model.Q4_1.gguf"}), ("some/hub-id", {})]
