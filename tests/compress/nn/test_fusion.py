"""Sibling fusion: fused q/k/v and gate/up layers give the unfused model's outputs, in every mode."""
import copy

import pytest
import torch
import torch._dynamo.testing
from torch import nn
from transformers import BertConfig, BertModel, LlamaConfig, LlamaForCausalLM

import compress
from compress.nn.fusion import SiblingGroup, SiblingOutput, fuse_members, fuse_siblings, is_fused, unfuse_siblings
from compress.nn.inference import BSRLinear, BSRW4A16Linear, W4A16Linear, W8A8Linear, W8A16Linear

LLAMA = dict(hidden_size=64, intermediate_size=128, num_attention_heads=2, num_key_value_heads=2, vocab_size=50,
             num_hidden_layers=2)
CONFIGS = {
    "w8a8": compress.W8A8Config(),
    "w4a16": compress.W4A16Config(group_size=32),
    "w8a16": compress.W8A16Config(),
    "w8a16-g128": compress.W8A16Config(group_size=128),
    "bsr": compress.BlockSparseConfig(0.5),
    "bsr+w8a8": [compress.BlockSparseConfig(0.5), compress.W8A8Config()],
    "bsr+w4a16": [compress.BlockSparseConfig(0.5), compress.W4A16Config(group_size=32)],
}


def _llama(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(**LLAMA)).eval()


def _groups(model: nn.Module) -> list[SiblingGroup]:
    return [m for m in model.modules() if isinstance(m, SiblingGroup)]


