"""scripts.bench.kernels on the CPU (``--cpu-check``: tiny shapes, the anchors' CPU branches and the
references): the sweep end to end, ratios, target evaluation, the JSON writer.
"""
import json

import pytest

from scripts.bench import kernels as bench


def test_cpu_check_writes_json(tmp_path):
    out = tmp_path / "r.json"
    bench.main(["--cpu-check", "--no-progress", "--shapes", "128x64", "--m", "1,16", "--out", str(out)])
    report = json.loads(out.read_text())
    settings = report["environment"]["settings"]
    assert report["environment"]["torch"] and settings["cpu_check"] is True
    assert settings["graph_max_m"] == bench.GRAPH_EVERY_M and settings["rotate_mb"] == 0.1
    kernels = {r["kernel"] for r in report["results"]}
    assert kernels == {"cublas_fp16", "torch_int_mm_w8a8", "torch_int_mm_w8a8_block", "tinygemm_int4_g128",
                       "torch_weight_int8pack_w8a16", "torch_bsr_50", "torch_bsr_75", "torch_bsr_90", "ours_w8a8",
                       "ours_w8a8_block", "ours_w4a16_g128", "ours_w8a16", "ours_w8a16_g128", "ours_dds_50",
                       "ours_dds_75", "ours_dds_90", "ours_dds_w8a8_50", "ours_dds_w8a8_90", "ours_dds_w4a16_50",
                       "ours_dds_w4a16_90", "ours_dds_tiles4_50", "ours_dds_tiles4_75"}
    assert len(report["results"]) == 22 * 2
    for r in report["results"]:
        assert "error" not in r, r
        assert r["ms"] > 0 and r["ratio_vs_cublas"] > 0 and r["K"] == 128 and r["N"] == 64
        assert r["graph"] is False and r["sets"] >= 1
    by_kernel = {(r["kernel"], r["M"]): r for r in report["results"]}
    for m in (1, 16):
        assert by_kernel[("ours_dds_90", m)]["rel_err"] < 1e-2 and "ratio_vs_torch_bsr" in by_kernel[("ours_dds_90", m)]
        assert by_kernel[("torch_bsr_90", m)]["rel_err"] < 1e-2  # the anchor's CPU branch, against fp32
        assert all("ratio_vs_anchor" in by_kernel[(name, m)]
                   for name in ("ours_w8a8", "ours_w4a16_g128", "ours_w8a16", "ours_w8a8_block"))
        assert by_kernel[("ours_w8a8_block", m)]["ratio_vs_w8a8"] > 0
    names = {t["target"] for t in report["targets"]}
    assert any("DDS 90%" in n and "M<=16" in n for n in names)
    assert all(t["met"] in (True, False, None) for t in report["targets"])


def test_targets_from_stored_times():
    results = [
        {"kernel": "cublas_fp16", "K": 4096, "N": 4096, "M": 1, "ms": 0.02},
        {"kernel": "ours_dds_90", "K": 4096, "N": 4096, "M": 1, "sparsity": 90, "ms": 0.004},
        {"kernel": "torch_bsr_90", "K": 4096, "N": 4096, "M": 1, "sparsity": 90, "ms": 0.01},
        {"kernel": "ours_dds_50", "K": 4096, "N": 4096, "M": 1, "sparsity": 50, "error": "boom"},
    ]
    bench.add_ratios(results)
    met = {t["target"]: t for t in bench.evaluate_targets(results)}
    assert met["DDS 90% vs cuBLAS fp16, M<=16"]["met"] is True  # 0.02 / 0.004 = 5x >= 4x
    assert met["DDS 90% vs torch bsr_dense_mm, every shape and M"]["met"] is True
    assert met["DDS 50% vs cuBLAS fp16, M<=16"]["met"] is None  # only an error cell


def test_block_scaled_targets_against_cublas_and_our_per_channel_w8a8():
    results = [
        {"kernel": "cublas_fp16", "K": 4096, "N": 4096, "M": 2048, "ms": 0.1},
        {"kernel": "ours_w8a8", "K": 4096, "N": 4096, "M": 2048, "ms": 0.05},
        {"kernel": "ours_w8a8_block", "K": 4096, "N": 4096, "M": 2048, "ms": 0.0625},
    ]
    bench.add_ratios(results)
    assert results[2]["ratio_vs_cublas"] == 1.6 and results[2]["ratio_vs_w8a8"] == 0.8
    met = {t["target"]: t for t in bench.evaluate_targets(results)}
    assert met["W8A8 block-scaled vs cuBLAS fp16, M>=2048 (every shape)"]["met"] is True  # 1.6x >= 1.5x
    peer = ("W8A8 block-scaled vs our per-channel W8A8, M>=2048 "
            "(4096x4096, 4096x11008, 11008x4096, 8192x8192, 8192x28672)")
    assert met[peer]["met"] is False  # 0.8 < 0.9


