"""The grouped path of QuantizedExperts (compress/nn/grouped_experts.py): which blocks take it, the stacked
buffers (one copy, the experts' buffers views of them, the state dict unchanged), agreement with the loop
(the reference on the CPU; the Triton kernels in the interpreter), casts, moves, replaced buffers, save and
load, torch.compile(fullgraph=True); on a GPU (marked ``gpu``) CUDA-graph capture and no host synchronisation."""
import copy

import pytest
import torch
from torch import nn

import compress
import compress.nn.grouped_experts as grouped_experts
from compress import BlockSparseConfig, W4A16Config, W8A8Config, W8A16Config
from compress.eval.evaluate import weight_memory
from compress.nn.experts import QuantizedExperts, route_to_experts
from compress.nn.grouped_experts import GROUPED_BUFFERS, grouped_problem
from compress.nn.inference import W4A16Linear, W8A8Linear

transformers = pytest.importorskip("transformers")
T = transformers
TINY = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
            head_dim=32, vocab_size=128)
CONFIGS = {"w4a16": W4A16Config(32), "w4a16-per-channel": W4A16Config(None), "w8a8": W8A8Config(),
           "w8a16": W8A16Config(), "w8a16-g128": W8A16Config(128)}


def _experts(config, experts=4, seed=0) -> QuantizedExperts:
    torch.manual_seed(seed)
    model = T.MixtralForCausalLM(T.MixtralConfig(num_local_experts=experts, num_experts_per_tok=2, **TINY)).eval()
    compress.convert(model, {"*": config})
    return model.model.layers[0].mlp.experts


def _inputs(tokens=10, experts=4, top_k=2, seed=1):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(experts, generator=gen)[:top_k] for _ in range(tokens)])
    return torch.randn(tokens, 64, generator=gen), ids, torch.rand(tokens, top_k, generator=gen)


def _loop(block, x, ids, weights):
    return route_to_experts(x, ids, weights, block.num_experts, block.gate_up, block.down, block.act_fn)


def _rel(a, b) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


@pytest.fixture
def interpreted_kernels(monkeypatch):
    """The grouped path calls the Triton kernels on CPU fp16 / bf16 inputs (the interpreter runs them)."""
    monkeypatch.setattr(grouped_experts, "kernels_run", lambda device, dtype: dtype in (torch.float16, torch.bfloat16))


@pytest.mark.parametrize("name", CONFIGS)
def test_blocks_of_one_scheme_take_the_grouped_path_with_one_copy_of_the_weights(name):
    block = _experts(CONFIGS[name])
    assert block.grouped_scheme == name.split("-")[0] and "path=grouped" in block.extra_repr()
    names = grouped_experts.GROUPED_KINDS[type(block.gate_up[0])][1]
    stacked = block._buffers[GROUPED_BUFFERS[0]]
    assert stacked.shape[0] == 4 and all(m._buffers[names[0]]._base is stacked for m in block.gate_up)
    down_scales = block._buffers[GROUPED_BUFFERS[3]]
    assert all(torch.equal(m._buffers[names[1]], down_scales[e]) for e, m in enumerate(block.down))
    assert not any(key.startswith("grouped") or ".grouped" in key for key in block.state_dict())
    x, ids, weights = _inputs()
    with torch.no_grad():  # CPU, fp32: the op's reference against the experts' own modules in the loop
        assert _rel(block(x, ids, weights), _loop(block, x, ids, weights)) < 1e-5