@pytest.mark.parametrize("kind", list(CONFIGS))
def test_fused_llama_gives_the_unfused_logits(kind):
    model = compress.convert(_llama(), CONFIGS[kind])
    fused = copy.deepcopy(model)
    assert fuse_siblings(fused) == 4  # per layer: q/k/v and gate/up
    assert fuse_siblings(fused) == 0  # a second call finds nothing left to fuse
    attention = fused.model.layers[0].self_attn
    assert isinstance(attention.q_proj, SiblingOutput) and attention.q_proj.out_features == 64
    group = attention.fused_q_proj_k_proj_v_proj
    assert group.sizes == (64, 64, 64) and group.fused.out_features == 192
    assert isinstance(group.fused, type(model.model.layers[0].self_attn.q_proj))
    ids = torch.randint(0, 50, (2, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected, actual = model(ids).logits, fused(ids).logits
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)
    assert all(g._state.input is None and g._state.slices == (None,) * len(g.sizes) for g in _groups(fused)), \
        "no tensor may outlive the forward"


def test_fused_bert_attention_with_bias_matches():
    torch.manual_seed(0)
    model = BertModel(BertConfig(vocab_size=40, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                                 intermediate_size=128)).eval()
    compress.convert(model, compress.W8A8Config())
    fused = copy.deepcopy(model)
    assert fuse_siblings(fused) == 2  # query/key/value per layer; BERT's MLP has no gate
    assert _groups(fused)[0].fused.bias is not None
    ids = torch.randint(0, 40, (3, 9))
    with torch.no_grad():
        torch.testing.assert_close(fused(ids).last_hidden_state, model(ids).last_hidden_state, rtol=1e-5, atol=1e-5)


def _three_w8a8(bias=(True, False, True)) -> list[W8A8Linear]:
    torch.manual_seed(0)
    return [W8A8Linear.from_float(nn.Linear(32, n, bias=b)) for n, b in zip((16, 32, 48), bias)]


def _parent(members, names=("q_proj", "k_proj", "v_proj")) -> nn.Module:
    parent = nn.Module()
    for name, member in zip(names, members):
        parent.add_module(name, member)
    return parent


def test_members_called_out_of_order_or_on_other_inputs_stay_correct():
    members = _three_w8a8()
    parent = _parent(copy.deepcopy(members))
    fuse_siblings(parent)
    x, y = torch.randn(5, 32), torch.randn(5, 32)
    expected = [m(x) for m in members], [m(y) for m in members]
    # v first, then q on the same input; k on another input (as cross-attention's key would be)
    assert torch.equal(parent.v_proj(x), expected[0][2])
    assert torch.equal(parent.k_proj(y), expected[1][1])
    assert torch.equal(parent.q_proj(y), expected[1][0])
    assert torch.equal(parent.v_proj(y), expected[1][2])
    # a member called twice on one input recomputes instead of returning a taken slice
    assert torch.equal(parent.q_proj(x), expected[0][0]) and torch.equal(parent.q_proj(x), expected[0][0])
    assert torch.equal(parent.k_proj(x), expected[0][1]) and torch.equal(parent.v_proj(x), expected[0][2])


def test_missing_biases_become_zeros():
    fused = fuse_members(_three_w8a8(bias=(False, True, False)))
    assert torch.equal(fused.bias[:16], torch.zeros(16)) and torch.equal(fused.bias[48:], torch.zeros(48))
    assert fuse_members(_three_w8a8(bias=(False, False, False))).bias is None


def test_bsr_block_rows_are_appended():
    torch.manual_seed(0)
    linears = [nn.Linear(64, n) for n in (32, 64)]
    masks = [torch.tensor([[True, False]]), torch.tensor([[False, False], [True, True]])]
    members = [BSRLinear.from_float(linear, weight=linear.weight, mask=mask) for linear, mask in zip(linears, masks)]
    fused = fuse_members(members)
    assert fused.crow_indices.tolist() == [0, 1, 1, 3] and fused.col_indices.tolist() == [0, 0, 1]
    dense = torch.cat([m.dequantized_weight() for m in members])
    torch.testing.assert_close(fused.dequantized_weight(), dense)


def test_bsr_w4a16_block_rows_and_their_scales_are_appended():
    torch.manual_seed(0)
    config = compress.W4A16Config(group_size=64)
    masks = [torch.tensor([[True, False]]), torch.tensor([[False, False], [True, True]])]
    members = [BSRW4A16Linear.from_float(nn.Linear(64, n), config, mask=mask) for n, mask in zip((32, 64), masks)]
    fused = fuse_members(members)
    assert fused.crow_indices.tolist() == [0, 1, 1, 3] and fused.scales.shape == (3, 32)
    torch.testing.assert_close(fused.dequantized_weight(), torch.cat([m.dequantized_weight() for m in members]))
    other = BSRW4A16Linear.from_float(nn.Linear(64, 32), compress.W4A16Config(group_size=32))
    assert "different block sizes or W4A16 configs" in fuse_members([members[0], other])


def test_w4a16_columns_are_appended():
    torch.manual_seed(0)
    members = [W4A16Linear.from_float(nn.Linear(64, n), compress.W4A16Config(group_size=32)) for n in (16, 24)]
    fused = fuse_members(members)
    assert fused.qweight.shape == (8, 40) and fused.scales.shape == (2, 40)
    torch.testing.assert_close(fused.dequantized_weight(), torch.cat([m.dequantized_weight() for m in members]))


def test_w8a16_rows_are_stacked():
    torch.manual_seed(0)
    members = [W8A16Linear.from_float(nn.Linear(128, n), compress.W8A16Config(group_size=128)) for n in (16, 24)]
    fused = fuse_members(members)
    assert fused.w_q.shape == (40, 128) and fused.w_scale.shape == (40, 1)
    torch.testing.assert_close(fused.dequantized_weight(), torch.cat([m.dequantized_weight() for m in members]))
    mixed = [members[0], W8A16Linear.from_float(nn.Linear(128, 16), compress.W8A16Config())]
    assert "different W8A16 configs" in fuse_members(mixed)


def test_incompatible_groups_are_left_alone():
    mixed = _three_w8a8()
    mixed[1] = W4A16Linear.from_float(nn.Linear(32, 32), compress.W4A16Config(group_size=32))
    assert "mixed kinds" in fuse_members(mixed)
    scales = [W8A8Linear.from_float(nn.Linear(32, 16), compress.W8A8Config("static"), act_scale=torch.tensor(s))
              for s in (0.1, 0.1, 0.2)]
    assert "activation scales" in fuse_members(scales)
    same = [W8A8Linear.from_float(nn.Linear(32, 16), compress.W8A8Config("static"), act_scale=torch.tensor(0.1))
            for _ in range(3)]
    assert fuse_members(same).act_scale.item() == pytest.approx(0.1)
    groups = [W4A16Linear.from_float(nn.Linear(64, 16), compress.W4A16Config(group_size=g)) for g in (32, 64)]
    assert "group sizes" in fuse_members(groups)
    dense = [nn.Linear(32, 16) for _ in range(3)]
    assert "dense=False" in fuse_members(dense)
    assert "different devices" in fuse_members([nn.Linear(32, 16), nn.Linear(32, 16, device="meta")], dense=True)
    parent = _parent(mixed)
    assert fuse_siblings(parent) == 0 and not is_fused(parent)
    assert fuse_siblings(_parent(dense)) == 0
    assert fuse_siblings(_parent(copy.deepcopy(dense)), dense=True) == 1
    with pytest.raises(TypeError, match="nn.Module"):
        fuse_siblings("model")


def test_dense_fusion_matches():
    model = _llama()
    fused = copy.deepcopy(model)
    assert fuse_siblings(fused, dense=True) == 4
    ids = torch.randint(0, 50, (1, 5))
    with torch.no_grad():
        torch.testing.assert_close(fused(ids).logits, model(ids).logits, rtol=1e-5, atol=1e-5)


def test_save_refuses_a_fused_model_until_it_is_unfused(tmp_path):
    model = compress.convert(_llama(), compress.W8A8Config())
    compress.save_compressed(model, tmp_path / "unfused")
    fuse_siblings(model)
    with pytest.raises(ValueError, match="save it before fusing, or call compress.nn.fusion.unfuse_siblings"):
        compress.save_compressed(model, tmp_path / "fused")
    loaded = compress.load_compressed(tmp_path / "unfused")
    assert not is_fused(loaded) and fuse_siblings(loaded) == 4
    assert unfuse_siblings(model) == 4 and not is_fused(model)
    compress.save_compressed(model, tmp_path / "again")
    again, unfused = (tmp_path / name / "model.safetensors" for name in ("again", "unfused"))
    assert again.read_bytes() == unfused.read_bytes()


@pytest.mark.parametrize("kind", [*CONFIGS, "dense"])
def test_unfuse_restores_every_member_exactly(kind):
    model = _llama()
    if kind != "dense":
        compress.convert(model, CONFIGS[kind])
    original = {k: v.clone() for k, v in model.state_dict().items()}
    fuse_siblings(model, dense=kind == "dense")
    assert unfuse_siblings(model) == 4
    state = model.state_dict()
    assert state.keys() == original.keys()
    for key, tensor in original.items():
        assert torch.equal(state[key], tensor), key
    assert unfuse_siblings(model) == 0


def test_unfuse_gives_a_member_without_bias_a_zero_one():
    members = _three_w8a8(bias=(True, False, True))
    parent = _parent(copy.deepcopy(members))
    fuse_siblings(parent)
    unfuse_siblings(parent)
    assert torch.equal(parent.k_proj.bias, torch.zeros(32))
    x = torch.randn(4, 32)
    for name, member in zip(("q_proj", "k_proj", "v_proj"), members):
        assert torch.equal(getattr(parent, name)(x), member(x))


def test_compiled_layers_share_one_graph_and_match_eager():
    """dynamo traces the bookkeeping (fullgraph, no break) and every decoder layer reuses one graph."""
    model = compress.convert(_llama(), compress.W4A16Config(group_size=32))
    fuse_siblings(model)
    x = torch.randn(1, 3, 64)
    positions = torch.arange(3)[None]
    rotary = model.model.rotary_emb(x, positions)

    def run_layer(layer, hidden):
        out = layer(hidden, position_embeddings=rotary, position_ids=positions)
        return out[0] if isinstance(out, tuple) else out

    counter = torch._dynamo.testing.CompileCounter()
    compiled = torch.compile(run_layer, backend=counter, fullgraph=True, dynamic=False)
    torch._dynamo.reset()
    with torch.no_grad():
        for layer in model.model.layers:
            torch.testing.assert_close(compiled(layer, x), run_layer(layer, x))
    assert counter.frame_count == 1
    assert all(g._state.input is None for g in _groups(model))


@pytest.mark.gpu
@pytest.mark.parametrize("kind", list(CONFIGS))
def test_gpu_fused_kernels_match_in_eager_compiled_and_graphed_forwards(kind):
    """On the GPU the fused modules call the Triton kernels; compile (inductor, fullgraph) and a
    CUDA graph of the compiled layer give the unfused layer's output."""
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=4,
                         vocab_size=64, num_hidden_layers=1)
    model = LlamaForCausalLM(config).eval()
    configs = CONFIGS[kind]
    if kind == "w4a16":
        configs = compress.W4A16Config(group_size=128)
    compress.convert(model, configs)
    model = model.half().cuda()
    fused = copy.deepcopy(model)
    assert fuse_siblings(fused) == 2
    layer, fused_layer = model.model.layers[0], fused.model.layers[0]
    x = torch.randn(2, 5, 256, device="cuda", dtype=torch.float16)
    positions = torch.arange(5, device="cuda")[None].expand(2, 5)
    rotary = model.model.rotary_emb(x, positions)

    def run_layer(module, hidden):
        out = module(hidden, position_embeddings=rotary, position_ids=positions)
        return out[0] if isinstance(out, tuple) else out

    with torch.no_grad():
        expected = run_layer(layer, x)
        torch.testing.assert_close(run_layer(fused_layer, x), expected, rtol=1e-2, atol=1e-2)
        torch._dynamo.reset()
        compiled = torch.compile(run_layer, fullgraph=True, dynamic=False)
        torch.testing.assert_close(compiled(fused_layer, x), expected, rtol=1e-2, atol=1e-2)
        static_x = x.clone()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                compiled(fused_layer, static_x)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_out = compiled(fused_layer, static_x)
        static_x.copy_(torch.randn_like(x))
        graph.replay()
        torch.testing.assert_close(static_out, run_layer(layer, static_x), rtol=1e-2, atol=1e-2)
    assert all(g._state.input is None for g in _groups(fused))
