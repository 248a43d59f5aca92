"""Smoke test of scripts/bench_kernels.py's plumbing on the CPU (``--cpu-check``: tiny shapes,
reference ops): weight sets, rotation, timing, ratios, target evaluation, JSON and Markdown writers.
"""
import importlib.util
import json
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_kernels.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_kernels", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the file executes
    spec.loader.exec_module(module)
    return module


def test_cpu_check_writes_json_and_markdown(bench, tmp_path):
    out, md = tmp_path / "r.json", tmp_path / "k.md"
    bench.main(["--cpu-check", "--no-progress", "--shapes", "128x64", "--m", "1,16",
                "--kernels", "cublas_fp16,ours_dds_*,torch_bsr_90,ours_w4a16_g128", "--out", str(out), "--markdown", str(md)])
    report = json.loads(out.read_text())
    assert report["environment"]["torch"] and report["environment"]["settings"]["cpu_check"] is True
    kernels = {r["kernel"] for r in report["results"]}
    assert kernels == {"cublas_fp16", "ours_dds_50", "ours_dds_75", "ours_dds_90", "ours_dds_w8a8_50", "ours_dds_w8a8_90",
                       "torch_bsr_90", "ours_w4a16_g128"}
    assert len(report["results"]) == 8 * 2
    for r in report["results"]:
        assert "error" not in r, r
        assert r["ms"] > 0 and r["ratio_vs_cublas"] > 0 and r["K"] == 128 and r["N"] == 64
    dds90 = [r for r in report["results"] if r["kernel"] == "ours_dds_90"]
    assert all("ratio_vs_torch_bsr" in r and r["rel_err"] < 1e-2 for r in dds90)
    names = {t["target"] for t in report["targets"]}
    assert any("DDS 90%" in n and "M<=16" in n for n in names)
    assert all(t["met"] in (True, False, None) for t in report["targets"])
    text = md.read_text()
    assert "## Targets" in text and "| 128x64 | 16 |" in text


def test_markdown_from_json_needs_no_timing(bench, tmp_path):
    report = {
        "environment": {"gpu": "test GPU", "torch": "x", "triton": "y", "cuda": "z", "date": "d"},
        "results": [
            {"kernel": "cublas_fp16", "K": 4096, "N": 4096, "M": 1, "ms": 0.02},
            {"kernel": "ours_dds_90", "K": 4096, "N": 4096, "M": 1, "sparsity": 90, "ms": 0.004},
            {"kernel": "torch_bsr_90", "K": 4096, "N": 4096, "M": 1, "sparsity": 90, "ms": 0.01},
            {"kernel": "ours_dds_50", "K": 4096, "N": 4096, "M": 1, "sparsity": 50, "error": "boom"},
        ],
    }
    bench.add_ratios(report["results"])
    report["targets"] = bench.evaluate_targets(report["results"])
    src, md = tmp_path / "in.json", tmp_path / "out.md"
    src.write_text(json.dumps(report))
    bench.main(["--from-json", str(src), "--markdown", str(md)])
    text = md.read_text()
    met = {t["target"]: t for t in report["targets"]}
    assert met["DDS 90% vs cuBLAS fp16, M<=16"]["met"] is True  # 0.02 / 0.004 = 5x >= 4x
    assert met["DDS 90% vs torch bsr_dense_mm, every shape and M"]["met"] is True
    assert met["DDS 50% vs cuBLAS fp16, M<=16"]["met"] is None  # only an error cell
    assert "test GPU" in text and "5.00x" in text and "boom" in text


def test_bad_shapes_option_is_refused(bench):
    with pytest.raises(SystemExit):
        bench.main(["--shapes", "4096by4096", "--cpu-check"])


def test_block_mask_has_exact_sparsity(bench):
    import torch

    mask = bench.random_block_mask(256, 512, 75, torch.Generator().manual_seed(0), torch.device("cpu"))
    assert mask.shape == (8, 16) and int((~mask).sum()) == round(0.75 * 128)
    crow, col, values = bench.bsr_parts_from_mask(mask, torch.float16, torch.Generator().manual_seed(1), torch.device("cpu"))
    assert crow[-1] == col.shape[0] == values.shape[0] == int(mask.sum())
