"""Tests for scripts/bench/llm_sections.py: the SmolLM2 page's post-training and generate sections."""
import pytest

from scripts.bench.llm_sections import (generate_section, generate_sections, post_training_section, pruning_section,
                                        sweep_section)


def post_training_data():
    variants = {"w4a16-g32-rtn": (40.0, 0.25), "w4a16-g32-gptq": (34.0, 0.0625)}
    return {"environment": {"torch": "2", "triton": "3"}, "model": "SmolLM2-135M-Instruct", "dtype": "float32",
            "calibration_blocks": 16, "block_size": 512, "eval_blocks": 12, "dense_perplexity": 32.0,
            "variants": {k: {"perplexity": p, "increase": i, "convert_s": 1.5} for k, (p, i) in variants.items()},
            "gptq_share_of_rtn_increase_removed": {"w4a16-g32": 0.75, "w8a8": 0.2}}


def test_post_training_lists_every_variant_and_checks_the_share_target_where_it_applies():
    text = "\n".join(post_training_section("pt.json", post_training_data()))
    assert "| w4a16-g32-gptq | 34.00 | +6.2% | 1.5 |" in text
    assert "| w4a16-g32 | 0.75 | met |" in text and "| w8a8 | 0.20 | - |" in text
    broken = post_training_data()
    del broken["variants"]
    with pytest.raises(ValueError, match="pt.json: expected a 'variants' entry"):
        post_training_section("pt.json", broken)


def generate_data():
    fp16 = {"model": "smollm2", "variant": "fp16", "batch": 1, "eager": {"tokens_per_s": 30.0},
            "compiled": {"tokens_per_s": 200.0}, "harness": {"tokens_per_s": 600.0}}
    w4 = {"model": "smollm2", "variant": "w4a16", "batch": 1, "eager": {"tokens_per_s": 15.0},
          "compiled": {"error": "RuntimeError: boom\nmore"}}
    return {"environment": {"gpu": "H100", "torch": "2", "triton": "3", "transformers": "5"},
            "config": {"models": ["smollm2"], "new_tokens": 64, "prompt_len": 16, "repeats": 3, "layers": 8},
            "host_overhead": [{"k": 576, "n": 576, "linear_us": 21.0, "modules": {"w4a16": {"forward_us": 122.4}}}],
            "results": [fp16, w4],
            "ratios": {"smollm2": {"1": {"fp16": {"eager_vs_fp16": 1.0, "compiled_vs_fp16": 1.0, "harness_vs_fp16": 1.0,
                                                   "compiled_vs_harness": 0.3333},
                                          "w4a16": {"eager_vs_fp16": 0.5}}}},
            "targets": {"eager generate no slower than fp16": False, "7b w4a16 >= 2x": None},
            "skipped": [{"model": "smollm2", "variant": "w8a8", "batch": 8, "reason": "time budget spent"}],
            "failed": [{"model": "smollm2", "variant": "w4a16", "batch": 1, "mode": "compiled",
                        "error": "RuntimeError: boom\nmore"}]}


def test_generate_section_gives_figures_ratios_failures_and_verdicts():
    text = "\n".join(generate_section("generate-h100.json", generate_data()))
    assert "| 576x576 | 21.0 | 122.4 |" in text and "Code:" not in text
    assert "| smollm2 | 1 | fp16 | 30.0 | 1.00x | 200.0 | 1.00x | 600.0 | 1.00x | 0.33x |" in text
    assert "| smollm2 | 1 | w4a16 | 15.0 | 0.50x | failed | - | - | - | - |" in text
    assert "- eager generate no slower than fp16: **not met**" in text and "- 7b w4a16 >= 2x: not measured" in text
    assert "Not run: smollm2 w8a8 batch 8 (time budget spent)." in text
    assert "Failed: smollm2 w4a16 batch 1 compiled: RuntimeError: boom" in text and "more" not in text
    assert "median over 3 rounds" in text  # a report from before --eager-rounds: its rounds were --repeats
    nine_rounds = generate_data()
    nine_rounds["config"]["eager_rounds"] = 9
    assert "median over 9 rounds" in "\n".join(generate_section("g.json", nine_rounds))
    with_code = {**generate_data(), "provenance": {"commit": "abc1234", "note": "before the fix"}}
    assert "Code: commit `abc1234`; before the fix." in "\n".join(generate_section("g.json", with_code))



