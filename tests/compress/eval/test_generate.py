"""Tests for compress/eval/generate.py: ``generate`` with the static cache and the compiled decode step gives
the tokens of the default eager ``generate``, for a dense and a compressed tiny Llama; the graphed loop
gives ``transformers``' greedy output (end of sequence, ``min_new_tokens``, padding after the end) and
hands every other call to ``transformers``.

On the CPU the step compiles with the ``aot_eager`` backend (no CUDA graphs; the graphed loop runs its
steps eagerly). The compressed model takes its kernel branch under the Triton interpreter, so the
compiled step runs the custom ops themselves. The GPU test captures the loop in a CUDA graph.
"""
import pytest
import torch

import compress
from compress.eval.generate import compile_for_generate, compiled_step_refusal, uncompile_for_generate
from compress.nn.inference import INFERENCE_MODULES
from compress.eval.decode_loop import GreedyDecoder, supports, unsupported_reason
from tests.compress.eval.test_decode_loop import compressed_moe, tiny_llama, tiny_model, tiny_moe

transformers = pytest.importorskip("transformers")
GREEDY = dict(do_sample=False, pad_token_id=0)


def test_compiled_generate_gives_the_eager_tokens_and_compiles_one_graph():
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()  # a process-wide tally: earlier tests in this worker compiled too
    model = tiny_llama()
    prompt = torch.randint(0, 256, (2, 5))
    eager = model.generate(prompt, max_new_tokens=8, min_new_tokens=8, **GREEDY)
    assert compile_for_generate(model, backend="aot_eager", loop="transformers") is model
    assert model.generation_config.cache_implementation == "static" and "generate" not in model.__dict__
    compiled = model.generate(prompt, max_new_tokens=8, min_new_tokens=8, **GREEDY)
    again = model.generate(prompt, max_new_tokens=6, min_new_tokens=6, **GREEDY)  # the cache keeps its length
    assert eager.shape == (2, 13) and torch.equal(compiled, eager) and torch.equal(again, eager[:, :11])
    assert hasattr(model, "_compiled_call") and counters["stats"]["unique_graphs"] == 1
    uncompile_for_generate(model)
    assert model.generation_config.cache_implementation is None and not hasattr(model, "_compiled_call")
    assert torch.equal(model.generate(prompt, max_new_tokens=8, min_new_tokens=8, **GREEDY), eager)


@pytest.mark.slow
def test_compiled_generate_runs_the_kernels_custom_ops(monkeypatch):
    import compress_kernels

    if not compress_kernels.TRITON_AVAILABLE or not compress_kernels.interpreting():
        pytest.skip("needs the project's Triton kernels and TRITON_INTERPRET=1 (set by conftest without a GPU)")
    for cls in INFERENCE_MODULES.values():  # the kernel branch on CPU fp16 inputs
        monkeypatch.setattr(cls, "_use_kernel", lambda self, x: x.dtype == torch.float16)
    torch._dynamo.reset()
    model = compress.convert(tiny_llama(layers=1), compress.W8A8Config()).half()
    prompt = torch.randint(0, 256, (1, 4))
    eager = model.generate(prompt, max_new_tokens=3, min_new_tokens=3, **GREEDY)
    compile_for_generate(model, backend="aot_eager", loop="transformers")
    assert torch.equal(model.generate(prompt, max_new_tokens=3, min_new_tokens=3, **GREEDY), eager)
    torch._dynamo.reset()


def test_a_model_without_a_generation_config_is_refused():
    with pytest.raises(TypeError, match="generation_config"):
        compile_for_generate(torch.nn.Linear(2, 2))


def _eager_and_graphed(model, prompt, **kwargs):
    uncompile_for_generate(model)
    eager = model.generate(prompt, **kwargs)
    compile_for_generate(model, backend="aot_eager")
    return eager, model.generate(prompt, **kwargs)


def test_the_graphed_loop_gives_transformers_greedy_output():
    model, prompt = tiny_llama(), torch.randint(0, 256, (2, 5), generator=torch.Generator().manual_seed(1))
    eager, graphed = _eager_and_graphed(model, prompt, max_new_tokens=12, **GREEDY)
    assert graphed.shape == (2, 17) and torch.equal(graphed, eager)
    assert set(model._graphed_decoders) == {"state", (2, 128)}  # the loop ran (not transformers)
    eos = int(eager[0, 5 + 3])  # sequence 0's fourth new token ends it: padding after, the other runs on
    eager, graphed = _eager_and_graphed(model, prompt, max_new_tokens=12, eos_token_id=eos, **GREEDY)
    assert torch.equal(graphed, eager) and graphed.shape == (2, 17) and (graphed[0, 9:] == 0).all()
    eager, graphed = _eager_and_graphed(model, prompt, max_new_tokens=12, eos_token_id=[7, eos], min_new_tokens=6,
                                        **GREEDY)
    assert torch.equal(graphed, eager)
    both = torch.stack([prompt[0], prompt[0]])  # every sequence ends at the same token: the output is cut there
    eager, graphed = _eager_and_graphed(model, both, max_new_tokens=12, eos_token_id=eos, **GREEDY)
    assert graphed.shape == eager.shape == (2, 9) and torch.equal(graphed, eager)


