"""LayerNorm / GELU handing their output over quantized to the W8A8 layers after them (compress/nn/input_quant.py)."""
import copy

import pytest
import torch
from torch import nn

import compress
from compress.nn.fusion import fuse_siblings
from compress.nn.input_quant import (
    QuantizingGELU,
    QuantizingLayerNorm,
    QuantizingRMSNorm,
    find_links,
    link_quantized_inputs,
    linked_layers,
    producer_for,
    takes_handed_input,
)
from compress.nn.inference import BSRW8A8Linear, W8A8Linear
from tests.compress.eval.test_evaluate import TINY_BERT, tiny_bert, tiny_w8a8_bert

LAYER = "bert.encoder.layer.0"


def inputs(batch=2, seq=12):
    ids = torch.randint(0, TINY_BERT["vocab_size"], (batch, seq), generator=torch.Generator().manual_seed(0))
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def count_handed_matmuls(monkeypatch) -> list:
    """Patch both W8A8 kinds to record each GEMM run from a handed-over input."""
    calls = []
    for cls in (W8A8Linear, BSRW8A8Linear):
        original = cls._matmul_quantized

        def spy(self, x, xq, s_x, original=original):
            calls.append(self)
            return original(self, x, xq, s_x)

        monkeypatch.setattr(cls, "_matmul_quantized", spy)
    return calls


def test_find_links_pairs_each_norm_and_gelu_with_the_w8a8_layer_reading_it():
    links = find_links(tiny_w8a8_bert().eval(), inputs())
    assert links == [
        ("bert.embeddings.LayerNorm", f"{LAYER}.attention.self.query"),
        ("bert.embeddings.LayerNorm", f"{LAYER}.attention.self.key"),
        ("bert.embeddings.LayerNorm", f"{LAYER}.attention.self.value"),
        (f"{LAYER}.attention.output.LayerNorm", f"{LAYER}.intermediate.dense"),
        (f"{LAYER}.intermediate.intermediate_act_fn", f"{LAYER}.output.dense"),
    ]  # the attention output layer reads attention's output: nothing to link


@pytest.mark.parametrize("fuse", [False, True])
def test_linked_model_gives_the_same_outputs_from_handed_inputs(fuse, monkeypatch):
    model = tiny_w8a8_bert().eval()
    if fuse:
        fuse_siblings(model)
    batch = inputs()
    with torch.no_grad():
        expected = model(**batch).logits
    keys = list(model.state_dict())
    assert link_quantized_inputs(model, batch) == (3 if fuse else 5) == linked_layers(model)
    assert isinstance(model.bert.embeddings.LayerNorm, QuantizingLayerNorm)
    assert isinstance(model.get_submodule(f"{LAYER}.intermediate.intermediate_act_fn"), QuantizingGELU)
    assert list(model.state_dict()) == keys  # the model saves as before
    calls = count_handed_matmuls(monkeypatch)
    for context in (torch.no_grad, torch.inference_mode):
        with context():
            assert torch.equal(model(**batch).logits, expected)  # CPU: the same reference ops
    assert len(calls) == 2 * (3 if fuse else 5)
    assert model.bert.embeddings.LayerNorm._handover is None  # every consumer took its copy


def test_sparse_w8a8_layers_are_linked_too(monkeypatch):
    model = tiny_bert().eval()
    compress.prepare(model, [compress.BlockSparseConfig(sparsity=0.5), compress.W8A8Config()])
    model = compress.convert(model)
    batch = inputs()
    with torch.no_grad():
        expected = model(**batch).logits
    assert link_quantized_inputs(model, batch) == 5
    calls = count_handed_matmuls(monkeypatch)
    with torch.no_grad():
        assert torch.equal(model(**batch).logits, expected)
    assert len(calls) == 5 and all(isinstance(layer, BSRW8A8Linear) for layer in calls)


