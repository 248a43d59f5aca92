"""Tests of scripts/bench/pages.py: pages written from small fixture JSON, ``--check``, bad input, and the
committed pages against the committed JSON."""
import json
import re

import pytest

from scripts.bench import pages
from tests.scripts.bench.test_llm_sections import generate_data, post_training_data, pruning_run, sweep_data


def kernel_report(gpu):
    """Two shapes at M = 1: cuBLAS, ours (W8A8, DDS 50%) and their PyTorch anchors, as the benchmark writes them."""
    results = []
    for k, n, base in ((1024, 1024, 0.004), (4096, 4096, 0.016)):
        results += [
            {"kernel": "cublas_fp16", "K": k, "N": n, "M": 1, "sparsity": None, "ms": base, "ratio_vs_cublas": 1.0},
            {"kernel": "torch_int_mm_w8a8", "K": k, "N": n, "M": 1, "sparsity": None, "ms": 4 * base,
             "ratio_vs_cublas": 0.25},
            {"kernel": "ours_w8a8", "K": k, "N": n, "M": 1, "sparsity": None, "ms": base / 1.5,
             "ratio_vs_cublas": 1.5, "ratio_vs_anchor": 6.0},
            {"kernel": "torch_bsr_50", "K": k, "N": n, "M": 1, "sparsity": 50, "ms": 2 * base, "ratio_vs_cublas": 0.5},
            {"kernel": "ours_dds_50", "K": k, "N": n, "M": 1, "sparsity": 50, "ms": base, "ratio_vs_cublas": 1.0,
             "ratio_vs_torch_bsr": 2.0},
        ]
    results.append({"kernel": "ours_dds_50", "K": 8192, "N": 8192, "M": 1, "sparsity": 50, "error": "skipped: OOM"})
    targets = [{"target": "W8A8 vs cuBLAS fp16, M<=16", "goal": ">= 1.6x", "cells": 2, "cells_met": 0, "worst": 1.5,
                "worst_at": "1024x1024 M=1", "met": False},
               {"target": "ours_w8a8 vs torch_int_mm_w8a8", "goal": "> 1x", "cells": 2, "cells_met": 2, "worst": 6.0,
                "worst_at": "1024x1024 M=1", "met": True}]
    env = {"gpu": gpu, "torch": "2.x", "triton": "3.x", "cuda": "13.0", "date": "2026-01-01 00:00:00",
           "sweep_seconds": 1.0, "settings": {"rotate_mb": 200.0}}
    return {"environment": env, "results": results, "targets": targets}


def decode_report(gpu):
    def variant(name, ms, weight_bytes):
        return {"variant": name, "weight_bytes": weight_bytes,
                "batches": [{"batch": 1, "tokens_per_s": 1e3 / ms, "ms_per_step": ms, "cuda_graph": True,
                             "decoder_weight_tb_per_s": weight_bytes / (ms * 1e-3) / 1e12,
                             "first_step_logits_rel_err_vs_eager": 5e-3}]}

    return {"benchmark": "decode", "environment": {"gpu": gpu, "torch": "2.x", "triton": "3.x"},
            "config": {"layers": 2, "steps": 4, "prompt_len": 4, "repeats": 3, "compile_backend": "inductor",
                       "fused_siblings": True, "model": {"hidden_size": 64}},
            "results": [variant("fp16", 6.0, 12e9), variant("w4a16", 3.0, 3e9)],
            "ratios": {"1": {"fp16": {"vs_fp16": 1.0}, "w4a16": {"vs_fp16": 2.0}}},
            "targets": {"w4a16 >= 2.0x fp16 (batch 1)": True, "dds90 >= 3x fp16 (batch 1)": None},
            "skipped": [{"variant": "dds90", "reason": "time budget of 1 s spent"}], "failed": [],
            "provenance": {"commit": "abc1234", "note": "the fixture's code"}}


