"""scripts.bench.generate_runner on the CPU: exact token counts, the fullgraph retry, the harness leaving
the model as it found it, and the tiny SmolLM2 stand-in's shapes."""
from __future__ import annotations

import argparse

import pytest
import torch

from scripts.bench import generate_runner as runner
from scripts.bench.decode_runner import random_prompt

CPU = torch.device("cpu")


def _args(**overrides) -> argparse.Namespace:
    args = dict(tiny=True, device=CPU, seed=0, layers=2, prompt_len=4, new_tokens=3, repeats=1, fuse="none",
                compile_backend="aot_eager", compile_mode=None, fullgraph=False, compiled_loop="graphed")
    return argparse.Namespace(**{**args, **overrides})


def test_tiny_sources_build_each_variant():
    smollm2 = runner.ModelSource("smollm2", _args()).build("w8a8")
    assert smollm2.config.num_key_value_heads == 2 and smollm2.config.tie_word_embeddings
    assert type(smollm2.model.layers[0].mlp.up_proj).__name__ == "W8A8Linear"
    llama = runner.ModelSource("llama2-7b", _args(fuse="all")).build("fp16")
    assert llama.model.layers[0].self_attn.q_proj.__class__.__name__ == "SiblingOutput"
    with pytest.raises(ValueError, match="expected one of"):
        runner.ModelSource("gpt2", _args())


def test_fusing_compressed_siblings_leaves_fp16_as_transformers_builds_it():
    source = runner.ModelSource("llama2-7b", _args(fuse="compressed"))
    fp16, w4a16 = source.build("fp16"), source.build("w4a16")
    assert type(fp16.model.layers[0].self_attn.q_proj) is torch.nn.Linear
    attention, mlp = w4a16.model.layers[0].self_attn, w4a16.model.layers[0].mlp
    assert {type(m).__name__ for m in (attention.q_proj, attention.k_proj, attention.v_proj, mlp.up_proj)} \
        == {"SiblingOutput"}
    assert type(attention.o_proj).__name__ == "W4A16Linear"
    with pytest.raises(ValueError, match="fuse: expected one of"):
        runner.ModelSource("llama2-7b", _args(fuse=True)).build("fp16")


def test_generate_makes_exactly_the_new_tokens_asked_for():
    model = runner.ModelSource("llama2-7b", _args()).build("fp16")
    prompt = random_prompt(model, 2, 4, seed=0)
    figures, out = runner.timed_generates(model, prompt, 5, repeats=2)
    assert out.shape == (2, 9) and len(figures["times_s"]) == 2 and figures["tokens_per_s"] > 0


def test_paired_rounds_time_the_reference_first_and_take_the_median_ratio(monkeypatch):
    source = runner.ModelSource("llama2-7b", _args())
    reference, model = source.reference(), source.build("w8a8")
    assert source.reference() is reference  # built once
    prompt = random_prompt(model, 1, 4, seed=0)
    seconds = iter([2.0, 1.0, 3.0, 1.0, 2.0, 4.0])  # rounds (fp16, w8a8): ratios 2, 3, 0.5
    order = []
    monkeypatch.setattr(runner, "timed_generate", lambda m, p, n: (order.append(m) or next(seconds), None))
    figures, _ = runner.paired_generates(model, reference, prompt, 3, repeats=3)
    assert order == [reference, model] * 3
    assert figures["vs_fp16_paired"] == 2.0 and figures["fp16_times_s"] == [2.0, 3.0, 2.0]
    assert figures["times_s"] == [1.0, 1.0, 4.0] and figures["tokens_per_s"] == pytest.approx(3.0)


def test_a_failed_fullgraph_compile_is_retried_without_it(monkeypatch):
    model = runner.ModelSource("llama2-7b", _args()).build("fp16")
    prompt = random_prompt(model, 1, 4, seed=0)
    calls = []
    real = runner.generate

    def first_compiled_call_fails(model, prompt, new_tokens):
        calls.append(model.generation_config.compile_config.fullgraph)
        if len(calls) == 1:
            raise RuntimeError("graph break")
        return real(model, prompt, new_tokens)

    monkeypatch.setattr(runner, "generate", first_compiled_call_fails)
    figures = runner.bench_compiled(model, prompt, _args(fullgraph=True), None)
    assert calls[:2] == [True, False] and figures["fullgraph"] is False and "graph break" in figures["fullgraph_error"]
    assert model.generation_config.cache_implementation is None  # compile settings undone after timing


def test_the_harness_restores_the_layer_indices():
    model = runner.ModelSource("llama2-7b", _args()).build("fp16")
    figures = runner.bench_harness(model, "fp16", 1, _args())
    assert figures["tokens_per_s"] > 0
    assert [layer.self_attn.layer_idx for layer in model.model.layers] == [0, 1]