def test_consumer_quantizes_itself_unless_given_the_producers_unchanged_output(monkeypatch):
    model = nn.Sequential(nn.LayerNorm(64), W8A8Linear.from_float(nn.Linear(64, 32)))
    unlinked = copy.deepcopy(model[1])
    x = torch.randn(3, 64)
    assert link_quantized_inputs(model, {"input": x}) == 1
    calls = count_handed_matmuls(monkeypatch)
    with torch.no_grad():
        y = model[0](x)
        other = y.clone()
        assert torch.equal(model[1](other), unlinked(other))  # another tensor: quantized by the layer
        y.mul_(2.0)  # changed in place after the norm kept its copy
        assert torch.equal(model[1](y), unlinked(y))
        assert not calls
        model(x)
    assert len(calls) == 1


def test_only_dynamic_unsmoothed_w8a8_layers_take_handed_inputs():
    dynamic = W8A8Linear.from_float(nn.Linear(32, 32))
    static = W8A8Linear.from_float(nn.Linear(32, 32), compress.W8A8Config(activation="static"),
                                   act_scale=torch.tensor(0.1))
    smoothed = W8A8Linear.from_float(nn.Linear(32, 32), input_smoothing=torch.ones(32))
    layers = (dynamic, static, smoothed, nn.Linear(32, 32))
    assert [takes_handed_input(m) for m in layers] == [True, False, False, False]
    model = nn.Sequential(nn.LayerNorm(32), static)
    assert link_quantized_inputs(model, {"input": torch.randn(2, 32)}) == 0
    assert type(model[0]) is nn.LayerNorm


def test_producers_are_layer_norms_over_the_last_dim_and_exact_gelus():
    assert isinstance(producer_for(nn.LayerNorm(16)), QuantizingLayerNorm)
    assert isinstance(producer_for(nn.GELU()), QuantizingGELU)
    assert producer_for(nn.GELU(approximate="tanh")) is None
    assert producer_for(nn.LayerNorm((4, 16))) is None
    assert producer_for(nn.ReLU()) is None
    with pytest.raises(ValueError, match="last dimension only"):
        QuantizingLayerNorm(nn.LayerNorm((4, 16)))


def test_quantizing_layer_norm_shares_the_parameters():
    norm = nn.LayerNorm(16)
    quantizing = QuantizingLayerNorm(norm)
    assert quantizing.weight is norm.weight and quantizing.bias is norm.bias and quantizing.eps == norm.eps
    x = torch.randn(2, 16)
    assert torch.equal(quantizing(x), norm(x))  # not linked: plain LayerNorm


def test_compiled_linked_model_traces_in_one_graph_without_hand_over():
    model = nn.Sequential(nn.LayerNorm(64), W8A8Linear.from_float(nn.Linear(64, 32)), nn.GELU(),
                          W8A8Linear.from_float(nn.Linear(32, 16)))
    x = torch.randn(5, 64)
    expected = model(x)
    assert link_quantized_inputs(model, {"input": x}) == 2
    with torch.no_grad():
        model[0](x)  # eager: keeps a copy for model[1]
    kept = model[0]._handover
    assert kept is not None
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    assert torch.equal(compiled(x), expected)
    assert model[0]._handover is kept  # the compiled forward neither kept nor took anything


def test_linked_model_saves_and_loads_as_the_plain_model(tmp_path):
    model = tiny_w8a8_bert().eval()
    batch = inputs()
    with torch.no_grad():
        expected = model(**batch).logits
    link_quantized_inputs(model, batch)
    compress.save_compressed(model, tmp_path / "linked")
    loaded = compress.load_compressed(tmp_path / "linked").eval()
    assert type(loaded.bert.embeddings.LayerNorm) is nn.LayerNorm and linked_layers(loaded) == 0
    with torch.no_grad():
        assert torch.equal(loaded(**batch).logits, expected)


