"""scripts/tune/w8a8.py on the CPU (Triton's interpreter), a tiny shape: rows come out, checked, and bad
arguments are refused. The neighbours are cut to one per case to keep the interpreter's time short."""
import json

import pytest

from scripts.tune import w8a8


@pytest.fixture
def few_neighbours(monkeypatch):
    full = w8a8.candidates
    monkeypatch.setattr(w8a8, "candidates", lambda cfg: full(cfg)[:2])


def test_rows_for_the_pick_and_a_neighbour(tmp_path, few_neighbours):
    out = tmp_path / "w8a8.json"
    rows = w8a8.main(["--shapes", "64x48", "--m", "1,17", "--max-sets", "1", "--warmup-ms", "0", "--rep-ms", "1",
                      "--out", str(out)])
    assert len(rows) == 4 and [r["picked"] for r in rows] == [True, False, True, False]
    assert [r["config"]["path"] for r in rows] == ["gemv", "gemv", "tiled", "tiled"]
    assert all(r["ok"] and r["rel_err"] <= 1e-3 and r["ms"] > 0 and r["ratio_vs_fp16"] > 0 for r in rows)
    assert json.loads(out.read_text()) == rows


def test_tma_tiles_keep_their_k_unsplit():
    from compress_kernels.w8a8.dispatch import TMA_TILE

    assert all(c.split_k == 1 and c.path == "tma" for c in w8a8.candidates(TMA_TILE))


@pytest.mark.parametrize("argv", [["--shapes", "64"], ["--m", "0"], ["--dtype", "fp8"], ["--max-sets", "0"]])
def test_bad_arguments_are_refused(argv):
    with pytest.raises(SystemExit):
        w8a8.main(argv)
