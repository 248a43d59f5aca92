"""Shared helpers of the checkpoint tests: tiny transformers models, rewriting a saved directory with
every checksum recomputed (a "sealed" edit, as a tool that rewrites the manifest would make), and a
compressed-tensors directory written by the compressed-tensors library itself."""
import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn

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


# ---- compressed-tensors ------------------------------------------------------------------------------
def tiny_llama(seed=0, intermediate_size=256, tie_word_embeddings=False):
    """A random Llama with sizes that are multiples of 128 (every W4A16 group size divides them)."""
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(vocab_size=256, hidden_size=128, intermediate_size=intermediate_size,
                                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                      max_position_embeddings=64, tie_word_embeddings=tie_word_embeddings)
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(config).eval()


def token_ids(seed=1, batch=2, length=16):
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (batch, length), generator=generator)


def logits(model, ids):
    with torch.no_grad():
        return model(ids).logits.float()


def relative_error(got, expected):
    return ((got - expected).norm() / expected.norm()).item()


def library_directory(path, scheme, model, calibration_ids=None, max_shard_size=None):
    """``model`` quantized with ``scheme`` (a compressed-tensors QuantizationScheme for "Linear", lm_head
    ignored) and saved the way llm-compressor does, with the compressed-tensors library's own API:
    apply the config, set the scales (absmax over each weight row or group and, for a static input
    scale, over the inputs of ``calibration_ids``), compress, ``save_pretrained``, write the config."""
    pytest.importorskip("compressed_tensors")
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import QuantizationConfig, apply_quantization_config
    from compressed_tensors.quantization.utils import calculate_qparams

    input_range = {}
    if calibration_ids is not None:
        def observe(name):
            def hook(module, args):
                x = args[0].detach()
                low, high = input_range.get(name, (x.min(), x.max()))
                input_range[name] = (torch.minimum(low, x.min()), torch.maximum(high, x.max()))
            return hook
        handles = [m.register_forward_pre_hook(observe(n))
                   for n, m in model.named_modules() if isinstance(m, nn.Linear)]
        logits(model, calibration_ids)
        for handle in handles:
            handle.remove()
    config = QuantizationConfig(config_groups={"group_0": scheme}, ignore=["lm_head"], quantization_status="frozen")
    apply_quantization_config(model, config)
    for name, module in model.named_modules():
        if not hasattr(module, "quantization_scheme"):
            continue
        weights, weight = module.quantization_scheme.weights, module.weight.detach()
        if weights.strategy == "group":
            weight = weight.unflatten(-1, (-1, weights.group_size))
        scale, _ = calculate_qparams(weight.amin(-1), weight.amax(-1), weights)
        module.weight_scale.data.copy_(scale.reshape(module.weight_scale.shape))
        if hasattr(module, "input_scale"):
            low, high = input_range[name]
            scale, _ = calculate_qparams(low.reshape(1), high.reshape(1), module.quantization_scheme.input_activations)
            module.input_scale.data.copy_(scale)
    compressor = ModelCompressor.from_pretrained_model(model)
    compressor.compress_model(model)
    model.save_pretrained(str(path), **({"max_shard_size": max_shard_size} if max_shard_size else {}))
    compressor.update_config(str(path))
    return path