@pytest.mark.parametrize("name", CONFIGS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_kernels_agree_with_the_loop(interpreted_kernels, name, dtype):
    block = _experts(CONFIGS[name]).to(dtype)
    x, ids, weights = _inputs(tokens=6)
    x, weights = x.to(dtype), weights.to(dtype)
    with torch.no_grad():
        assert _rel(block(x, ids, weights), _loop(block, x, ids, weights)) < (3e-3 if dtype == torch.float16 else 3e-2)
    assert "_bound_moe" in block.__dict__  # eager calls go through a call bound once to the stacked weights


def test_other_blocks_keep_the_loop():
    assert _experts([BlockSparseConfig(0.5), W8A8Config()]).grouped_scheme is None
    assert _experts(W8A8Config(), seed=1).grouped_scheme == "w8a8"
    block = _experts(W4A16Config(32))
    linear = nn.Linear(64, 192, bias=False)
    mixed = QuantizedExperts(block.act_fn, [W8A8Linear.from_float(linear), *list(block.gate_up)[1:]], list(block.down))
    assert mixed.grouped_scheme is None and "several kinds" in grouped_problem(mixed.act_fn, mixed.gate_up, mixed.down)
    gelu = QuantizedExperts(nn.GELU(), list(block.gate_up), list(block.down))
    assert gelu.grouped_scheme is None and "act_fn GELU" in grouped_problem(gelu.act_fn, gelu.gate_up, gelu.down)
    biased = [W4A16Linear.from_float(nn.Linear(64, 192), W4A16Config(32)) for _ in range(4)]
    assert "expert biases" in grouped_problem(block.act_fn, nn.ModuleList(biased), block.down)
    static = [W8A8Linear.from_float(linear, W8A8Config("static"), act_scale=torch.tensor(0.1)) for _ in range(4)]
    assert "static activation scales" in grouped_problem(block.act_fn, nn.ModuleList(static), nn.ModuleList(static))
    dense = QuantizedExperts.empty_like(T.MixtralForCausalLM(T.MixtralConfig(
        num_local_experts=4, num_experts_per_tok=2, **TINY)).model.layers[0].mlp.experts)
    assert dense.grouped_scheme is None and "path=loop" in dense.extra_repr()
    x, ids, weights = _inputs()
    with torch.no_grad():
        assert torch.equal(mixed(x, ids, weights), _loop(mixed, x, ids, weights))
    assert block.set_grouped(False) is None and GROUPED_BUFFERS[0] not in block._buffers  # the loop, on request
    with torch.no_grad():
        assert torch.equal(block(x, ids, weights), _loop(block, x, ids, weights))
    assert block.set_grouped(True) == "w4a16"


def test_casts_moves_and_replaced_buffers_keep_it_stacked():
    block = _experts(W4A16Config(32))
    stacked = block.grouped_gate_up
    block.half()  # integers and float32 scales unchanged: the same stack
    assert block.grouped_gate_up is stacked and block.gate_up[0].scales.dtype == torch.float32
    block.to(torch.float32)
    x, ids, weights = _inputs()
    replaced = block.down[2].qweight.clone()
    replaced[0] ^= 0x11111111  # a new tensor in place of expert 2's buffer: the next forward stacks again
    block.down[2].qweight = replaced
    with torch.no_grad():
        y = block(x, ids, weights)
    assert block.down[2].qweight._base is block.grouped_down and torch.equal(block.grouped_down[2], replaced)
    with torch.no_grad():
        assert _rel(y, _loop(block, x, ids, weights)) < 1e-5
    with torch.no_grad():  # in place (load_state_dict without assign): the view writes the stack
        block.down[1].qweight.zero_()
    assert torch.equal(block.grouped_down[1], torch.zeros_like(block.grouped_down[1]))
    copied = copy.deepcopy(block)  # a copy shares one storage too (its views are set_ on the copied stack)
    assert copied.grouped_scheme == "w4a16" and copied.down[3].qweight.data_ptr() == copied.grouped_down[3].data_ptr()


def test_weight_memory_counts_the_stacked_weights_once():
    model = compress.convert(T.MixtralForCausalLM(T.MixtralConfig(num_local_experts=4, num_experts_per_tok=2,
                                                                  **TINY)).eval(), {"*": W8A8Config()})
    assert model.model.layers[0].mlp.experts.grouped_scheme == "w8a8"
    tensors = [*model.named_parameters(), *model.named_buffers()]
    expected = sum(t.numel() * t.element_size() for name, t in tensors if ".grouped_" not in name)
    assert weight_memory(model)[1] == expected


def test_save_and_load_round_trip_groups_the_loaded_block(tmp_path):
    torch.manual_seed(0)
    config = T.OlmoeConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=2,
                           num_key_value_heads=1, vocab_size=128, num_experts=4, num_experts_per_tok=2)
    model = compress.convert(T.OlmoeForCausalLM(config).eval(), W4A16Config(32))
    compress.save_compressed(model, tmp_path / "model")
    loaded = compress.load_compressed(tmp_path / "model")
    block = loaded.model.layers[0].mlp.experts
    assert block.grouped_scheme == "w4a16" and block.gate_up[1].qweight._base is block.grouped_gate_up
    saved, restored = model.state_dict(), loaded.state_dict()
    assert saved.keys() == restored.keys() and all(torch.equal(saved[k], restored[k]) for k in saved)
    tokens = torch.randint(0, 128, (2, 7))
    with torch.no_grad():
        assert torch.equal(loaded(tokens).logits, model(tokens).logits)


