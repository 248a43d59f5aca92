"""Tests for compress/schedule/distributed.py: a plain DDP loop (2 CPU processes, gloo) with the
schedule, each rank on its own batches, ends with the same masks, gradient sums, smoothing, static
scales and GPTQ weights on every rank; without a process group the helpers do nothing."""
import pytest
import torch
import torch.distributed as dist
from torch import nn

from compress import CalibrationSchedule, CompressionSchedule, PruningSchedule, QuantizationSchedule, W8A8Config
from compress.nn.qat import compressed_layers
from compress.schedule import distributed
from tests.compress.schedule.test_schedule import PreNormMLP, batches
from tests.compress.ranks import run_ranks


def train_on_rank(rank: int, world_size: int, init_file: str, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    torch.manual_seed(0)
    model = PreNormMLP()
    schedule = CompressionSchedule(
        model, pruning=PruningSchedule(0.5, start_step=1, end_step=8, frequency=1, score="movement"),
        quantization=QuantizationSchedule(W8A8Config(activation="static", algorithm="gptq"), start_step=0),
        calibration=CalibrationSchedule(num_batches=2, smoothquant_alpha=0.5))
    parallel = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(parallel.parameters(), lr=1e-2)
    data = batches(seed=10 + rank)  # each rank its own batches
    for x, y in data[:6]:
        nn.functional.cross_entropy(parallel(x), y).backward()
        schedule.before_optimizer_step(optimizer)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad()
    schedule.finish(calibration_data=data[6:8])
    state = {name: {"mask": layer.mask, "act_scale": layer.act_scale, "smoothing": layer.input_smoothing,
                    "weight": layer.weight.detach(), "weight_scale": layer.weight_scale,
                    "sums": schedule.pruning.gradient_scores[name]}
             for name, layer in compressed_layers(model).items()}
    state["norm"] = {"weight": model.norm.weight.detach()}
    torch.save(state, f"{out_dir}/rank{rank}.pt")
    dist.destroy_process_group()


@pytest.mark.slow
def test_a_ddp_loop_keeps_the_ranks_identical(tmp_path):
    run_ranks(train_on_rank, (2, str(tmp_path / "init"), str(tmp_path)))
    rank0, rank1 = (torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in (0, 1))
    assert set(rank0) == set(rank1) == {"up", "down", "norm"}
    for name, tensors in rank0.items():
        for key, tensor in tensors.items():
            assert torch.equal(tensor, rank1[name][key]), (name, key)
    for name in ("up", "down"):
        assert rank0[name]["act_scale"].item() > 0 and not rank0[name]["mask"].all() and rank0[name]["sums"].any()


def test_without_a_process_group_the_helpers_do_nothing():
    assert not distributed.is_distributed() and distributed.is_rank_zero()
    mask = torch.tensor([True, False])
    distributed.broadcast_(mask)
    stats = {"up": [torch.ones(2, 2), 5]}
    distributed.sum_over_ranks(stats)
    assert mask.tolist() == [True, False] and stats["up"][1] == 5 and torch.equal(stats["up"][0], torch.ones(2, 2))
