"""Damaged or incomplete compressed-model directories are refused with a CheckpointError that names
the path (and, for manifests, the field) instead of loading wrongly or failing with a stray error."""
import pytest
import torch

import compress
from compress import CheckpointError, W8A8Config
from compress.checkpoint import MANIFEST, TENSORS, load_model_dir


def _tiny_bert_classifier():
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(vocab_size=100, hidden_size=64, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=128, max_position_embeddings=32, num_labels=3)
    torch.manual_seed(0)
    return transformers.BertForSequenceClassification(config).eval()


def test_compressed_dir_without_manifest_is_refused_not_loaded_as_plain(tmp_path):
    """Without the check, from_pretrained would rebuild the model with random compressed layers."""
    path = compress.save_compressed(compress.convert(_tiny_bert_classifier(), W8A8Config()), tmp_path / "w8a8")
    (path / MANIFEST).unlink()
    assert (path / "config.json").is_file() and (path / TENSORS).is_file()  # a plain loader would take it
    with pytest.raises(CheckpointError, match=r"w8a8: looks like a compressed-model directory .*w_q.* "
                                              r"but has no manifest\.json") as error:
        load_model_dir(path)
    assert "\n" not in str(error.value)


def test_dir_with_an_interrupted_save_sibling_and_no_manifest_is_refused(tmp_path):
    plain = _tiny_bert_classifier()
    plain.save_pretrained(tmp_path / "model")
    # a sibling a live process (our parent) is still writing: recover leaves it alone, so it stays a trace.
    import os
    (tmp_path / f".model.tmp-{os.getppid()}-abc").mkdir()
    with pytest.raises(CheckpointError, match=r"model: looks like .*interrupted-save siblings \['\.model\.tmp-"):
        load_model_dir(tmp_path / "model")
    (tmp_path / f".model.tmp-{os.getppid()}-abc").rmdir()
    assert type(load_model_dir(tmp_path / "model")).__name__ == "BertForSequenceClassification"