def test_the_int8pack_anchor_is_timed_up_to_its_row_limit_only():
    report = bench.main(["--cpu-check", "--no-progress", "--shapes", "128x64", "--m", "1,257",
                         "--kernels", "torch_weight_int8pack_w8a16,ours_w8a16"])
    cells = {(r["kernel"], r["M"]): r for r in report["results"]}
    assert cells[("torch_weight_int8pack_w8a16", 257)]["error"] == "skipped: timed up to M = 256 only"
    assert "ratio_vs_anchor" in cells[("ours_w8a16", 1)] and "ratio_vs_anchor" not in cells[("ours_w8a16", 257)]
    assert cells[("ours_w8a16", 257)]["ms"] > 0


def test_kernel_filter_keeps_cublas_for_the_ratios(tmp_path):
    report = bench.main(["--cpu-check", "--no-progress", "--shapes", "128x64", "--m", "1", "--kernels", "ours_dds_9*"])
    assert [r["kernel"] for r in report["results"]] == ["cublas_fp16", "ours_dds_90"]


def test_no_graph_is_recorded_in_the_settings():
    report = bench.main(["--cpu-check", "--no-progress", "--shapes", "128x64", "--m", "1", "--kernels", "cublas_fp16",
                         "--no-graph"])
    assert report["environment"]["settings"]["graph_max_m"] == 0


@pytest.mark.parametrize("argv", [["--shapes", "4096by4096"], ["--m", "1,x"], ["--graph-max-m", "64"]])
def test_bad_options_are_refused(argv):
    with pytest.raises(SystemExit):
        bench.main([*argv, "--cpu-check"])


def test_fraction_of_limit_target_per_kernel_on_large_shapes_at_small_m():
    results = [
        {"kernel": "ours_w8a8", "K": 4096, "N": 4096, "M": 1, "ms": 0.01, "fraction_of_limit": 0.85},
        {"kernel": "ours_w8a8", "K": 4096, "N": 4096, "M": 16, "ms": 0.01, "fraction_of_limit": 0.6},
        {"kernel": "ours_w8a8", "K": 1024, "N": 1024, "M": 1, "ms": 0.01, "fraction_of_limit": 0.1},  # small shape
    ]
    met = {t["target"]: t for t in bench.evaluate_targets(results)}
    row = met["ours_w8a8: fraction of its limit, M<=16 (K, N >= 4096)"]
    assert (row["cells"], row["cells_met"], row["worst"], row["met"], row["unit"]) == (2, 1, 0.6, False, "fraction")


def test_retarget_judges_a_stored_run_on_its_own_timings(tmp_path):
    stored = {"environment": {"gpu": "NVIDIA H200"}, "targets": [], "results": [
        {"kernel": "cublas_fp16", "K": 4096, "N": 11008, "M": 1, "ms": 0.03, "gbps": 3000.0},
        {"kernel": "ours_w4a16_g128", "K": 4096, "N": 11008, "M": 1, "ms": 0.01, "gbps": 2400.0},
    ]}
    path = tmp_path / "kernels-h200.json"
    path.write_text(json.dumps(stored))
    bench.main(["--retarget", str(path)])
    report = json.loads(path.read_text())
    assert [r["ms"] for r in report["results"]] == [0.03, 0.01]  # timings kept as measured
    met = {t["target"]: t for t in report["targets"]}
    target = "W4A16 g128 near the limit vs cuBLAS fp16, M<=1 (4096x11008, 11008x4096, 8192x8192, 8192x28672)"
    assert met[target]["met"] is True
    assert report["results"][1]["fraction_of_limit"] == 0.8
    assert not list(tmp_path.glob("*.partial"))


def test_every_target_has_its_own_name():
    results = [{"kernel": name, "K": 4096, "N": 4096, "M": m, "ms": 0.01, "ratio_vs_cublas": 1.0,
                "ratio_vs_anchor": 1.0, "ratio_vs_torch_bsr": 1.0, "ratio_vs_w8a8": 1.0, "fraction_of_limit": 0.5}
               for name in ("ours_w4a16_g128", "ours_w8a8", "ours_w8a16", "ours_w8a8_block", "ours_dds_50",
                            "ours_dds_90", "ours_dds_tiles4_50", "ours_dds_tiles4_75") for m in (1, 16, 64, 2048)]
    names = [t["target"] for t in bench.evaluate_targets(results)]
    assert len(names) == len(set(names))
