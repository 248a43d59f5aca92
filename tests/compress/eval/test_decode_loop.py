"""Tests for compress/eval/decode_loop.py on the CPU: the static-cache loop gives the logits of the model's own
forward pass (the prompt padded to its bucket), leaves nothing of an earlier call's longer prompt
behind, bars end of sequence below ``min_new_tokens``, restores the layer indices it shares, and
refuses models and shapes it cannot serve. (Its CUDA graph: tests/compress/eval/test_generate.py, GPU.)"""
import pytest
import torch

from compress.eval.decode_loop import GreedyDecoder, prefill_length, supports

transformers = pytest.importorskip("transformers")


def tiny_llama(layers: int = 2) -> torch.nn.Module:
    """A seeded random Llama (hidden 64, 4 heads / 2 KV heads, vocabulary 256); test_generate.py's too."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4,
                                      num_key_value_heads=2, num_hidden_layers=layers, vocab_size=256,
                                      max_position_embeddings=64)
    return transformers.LlamaForCausalLM(config).eval()


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
    with pytest.raises(TypeError, match="Llama-style"):
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
