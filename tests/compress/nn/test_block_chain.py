"""Tests for compress/nn/block_chain.py: block-scaled MLP chains (up -> GELU -> down) found in a BERT,
linked, computing the unlinked model's outputs bit for bit on the CPU, and refused where something else
reads the up-projection's output."""
import pytest
import torch
from torch import nn

import compress
from compress import W8A8BlockConfig, W8A8BlockLinear
from compress.nn.block_chain import (BlockChain, ChainedGELU, find_block_chains, link_block_chains, linked_chains,
                                     unlink_block_chains)

transformers = pytest.importorskip("transformers")


def _bert(layers=2):
    config = transformers.BertConfig(vocab_size=100, hidden_size=128, num_hidden_layers=layers, num_attention_heads=2,
                                     intermediate_size=384, max_position_embeddings=32)
    torch.manual_seed(0)
    model = transformers.BertModel(config).eval()
    return compress.convert(model, W8A8BlockConfig())


def _inputs(seed=0):
    return {"input_ids": torch.randint(0, 100, (2, 9), generator=torch.Generator().manual_seed(seed))}


def test_bert_mlps_are_found_and_linked():
    model = _bert()
    chains = find_block_chains(model, _inputs())
    assert chains == [(f"encoder.layer.{i}.intermediate.dense", f"encoder.layer.{i}.intermediate.intermediate_act_fn",
                       f"encoder.layer.{i}.output.dense") for i in range(2)]
    assert link_block_chains(model, _inputs()) == 2 and linked_chains(model) == 2
    assert isinstance(model.encoder.layer[0].intermediate.intermediate_act_fn, ChainedGELU)
    assert "chain_head" in repr(model.encoder.layer[0].intermediate.dense)


def test_linked_outputs_equal_the_unlinked_ones_bit_for_bit():
    model = _bert()
    with torch.no_grad():
        before = [model(**_inputs(s)).last_hidden_state for s in range(3)]
    link_block_chains(model, _inputs())
    with torch.no_grad():
        after = [model(**_inputs(s)).last_hidden_state for s in range(3)]
    assert all(torch.equal(a, b) for a, b in zip(before, after))
    state = model.state_dict()
    assert not any("chain" in name for name in state)  # the links are no state


def test_the_down_projection_reads_int8_and_no_float_intermediate_is_made():
    model = _bert(layers=1)
    link_block_chains(model, _inputs())
    up = model.encoder.layer[0].intermediate.dense
    down = model.encoder.layer[0].output.dense
    seen = {}
    up.register_forward_hook(lambda m, a, out: seen.update(up=out))
    calls = []
    original = down.matmul_quantized
    down.matmul_quantized = lambda x, xq, s_x: calls.append((xq.dtype, tuple(s_x.shape))) or original(x, xq, s_x)
    with torch.no_grad():
        model(**_inputs())
    assert seen["up"].stride() == (0, 0, 0) and torch.isnan(seen["up"]).all()  # the placeholder: no memory
    assert calls == [(torch.int8, (18, 3))]  # 2 x 9 tokens, 384 channels in three 1 x 128 blocks


def test_a_model_reading_the_up_projection_elsewhere_is_left_unlinked():
    class LeakyMLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.up, self.act, self.down = nn.Linear(128, 256), nn.GELU(), nn.Linear(256, 128)

        def forward(self, x):
            h = self.up(x)
            return self.down(self.act(h)) + h[..., :128]  # the up-projection's output read twice

    torch.manual_seed(0)
    model = compress.convert(LeakyMLP(), W8A8BlockConfig())
    x = {"x": torch.randn(3, 128)}
    assert len(find_block_chains(model, x)) == 1
    assert link_block_chains(model, x) == 0 and linked_chains(model) == 0
    assert type(model.act) is nn.GELU and torch.isfinite(model(**x)).all()


def test_unlink_puts_the_original_gelu_back_and_linking_twice_links_once():
    model = _bert(layers=1)
    act = model.encoder.layer[0].intermediate.intermediate_act_fn
    assert link_block_chains(model, _inputs()) == 1 and link_block_chains(model, _inputs()) == 1
    assert unlink_block_chains(model) == 1 and model.encoder.layer[0].intermediate.intermediate_act_fn is act
    assert linked_chains(model) == 0


def test_chained_gelu_on_other_inputs_is_the_exact_gelu():
    gelu = ChainedGELU(BlockChain(), nn.GELU())
    x = torch.randn(5, 7)
    assert torch.equal(gelu(x), torch.nn.functional.gelu(x))


def test_models_without_block_chains_are_left_alone():
    torch.manual_seed(0)
    model = compress.convert(nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64)), W8A8BlockConfig())
    assert link_block_chains(model, {"input": torch.randn(2, 64)}) == 0
    assert all(not isinstance(m, ChainedGELU) for m in model.modules())
    assert isinstance(model[0], W8A8BlockLinear)


def test_kernel_branch_under_the_triton_interpreter(monkeypatch):
    """The chain's kernel calls (int8 output with GELU, then the quantized GEMM) run as bound calls and give
    the unlinked kernels' result (to GELU's last fp32 bit)."""
    import compress_kernels
    from compress_kernels import interpreting

    if not compress_kernels.TRITON_AVAILABLE or not interpreting():
        pytest.skip("needs the project's Triton kernels and TRITON_INTERPRET=1 (set by conftest without a GPU)")
    from compress_kernels.w8a8_block.op import (bind_w8a8_block_matmul, bind_w8a8_block_matmul_int8,
                                                bind_w8a8_block_matmul_quantized)

    monkeypatch.setattr(W8A8BlockLinear, "_use_kernel", lambda self, x: x.dtype in (torch.float16, torch.bfloat16))
    torch.manual_seed(0)
    model = compress.convert(nn.Sequential(nn.Linear(128, 256), nn.GELU(), nn.Linear(256, 128)), W8A8BlockConfig())
    model = model.half()
    x = {"input": torch.randn(3, 128).half()}
    with torch.no_grad():
        unlinked = model(**x)
        assert link_block_chains(model, x) == 1
        linked = model(**x)
    assert (linked.float() - unlinked.float()).norm() / unlinked.float().norm() < 1e-2
    assert set(model[0].__dict__["_bound_calls"]) == {bind_w8a8_block_matmul, bind_w8a8_block_matmul_int8}
    assert bind_w8a8_block_matmul_quantized in model[2].__dict__["_bound_calls"]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gpu_linked_bert_matches_unlinked(dtype):
    model = _bert().to("cuda", dtype)
    inputs = {k: v.cuda() for k, v in _inputs().items()}
    with torch.no_grad():
        before = model(**inputs).last_hidden_state.float()
        assert link_block_chains(model, inputs) == 2
        after = model(**inputs).last_hidden_state.float()
    assert (after - before).norm() / before.norm() < 1e-2