def test_generate_file_of_several_runs_gives_a_section_per_run_in_order():
    llama = generate_data()
    llama["config"]["models"] = ["llama2-7b"]
    both = generate_sections("generate-h100.json", {"benchmark": "generate", "runs": [generate_data(), llama]})
    titles = [line for line in both if line.startswith("## Generate")]
    assert titles == ["## Generate: smollm2", "## Generate: llama2-7b"]
    assert generate_sections("g.json", generate_data()) == generate_section("g.json", generate_data())
    broken = generate_data()
    del broken["results"]
    with pytest.raises(ValueError, match=r"g.json runs\[1\]: expected a 'results' entry"):
        generate_sections("g.json", {"runs": [generate_data(), broken]})
    with pytest.raises(ValueError, match="g.json: expected 'runs' to be a non-empty list"):
        generate_sections("g.json", {"runs": []})


def pruning_run(seed, variants):
    return {"environment": {"gpu": "H200", "torch": "2", "triton": "3"}, "model": "float", "dtype": "float16",
            "calibration_blocks": 128, "block_size": 1024, "eval_blocks": 26, "dense_perplexity": 16.0, "seed": seed,
            "variants": {k: {"perplexity": p, "increase": p / 16.0 - 1, "prune_s": 2.0} for k, p in variants.items()}}


def test_pruning_lists_each_run_and_means_only_todays_stages_against_sparsegpt_2of4():
    data = {"runs": [
        {**pruning_run(0, {"blocks-50-obs": 300.0, "sparsegpt-2of4": 36.0}), "stages": "per role", "commit": "abc"},
        pruning_run(0, {"blocks-50-obs": 30.0, "blocks-50-obs-w4a16-g32": 40.0}),
        {**pruning_run(1, {"blocks-50-obs": 34.0}), "note": "one variant"}]}
    text = "\n".join(pruning_section("p.json", data))
    assert ("| variant | seed 0, per role (`abc`) | seed 0, per block and input group | seed 1, per block and input "
            "group | mean today vs dense |") in text
    assert "| blocks-50-obs | 300.00 (2 s) | 30.00 (2 s) | 34.00 (2 s) | 32.00 (+100.0%) |" in text  # 300 not counted
    assert "| sparsegpt-2of4 | 36.00 (2 s) | - | - | 36.00 (+125.0%) |" in text  # a peer counts at any stages
    assert "| blocks-50-obs | 32.00 | met |" in text and "| blocks-50-obs-w4a16-g32 | 40.00 | **not met** |" in text
    assert "- seed 1, per block and input group: one variant" in text
    with pytest.raises(ValueError, match="p.json: expected a 'runs' entry"):
        pruning_section("p.json", {})


def sweep_data():
    return {"environment": {"gpu": "H200", "torch": "2", "triton": "3"}, "commit": "abc", "description": "A sweep.",
            "dense": {"perplexity": 20.0, "latency_ms": {"1": 4.0, "8": 16.0}, "linear_weight_bytes": 2 ** 21},
            "points": [{"name": "blocks-25", "recipe": "r25", "perplexity": 21.0},
                       {"name": "blocks-50", "recipe": "r50", "perplexity": 30.0, "latency_ms": {"1": 2.0, "8": 16.0},
                        "linear_weight_bytes": 2 ** 20}]}


def test_sweep_rows_speed_against_dense_and_the_targets():
    text = "\n".join(sweep_section("s.json", sweep_data()))
    assert "| blocks-25 | r25 | 21.00 | +5.0% | not measured | not measured | - |" in text
    assert "| blocks-50 | r50 | 30.00 | +50.0% | 2.000 (2.00x) | 16.000 (1.00x) | 1.0 |" in text
    assert "| blocks-25 | within +8% | +5.0% | met |" in text
    assert "| blocks-50 | within +40% | +50.0% | **not met** |" in text
    assert "| blocks-50-w8a8 | within +45% | - | not measured |" in text
    with pytest.raises(ValueError, match="s.json: expected a 'dense' entry"):
        sweep_section("s.json", {})
