"""Tests for compress/eval/decode_loop.py on the CPU: the static-cache loop gives the logits of the model's own
forward pass (the prompt padded to its bucket), leaves nothing of an earlier call's longer prompt
behind, bars end of sequence below ``min_new_tokens``, restores the layer indices it shares, builds
each layer's mask (sliding windows, sdpa's bool or eager's float), and refuses, with the reason,
models, settings and shapes it cannot serve. (Its tokens against ``transformers``' over many tiny
models: test_generate.py's sweep; its CUDA graph: test_generate.py, GPU.)"""
import pytest
import torch

import compress
from compress.eval.decode_loop import GreedyDecoder, cache_keyword, prefill_length, supports, unsupported_reason

transformers = pytest.importorskip("transformers")

SMALL = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
             max_position_embeddings=64)


def tiny_model(family: str, attention: str = "sdpa", layers: int = 2, **settings) -> torch.nn.Module:
    """A seeded random ``transformers`` causal LM of ``family`` ("Llama", "Mistral", "Qwen2", "Qwen3",
    "Gemma3"; hidden 64, 4 heads / 2 KV heads, vocabulary 256) with ``settings`` on its config, in eval mode."""
    torch.manual_seed(0)
    config_class = transformers.Gemma3TextConfig if family == "Gemma3" else getattr(transformers, family + "Config")
    config = config_class(**{**SMALL, "num_hidden_layers": layers, **settings})
    config._attn_implementation = attention
    return getattr(transformers, family + "ForCausalLM")(config).eval()


def tiny_moe(family: str, experts: str = "grouped_mm", **settings) -> torch.nn.Module:
    """A tiny Mixtral or Qwen3-MoE (:func:`tiny_model`, 4 experts of 32 hidden units, top-2) whose float experts
    run as ``experts``."""
    count = {"num_local_experts": 4} if family == "Mixtral" else {"num_experts": 4, "head_dim": 16,
                                                                   "moe_intermediate_size": 32}
    model = tiny_model(family, **count, num_experts_per_tok=2, **settings)
    model.set_experts_implementation(experts)
    return model


def compressed_moe(family: str, config, grouped: bool = True) -> torch.nn.Module:
    """:func:`tiny_moe` with every layer (experts included) converted to ``config``; ``grouped=False`` keeps the
    experts on QuantizedExperts' loop."""
    model = compress.convert(tiny_moe(family), {"*": config})
    for module in model.modules():
        if hasattr(module, "set_grouped"):
            module.set_grouped(grouped)
    return model


def tiny_llama(layers: int = 2) -> torch.nn.Module:
    """A seeded random Llama (:func:`tiny_model`); test_generate.py's too."""
    return tiny_model("Llama", layers=layers)


@torch.no_grad()
def test_prefill_and_decode_steps_match_the_full_forward():
    model = tiny_llama()
    decoder = GreedyDecoder(model, batch=2, max_len=12)
    prompt = torch.randint(0, 256, (2, 5), generator=torch.Generator().manual_seed(1))
    decoder.prefill(prompt)
    tokens = [prompt]
    for step in range(3):
        tokens.append(decoder.token.clone())
        assert torch.equal(decoder.generated[:, step], decoder.token[:, 0])
        decoder.step()
        want = model(input_ids=torch.cat(tokens, dim=1), use_cache=False).logits[:, -1]
        assert torch.allclose(decoder.logits, want, atol=1e-4, rtol=1e-4)
    assert int(decoder.position) == 5 + 3 and decoder.graph is None


def test_prompts_run_in_power_of_two_buckets_within_the_cache():
    assert [prefill_length(n, 128) for n in (1, 16, 17, 33, 100, 127)] == [16, 16, 32, 64, 128, 128]
    assert prefill_length(5, 12) == 12 and prefill_length(300, 384) == 384


@torch.no_grad()
def test_a_longer_earlier_prompt_leaves_no_trace():
    model = tiny_llama()
    long_prompt, short_prompt = (torch.randint(0, 256, (1, n), generator=torch.Generator().manual_seed(n))
                                 for n in (27, 3))
    reused = GreedyDecoder(model, 1, 48)
    reused.generate(long_prompt, 10)  # keys at positions 0..36 written, prompt buffer filled to 27
    got = reused.generate(short_prompt, 10)
    want = model.generate(short_prompt, max_new_tokens=10, do_sample=False, min_new_tokens=10)[:, 3:]
    assert torch.equal(got, want) and torch.equal(got, GreedyDecoder(model, 1, 48).generate(short_prompt, 10))