def test_deepcopy_keeps_links_to_the_copied_producers():
    model = tiny_w8a8_bert().eval()
    link_quantized_inputs(model, inputs())
    clone = copy.deepcopy(model)
    consumer = clone.get_submodule(f"{LAYER}.output.dense")
    assert consumer.__dict__["input_source"] is clone.get_submodule(f"{LAYER}.intermediate.intermediate_act_fn")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gpu_linked_model_matches_unlinked_eager_and_in_a_cuda_graph(dtype, monkeypatch):
    model = tiny_w8a8_bert().eval().to("cuda", dtype)
    fuse_siblings(model)
    batch = {k: v.cuda() for k, v in inputs(batch=4, seq=32).items()}
    with torch.no_grad():
        expected = model(**batch).logits.float()
        link_quantized_inputs(model, batch)
        calls = count_handed_matmuls(monkeypatch)
        linked = model(**batch).logits.float()
        assert len(calls) == 3
        # the kernels' LayerNorm / GELU may round y differently in the last bit from PyTorch's
        torch.testing.assert_close(linked, expected, rtol=0.05, atol=0.05)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            model(**batch)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = model(**batch).logits
        graph.replay()
        assert torch.equal(captured.float(), linked)


def tiny_w8a8_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=32)
    model = LlamaForCausalLM(config).eval()
    compress.prepare(model, compress.W8A8Config())
    return compress.convert(model).eval()


@pytest.mark.parametrize("fuse", [False, True])
def test_llama_rms_norms_hand_over_to_attention_and_gate_up(fuse, monkeypatch):
    model = tiny_w8a8_llama()
    if fuse:
        fuse_siblings(model)
    ids = torch.randint(0, 64, (2, 10), generator=torch.Generator().manual_seed(1))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    with torch.no_grad():
        expected = model(**batch).logits
    keys = list(model.state_dict())
    per_layer = 2 if fuse else 5  # q/k/v after input_layernorm, gate/up after post_attention_layernorm
    assert link_quantized_inputs(model, batch) == 2 * per_layer
    assert isinstance(model.model.layers[0].input_layernorm, QuantizingRMSNorm)
    assert list(model.state_dict()) == keys
    calls = count_handed_matmuls(monkeypatch)
    with torch.no_grad():
        assert torch.equal(model(**batch).logits, expected)
    assert len(calls) == 2 * per_layer


def test_rms_norm_with_a_weight_in_another_dtype_computes_as_transformers_does():
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    norm = LlamaRMSNorm(16)
    quantizing = producer_for(norm)
    quantizing.linked_consumers = 1
    x = torch.randn(3, 16, dtype=torch.float64)  # float32 weight: the product is float64, no hand-over
    assert torch.equal(quantizing(x), norm(x)) and quantizing._handover is None


@pytest.mark.gpu
def test_gpu_llama_linked_matches_unlinked(monkeypatch):
    model = tiny_w8a8_llama().to("cuda", torch.float16)
    fuse_siblings(model)
    ids = torch.randint(0, 64, (3, 16), device="cuda")
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    with torch.no_grad():
        expected = model(**batch).logits.float()
        assert link_quantized_inputs(model, batch) == 4
        calls = count_handed_matmuls(monkeypatch)
        linked = model(**batch).logits.float()
    assert len(calls) == 4
    torch.testing.assert_close(linked, expected, rtol=0.05, atol=0.05)


@pytest.mark.gpu
def test_gpu_rows_too_long_for_the_kernel_are_handed_over_by_the_reference():
    from compress_kernels import NORM_QUANT_MAX_ROW

    k = NORM_QUANT_MAX_ROW + 32
    model = nn.Sequential(nn.LayerNorm(k), W8A8Linear.from_float(nn.Linear(k, 32))).to("cuda", torch.float16)
    x = torch.randn(4, k, device="cuda", dtype=torch.float16)
    with torch.no_grad():
        expected = model(x)
        assert link_quantized_inputs(model, {"input": x}) == 1
        # PyTorch's LayerNorm (on an fp32 copy) and quantization, handed over to the Triton GEMM
        torch.testing.assert_close(model(x), expected, rtol=0.02, atol=0.02)
        assert model[0]._handover is None
