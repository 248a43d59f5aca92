"""scripts/tune/moe.py on the CPU (Triton's interpreter), a tiny layer: rows come out for the pick and its
neighbours, checked against the reference, and bad arguments are refused. The candidates are cut to the
pick and the next one to keep the interpreter's time short."""
import json

import pytest

from compress_kernels.moe.dispatch import pick
from scripts.tune import moe


@pytest.fixture
def few_candidates(monkeypatch):
    full = moe.candidates
    monkeypatch.setattr(moe, "candidates", lambda *args: full(*args)[:2])


@pytest.mark.parametrize("scheme,group", [("w4a16", "64"), ("w8a8", "0"), ("w8a16", "128")])
def test_rows_for_the_pick_and_another(tmp_path, few_candidates, scheme, group):
    out = tmp_path / "moe.json"
    rows = moe.main(["--scheme", scheme, "--group", group, "--shapes", "128x128", "--m", "1", "--experts", "4",
                     "--warmup-ms", "0", "--rep-ms", "1", "--out", str(out)])
    assert len(rows) == 2 and [r["picked"] for r in rows] == [True, False]
    assert all(r["ok"] and r["ms"] > 0 and r["op"] == f"moe_{scheme}" for r in rows), rows
    assert json.loads(out.read_text()) == rows


def test_candidates_stay_within_what_the_kernels_take():
    picked = pick("w4a16", 64, 8, 1024, 1024, 512, 32, 32, "cpu")  # 16 rows, groups of 32: 32-deep tiles
    for cfg in moe.candidates(picked, [], "w4a16", 32):
        assert cfg.gate_up.block_k <= 32 and cfg.down.block_k <= 32 and cfg.gate_up.split_k == 1
    one_row = pick("w4a16", 2, 8, 1024, 1024, 512, 128, 128, "cpu")
    assert one_row.block_m == 1 and all(c.down.num_stages == one_row.down.num_stages
                                        for c in moe.candidates(one_row, [], "w4a16", 128))


@pytest.mark.parametrize("argv", [["--scheme", "w8a16", "--group", "64"], ["--top-k", "9"], ["--m", "0"],
                                  ["--shapes", "64"]])
def test_bad_arguments_are_refused(argv):
    with pytest.raises(SystemExit):
        moe.main(argv)