@torch.no_grad()
def test_end_of_sequence_is_barred_below_min_new_tokens():
    model, prompt = tiny_llama(), torch.randint(0, 256, (1, 4), generator=torch.Generator().manual_seed(2))
    free = GreedyDecoder(model, 1, 16).generate(prompt, 6)
    eos = int(free[0, 0])  # the first new token, made end of sequence
    barred = GreedyDecoder(model, 1, 16).generate(prompt, 6, min_new_tokens=3, eos_token_ids=[eos])
    assert int(barred[0, 0]) != eos and torch.equal(GreedyDecoder(model, 1, 16).generate(prompt, 6, 0, [eos]), free)


def test_shared_layer_index_is_restored():
    model = tiny_llama()
    decoder = GreedyDecoder(model, 1, 8)
    with pytest.raises(RuntimeError, match="boom"), decoder.shared_layer_index():
        assert [layer.self_attn.layer_idx for layer in model.model.layers] == [0, 0]
        raise RuntimeError("boom")
    assert [layer.self_attn.layer_idx for layer in model.model.layers] == [0, 1]


def test_bad_models_and_shapes_are_refused():
    model = tiny_llama()
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=64))
    assert supports(model) and not supports(gpt2) and not supports(torch.nn.Linear(2, 2))
    with pytest.raises(TypeError, match="GPT2LMHeadModel is not one of the architectures the loop models"):
        GreedyDecoder(gpt2, 1, 8)
    with pytest.raises(ValueError, match="max_len >= 2"):
        GreedyDecoder(model, 1, 1)
    decoder = GreedyDecoder(model, 2, 8)
    with pytest.raises(ValueError, match=r"prompt: expected shape \(2, 1..7\)"):
        decoder.prefill(torch.zeros(1, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="new_tokens: expected 1..5"):
        decoder.generate(torch.zeros(2, 3, dtype=torch.long), 6)
    with pytest.raises(RuntimeError, match="CUDA graphs need a CUDA model"):
        decoder.capture()


class LlamaWithOwnForward(transformers.LlamaForCausalLM):
    """A subclass: its forward may differ from the Llama forward the loop reproduces."""


def _refusal(model, change=None) -> str | None:
    if change is not None:
        change(model)
    return unsupported_reason(model)


@pytest.mark.parametrize("family", ["Llama", "Mistral", "Qwen2", "Qwen3"])
@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_the_architectures_the_loop_models_are_supported(family, attention):
    assert unsupported_reason(tiny_model(family, attention)) is None


@pytest.mark.parametrize("family", ["Mixtral", "Qwen3Moe"])
@pytest.mark.parametrize("experts", ["grouped_mm", "batched_mm"])
def test_mixture_of_experts_models_with_experts_on_the_device_are_supported(family, experts):
    assert unsupported_reason(tiny_moe(family, experts)) is None
    assert unsupported_reason(compressed_moe(family, compress.W8A8Config())) is None


@pytest.mark.parametrize(("build", "reason"), [
    (lambda: tiny_model("Gemma3", head_dim=16), "Gemma3ForCausalLM is not one of the architectures"),
    (lambda: LlamaWithOwnForward(tiny_llama().config), "LlamaWithOwnForward is not one of the architectures"),
    (lambda: tiny_model("Llama", rope_parameters=dict(rope_type="dynamic", factor=2.0, rope_theta=1e4)),
     "rotary embedding type 'dynamic'"),
    (lambda: tiny_model("Llama", rope_parameters=dict(rope_type="longrope", rope_theta=1e4, short_factor=[1.0] * 8,
                                                      long_factor=[2.0] * 8, original_max_position_embeddings=32)),
     "rotary embedding type 'longrope'"),
    (lambda: tiny_llama().train(), "training mode"),
    (lambda: tiny_moe("Mixtral", experts="eager"), "model.layers.0.mlp.experts runs transformers' experts as 'eager'"),
    (lambda: compressed_moe("Qwen3Moe", compress.W8A8Config(), grouped=False),
     "model.layers.0.mlp.experts runs QuantizedExperts' expert loop"),
    (lambda: tiny_model("Qwen2", layer_types=["full_attention", "chunked_attention"]), "config.layer_types"),
])
def test_what_the_loop_does_not_model_is_refused_with_the_reason(build, reason):
    model = build()
    assert reason in unsupported_reason(model) and not supports(model)
    with pytest.raises(TypeError, match="cannot give transformers' greedy tokens"):
        GreedyDecoder(model, 1, 8)


@pytest.mark.parametrize(("setting", "value", "reason"), [
    ("_attn_implementation", "flash_attention_2", "attention implementation 'flash_attention_2'"),
    ("_attn_implementation", "flex_attention", "attention implementation 'flex_attention'"),
    ("is_causal", False, "config.is_causal"),
    ("num_hidden_layers", 1, "2 decoder layers but config.num_hidden_layers 1"),
])
def test_settings_changed_after_construction_are_refused(setting, value, reason):
    model = tiny_llama()
    setattr(model.config, setting, value)
    assert reason in unsupported_reason(model)


def test_inner_modules_of_another_class_are_refused():
    model = tiny_llama()
    model.model.layers[1].self_attn = transformers.models.mistral.modeling_mistral.MistralAttention(model.config, 1)
    assert "decoder layer 1 is a LlamaDecoderLayer with a MistralAttention" in unsupported_reason(model)
    model = tiny_llama()
    model.model = transformers.MistralModel(transformers.MistralConfig(**SMALL, num_hidden_layers=2))
    assert "model.model is a MistralModel, not the LlamaModel" in unsupported_reason(model)


def test_the_cache_goes_by_the_keyword_the_layer_takes_and_must_be_written():
    model, prompt = tiny_llama(), torch.randint(0, 256, (1, 4))
    assert cache_keyword(model.model.layers[0]) == "cache" and cache_keyword(torch.nn.Linear(2, 2)) is None
    decoder = GreedyDecoder(model, 1, 16)
    decoder.cache_keyword = "past_key_values_gone"  # what a renamed keyword does: the layer runs without the cache
    with pytest.raises(RuntimeError, match=r"decoder layers \[0, 1\] never called the cache's update"):
        decoder.prefill(prompt)


def test_masks_follow_each_layer_window_in_the_implementation_form():
    model = tiny_model("Qwen2", layers=2, use_sliding_window=True, sliding_window=2, max_window_layers=1)
    decoder = GreedyDecoder(model, 1, 6)
    assert decoder.windows == (None, 2)
    full, sliding = decoder.masks(torch.tensor([3, 4]), 1, torch.float32)
    assert full.dtype == torch.bool and full.shape == (1, 1, 2, 6)
    assert full[0, 0].tolist() == [[True] * 4 + [False] * 2, [True] * 5 + [False]]
    assert sliding[0, 0].tolist() == [[False, False, True, True, False, False], [False] * 3 + [True] * 2 + [False]]
    eager = GreedyDecoder(tiny_model("Mistral", "eager", sliding_window=2), 1, 6)
    masks = eager.masks(torch.tensor([3]), 1, torch.float16)
    assert eager.windows == (2, 2) and masks[0].dtype == torch.float16
    assert masks[0][0, 0, 0].tolist() == [-65504.0, -65504.0, 0.0, 0.0, -65504.0, -65504.0]


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_the_compiled_shared_layer_gives_transformers_tokens_with_sliding_windows(attention):
    model = tiny_model("Qwen2", attention, use_sliding_window=True, sliding_window=4, max_window_layers=1)
    prompt = torch.randint(0, 256, (2, 7), generator=torch.Generator().manual_seed(1))
    want = model.generate(prompt, max_new_tokens=12, min_new_tokens=12, do_sample=False, pad_token_id=0)[:, 7:]
    decoder = GreedyDecoder(model, 2, 32)
    decoder.compile_layers("aot_eager")  # fullgraph: the masks and the cache keyword trace into one graph
    with decoder.shared_layer_index():
        got = decoder.generate(prompt, 12)
    torch._dynamo.reset()
    assert torch.equal(got, want)
