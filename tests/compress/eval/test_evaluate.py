"""Tests for compress/eval/evaluate.py: weight memory, latency timing, metrics of a model."""
import copy
import dataclasses

import pytest
import torch
from torch import nn

import compress
from compress.eval.evaluate import (
    LATENCY_MODES,
    EvalOptions,
    cast_for_inference,
    evaluate_model,
    latency_inputs,
    latency_ms,
    measure_latency,
    measure_latency_or_eager,
    runs_reference,
    tensor_bytes,
    weight_memory,
)
from compress.eval.timing import capture_graph, replay_ms
from compress.lightning.data import DigitsData
from compress.lightning.tasks import SequenceClassificationTask

TINY_BERT = {
    "model_type": "bert", "vocab_size": DigitsData.VOCAB_SIZE, "hidden_size": 64, "num_hidden_layers": 1,
    "num_attention_heads": 2, "intermediate_size": 128, "max_position_embeddings": 80, "type_vocab_size": 1,
}


def tiny_bert():
    torch.manual_seed(0)
    return SequenceClassificationTask(config=TINY_BERT, num_labels=10).model


def tiny_w8a8_bert():
    model = tiny_bert()
    compress.prepare(model, compress.W8A8Config())
    return compress.convert(model)


def test_weight_memory_counts_linear_layers_and_the_whole_model():
    model = nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 8))
    linear, total = weight_memory(model)
    assert linear == (4 * 8 + 8) * 4
    assert total == linear + 10 * 4 * 4


def test_weight_memory_counts_transformers_conv1d_layers():
    from transformers.pytorch_utils import Conv1D

    linear, total = weight_memory(nn.Sequential(nn.Embedding(10, 4), Conv1D(8, 4)))  # GPT-2's layer, weight (4, 8)
    assert linear == (4 * 8 + 8) * 4
    assert total == linear + 10 * 4 * 4


def test_weight_memory_of_a_w8a8_layer_is_int8_plus_scales():
    layer = compress.W8A8Linear.from_float(nn.Linear(64, 32))
    linear, total = weight_memory(nn.Sequential(layer))
    assert linear == total == 32 * 64 * 1 + 32 * 4 + 32 * 4  # int8 weight, float32 scales and bias


def test_tensor_bytes_of_a_bsr_tensor():
    dense = torch.zeros(64, 64)
    dense[:32, :32] = 1.0
    dense[32:, 32:] = 2.0
    bsr = dense.to_sparse_bsr((32, 32))
    expected = 3 * 8 + 2 * 8 + 2 * 32 * 32 * 4  # crow (int64), col (int64), values (float32)
    assert tensor_bytes(bsr) == expected


def test_cast_for_inference_keeps_quantization_scales_float32():
    model = nn.Sequential(nn.Linear(32, 32), compress.W8A8Linear.from_float(nn.Linear(32, 32)))
    cast_for_inference(model, torch.device("cpu"), torch.float16)
    assert model[0].weight.dtype == torch.float16
    assert model[1].w_scale.dtype == torch.float32 and model[1].bias.dtype == torch.float16
    assert not model.training


def test_measure_latency_times_every_batch_size():
    options = EvalOptions(batch_sizes=(1, 3), seq_len=12, warmup=1, repeats=2, device="cpu")
    points = measure_latency(tiny_bert().eval(), options, torch.device("cpu"))
    assert [p.batch_size for p in points] == [1, 3]
    assert all(p.seq_len == 12 and p.latency_ms > 0 for p in points)


def test_eval_options_reject_bad_values():
    with pytest.raises(ValueError, match="batch_sizes"):
        EvalOptions(batch_sizes=(0,))
    with pytest.raises(ValueError, match="dtype"):
        EvalOptions(dtype="int8")
    assert EvalOptions(device="cpu").resolved_dtype() == torch.float32


def test_latency_mode_defaults_to_cuda_graph_and_rejects_unknown_modes():
    assert EvalOptions().latency_mode == "cuda_graph"
    with pytest.raises(ValueError, match="latency_mode") as error:
        EvalOptions(latency_mode="graph")
    assert all(mode in str(error.value) for mode in LATENCY_MODES) and "'graph'" in str(error.value)


@pytest.mark.parametrize("mode", LATENCY_MODES)
def test_latency_mode_resolves_to_eager_on_cpu(mode):
    assert EvalOptions(device="cpu", latency_mode=mode).resolved_latency_mode() == "eager"