def moe_report(gpu):
    """One MoE layer at 1 and 8 tokens: float, a loop and a grouped variant, as the MoE benchmark writes them."""
    def record(variant, tokens, ms, **extra):
        return {"model": "layer", "variant": variant, "tokens": tokens, "ms": ms, "graph": True,
                "ratio_vs_float": {1: 0.4, 8: 0.8}[tokens] / ms, **extra}

    results = [record("float", 1, 0.4), record("float", 8, 0.8),
               record("w4a16-loop", 1, 0.8, rel_err_vs_float=0.2), record("w4a16-loop", 8, 1.6, rel_err_vs_float=0.21),
               record("w4a16-grouped", 1, 0.1, rel_err_vs_float=0.2, rel_err_vs_loop=3e-3),
               record("w4a16-grouped", 8, 0.4, rel_err_vs_float=0.2, rel_err_vs_loop=4e-3)]
    return {"environment": {"gpu": gpu, "torch": "2.x", "triton": "3.x", "transformers": "5.x", "cuda": "13.0"},
            "config": {"models": {"layer": {"hidden": 64, "intermediate": 96, "experts": 4, "top_k": 2,
                                            "moe_layers": 1, "float_experts_implementation": "grouped_mm"}},
                       "tokens": [1, 8], "dtype": "bfloat16"},
            "results": results,
            "targets": [{"target": "w4a16-grouped >= 2.5x float at 1-8 tokens", "cells": 2, "worst": 2.0,
                         "worst_at": "layer T=8", "met": False}],
            "provenance": {"commit": "abc1234", "note": "the fixture's code"}}


def quality_run(variant, seed, value, metric="accuracy", counts_for=("metric",), latency=None, dense_latency=None,
                note=""):
    run = {"variant": variant, "recipe": f"recipes/{variant}.yaml", "seed": seed, metric: value, "steps": 100,
           "latency_ms": latency or {}, "counts_for": list(counts_for),
           "source": {"commit": "abc1234", "report": "runs/report.json", "model": variant}, "note": note}
    if dense_latency is not None:
        run["dense_latency_ms"] = dense_latency
    return run


def sst2_data():
    dense_ms = {"1": 0.30, "8": 0.40}
    return {"family": "sst2", "description": "A fixture model", "gpu": "GPU X", "environment": {"torch": "2.x"},
            "metric": "accuracy", "higher_is_better": True, "targets": {"w8a8-qat": 0.5, "sparse50": 1.5},
            "target_unit": "points",
            "runs": [quality_run("dense", 42, 0.90, counts_for=("metric", "speed"), latency=dense_ms,
                                 dense_latency=dense_ms),
                     quality_run("dense", 43, 0.88),
                     quality_run("w8a8-qat", 42, 0.899, counts_for=("metric", "speed"),
                                 latency={"1": 0.25, "8": 0.40}, dense_latency=dense_ms),
                     quality_run("sparse50", 42, 0.88),
                     quality_run("sparse50", 43, 0.87, note="stopped early")]}


def wikitext_data():
    return {"family": "wikitext", "description": "A fixture Llama", "gpu": "GPU X", "environment": {},
            "metric": "perplexity", "higher_is_better": False, "targets": {"w8a8-qat": 2.0}, "target_unit": "percent",
            "runs": [quality_run("dense", 0, 200.0, metric="perplexity"),
                     quality_run("w8a8-qat", 0, 206.0, metric="perplexity")]}


@pytest.fixture
def root(tmp_path):
    """A repository root holding the fixture JSON of every page."""
    results = tmp_path / "benchmarks" / "results"
    results.mkdir(parents=True)
    files = {"kernels-h100.json": kernel_report("GPU A"), "kernels-h200.json": {**kernel_report("GPU B"), "runs": [
                 {**kernel_report("GPU B"), "title": "tiles of 4 block rows"}]},
             "decode-h100.json": decode_report("GPU A"), "decode-h200.json": decode_report("GPU B"),
             "moe-h200.json": moe_report("GPU B"),
             "sst2-h100.json": sst2_data(), "wikitext-h100.json": wikitext_data(),
             "smollm2-h100.json": {**wikitext_data(), "family": "smollm2", "plot": "benchmarks/results/smollm2.png",
                                   "plot_note": "The plot's runs are older."},
             "smollm2-post-training-cpu.json": post_training_data(), "generate-h100.json": generate_data(),
             "generate-h200.json": generate_data(),
             "smollm2-h200.json": {"sweep": sweep_data(), "pruning": {"runs": [
                 pruning_run(0, {"blocks-50-obs": 30.0, "sparsegpt-2of4": 36.0})]}}}
    for name, data in files.items():
        (results / name).write_text(json.dumps(data))
    return tmp_path


@pytest.fixture
def written(root):
    """The pages written from the fixture JSON, by file name."""
    return {path.name: path.read_text() for path in pages.write_pages(root)}


