"""save_compressed(format="compressed-tensors"): transformers (with the compressed-tensors package) loads our
W8A8 / W4A16 exports and computes what our modules compute; load_compressed reads them back exactly; what the
format cannot hold is refused before anything is written.

Tolerances on the logits (relative Frobenius error, float32 on the CPU), against what was measured on
4 seeds of the tiny Llama:

* W4A16: both sides dequantize the same integers with the same scales and multiply in float32
  (measured 0; 2.3e-7 where our layer pads K = 260 to 264 with zero channels): 1e-5.
* static W8A8: the same integers, activation scale and rounding; we sum int8 products and scale once,
  transformers sums dequantized floats, and where that order moves an activation of a later layer
  across a rounding boundary it lands one int8 step away (measured 2.7e-7 typically, 7.3e-4 at worst): 2e-3.
* dynamic W8A8 (and the mixed model that has it): transformers runs compressed-tensors' fake
  quantization, whose per-token scale is max|x| / 127.5 where ours (and vLLM's int8 kernel) is
  max|x| / 127, so activations round to other integers (measured 1.2% to 1.3%): 3e-2.

The weights themselves are compared exactly: transformers' decompressed weight equals our module's
dequantized weight bit for bit.
"""
import json

import pytest
import torch
from torch import nn

import compress
from compress import BlockSparseConfig, CheckpointError, W4A16Config, W8A8Config
from compress.checkpoint import TENSORS, load_model_dir
from compress.nn.inference import W4A16Linear, W8A8Linear
from tests.compress.checkpoint.helpers import logits, relative_error, tiny_llama, token_ids

transformers = pytest.importorskip("transformers")

MIXED = {"*.mlp.*": W4A16Config(group_size=32), "*.self_attn.*": W8A8Config()}
PLANS = {  # name: (plan, tolerance on the logits against transformers' loaded model, tiny_llama arguments)
    "w8a8-dynamic": (W8A8Config(), 3e-2, {}),
    "w8a8-static": (W8A8Config(activation="static"), 2e-3, {}),
    "w4a16-group64": (W4A16Config(group_size=64), 1e-5, {}),
    "w4a16-per-channel": (W4A16Config(group_size=None), 1e-5, {}),
    "w4a16-per-channel-k260": (W4A16Config(group_size=None), 1e-5, {"intermediate_size": 260}),  # K padded to 264
    "mixed": (MIXED, 3e-2, {}),
}


def _converted(plan, **llama):
    static = any(isinstance(c, W8A8Config) and c.static for c in (plan.values() if isinstance(plan, dict) else [plan]))
    return compress.convert(tiny_llama(**llama), plan, calibration_data=[token_ids(seed=2)] if static else None)


def _layers(model):
    return {name: m for name, m in model.named_modules() if isinstance(m, (W8A8Linear, W4A16Linear))}


@pytest.mark.parametrize("name", PLANS)
def test_transformers_loads_our_export_and_computes_the_same(tmp_path, name):
    pytest.importorskip("compressed_tensors")
    plan, tolerance, llama = PLANS[name]
    ours = _converted(plan, **llama)
    path = compress.save_compressed(ours, tmp_path / "ct", format="compressed-tensors")
    theirs = transformers.AutoModelForCausalLM.from_pretrained(str(path)).eval()
    ids = token_ids()
    error = relative_error(logits(theirs, ids), logits(ours, ids))
    assert error <= tolerance, f"{name}: relative logit error {error:.2e} > {tolerance}"
    for layer, module in _layers(ours).items():  # decompressed by the forward above
        assert torch.equal(theirs.get_submodule(layer).weight, module.dequantized_weight()), layer
    quantization = json.loads((path / "config.json").read_text())["quantization_config"]
    assert quantization["quant_method"] == "compressed-tensors" and quantization["quantization_status"] == "compressed"
    assert quantization["ignore"] == ["lm_head"]
    groups = quantization["config_groups"]
    if name == "mixed":
        assert quantization["format"] == "mixed-precision" and len(groups) == 2
        assert sorted(len(g["targets"]) for g in groups.values()) == [6, 8]  # 2 x (gate, up, down); 2 x q/k/v/o
    else:
        assert [g["targets"] for g in groups.values()] == [["Linear"]]