def test_cpu_latency_is_timed_eager_without_a_note():
    options = EvalOptions(batch_sizes=(2,), seq_len=8, warmup=0, repeats=1, device="cpu", latency_mode="cuda_graph")
    points, mode, note = measure_latency_or_eager(tiny_bert().eval(), options, torch.device("cpu"))
    assert mode == "eager" and note == ""
    assert [p.batch_size for p in points] == [2] and points[0].latency_ms > 0


def test_failed_capture_falls_back_to_eager_and_says_why(monkeypatch, caplog):
    def failing_capture(calls, warmup):
        try:
            raise RuntimeError("operation not permitted when stream is capturing")
        finally:  # as torch.cuda.graph's exit does: ending the broken capture raises again
            raise RuntimeError("operation failed due to a previous error during capture")

    monkeypatch.setattr("compress.eval.evaluate.capture_graph", failing_capture)
    monkeypatch.setattr(EvalOptions, "resolved_latency_mode", lambda self: "cuda_graph")
    options = EvalOptions(batch_sizes=(1, 2), seq_len=8, warmup=0, repeats=1, device="cpu")
    with caplog.at_level("WARNING", logger="compress.eval.evaluate"):
        points, mode, note = measure_latency_or_eager(tiny_bert().eval(), options, torch.device("cpu"), "tiny")
    assert mode == "eager" and [p.batch_size for p in points] == [1, 2]
    assert note == "cuda_graph failed (RuntimeError: operation not permitted when stream is capturing); timed eager"
    assert any("tiny" in r.getMessage() and "cuda_graph failed" in r.getMessage() for r in caplog.records)


def test_eager_latency_runs_the_warmup_then_the_timed_calls_without_gradients():
    calls = []

    def forward(**inputs):
        calls.append((sorted(inputs), torch.is_inference_mode_enabled()))

    options = EvalOptions(batch_sizes=(1,), seq_len=8, warmup=3, repeats=4, device="cpu")
    assert latency_ms(forward, {"input_ids": None}, options, torch.device("cpu"), "eager") >= 0
    assert calls == [(["input_ids"], True)] * 7


@pytest.mark.parametrize("device, dtype, compressed, expected", [
    ("cpu", "auto", True, True),          # CPU: the reference, whatever the dtype
    ("cpu", "float16", True, True),
    ("cuda", "float32", True, True),      # the kernels take fp16 / bf16 only
    ("cuda", "float16", True, False),     # the Triton kernels run
    ("cuda", "bfloat16", True, False),
    ("cpu", "auto", False, False),        # dense models only: no compressed layer to run either way
])
def test_runs_reference_when_the_compressed_layers_cannot_call_the_kernels(device, dtype, compressed, expected):
    models = [tiny_bert()] + ([tiny_w8a8_bert()] if compressed else [])
    assert runs_reference(models, EvalOptions(device=device, dtype=dtype)) is expected


def test_measure_latency_rejects_an_unknown_mode():
    options = EvalOptions(batch_sizes=(1,), seq_len=8, warmup=0, repeats=1, device="cpu")
    with pytest.raises(ValueError, match="expected one of"):
        measure_latency(tiny_bert().eval(), options, torch.device("cpu"), mode="graphs")


def test_evaluate_model_on_digits():
    data = DigitsData(batch_size=32)
    data.setup()
    options = EvalOptions(batch_sizes=(1, 2), seq_len=DigitsData.SEQ_LEN, warmup=0, repeats=1,
                          max_eval_batches=2, device="cpu")
    result = evaluate_model("tiny", tiny_bert(), data.val_dataloader(), options, source="test")
    assert result.primary_metric == "accuracy" and result.higher_is_better
    assert 0.0 <= result.metrics["accuracy"] <= 1.0 and "f1" in result.metrics
    assert [p.batch_size for p in result.latency] == [1, 2]
    assert 0 < result.linear_weight_bytes < result.total_weight_bytes
    assert result.compression == "dense"
    assert result.latency_mode == "eager" and result.latency_note == ""


def _on_gpu(model):
    return cast_for_inference(model, torch.device("cuda"), torch.float16)


@pytest.mark.gpu
@pytest.mark.parametrize("make_model", [tiny_bert, tiny_w8a8_bert], ids=["dense", "w8a8"])
def test_cuda_graph_replay_matches_eager_and_is_timed(make_model):
    model = _on_gpu(make_model())
    inputs = latency_inputs(model, batch_size=4, seq_len=32, device=torch.device("cuda"))
    with torch.no_grad():
        eager = model(**inputs).logits.clone()
    graph, (static_output,) = capture_graph([lambda: model(**inputs)], warmup=2)
    static_output.logits.zero_()
    graph.replay()
    torch.cuda.synchronize()
    # same kernels on the same inputs; tolerance only for a cuBLAS algorithm choice under capture
    torch.testing.assert_close(static_output.logits, eager, rtol=1e-3, atol=1e-3)
    assert replay_ms(graph, warmup=1, repeats=3) > 0