def test_every_page_says_it_is_generated_and_from_which_json(written):
    assert sorted(written) == ["decode.md", "kernels.md", "moe.md", "smollm2.md", "sst2.md", "wikitext.md"]
    for p in pages.PAGES:
        text = written[p.name]
        assert text.startswith(f"# {p.title}\n")
        assert f"Generated by `{pages.COMMAND}`" in text
        for source in p.sources:
            assert f"[`benchmarks/results/{source}`](../../benchmarks/results/{source})" in text


EXPECTED_LINES = [
    # kernels: both GPUs, every cell's ratio to cuBLAS, ours against its anchor, targets, what was not measured
    ("kernels.md", "## GPU A"),
    ("kernels.md", "## GPU B"),
    ("kernels.md", "## GPU B: tiles of 4 block rows"),
    ("kernels.md", "| K x N | M | cuBLAS fp16 us | ours_w8a8 | ours_dds_50 | torch_int_mm_w8a8 | torch_bsr_50 |"),
    ("kernels.md", "| 4096x4096 | 1 | 16.0 | 1.50x | 1.00x | 0.25x | 0.50x |"),
    ("kernels.md", "| K x N | M | ours_w8a8 vs its PyTorch anchor | ours_dds_50 vs torch_bsr_50 |"),
    ("kernels.md", "| 1024x1024 | 1 | 6.00x | 2.00x |"),
    ("kernels.md", "| W8A8 vs cuBLAS fp16, M<=16 | >= 1.6x | 1.5x (1024x1024 M=1) | 0/2 | **not met** |"),
    ("kernels.md", "| ours_w8a8 vs torch_int_mm_w8a8 | > 1x | 6.0x (1024x1024 M=1) | 2/2 | met |"),
    ("kernels.md", "- ours_dds_50 8192x8192 M=1: skipped: OOM"),
    # decode: speeds and ratios, targets (a missing figure is "not measured"), skipped variants, provenance
    ("decode.md", "| w4a16 | 1 | 333.3 | 3.000 | 2.00x | - | 3.00 | 1.00 | yes | 5.0e-03 |"),
    ("decode.md", "| w4a16 >= 2.0x fp16 (batch 1) | met |"),
    ("decode.md", "| dds90 >= 3x fp16 (batch 1) | not measured |"),
    ("decode.md", "- dds90: time budget of 1 s spent"),
    ("decode.md", "Code: commit `abc1234`; the fixture's code."),
    ("decode.md", "q/k/v and gate/up fused into one layer each in every variant"),
    # moe: us (ratio to float) per variant and token count, the largest errors, targets, provenance
    ("moe.md", "| w4a16-grouped | 100.0 (4.00x) | 400.0 (2.00x) |"),
    ("moe.md", "| float | 400.0 | 800.0 |"),
    ("moe.md", "| w4a16-loop | 2.1e-01 | - |"),
    ("moe.md", "| w4a16-grouped | 2.0e-01 | 4.0e-03 |"),
    ("moe.md", "| w4a16-grouped >= 2.5x float at 1-8 tokens | 2.00x (layer T=8) | **not met** |"),
    ("moe.md", "Code: commit `abc1234`; the fixture's code."),
    ("moe.md", "`layer`: one sparse MoE block, hidden 64, intermediate 96, 4 experts, top-2, bfloat16"),
    # sst2: per-seed change against the same seed's dense model; the mean 0.875 against the dense mean
    # 0.89 of seeds 42-43 is 1.5 points, just within the target; speed ratios against the same report's dense
    ("sst2.md", "| sparse50 | 43 | 0.8700 | -1.00 | 100 |"),
    ("sst2.md", "| sparse50 | at most 1.5 points below dense | 42, 43 | 0.8750 | 0.8900 | -1.50 | met | 1 of 2 |"),
    ("sst2.md", "| w8a8-qat | at most 0.5 points below dense | 42 | 0.8990 | 0.9000 | -0.10 | met | 1 of 1 |"),
    ("sst2.md", "| w8a8-qat | 0.250 (1.20x) | 0.400 (1.00x) |"),
    ("sst2.md", "- sparse50, seed 43: stopped early."),
    # wikitext: perplexity, lower is better, compared in percent
    ("wikitext.md", "| w8a8-qat | 0 | 206.00 | +3.0% | 100 |"),
    ("wikitext.md",
     "| w8a8-qat | at most 2.0 percent above dense | 0 | 206.00 | 200.00 | +3.0% | **not met** | 0 of 1 |"),
    # smollm2: the recipes' quality section, then post-training and generate (scripts/bench/llm_sections.py)
    ("smollm2.md", "## Recipes: fine-tune, compress, export"),
    ("smollm2.md", "| w8a8-qat | 0 | 206.00 | +3.0% | 100 |"),
    ("smollm2.md", "![smollm2: metric against speed, from compress evaluate](../../benchmarks/results/smollm2.png)"),
    ("smollm2.md", "The plot's runs are older."),
    ("smollm2.md", "| w4a16-g32 | 0.75 | met |"),
    ("smollm2.md", "| blocks-50-obs | 30.00 | met |"),
    ("smollm2.md", "| smollm2 | 1 | fp16 | 30.0 | 1.00x | 200.0 | 1.00x | 600.0 | 1.00x | 0.33x |"),
]