@pytest.mark.parametrize("name", PLANS)
def test_ours_to_compressed_tensors_to_ours_is_exact(tmp_path, name):
    plan, _, llama = PLANS[name]
    model = _converted(plan, **llama)
    path = compress.save_compressed(model, tmp_path / "ct", format="compressed-tensors")
    loaded = compress.load_compressed(path)
    before, after = model.state_dict(), loaded.state_dict()
    assert list(before) == list(after)
    for key in before:
        assert before[key].dtype == after[key].dtype and torch.equal(before[key], after[key]), key
    assert {n: type(m) for n, m in _layers(loaded).items()} == {n: type(m) for n, m in _layers(model).items()}
    assert {n: m.config for n, m in _layers(loaded).items()} == {n: m.config for n, m in _layers(model).items()}
    ids = token_ids()
    assert torch.equal(logits(loaded, ids), logits(model, ids))
    assert not hasattr(loaded.config, "quantization_config")  # the model runs our modules now
    assert type(load_model_dir(path).get_submodule("model.layers.0.mlp.down_proj")) is type(
        model.get_submodule("model.layers.0.mlp.down_proj"))


def test_a_bfloat16_model_keeps_its_dtypes(tmp_path):
    model = _converted(W4A16Config(group_size=64)).to(torch.bfloat16)
    path = compress.save_compressed(model, tmp_path / "ct", format="compressed-tensors")
    assert json.loads((path / "config.json").read_text())["dtype"] == "bfloat16"
    loaded = compress.load_compressed(path)
    for (name, before), after in zip(model.state_dict().items(), loaded.state_dict().values()):
        assert before.dtype == after.dtype and torch.equal(before, after), name
    layer = loaded.get_submodule("model.layers.0.mlp.up_proj")
    assert layer.scales.dtype == torch.float32 and layer.weight.dtype == torch.bfloat16


def test_tied_embedding_is_stored_once_and_tied_again(tmp_path):
    from safetensors import safe_open

    model = _converted(W8A8Config(), tie_word_embeddings=True)
    path = compress.save_compressed(model, tmp_path / "ct", format="compressed-tensors")
    with safe_open(str(path / TENSORS), "pt") as handle:
        names = set(handle.keys())
    assert "model.embed_tokens.weight" in names and "lm_head.weight" not in names
    loaded = compress.load_compressed(path)
    assert loaded.lm_head.weight is loaded.model.embed_tokens.weight
    assert torch.equal(logits(loaded, token_ids()), logits(model, token_ids()))


def test_the_tokenizer_given_or_beside_the_model_is_written(tmp_path):
    from tokenizers import Tokenizer, models

    vocab = {f"t{i}": i for i in range(256)}
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="t0")), unk_token="t0")
    model = _converted(W4A16Config())
    path = compress.save_compressed(model, tmp_path / "given", format="compressed-tensors", tokenizer=tokenizer)
    assert transformers.AutoTokenizer.from_pretrained(str(path)).get_vocab() == vocab
    tokenizer.save_pretrained(str(tmp_path / "original"))
    model.config._name_or_path = str(tmp_path / "original")
    path = compress.save_compressed(model, tmp_path / "beside", format="compressed-tensors")
    assert (path / "tokenizer.json").read_bytes() == (tmp_path / "original" / "tokenizer.json").read_bytes()


def test_an_export_of_ours_is_replaced_only_with_overwrite_and_verified_on_load(tmp_path):
    model = _converted(W8A8Config())
    path = compress.save_compressed(model, tmp_path / "ct", format="compressed-tensors")
    with pytest.raises(FileExistsError, match="already holds a compressed checkpoint; pass overwrite=True"):
        compress.save_compressed(model, path, format="compressed-tensors")
    compress.save_compressed(model, path, format="compressed-tensors", overwrite=True)
    compress.save_compressed(model, path, overwrite=True)  # our own format may replace it too
    compress.save_compressed(model, path, format="compressed-tensors", overwrite=True)
    data = bytearray((path / TENSORS).read_bytes())
    data[-1] ^= 1
    (path / TENSORS).write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=r"model\.safetensors: checksum mismatch"):
        compress.load_compressed(path)


