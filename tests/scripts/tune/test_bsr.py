"""scripts/tune/bsr.py on the CPU (Triton's interpreter), a tiny shape: rows come out for DDS and DDS +
W8A8, checked, and bad arguments are refused. The neighbours are cut to one per case."""
import pytest

from compress_kernels.bsr.dispatch import DENSE, BsrConfig
from scripts.tune import bsr


@pytest.fixture
def few_neighbours(monkeypatch):
    full = bsr.candidates
    monkeypatch.setattr(bsr, "candidates", lambda cfg, int8: full(cfg, int8)[:2])


@pytest.mark.parametrize("int8", [False, True])
def test_rows_for_the_pick_and_a_neighbour(int8, few_neighbours):
    rows = bsr.main(["--shapes", "64x64", "--m", "17", "--sparsity", "50", "--max-sets", "1", "--warmup-ms", "0",
                     "--rep-ms", "1", *(["--int8"] if int8 else [])])
    assert len(rows) == 2 and [r["picked"] for r in rows] == [True, False]
    assert all(r["ok"] and r["sparsity"] == 50 and r["op"] == ("bsr_w8a8" if int8 else "bsr") for r in rows)


def test_neighbours_stay_on_the_kernel():
    assert bsr.candidates(DENSE, False) == [DENSE]
    gemv = bsr.candidates(BsrConfig("gemv", 1, 8, 16, 4, 3), False)
    assert all(c.kernel == "gemv" and c.block_m == 1 and c.split == 1 and 8 <= c.block_n <= 32 for c in gemv)


@pytest.mark.parametrize("argv", [["--sparsity", "120"], ["--sparsity", "x"], ["--shapes", "48x64"]])
def test_bad_arguments_are_refused(argv):
    with pytest.raises(SystemExit):
        bsr.main([*argv, "--m", "1", "--max-sets", "1"])