@pytest.mark.parametrize("name, line", EXPECTED_LINES)
def test_pages_carry_the_fixture_figures(written, name, line):
    """Each expected text stands within one line of the page (table rows go on with their source column)."""
    assert any(line in page_line for page_line in written[name].splitlines())


def test_check_finds_missing_and_edited_pages_and_passes_after_writing(root):
    assert pages.main(["--check", "--root", str(root)]) == 1  # no page yet
    pages.write_pages(root)
    assert pages.main(["--check", "--root", str(root)]) == 0
    sst2 = root / "docs" / "results" / "sst2.md"
    sst2.write_text(sst2.read_text().replace("0.8750", "0.8800"))
    assert pages.stale_pages(root) == [sst2]
    assert pages.main(["--root", str(root)]) == 0
    assert pages.stale_pages(root) == []


def test_missing_json_and_bad_json_are_named(root):
    (root / "benchmarks" / "results" / "decode-h200.json").unlink()
    with pytest.raises(FileNotFoundError, match="decode-h200.json"):
        pages.render(pages.PAGES[1], root)
    (root / "benchmarks" / "results" / "kernels-h100.json").write_text(json.dumps({"environment": {}}))
    with pytest.raises(ValueError, match=r"kernels-h100.json: expected a 'results' entry"):
        pages.render(pages.PAGES[0], root)


def test_two_runs_for_one_seed_are_refused(root):
    data = sst2_data()
    data["runs"].append(quality_run("sparse50", 43, 0.86))
    (root / "benchmarks" / "results" / "sst2-h100.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match="two runs count for sparse50 seed 43"):
        pages.render(pages.PAGES[2], root)


def test_results_folder_holds_family_files_and_one_history():
    """benchmarks/results: ``history.csv`` and ``<family>-<gpu>.json`` files only, at most 14 entries (one per
    benchmark family and GPU: kernels, decode, generate, MoE, the model families)."""
    entries = sorted(p.name for p in (pages.REPO_ROOT / pages.RESULTS).iterdir())
    named = re.compile(r"[a-z0-9]+(-[a-z0-9]+)*-(cpu|[a-z]\d{3})\.json")
    assert "history.csv" in entries
    assert [e for e in entries if e != "history.csv" and not named.fullmatch(e)] == []
    assert len(entries) <= 14, f"{len(entries)} entries in {pages.RESULTS}: merge re-runs into the family files"


def test_committed_pages_equal_what_the_committed_json_gives():
    assert pages.stale_pages(pages.REPO_ROOT) == [], f"run `{pages.COMMAND}` and commit the pages"


def test_figures_block_of_the_kernels_doc_is_rewritten_in_place():
    doc = f"# Kernels\n\nintro\n\n{pages.BLOCK_BEGIN}\nold figures\n{pages.BLOCK_END}\n\n## After\n"
    text = pages.with_figures(doc, kernel_report("GPU A"))
    assert text.startswith("# Kernels\n\nintro\n\n") and text.endswith(f"{pages.BLOCK_END}\n\n## After\n")
    assert "old figures" not in text
    assert "| 4096x4096 | 10.7 (1.50x) |" in text  # ours_w8a8 at M = 1: 16 us / 1.5
    assert pages.with_figures(text, kernel_report("GPU A")) == text  # idempotent


def test_figures_block_without_markers_is_refused():
    with pytest.raises(ValueError, match="expected one line"):
        pages.with_figures("# Kernels\nno markers\n", kernel_report("GPU A"))