def _refused(tmp_path, model, pattern, **kwargs):
    target = tmp_path / "refused"
    with pytest.raises((ValueError, TypeError), match=pattern):
        compress.save_compressed(model, target, format=kwargs.pop("format", "compressed-tensors"), **kwargs)
    assert not target.exists() and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("plan", [{"*.mlp.*": BlockSparseConfig(0.5), "*.self_attn.*": W8A8Config()},
                                  [BlockSparseConfig(0.5), W8A8Config()], [BlockSparseConfig(0.5), W4A16Config(32)]],
                         ids=["bsr", "bsr-w8a8", "bsr-w4a16"])
def test_block_sparse_layers_are_refused_naming_them(tmp_path, plan):
    _refused(tmp_path, compress.convert(tiny_llama(), plan),
             r"block-sparse layers model\.layers\.0\.\w+\.\w+_proj, .*no block-sparse layout")


def test_w8a16_layers_are_refused_naming_them(tmp_path):
    _refused(tmp_path, compress.convert(tiny_llama(), compress.W8A16Config()),
             r"layers model\.layers\.0\.self_attn\.q_proj \(W8A16Linear\).*only W8A8Linear and W4A16Linear")


def test_moe_experts_blocks_are_refused_naming_them(tmp_path):
    config = transformers.OlmoeConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=2,
                                      num_key_value_heads=1, vocab_size=128, num_experts=4, num_experts_per_tok=2)
    model = compress.convert(compress.prepare(transformers.OlmoeForCausalLM(config).eval(), W4A16Config(32)))
    _refused(tmp_path, model, r"MoE experts blocks model\.layers\.0\.mlp\.experts \(QuantizedExperts\)")


def test_smoothquant_factors_no_norm_absorbed_are_refused(tmp_path):
    model = compress.convert(tiny_llama(), W8A8Config(activation="static", smoothquant_alpha=0.5),
                             calibration_data=[token_ids(seed=2)])
    _refused(tmp_path, model, r"W8A8 layers model\.layers\.0\..* SmoothQuant factors .*smoothquant_alpha=None")


def test_a_group_size_that_does_not_divide_k_is_refused_naming_the_layer(tmp_path):
    model = compress.convert(tiny_llama(intermediate_size=320), W4A16Config(group_size=128))
    _refused(tmp_path, model, r"W4A16 layers model\.layers\.0\.mlp\.down_proj \(in_features=320, group_size=128\), "
                              r"model\.layers\.1\.mlp\.down_proj .*group size does not divide in_features")


def test_models_transformers_would_build_otherwise_are_refused(tmp_path):
    mlp = compress.convert(nn.Sequential(nn.Linear(64, 64)), W8A8Config())
    _refused(tmp_path, mlp, r"expected a transformers model .*got torch\.nn\.modules\.container\.Sequential")
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_embd=64, n_layer=1, n_head=2, vocab_size=100,
                                                                n_positions=32, bos_token_id=0, eos_token_id=0))
    _refused(tmp_path, compress.convert(gpt2, W8A8Config()),
             r"layer 'transformer\.h\.0\.attn\.c_attn' \(64 -> 192, bias=True\) is a Conv1D in GPT2LMHeadModel")


def test_bad_arguments_are_refused(tmp_path):
    model = _converted(W8A8Config())
    _refused(tmp_path, model, r"format: expected one of \('compress', 'compressed-tensors'\), got 'gguf'",
             format="gguf")
    _refused(tmp_path, model, "tokenizer: only format='compressed-tensors' writes a tokenizer", format="compress",
             tokenizer=object())
    _refused(tmp_path, model, "tokenizer: expected a transformers tokenizer .*got object", tokenizer=object())
