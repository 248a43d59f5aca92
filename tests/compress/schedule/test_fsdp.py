"""Tests for compress/schedule/fsdp.py and the schedule under FSDP2: a plain loop with
``CompressionSchedule`` on a model sharded by ``fully_shard_model`` over 2 CPU processes (gloo), each
on its own half of every batch, against the same loop in one process on the whole batches.

The runs: block pruning by each score (magnitude, l2, movement, Fisher), a composed run (movement
pruning, W8A8 QAT with static scales and LSQ scales, SmoothQuant calibration, GPTQ at the end), and
block-scaled W8A8 QAT with LSQ block scales. The up layer has 96 rows, split 48/48, so a shard boundary
cuts one of its 32-row blocks and its one 128 x 128 scale block (whose scale row rank 0 alone holds).

Asserted: masks bit-equal on both ranks and equal to the single process's; each rank's rows of the
pruned blocks exactly zero after every optimizer step; gradient sums, static activation scales and
SmoothQuant factors bit-equal on both ranks and within ``TOLERANCE`` (relative) of the single
process's; the model gathered on rank 0 (``gather_full_model``) exports what the single process
exports (:func:`assert_exports_close`): the same kept blocks, int8 weights equal but in under 5% of
their entries, none more than 2 steps of the grid apart (a rounding that float32 reassociation flips,
GPTQ carries into the columns after it), other tensors and the outputs within ``EXPORT_TOLERANCE`` of
their largest value. A tiny Llama whose ``lm_head`` is its embedding (SmolLM2's layout) shards by
decoder layer and gathers back as a plain ``LlamaForCausalLM``: tie kept, no FSDP class or hook left,
the same logits as before sharding. Also the helpers' checks.
"""
import copy

import pytest
import torch
import torch.distributed as dist
from torch import nn

import compress
from compress import CalibrationSchedule, CompressionSchedule, PruningSchedule, QuantizationSchedule, W8A8Config
from compress.configs import W8A8BlockConfig
from compress.core.sharding import local_rows, local_tensor
from compress.core.sparsity import expand_mask
from compress.nn.qat import compressed_layers
from compress.schedule.fsdp import fully_shard_model, gather_full_model, transformer_blocks
from tests.compress.models import PreNormMLP
from tests.compress.ranks import run_ranks

RUNS = {"magnitude": ("magnitude", None), "l2": ("l2", None), "movement": ("movement", None),
        "fisher": ("fisher", None), "composed": ("movement", "w8a8"), "block-scaled": ("movement", "w8a8-block")}
STEPS = 6
TOLERANCE = 1e-4  # FSDP against one process: the same sums in another order, over a few AdamW steps
EXPORT_TOLERANCE = 1e-3  # the export after static fake quantization and GPTQ, whose roundings amplify that
# AdamW moves a weight by about its learning rate (1e-2 here) whatever the gradient's size, so a weight
# whose gradient is near zero once the model is quantized can take a step of another sign when its
# sum comes in another order: float tensors of the export may also differ by 5% of one such step
# (torch 2.11 on a GPU machine: norm.bias 2e-4 apart under the composed run, against 4e-5 from the
# relative bound)
ADAM_STEP_SLACK = 5e-4


def halves(count=STEPS + 2, seed=0):
    """``count`` batches (x (2, 8, 64), y (2, 8)) of 16 rows in two halves of 8: rank r trains on half r."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(count, 2, 8, 64, generator=generator)
    x[..., 3] *= 20  # an outlier channel for SmoothQuant to move
    return list(zip(x, torch.randint(0, 4, (count, 2, 8), generator=generator)))


def whole(data):
    """The same batches whole: (x (16, 64), y (16,)), rank 0's half first."""
    return [(x.reshape(-1, x.shape[-1]), y.reshape(-1)) for x, y in data]


