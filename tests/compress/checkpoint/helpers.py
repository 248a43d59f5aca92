"""Shared helpers of the checkpoint tests: a tiny transformers model, and rewriting a saved directory
with every checksum recomputed (a "sealed" edit, as a tool that rewrites the manifest would make)."""
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from compress.checkpoint import MANIFEST, TENSORS
from compress.checkpoint.manifest import file_sha256, manifest_digest


def tiny_bert_classifier():
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(vocab_size=100, hidden_size=64, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=128, max_position_embeddings=32, num_labels=3)
    torch.manual_seed(0)
    return transformers.BertForSequenceClassification(config).eval()


def write_sealed(path, manifest):
    """Write ``manifest`` with its files' checksums and its digest (where it has one) recomputed."""
    for name in manifest.get("files", {}):
        manifest["files"][name] = file_sha256(path / name)
    if "digest" in manifest:
        manifest["digest"] = manifest_digest(manifest)
    (path / MANIFEST).write_text(json.dumps(manifest))


def rewrite_tensors(path, edit):
    """Rewrite model.safetensors through ``edit(tensors)`` and reseal the manifest to match."""
    tensors = load_file(str(path / TENSORS))
    edit(tensors)
    save_file(tensors, str(path / TENSORS))
    manifest = json.loads((path / MANIFEST).read_text())
    manifest["tensors"] = {n: {"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape)}
                           for n, t in tensors.items()}
    write_sealed(path, manifest)
