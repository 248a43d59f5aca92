"""scripts.bench.block_chain on the CPU (``--cpu-check``: tiny shapes, the references): every variant
computes the chain, the ratios and targets, the JSON writer, bad options refused."""
import json

import pytest

from scripts.bench import block_chain as bench


def test_cpu_check_writes_json_with_every_variant(tmp_path):
    out = tmp_path / "chain.json"
    report = bench.main(["--cpu-check", "--m", "1,3", "--out", str(out)])
    assert json.loads(out.read_text()) == report
    assert {r["variant"] for r in report["results"]} == set(bench.VARIANTS) and len(report["results"]) == 8
    for r in report["results"]:
        assert r["ms"] > 0 and r["ratio_vs_fused"] > 0 and r["graph"] is False
        # fused and float compute the reference chain; separate quantizes before the GELU; fp16 has no int8 noise
        assert r["rel_err"] < (1e-6 if r["variant"] in ("fused", "float") else 5e-2), r
    assert {t["target"] for t in report["targets"]} == {"fused chain faster than separate",
                                                         "fused chain faster than float"}


def test_targets_from_stored_times():
    results = [{"variant": "fused", "H": 1, "F": 2, "M": 1, "ms": 1.0},
               {"variant": "separate", "H": 1, "F": 2, "M": 1, "ms": 1.5},
               {"variant": "float", "H": 1, "F": 2, "M": 1, "ms": 0.9}]
    bench.add_ratios(results)
    met = {t["target"]: t["met"] for t in bench.targets(results)}
    assert met == {"fused chain faster than separate": True, "fused chain faster than float": False}


@pytest.mark.parametrize("argv", [["--variants", "fused,magic"], ["--shapes", "4096by11008"], ["--m", "x"]])
def test_bad_options_are_refused(argv):
    with pytest.raises(SystemExit):
        bench.main([*argv, "--cpu-check"])