def model_and_schedule(run):
    """The run's model and schedule: pruning by the score from step 1 to 3; the composed run adds W8A8
    QAT from step 3 (static and LSQ scales, GPTQ at finish) and SmoothQuant calibration (smoothing after
    step 1, static scales frozen after step 3): masks final before static fake quantization starts,
    whose roundings turn float32 reassociation into different values (in DDP as in FSDP). The
    block-scaled run adds block-scaled W8A8 QAT with LSQ block scales from step 3."""
    score, quantization = RUNS[run]
    torch.manual_seed(0)
    model = PreNormMLP(ffn=96)
    pruning = PruningSchedule(0.5, start_step=1, end_step=3, frequency=1, score=score)
    if quantization is None:
        return model, CompressionSchedule(model, pruning=pruning)
    if quantization == "w8a8-block":
        block_scaled = QuantizationSchedule(W8A8BlockConfig(learnable_scale=True), start_step=3)
        return model, CompressionSchedule(model, pruning=pruning, quantization=block_scaled)
    config = W8A8Config(activation="static", learnable_scale=True, algorithm="gptq")
    return model, CompressionSchedule(model, pruning=pruning, quantization=QuantizationSchedule(config, start_step=3),
                                      calibration=CalibrationSchedule(num_batches=2, smoothquant_alpha=0.5))


def train(model, schedule, data, on_step=None):
    """The plain loop over ``data`` [(x, y)], then ``finish`` on the last two batches (GPTQ)."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    for x, y in data[:STEPS]:
        nn.functional.cross_entropy(model(x), y).backward()
        schedule.before_optimizer_step(optimizer)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad()
        if on_step is not None:
            on_step()
    schedule.finish(calibration_data=[x for x, _ in data[STEPS:]])


def buffers_of(model, schedule):
    """What must be the same on every rank: masks, scales, smoothing factors, gradient sums."""
    sums = schedule.pruning.gradient_scores
    return {name: {"mask": layer.mask.clone(), "act_scale": layer.act_scale, "smoothing": layer.input_smoothing,
                   "sums": sums.get(name)} for name, layer in compressed_layers(model).items()}


def pruned_weights_are_zero(model) -> bool:
    """Whether this rank's rows of every pruned block hold exact zeros."""
    for layer in compressed_layers(model).values():
        keep = expand_mask(layer.mask, (layer.out_features, layer.in_features))[local_rows(layer.weight)]
        if bool(local_tensor(layer.weight).detach()[~keep].any()):
            return False
    return True