@pytest.mark.gpu
@pytest.mark.parametrize("make_model", [tiny_bert, tiny_w8a8_bert], ids=["dense", "w8a8"])
def test_cuda_graph_mode_captures_every_batch_size(make_model):
    options = EvalOptions(batch_sizes=(1, 8), seq_len=32, warmup=1, repeats=3, device="cuda")
    points, mode, note = measure_latency_or_eager(_on_gpu(make_model()), options, torch.device("cuda"))
    assert (mode, note) == ("cuda_graph", "")
    assert [p.batch_size for p in points] == [1, 8] and all(p.latency_ms > 0 for p in points)


@pytest.mark.gpu
@pytest.mark.slow
def test_compile_mode_captures_the_compiled_w8a8_forward():
    options = EvalOptions(batch_sizes=(2,), seq_len=32, warmup=1, repeats=3, device="cuda", latency_mode="compile")
    points, mode, note = measure_latency_or_eager(_on_gpu(tiny_w8a8_bert()), options, torch.device("cuda"))
    assert (mode, note) == ("compile", "")
    assert points[0].latency_ms > 0


@pytest.mark.parametrize("fuse", [True, False])
def test_evaluate_model_fuses_compressed_siblings_unless_asked_not_to(fuse):
    data = DigitsData(batch_size=32)
    data.setup()
    options = EvalOptions(batch_sizes=(1,), seq_len=DigitsData.SEQ_LEN, warmup=0, repeats=1, max_eval_batches=2,
                          device="cpu", fuse_siblings=fuse)
    unfused = tiny_w8a8_bert()
    expected = evaluate_model("unfused", copy.deepcopy(unfused), data.val_dataloader(),
                              dataclasses.replace(options, fuse_siblings=False))
    result = evaluate_model("w8a8", unfused, data.val_dataloader(), options)
    assert result.metrics == expected.metrics  # fusion changes no prediction
    assert result.linear_weight_bytes == expected.linear_weight_bytes
    # q/k/v and the first MLP layer read LayerNorm outputs, the second MLP layer the GELU's
    if fuse:
        assert result.compression == ("W8A8Linear x4, dense x2 "
                                      "(1 fused sibling group, 3 fed int8 by the norm / GELU before)")
    else:
        assert result.compression == "W8A8Linear x6, dense x2 (5 fed int8 by the norm / GELU before)"


def test_evaluate_model_links_quantized_inputs_unless_asked_not_to():
    data = DigitsData(batch_size=32)
    data.setup()
    options = EvalOptions(batch_sizes=(1,), seq_len=DigitsData.SEQ_LEN, warmup=0, repeats=1, max_eval_batches=2,
                          device="cpu", fuse_siblings=False, link_quantized_inputs=False)
    model = tiny_w8a8_bert()
    linked = evaluate_model("linked", copy.deepcopy(model), data.val_dataloader(),
                            dataclasses.replace(options, link_quantized_inputs=True))
    unlinked = evaluate_model("unlinked", model, data.val_dataloader(), options)
    assert unlinked.compression == "W8A8Linear x6, dense x2"
    assert linked.compression.endswith("(5 fed int8 by the norm / GELU before)")
    assert linked.metrics == unlinked.metrics  # the same integers: no prediction changes on the CPU


def test_evaluate_model_links_block_scaled_mlp_chains_unless_asked_not_to():
    data = DigitsData(batch_size=32)
    data.setup()
    options = EvalOptions(batch_sizes=(1,), seq_len=DigitsData.SEQ_LEN, warmup=0, repeats=1, max_eval_batches=2,
                          device="cpu", fuse_siblings=False, link_quantized_inputs=False)
    model = tiny_bert()
    compress.prepare(model, compress.W8A8BlockConfig())
    compress.convert(model)
    linked = evaluate_model("linked", copy.deepcopy(model), data.val_dataloader(),
                            dataclasses.replace(options, link_quantized_inputs=True))
    unlinked = evaluate_model("unlinked", model, data.val_dataloader(), options)
    assert unlinked.compression == "W8A8BlockLinear x6, dense x2"
    assert linked.compression == "W8A8BlockLinear x6, dense x2 (1 MLP chain in int8)"
    assert linked.metrics == unlinked.metrics  # the same integers on the CPU
