"""scripts.export_oneshot on a tiny Bert saved to disk: every scheme exports and reloads."""
import pytest
import torch

import compress
from scripts import export_oneshot


@pytest.fixture
def tiny_bert_dir(tmp_path):
    from transformers import BertConfig, BertForSequenceClassification

    config = BertConfig(vocab_size=50, hidden_size=128, num_hidden_layers=1, num_attention_heads=4,
                        intermediate_size=256, max_position_embeddings=32, num_labels=2)
    BertForSequenceClassification(config).save_pretrained(tmp_path / "bert")
    return tmp_path / "bert"


def test_every_scheme_exports_and_reloads(tiny_bert_dir, tmp_path):
    out = tmp_path / "out"
    export_oneshot.main(["--model", str(tiny_bert_dir), "--out", str(out)])
    expected = {"w8a8": "W8A8Linear", "w8a8-block": "W8A8BlockLinear", "w4a16": "W4A16Linear",
                "w8a16": "W8A16Linear", "sparse50": "BSRLinear", "sparse50-w8a8": "BSRW8A8Linear"}
    ids = torch.randint(0, 50, (2, 16))
    dense_logits = compress.load_compressed(out / "dense")(input_ids=ids).logits
    for name, module_type in expected.items():
        model = compress.load_compressed(out / name)
        types = {type(m).__name__ for m in model.modules()}
        assert module_type in types, (name, types)
        logits = model(input_ids=ids).logits
        assert logits.shape == dense_logits.shape and torch.isfinite(logits).all()


def test_unknown_scheme_is_refused(tiny_bert_dir, tmp_path):
    with pytest.raises(SystemExit):
        export_oneshot.main(["--model", str(tiny_bert_dir), "--out", str(tmp_path / "o"), "--schemes", "w8a8,int3"])
