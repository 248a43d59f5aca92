"""Tests for compress/core/sharding.py: whole tensors are their own rows; on 2 CPU processes (gloo),
DTensors sharded on dim 0 give the rows torch.chunk gives each rank (uneven splits and an empty shard
included), a write into the local rows reaches the shard, rows gather back into the full tensor,
column maxima cover every rank's rows, and any other placement is refused."""
import pytest
import torch
import torch.distributed as dist
from torch import nn

from compress.core.sharding import (
    column_absmax,
    fsdp_modules,
    is_sharded,
    local_rows,
    local_tensor,
    reshard_,
    rows_to_full,
)
from tests.compress.ranks import run_ranks

ROWS = (1, 3, 5, 96)  # 1 row: rank 1 holds none


def test_a_whole_tensor_is_its_own_rows():
    w = torch.randn(5, 3)
    assert not is_sharded(w) and local_tensor(w) is w and local_rows(w) == slice(0, 5)
    assert rows_to_full(w, like=w) is w
    assert torch.equal(column_absmax(w), w.abs().amax(dim=0))
    assert torch.equal(column_absmax(w[:0]), torch.zeros(3))
    model = nn.Linear(3, 5)
    reshard_(model)  # nothing sharded: nothing to do
    assert fsdp_modules(model) == []


def shard_checks(rank, world_size, init_file, out_dir):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (world_size,))
    results = {}
    for rows in ROWS:
        full = torch.arange(rows * 4, dtype=torch.float32).reshape(rows, 4) - 7
        sharded = distribute_tensor(full, mesh, [Shard(0)])
        expected = torch.chunk(torch.arange(rows), world_size)
        held = expected[rank] if rank < len(expected) else torch.arange(0)
        span = local_rows(sharded)
        results[rows] = {
            "rows": (span.start, span.stop), "expected": (int(held[0]), int(held[-1]) + 1) if len(held) else None,
            "local_is_those_rows": torch.equal(local_tensor(sharded), full[span]),
            "gathered": torch.equal(rows_to_full(local_tensor(sharded) * 2, like=sharded), full * 2),
            "column_absmax": torch.equal(column_absmax(sharded), full.abs().amax(dim=0)),
        }
        local_tensor(sharded).zero_()
        results[rows]["write_reaches_shard"] = not bool(sharded.full_tensor().any())
    mesh_2d = init_device_mesh("cpu", (1, world_size))
    try:
        local_rows(distribute_tensor(torch.zeros(4, 4), mesh_2d, [Replicate(), Shard(0)]))
        results["2d"] = None
    except ValueError as error:
        results["2d"] = str(error)
    torch.save(results, f"{out_dir}/rank{rank}.pt")
    dist.destroy_process_group()


@pytest.mark.slow
def test_shards_are_torch_chunk_rows_and_gather_back(tmp_path):
    run_ranks(shard_checks, (2, str(tmp_path / "init"), str(tmp_path)))
    for rank in (0, 1):
        results = torch.load(tmp_path / f"rank{rank}.pt", weights_only=True)
        for rows in ROWS:
            found = results[rows]
            start, stop = found["rows"]
            assert (start, stop) == (found["expected"] or (start, start)), (rank, rows)
            assert all(found[key] for key in ("local_is_those_rows", "gathered", "column_absmax",
                                              "write_reaches_shard")), (rank, rows, found)
        assert "1-D mesh" in results["2d"]
    assert torch.load(tmp_path / "rank1.pt", weights_only=True)[1]["rows"] == (1, 1)  # 1 row: rank 1 holds none
