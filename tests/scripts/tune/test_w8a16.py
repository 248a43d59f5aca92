"""scripts/tune/w8a16.py on the CPU (Triton's interpreter), a tiny shape: rows come out, checked, and bad
arguments are refused. The neighbours are cut to one per case to keep the interpreter's time short."""
import pytest

from compress_kernels.w8a16.dispatch import TileConfig
from scripts.tune import w8a16


@pytest.fixture
def few_neighbours(monkeypatch):
    full = w8a16.candidates
    monkeypatch.setattr(w8a16, "candidates", lambda cfg: full(cfg)[:2])


@pytest.mark.parametrize("group", ["0", "128"])
def test_rows_for_the_pick_and_a_neighbour(group, few_neighbours):
    rows = w8a16.main(["--shapes", "256x48", "--m", "1,17", "--group", group, "--max-sets", "1",
                       "--warmup-ms", "0", "--rep-ms", "1"])
    assert len(rows) == 4 and [r["picked"] for r in rows] == [True, False, True, False]
    assert [r["config"]["path"] for r in rows] == ["gemv", "gemv", "tiled", "tiled"]
    assert all(r["ok"] and r["group"] == (int(group) or "channel") and r["ms"] > 0 for r in rows)


def test_each_path_keeps_to_the_configs_it_takes():
    gemv = w8a16.candidates(TileConfig(1, 8, 1024, path="gemv", num_stages=1))
    assert all(c.num_stages == 1 and c.block_m == 1 for c in gemv) and len(gemv) > 1
    tiled = w8a16.candidates(TileConfig(16, 64, 128, num_stages=4))
    assert {c.num_stages for c in tiled} == {3, 4, 5} and all(c.block_m >= 16 for c in tiled)


@pytest.mark.parametrize("argv", [["--group", "64"], ["--shapes", "100x48"], ["--shapes", "136x48", "--group", "128"]])
def test_bad_arguments_are_refused(argv):
    with pytest.raises(SystemExit):
        w8a16.main([*argv, "--m", "1", "--max-sets", "1"])
