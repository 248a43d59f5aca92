"""Tests for compress/eval/generate.py: ``generate`` with the static cache and the compiled decode step gives
the tokens of the default eager ``generate``, for a dense and a compressed tiny Llama.

On the CPU the step compiles with the ``aot_eager`` backend (no CUDA graphs). The compressed model takes
its kernel branch under the Triton interpreter, so the compiled step runs the custom ops themselves.
"""
import pytest
import torch

import compress
from compress.eval.generate import compile_for_generate, uncompile_for_generate
from compress.nn.modules import INFERENCE_MODULES

transformers = pytest.importorskip("transformers")
GREEDY = dict(do_sample=False, pad_token_id=0)


def tiny_llama(layers: int = 2) -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4,
                                      num_key_value_heads=2, num_hidden_layers=layers, vocab_size=256,
                                      max_position_embeddings=64)
    return transformers.LlamaForCausalLM(config).eval()


def test_compiled_generate_gives_the_eager_tokens_and_compiles_one_graph():
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()  # a process-wide tally: earlier tests in this worker compiled too
    model = tiny_llama()
    prompt = torch.randint(0, 256, (2, 5))
    eager = model.generate(prompt, max_new_tokens=8, min_new_tokens=8, **GREEDY)
    assert compile_for_generate(model, backend="aot_eager") is model
    assert model.generation_config.cache_implementation == "static"
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
    compile_for_generate(model, backend="aot_eager")
    assert torch.equal(model.generate(prompt, max_new_tokens=3, min_new_tokens=3, **GREEDY), eager)
    torch._dynamo.reset()


def test_a_model_without_a_generation_config_is_refused():
    with pytest.raises(TypeError, match="generation_config"):
        compile_for_generate(torch.nn.Linear(2, 2))