def test_other_calls_go_to_transformers_generate(monkeypatch):
    model, prompt = tiny_llama(), torch.randint(0, 256, (2, 5))
    compile_for_generate(model, backend="aot_eager")
    calls = []
    monkeypatch.setattr(type(model), "generate", lambda self, *a, **k: calls.append(k) or "transformers")
    compile_for_generate(model, backend="aot_eager")  # binds the patched transformers generate
    padded = torch.ones_like(prompt)
    padded[0, 0] = 0
    others = [dict(do_sample=True), dict(num_beams=2, do_sample=False), dict(repetition_penalty=1.3, do_sample=False),
              dict(attention_mask=padded, do_sample=False), dict(do_sample=False, output_scores=True,
                                                                 return_dict_in_generate=True)]
    for kwargs in others:
        assert model.generate(prompt, max_new_tokens=4, **kwargs) == "transformers", kwargs
    assert len(calls) == len(others) and model._graphed_decoders == {}


def test_a_call_that_is_not_greedy_runs_transformers_generate_itself():
    model, prompt = tiny_llama(layers=1), torch.randint(0, 256, (1, 4))
    compile_for_generate(model, backend="aot_eager")
    out = model.generate(input_ids=prompt, max_new_tokens=3, output_scores=True, return_dict_in_generate=True,
                         **GREEDY)
    assert out.sequences.shape == (1, 7) and len(out.scores) == 3 and model._graphed_decoders == {}
    graphed = model.generate(inputs=prompt, max_new_tokens=3, **GREEDY)  # the keyword forms of the prompt
    assert torch.equal(graphed, out.sequences) and set(model._graphed_decoders) == {"state", (1, 128)}


def test_decoders_are_rebuilt_when_the_weights_are_replaced():
    model, prompt = tiny_llama(), torch.randint(0, 256, (1, 4))
    compile_for_generate(model, backend="aot_eager")
    first = model.generate(prompt, max_new_tokens=5, **GREEDY)
    decoder = model._graphed_decoders[(1, 128)]
    model.to(torch.float64)
    second = model.generate(prompt, max_new_tokens=5, **GREEDY)
    assert model._graphed_decoders[(1, 128)] is not decoder and torch.equal(first, second)


def test_models_the_loop_does_not_model_keep_transformers_path_and_say_why(caplog):
    config = transformers.GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=64, n_positions=32)
    model = transformers.GPT2LMHeadModel(config).eval()
    prompt = torch.randint(0, 64, (1, 4))
    eager = model.generate(prompt, max_new_tokens=3, **GREEDY)
    with caplog.at_level("INFO", logger="compress.eval.generate"):
        compile_for_generate(model, backend="aot_eager")
        assert torch.equal(model.generate(prompt, max_new_tokens=3, **GREEDY), eager)
    said = [record.getMessage() for record in caplog.records if record.name == "compress.eval.generate"]
    assert len(said) == 1 and "GPT2LMHeadModel keeps transformers' generate" in said[0]  # once, not every call
    assert model._graphed_decoders == {} and model.generation_config.cache_implementation == "static"
    with pytest.raises(ValueError, match="loop: expected one of"):
        compile_for_generate(model, loop="custom")


def test_a_change_after_compiling_is_seen_on_the_next_call():
    model, prompt = tiny_llama(), torch.randint(0, 256, (1, 5))
    compile_for_generate(model, backend="aot_eager")
    sdpa = model.generate(prompt, max_new_tokens=6, **GREEDY)
    model.config._attn_implementation = "eager"  # the sdpa decoders' bool masks would be added as 0 / 1
    eager = model.generate(prompt, max_new_tokens=6, **GREEDY)
    assert model._graphed_decoders["state"][1] == "eager" and torch.equal(eager, sdpa)
    model.train()  # not modelled: transformers' path, no decoder
    model._graphed_decoders = {}
    assert torch.equal(model.generate(prompt, max_new_tokens=6, **GREEDY), sdpa) and model._graphed_decoders == {}
    assert "training mode" in model._graphed_refusal
    model.eval()
    assert torch.equal(model.generate(prompt, max_new_tokens=6, **GREEDY), sdpa) and (1, 128) in model._graphed_decoders


