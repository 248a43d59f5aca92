"""scripts/tune/sweep.py: option parsing, neighbouring configs, the rows of one case and the reference check."""
import argparse
import json

import pytest
import torch

from compress_kernels.w8a8.dispatch import TileConfig
from scripts.tune import sweep


def test_lists_parse_and_bad_ones_are_refused():
    assert sweep.parse_ints("1,16, 64") == [1, 16, 64]
    assert sweep.parse_shapes("4096x11008,64X48") == [(4096, 11008), (64, 48)]
    for bad in ("0", "a,2", ""):
        with pytest.raises(argparse.ArgumentTypeError, match="expected"):
            sweep.parse_ints(bad)
    for bad in ("4096", "4096x", "0x8", "4x4x4"):
        with pytest.raises(argparse.ArgumentTypeError, match="expected shapes KxN"):
            sweep.parse_shapes(bad)


def test_neighbours_change_one_field_within_bounds():
    cfg = TileConfig(16, 64, 256, num_warps=4, num_stages=1)
    found = sweep.neighbours(cfg, {"block_n": sweep.halve_double(16, 64), "num_stages": sweep.stages})
    assert found == [cfg._replace(block_n=32), cfg._replace(num_stages=2)]  # 128 too wide, 0 stages refused


def test_set_count_spans_l2_within_the_cap():
    args = argparse.Namespace(rotate_l2=4.0, max_sets=16)
    cpu = torch.device("cpu")  # an H100's 50 MiB of L2
    assert sweep.set_count(100 * 2**20, cpu, args) == 2
    assert sweep.set_count(1, cpu, args) == 16


def test_a_case_gives_a_row_per_config_and_flags_a_wrong_output(tmp_path):
    args = sweep.argument_parser("w8a8", "test", "8x8", "1").parse_args(["--warmup-ms", "0", "--rep-ms", "1",
                                                                  "--out", str(tmp_path / "rows.json")])
    x, w = torch.randn(2, 8).half(), torch.randn(4, 8).half()
    good, wrong = TileConfig(16, 16, 16), TileConfig(16, 32, 16)
    run = lambda cfg, s: s[0].float() @ s[1].float().T * (1 if cfg == good else 2)  # noqa: E731
    rows = sweep.time_case({"op": "t", "K": 8, "N": 4, "M": 2, "dtype": "fp16"}, [good, wrong], good, [(x, w)],
                           run, lambda s: s[0].float() @ s[1].float().T, 1e-3, [(x, w)], args)
    assert [(r["picked"], r["ok"]) for r in rows] == [(True, True), (False, False)]
    assert all(r["ms"] > 0 and r["fp16_ms"] > 0 and r["error"] is None for r in rows)
    sweep.report(rows, args)
    assert json.loads((tmp_path / "rows.json").read_text())[0]["config"]["block_n"] == 16


def test_a_config_that_fails_is_a_row_with_its_error():
    args = sweep.argument_parser("w8a8", "test", "8x8", "1").parse_args(["--warmup-ms", "0", "--rep-ms", "1"])
    x, w = torch.randn(2, 8).half(), torch.randn(4, 8).half()

    def run(cfg, s):
        raise RuntimeError("out of resources")

    rows = sweep.time_case({"op": "t", "K": 8, "N": 4, "M": 2, "dtype": "fp16"}, [TileConfig(16, 16, 16)], None,
                           [(x, w)], run, lambda s: x, 1e-3, [(x, w)], args)
    assert rows[0]["ms"] is None and not rows[0]["ok"] and rows[0]["error"] == "RuntimeError: out of resources"