def tied_llama():
    """A tiny Llama whose lm_head is its embedding (tied), its linear layers prepared for W8A8."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32,
                         tie_word_embeddings=True)
    return compress.prepare(LlamaForCausalLM(config), W8A8Config())


def llama_tokens():
    return torch.arange(24).reshape(2, 12) % 64


def gathered_llama(mesh) -> dict:
    """The tied Llama sharded then gathered: FSDP units, and on rank 0 what the gathered copy is."""
    from torch.distributed.fsdp import FSDPModule

    llama = tied_llama()
    fully_shard_model(llama, mesh)
    units = len([m for m in llama.modules() if isinstance(m, FSDPModule)])
    gathered = gather_full_model(llama)
    if gathered is None:
        return {"units": units, "gathered": None}
    with torch.no_grad():
        logits = gathered(llama_tokens()).logits
    return {"units": units, "gathered": {
        "class": type(gathered).__name__, "tied": gathered.lm_head.weight is gathered.model.embed_tokens.weight,
        "fsdp_left": any(isinstance(m, FSDPModule) or m._forward_pre_hooks for m in gathered.modules()),
        "logits": logits}}


def sharded_runs(rank, world_size, init_file, out_dir):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (world_size,))
    results = {}
    for run in RUNS:
        model, schedule = model_and_schedule(run)
        fully_shard_model(model, mesh)
        zero = []
        train(model, schedule, [(x[rank], y[rank]) for x, y in halves()],
              lambda: zero.append(pruned_weights_are_zero(model)))
        exported = gather_full_model(model)
        results[run] = {"buffers": buffers_of(model, schedule), "zero": zero,
                        "export": None if exported is None else compress.convert(exported).state_dict()}
    results["llama"] = gathered_llama(mesh)
    torch.save(results, f"{out_dir}/rank{rank}.pt")
    dist.destroy_process_group()


def single_run(run):
    """(buffers, exported model) of the run in one process on the whole batches."""
    model, schedule = model_and_schedule(run)
    train(model, schedule, whole(halves()))
    return buffers_of(model, schedule), compress.convert(model)


def assert_close(actual, expected, tolerance, what, floor=0.0):
    """The largest difference at most ``tolerance`` of the largest value of ``expected``, or ``floor``."""
    scale = expected.float().abs().max()
    assert (actual.float() - expected.float()).abs().max() <= max(tolerance * scale, floor), what


def assert_exports_close(actual: dict, expected: dict, tolerance: float) -> None:
    """Two exports' state dicts: the same BSR indices, int8 values equal but in under 5% of entries and
    at most 2 apart, every other tensor within ``tolerance`` of its largest value or ``ADAM_STEP_SLACK``."""
    assert set(actual) == set(expected)
    for key, tensor in actual.items():
        if key.endswith(("crow_indices", "col_indices")):
            assert torch.equal(tensor, expected[key]), key  # the same kept blocks
        elif tensor.dtype == torch.int8:
            steps = (tensor.int() - expected[key].int()).abs()
            assert steps.max() <= 2 and (steps > 0).float().mean() < 0.05, key
        else:
            assert_close(tensor, expected[key], tolerance, key, floor=ADAM_STEP_SLACK)


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("fsdp")
    run_ranks(sharded_runs, (2, str(out / "init"), str(out)))
    return [torch.load(out / f"rank{r}.pt", weights_only=True) for r in (0, 1)]


@pytest.mark.slow
@pytest.mark.parametrize("run", list(RUNS))
def test_fsdp_ranks_end_with_the_single_process_masks_and_scales(ranks, run):
    rank0, rank1 = ranks[0][run], ranks[1][run]
    assert rank0["zero"] == rank1["zero"] == [True] * STEPS
    single, _ = single_run(run)
    for name, tensors in rank0["buffers"].items():
        assert not tensors["mask"].all(), name
        for key, tensor in tensors.items():
            if tensor is None:
                assert rank1["buffers"][name][key] is None and single[name][key] is None, (name, key)
                continue
            assert torch.equal(tensor, rank1["buffers"][name][key]), (name, key)
            if key == "mask":
                assert torch.equal(tensor, single[name][key]), name
            else:
                assert_close(tensor, single[name][key], TOLERANCE, (name, key))


@pytest.mark.slow
@pytest.mark.parametrize("run, module", [("composed", "BSRW8A8Linear"), ("block-scaled", "W8A8BlockLinear")])
def test_the_model_gathered_on_rank_zero_exports_what_one_process_exports(ranks, run, module):
    assert ranks[1][run]["export"] is None  # gathered on rank 0 only
    exported = ranks[0][run]["export"]
    _, single = single_run(run)
    assert type(single.up).__name__ == module
    assert_exports_close(exported, single.state_dict(), EXPORT_TOLERANCE)
    gathered = copy.deepcopy(single)  # the same modules, since the same blocks are kept
    gathered.load_state_dict(exported)
    x = whole(halves())[0][0]
    with torch.no_grad():
        assert_close(gathered(x), single(x), EXPORT_TOLERANCE, "outputs")


@pytest.mark.slow
def test_a_tied_llama_shards_by_decoder_layer_and_gathers_back_plain(ranks):
    assert ranks[0]["llama"]["units"] == ranks[1]["llama"]["units"] == 3  # 2 decoder layers, then the model
    assert ranks[1]["llama"]["gathered"] is None
    gathered = ranks[0]["llama"]["gathered"]
    assert gathered["class"] == "LlamaForCausalLM" and gathered["tied"] and not gathered["fsdp_left"]
    with torch.no_grad():
        assert torch.equal(gathered["logits"], tied_llama()(llama_tokens()).logits)


def test_transformer_blocks_are_the_layers_innermost_first_and_self_contained():
    class Stack(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList([PreNormMLP(), PreNormMLP()])
            self.head = nn.Linear(64, 2)

    stack = Stack()
    assert transformer_blocks(stack) == [stack.layers[1], stack.layers[0]]
    assert transformer_blocks(stack, ["LayerNorm"]) == [stack.layers[1].norm, stack.layers[0].norm]
    stack.head = nn.Linear(64, 128)
    stack.head.weight = stack.layers[0].up.weight  # tied across a block boundary: that block stays in the root
    assert transformer_blocks(stack) == [stack.layers[1]]


def test_fully_shard_model_refuses_a_two_dimensional_mesh():
    class Mesh:
        ndim = 2

    with pytest.raises(ValueError, match="1-D device mesh"):
        fully_shard_model(PreNormMLP(), Mesh())


def test_gather_full_model_refuses_a_model_that_is_not_sharded():
    with pytest.raises(ValueError, match="sharded by FSDP2"):
        gather_full_model(PreNormMLP())