@pytest.mark.parametrize(("build", "reason"), [
    (lambda: tiny_model("Mistral", sliding_window=64), "static cache would hold ['sliding_attention'] layers"),
    (lambda: tiny_model("Gemma3", head_dim=16), "static cache would hold ['sliding_attention'] layers"),
    (lambda: tiny_model("Llama", rope_parameters=dict(rope_type="dynamic", factor=2.0, rope_theta=1e4)),
     "model.rotary_emb's rotary embedding (dynamic) branches on the positions"),
])
def test_models_whose_compiled_step_is_not_one_graph_keep_the_eager_step(build, reason):
    model, prompt = build(), torch.randint(0, 256, (1, 5))
    assert reason in compiled_step_refusal(model) and compiled_step_refusal(tiny_llama()) is None
    scored = dict(max_new_tokens=5, output_scores=True, return_dict_in_generate=True, **GREEDY)  # not the loop's
    want = model.generate(prompt, **scored).sequences
    compile_for_generate(model, backend="aot_eager")
    assert model.generation_config.cache_implementation is None and model.generation_config.compile_config is None
    assert torch.equal(model.generate(prompt, **scored).sequences, want)


# Tiny models: the loop must give transformers' greedy tokens (True) or step aside (False). The prompt (7) plus
# the new tokens (12) run past every sliding window (4), so windows that the loop ignored would show.
SWEEP = {
    "llama": (lambda: tiny_model("Llama"), True),
    "llama eager": (lambda: tiny_model("Llama", "eager"), True),
    "llama biases, tied embeddings, head_dim 32": (
        lambda: tiny_model("Llama", attention_bias=True, mlp_bias=True, tie_word_embeddings=True, head_dim=32), True),
    "llama rope linear": (lambda: tiny_model("Llama", rope_parameters=dict(rope_type="linear", factor=4.0,
                                                                           rope_theta=1e4)), True),
    "llama rope llama3": (lambda: tiny_model("Llama", rope_parameters=dict(
        rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=8,
        rope_theta=1e4)), True),
    "llama rope yarn": (lambda: tiny_model("Llama", rope_parameters=dict(
        rope_type="yarn", factor=4.0, original_max_position_embeddings=16, rope_theta=1e4)), True),
    "llama rope dynamic": (lambda: tiny_model("Llama", max_position_embeddings=8, rope_parameters=dict(
        rope_type="dynamic", factor=2.0, rope_theta=1e4)), False),
    "llama in training mode": (lambda: tiny_model("Llama").train(), False),
    "mistral window 4": (lambda: tiny_model("Mistral", sliding_window=4), True),
    "mistral window 4 eager": (lambda: tiny_model("Mistral", "eager", sliding_window=4), True),
    "mistral no window": (lambda: tiny_model("Mistral", sliding_window=None), True),
    "qwen2": (lambda: tiny_model("Qwen2"), True),
    "qwen2 window 4 on layer 1": (lambda: tiny_model("Qwen2", use_sliding_window=True, sliding_window=4,
                                                     max_window_layers=1), True),
    "qwen3": (lambda: tiny_model("Qwen3", head_dim=16), True),
    "qwen3 window 4 eager": (lambda: tiny_model("Qwen3", "eager", head_dim=16, use_sliding_window=True,
                                                sliding_window=4, max_window_layers=0), True),
    "gemma3 window 4, softcapping": (lambda: tiny_model("Gemma3", head_dim=16, sliding_window=4,
                                                        final_logit_softcapping=1.0), False),
    "mixtral window 4, grouped_mm experts": (lambda: tiny_moe("Mixtral", sliding_window=4), True),
    "mixtral W8A8 experts (grouped kernels)": (lambda: compressed_moe("Mixtral", compress.W8A8Config()), True),
    "mixtral W8A8 experts on the loop": (lambda: compressed_moe("Mixtral", compress.W8A8Config(), grouped=False),
                                         False),
    "mixtral eager experts": (lambda: tiny_moe("Mixtral", experts="eager"), False),
    "qwen3-moe, a dense layer": (lambda: tiny_moe("Qwen3Moe", mlp_only_layers=[1]), True),
    "qwen3-moe W4A16 experts (grouped kernels)": (
        lambda: compressed_moe("Qwen3Moe", compress.W4A16Config(group_size=32)), True),
}



@pytest.mark.parametrize("name", SWEEP)
def test_generate_gives_transformers_greedy_tokens_or_steps_aside(name):
    build, modelled = SWEEP[name]
    model, prompt = build(), torch.randint(0, 256, (2, 7), generator=torch.Generator().manual_seed(1))
    assert supports(model) is modelled
    want = model.generate(prompt, max_new_tokens=12, **GREEDY)
    compile_for_generate(model, backend="aot_eager")
    got = model.generate(prompt, max_new_tokens=12, **GREEDY)
    assert torch.equal(got, want) and ((2, 128) in model._graphed_decoders) is modelled  # the loop ran iff modelled
    torch._dynamo.reset()


