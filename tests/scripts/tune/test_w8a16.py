"""scripts/tune/w8a16.py on the CPU (Triton's interpreter), a tiny shape: rows come out, checked, and bad
arguments are refused. The neighbours are cut to one per case to keep the interpreter's time short."""
import pytest
import torch

from compress_kernels.w8a16.dispatch import TileConfig
from scripts.tune import w8a16


@pytest.fixture
def few_neighbours(monkeypatch):
    full = w8a16.candidates
    monkeypatch.setattr(w8a16, "candidates", lambda cfg, *shape: full(cfg, *shape)[:2])


@pytest.mark.parametrize("group", ["0", "128"])
def test_rows_for_the_pick_and_a_neighbour(group, few_neighbours):
    rows = w8a16.main(["--shapes", "256x48", "--m", "1,17", "--group", group, "--max-sets", "1",
                       "--warmup-ms", "0", "--rep-ms", "1"])
    assert len(rows) == 4 and [r["picked"] for r in rows] == [True, False, True, False]
    assert [r["config"]["path"] for r in rows] == ["gemv", "gemv", "tiled", "tiled"]
    assert all(r["ok"] and r["group"] == (int(group) or "channel") and r["ms"] > 0 for r in rows)


CPU = torch.device("cpu")


def test_each_path_keeps_to_the_configs_it_takes():
    gemv = w8a16.candidates(TileConfig(1, 8, 1024, path="gemv", num_stages=1), 1, 4096, 4096, False, CPU)
    assert all(c.num_stages == 1 and c.block_m == 1 and c.path == "gemv" for c in gemv) and len(gemv) > 1
    assert all(c.block_n * c.block_k <= 16384 for c in gemv if c.block_n > 16)  # wider tiles: shallower steps
    assert {512, 2048} <= {c.block_k for c in gemv if c.block_n == 8}  # the K step halved and doubled
    grouped = w8a16.candidates(TileConfig(1, 8, 128, path="gemv", num_stages=1), 1, 4096, 4096, True, CPU)
    assert all(c.block_k <= 128 for c in grouped) and {16, 32, 64} <= {c.block_n for c in grouped}
    tiled = w8a16.candidates(TileConfig(16, 64, 128, num_stages=4), 16, 4096, 4096, False, CPU)
    assert {c.num_stages for c in tiled} == {3, 4, 5} and all(c.block_m >= 16 for c in tiled)
    assert all(c.path == "tiled" for c in tiled)


def test_from_large_m_the_tiles_and_the_dequant_path_are_timed_against_each_other():
    tiled = w8a16.candidates(TileConfig(128, 128, 64, num_warps=8, num_stages=4), 256, 4096, 4096, False, CPU)
    assert tiled[-1].path == "dequant"
    dequant = w8a16.candidates(TileConfig(0, 0, 0, path="dequant"), 2048, 4096, 4096, False, CPU)
    assert [c.path for c in dequant] == ["dequant"] * 4 + ["tiled"]


@pytest.mark.parametrize("argv", [["--group", "64"], ["--shapes", "100x48"], ["--shapes", "136x48", "--group", "128"]])
def test_bad_arguments_are_refused(argv):
    with pytest.raises(SystemExit):
        w8a16.main([*argv, "--m", "1", "--max-sets", "1"])
