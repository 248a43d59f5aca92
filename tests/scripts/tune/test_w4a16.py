"""scripts/tune/w4a16.py on the CPU (Triton's interpreter), a tiny shape: rows come out, checked, and bad
arguments are refused. The neighbours are cut to one per case to keep the interpreter's time short."""
import pytest

from compress_kernels.w4a16.dispatch import TileConfig
from scripts.tune import w4a16


@pytest.fixture
def few_neighbours(monkeypatch):
    full = w4a16.candidates
    monkeypatch.setattr(w4a16, "candidates", lambda cfg: full(cfg)[:2])


def test_rows_for_the_pick_and_a_neighbour(few_neighbours):
    rows = w4a16.main(["--shapes", "128x48", "--m", "1,17", "--group", "32", "--scales", "act", "--max-sets", "1",
                       "--warmup-ms", "0", "--rep-ms", "1"])
    assert len(rows) == 4 and [r["picked"] for r in rows] == [True, False, True, False]
    assert [r["config"]["path"] for r in rows] == ["wholek", "wholek", "tiled", "tiled"]
    assert all(r["ok"] and r["group"] == 32 and r["scales"] == "act" and r["ms"] > 0 for r in rows)


def test_each_path_keeps_to_the_configs_it_takes():
    assert w4a16.candidates(TileConfig(0, 0, 0, path="dequant")) == [TileConfig(0, 0, 0, path="dequant")]
    wholek = w4a16.candidates(TileConfig(1, 16, 128, num_warps=8, num_stages=1, path="wholek"))
    assert all(c.split_k == 1 and c.num_stages == 1 and c.block_k == 128 for c in wholek)


@pytest.mark.parametrize("argv", [["--group", "48"], ["--scales", "int8"], ["--shapes", "100x48", "--group", "32"]])
def test_bad_arguments_are_refused(argv):
    with pytest.raises(SystemExit):
        w4a16.main([*argv, "--m", "1", "--max-sets", "1"])