@pytest.mark.parametrize("family", ["Llama", "Mistral"])
def test_eager_and_sdpa_attention_give_the_same_loop_tokens(family):
    prompt = torch.randint(0, 256, (2, 7), generator=torch.Generator().manual_seed(1))
    sdpa, eager = (GreedyDecoder(tiny_model(family, attention, sliding_window=4) if family == "Mistral"
                                 else tiny_model(family, attention), 2, 32).generate(prompt, 20)
                   for attention in ("sdpa", "eager"))
    assert torch.equal(sdpa, eager)


@pytest.mark.gpu
def test_gpu_graphed_loop_replays_a_cuda_graph_and_matches_eager_generate():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    model = tiny_llama().half().cuda()
    prompt = torch.randint(0, 256, (2, 5), device="cuda")
    eager = model.generate(prompt, max_new_tokens=16, **GREEDY)
    compile_for_generate(model)
    graphed = model.generate(prompt, max_new_tokens=16, **GREEDY)
    decoder = model._graphed_decoders[(2, 128)]
    assert decoder.graph is not None and [layer.self_attn.layer_idx for layer in model.model.layers] == [0, 1]
    assert graphed.shape == eager.shape and (graphed == eager).float().mean() > 0.9  # fp16 near-ties may flip
    assert torch.equal(model.generate(prompt, max_new_tokens=16, **GREEDY), graphed)  # replays the same graph
    longer = torch.randint(0, 256, (2, 20), device="cuda")  # a second prompt bucket: 32 positions
    graphed_longer = model.generate(longer, max_new_tokens=16, **GREEDY)
    assert sorted(decoder.prefill_graphs) == [16, 32] and graphed_longer.shape == (2, 36)
    assert torch.equal(model.generate(prompt, max_new_tokens=16, **GREEDY), graphed)  # nothing left of the longer one
    uncompile_for_generate(model)
    assert (graphed_longer == model.generate(longer, max_new_tokens=16, **GREEDY)).float().mean() > 0.9
    torch._dynamo.reset()


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["llama eager", "mistral window 4", "qwen2 window 4 on layer 1",
                                  "qwen3 window 4 eager"])
def test_gpu_graphed_loop_models_eager_attention_and_sliding_windows(name):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    model = SWEEP[name][0]().cuda()  # float32: no half-precision near-ties between the two paths
    prompt = torch.randint(0, 256, (2, 7), generator=torch.Generator().manual_seed(1)).cuda()
    want = model.generate(prompt, max_new_tokens=24, **GREEDY)
    compile_for_generate(model)
    got = model.generate(prompt, max_new_tokens=24, **GREEDY)
    assert model._graphed_decoders[(2, 128)].graph is not None and torch.equal(got, want)
    torch._dynamo.reset()


@pytest.mark.gpu
@pytest.mark.parametrize("name, dtype", [("mixtral window 4, grouped_mm experts", torch.bfloat16),
                                         ("mixtral W8A8 experts (grouped kernels)", torch.float16),
                                         ("qwen3-moe W4A16 experts (grouped kernels)", torch.float16)])
def test_gpu_graphed_loop_serves_mixture_of_experts_models(name, dtype):
    """Routing and experts inside the captured step: float grouped_mm experts (bf16, torch's device kernel),
    our grouped kernels (fp16)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    if dtype == torch.bfloat16 and torch.cuda.get_device_capability()[0] not in (9, 10):
        pytest.skip("torch's grouped_mm runs on the device in bf16 on SM90 / SM100 only")
    model = SWEEP[name][0]().to(device="cuda", dtype=dtype)
    prompt = torch.randint(0, 256, (2, 7), generator=torch.Generator().manual_seed(1)).cuda()
    want = model.generate(prompt, max_new_tokens=16, **GREEDY)
    compile_for_generate(model)
    got = model.generate(prompt, max_new_tokens=16, **GREEDY)
    assert model._graphed_decoders[(2, 128)].graph is not None
    assert got.shape == want.shape and (got == want).float().mean() > 0.9  # half-precision near-ties may flip
    torch._dynamo.reset()


@pytest.mark.gpu
def test_gpu_fp16_grouped_mm_experts_step_aside_with_the_reason():
    """torch's fp16 grouped_mm reads the expert offsets on the host: the loop refuses it, generate still
    gives transformers' tokens."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    model = tiny_moe("Mixtral").half().cuda()
    assert "offsets read on the host" in unsupported_reason(model)
    prompt = torch.randint(0, 256, (2, 7), generator=torch.Generator().manual_seed(1)).cuda()
    want = model.generate(prompt, max_new_tokens=8, **GREEDY)
    compile_for_generate(model)
    assert torch.equal(model.generate(prompt, max_new_tokens=8, **GREEDY), want)
    torch._dynamo.reset()
