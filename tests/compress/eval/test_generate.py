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
from compress.eval.generate import compile_for_generate, uncompile_for_generate
from compress.nn.modules import INFERENCE_MODULES
from tests.compress.eval.test_decode_loop import tiny_llama

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
    assert set(model._graphed_decoders) == {"tensors", (2, 128)}  # the loop ran (not transformers)
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
    assert torch.equal(graphed, out.sequences) and set(model._graphed_decoders) == {"tensors", (1, 128)}


def test_decoders_are_rebuilt_when_the_weights_are_replaced():
    model, prompt = tiny_llama(), torch.randint(0, 256, (1, 4))
    compile_for_generate(model, backend="aot_eager")
    first = model.generate(prompt, max_new_tokens=5, **GREEDY)
    decoder = model._graphed_decoders[(1, 128)]
    model.to(torch.float64)
    second = model.generate(prompt, max_new_tokens=5, **GREEDY)
    assert model._graphed_decoders[(1, 128)] is not decoder and torch.equal(first, second)


def test_models_that_are_not_llama_style_keep_transformers_path():
    config = transformers.GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=64, n_positions=32)
    model = transformers.GPT2LMHeadModel(config).eval()
    compile_for_generate(model, backend="aot_eager")
    assert "generate" not in model.__dict__ and model.generation_config.cache_implementation == "static"
    with pytest.raises(ValueError, match="loop: expected one of"):
        compile_for_generate(model, loop="custom")


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
