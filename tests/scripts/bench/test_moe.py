"""scripts.bench.moe on the CPU (``--cpu-check``: tiny Mixtral shapes in fp32, the references): every model,
variant and token count timed and checked against float and the loop, the ratios and targets, the JSON
writer, bad options refused."""
import json

import pytest

from scripts.bench import moe as bench

pytest.importorskip("transformers")


def test_cpu_check_writes_json_with_every_model_variant_and_token_count(tmp_path):
    out = tmp_path / "moe.json"
    report = bench.main(["--cpu-check", "--out", str(out)])
    assert json.loads(out.read_text()) == report
    cells = {(r["model"], r["variant"], r["tokens"]) for r in report["results"]}
    assert cells == {(m, v, t) for m in bench.MODELS for v in bench.DEFAULT_VARIANTS for t in bench.CPU_TOKENS}
    for r in report["results"]:
        assert r["ms"] > 0 and r["graph"] is False and r["ratio_vs_float"] > 0
        assert r["rel_err_vs_float"] < (0.5 if r["variant"].startswith("w4a16") else 5e-2), r  # tiny K: coarse int4
        if r["variant"].endswith("grouped") and "rel_err_vs_loop" in r:
            assert r["rel_err_vs_loop"] < 1e-5, r  # the same modules' numbers, grouped or looped
        if r["variant"].endswith("loop"):
            assert "experts_ms" not in r
        else:  # the experts alone on the routed inputs: a share of the whole call
            assert r["experts_ms"] > 0 and r["experts_share"] == r["experts_ms"] / r["ms"]
    assert set(report["ratios"]) == set(bench.MODELS)
    assert report["config"]["models"]["mixtral-layer"]["float_experts_implementation"]
    assert [t["target"] for t in report["targets"]] == [
        "w4a16-grouped >= 2.5x float at 1-8 tokens", "w4a16-grouped >= 1.0x float at 512 tokens",
        "w8a8-grouped >= 1.6x float at 1-8 tokens", "w8a8-grouped >= 1.2x float at 512 tokens"]


def test_a_subset_of_models_variants_and_tokens():
    report = bench.main(["--cpu-check", "--models", "small-model", "--variants", "w8a16-grouped,float",
                         "--tokens", "2"])
    assert [(r["variant"], r["tokens"]) for r in report["results"]] == [("float", 2), ("w8a16-grouped", 2)]


def test_targets_from_stored_times():
    results = [{"model": "m", "variant": "float", "tokens": t, "ms": 1.0} for t in (1, 8, 512)]
    results += [{"model": "m", "variant": "w4a16-grouped", "tokens": 1, "ms": 0.3},
                {"model": "m", "variant": "w4a16-grouped", "tokens": 8, "ms": 0.5},
                {"model": "m", "variant": "w8a8-grouped", "tokens": 512, "ms": 0.8}]
    ratios = bench.add_ratios(results)
    assert ratios["m"]["8"]["w4a16-grouped"] == 2.0
    verdicts = {t["target"]: (t["met"], t["worst"]) for t in bench.targets(results)}
    assert verdicts["w4a16-grouped >= 2.5x float at 1-8 tokens"] == (False, 2.0)
    assert verdicts["w8a8-grouped >= 1.2x float at 512 tokens"] == (True, 1.25)
    assert verdicts["w4a16-grouped >= 1.0x float at 512 tokens"] == (None, None)


@pytest.mark.parametrize("argv", [["--variants", "float,magic"], ["--models", "gpt"], ["--tokens", "x"]])
def test_bad_options_are_refused(argv):
    with pytest.raises(SystemExit):
        bench.main([*argv, "--cpu-check"])