@pytest.mark.parametrize("kernels", [False, True])
def test_compiles_whole(monkeypatch, kernels):
    """No host synchronisation or data-dependent shape in the grouped forward: one graph (fullgraph), on the
    reference (fp32) and on the kernels' custom op (fp16, run by the interpreter)."""
    if kernels:
        monkeypatch.setattr(grouped_experts, "kernels_run", lambda device, dtype: dtype == torch.float16)
    dtype = torch.float16 if kernels else torch.float32
    block = _experts(W8A16Config()).to(dtype)
    x, ids, weights = _inputs(tokens=5)
    x, weights = x.to(dtype), weights.to(dtype)
    torch._dynamo.reset()
    compiled = torch.compile(block, backend="aot_eager", fullgraph=True)
    with torch.no_grad():
        assert torch.equal(compiled(x, ids, weights), block(x, ids, weights))


# ---- GPU ------------------------------------------------------------------------------------------------------
def _gpu_block(name, experts=8):
    torch.manual_seed(0)
    config = T.MixtralConfig(num_local_experts=experts, num_experts_per_tok=2, hidden_size=1024, intermediate_size=2048,
                             num_hidden_layers=1, num_attention_heads=8, num_key_value_heads=2, vocab_size=128)
    model = T.MixtralForCausalLM(config).eval()
    compress.convert(model, {"*": CONFIGS[name]})
    return model.model.layers[0].mlp.experts.to("cuda", torch.bfloat16)


def _gpu_inputs(tokens, experts=8):
    x = torch.randn(tokens, 1024, device="cuda", dtype=torch.bfloat16)
    logits = torch.randn(tokens, experts, device="cuda")
    weights, ids = torch.softmax(logits, -1).topk(2, dim=-1)
    return x, ids, (weights / weights.sum(-1, keepdim=True)).bfloat16()


@pytest.mark.gpu
@pytest.mark.parametrize("name", CONFIGS)
@pytest.mark.parametrize("tokens", [1, 8, 300])
def test_gpu_agrees_with_the_loop(name, tokens):
    block = _gpu_block(name)
    x, ids, weights = _gpu_inputs(tokens)
    with torch.no_grad():
        assert _rel(block(x, ids, weights), _loop(block, x, ids, weights)) < 3e-2


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["w4a16", "w8a8", "w8a16"])
def test_gpu_captures_in_a_cuda_graph_without_host_synchronisation(name):
    block = _gpu_block(name)
    x, ids, weights = _gpu_inputs(8)
    with torch.no_grad():
        block(x, ids, weights)  # warm-up
        torch.cuda.set_sync_debug_mode("error")
        try:
            block(x, ids, weights)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            y = block(x, ids, weights)
        new_x, new_ids, new_weights = _gpu_inputs(8)
        x.copy_(new_x)
        ids.copy_(new_ids)
        weights.copy_(new_weights)
        graph.replay()
        assert _rel(y, _loop(block, x, ids, weights)) < 3e-2


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["w4a16", "w8a8"])
def test_gpu_compiles_whole_and_captures(name):
    block = _gpu_block(name)
    x, ids, weights = _gpu_inputs(4)
    torch._dynamo.reset()
    compiled = torch.compile(block, mode="reduce-overhead", fullgraph=True)
    with torch.no_grad():
        for _ in range(3):
            y = compiled(x, ids, weights)
        torch.testing.assert_close(y, block(x, ids, weights), rtol=0, atol=0)
