"""Tests for scripts/bench_decode.py: the decode harness on a tiny Llama, and its int4 anchor module.

The CPU tests run the real harness (``--tiny``: tiny config, pure-PyTorch reference path of the
inference modules, ``torch.compile`` with ``aot_eager``) so it cannot rot; the GPU test runs the
same tiny model with inductor and CUDA graphs through the Triton kernels.
"""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_decode.py"


def _load_script():
    spec = importlib.util.spec_from_file_location("scripts_bench_decode", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the file executes
    spec.loader.exec_module(module)
    return module


bench = _load_script()
TINY_ARGS = ["--tiny", "--steps", "2", "--repeats", "1", "--warmup", "1"]


def _run(tmp_path, *extra) -> dict:
    out = tmp_path / "decode.json"
    report = bench.main([*TINY_ARGS, "--out", str(out), *extra])
    assert json.loads(out.read_text()) == json.loads(json.dumps(report))  # the file is the report
    return report


def _by_variant(report: dict) -> dict:
    return {r["variant"]: r for r in report["results"]}


def test_tiny_cpu_harness_times_every_requested_variant(tmp_path):
    report = _run(tmp_path, "--device", "cpu", "--variants", "fp16,w4a16,int4-aten", "--batch", "2")
    assert report["failed"] == [] and report["skipped"] == []
    results = _by_variant(report)
    assert list(results) == ["fp16", "w4a16", "int4-aten"]
    for result in results.values():
        (batch,) = result["batches"]
        assert batch["batch"] == 2 and batch["tokens_per_s"] > 0
        assert batch["compiled_graphs"] == 1, "all decoder layers must share one compiled graph"
        assert batch["first_step_logits_rel_err_vs_eager"] < 1e-2
    # packed int4 weights: a quarter of the fp16 bytes plus one fp32 / bf16 scale per 128 weights
    assert results["w4a16"]["weight_bytes"] < 0.3 * results["fp16"]["weight_bytes"]
    assert report["ratios"]["2"]["fp16"]["vs_fp16"] == pytest.approx(1.0)
    assert set(report["targets"].values()) == {None}  # no batch-1 figures, so no verdicts


@pytest.mark.slow
def test_tiny_cpu_harness_all_variants(tmp_path):
    report = _run(tmp_path, "--device", "cpu", "--batch", "1")
    assert report["failed"] == []
    assert set(_by_variant(report)) == set(bench.ALL_VARIANTS)
    assert all(ok is not None for ok in report["targets"].values())
    assert report["ratios"]["1"]["fp16-eager"]["vs_fp16_eager"] == pytest.approx(1.0)


def test_time_budget_skips_variants_not_started_in_time(tmp_path):
    report = _run(tmp_path, "--device", "cpu", "--variants", "fp16-eager,w8a8", "--batch", "1",
                  "--time-budget", "0")
    assert [s["variant"] for s in report["skipped"]] == ["fp16-eager", "w8a8"]
    assert report["results"] == [] and report["failed"] == []


def test_siblings_are_fused_in_every_variant_unless_asked_not_to(tmp_path):
    from compress.fusion import SiblingGroup, fuse_siblings

    fused = _run(tmp_path, "--device", "cpu", "--variants", "fp16,w8a8", "--batch", "1")
    unfused = _run(tmp_path, "--device", "cpu", "--variants", "fp16,w8a8", "--batch", "1", "--no-fuse")
    assert fused["config"]["fused_siblings"] is True and unfused["config"]["fused_siblings"] is False
    for report in (fused, unfused):
        assert report["failed"] == []
        assert all(b["first_step_logits_rel_err_vs_eager"] < 1e-2 for r in report["results"] for b in r["batches"])
    # the same weights either way: the fused decoder holds exactly the unfused one's bytes
    assert {r["variant"]: r["weight_bytes"] for r in fused["results"]} == \
        {r["variant"]: r["weight_bytes"] for r in unfused["results"]}
    config = bench.llama_config(1, tiny=True, max_positions=16)
    model = bench.build_model(config, torch.float16, torch.device("cpu"), seed=0)
    assert fuse_siblings(model, dense=True) == 2
    assert sum(isinstance(m, SiblingGroup) for m in model.modules()) == 2


def test_random_block_sparsity_prunes_exactly_the_fraction():
    from compress.modules import BSRLinear

    config = bench.llama_config(1, tiny=True, max_positions=16)
    model = bench.build_model(config, torch.float16, torch.device("cpu"), seed=0)
    bench.apply_random_block_sparsity(model, 0.75, seed=1)
    layers = [m for m in model.model.layers.modules() if isinstance(m, BSRLinear)]
    assert len(layers) == 7
    for layer in layers:
        blocks = (layer.out_features // 32) * (layer.in_features // 32)
        assert layer.nnz == blocks - int(0.75 * blocks)
    assert isinstance(model.lm_head, nn.Linear)  # lm_head stays dense


def test_build_model_is_seeded():
    config = bench.llama_config(1, tiny=True, max_positions=16)
    a = bench.build_model(config, torch.float16, torch.device("cpu"), seed=3)
    b = bench.build_model(config, torch.float16, torch.device("cpu"), seed=3)
    c = bench.build_model(config, torch.float16, torch.device("cpu"), seed=4)
    wa, wb, wc = (m.model.layers[0].mlp.up_proj.weight for m in (a, b, c))
    assert torch.equal(wa, wb) and not torch.equal(wa, wc)
    assert wa.dtype == torch.float16 and 0.015 < wa.float().std() < 0.025


def test_int4_symmetric_quantization_matches_the_contract():
    w = torch.randn(32, 256)
    w[3] = 0.0  # an all-zero row: scale must not be 0 / NaN
    q, scales = bench.quantize_int4_symmetric(w, 128)
    assert q.min() >= -8 and q.max() <= 7 and torch.isfinite(scales).all()
    expected_scale = w[5, 128:].abs().max() / 7
    assert scales[5, 1] == pytest.approx(expected_scale.item())
    assert torch.equal(q[3], torch.zeros_like(q[3]))


def test_tinygemm_module_matches_dequantized_weights():
    torch.manual_seed(0)
    linear = nn.Linear(256, 64, bias=False)
    module = bench.TinygemmInt4Linear.from_float(linear, group_size=128)
    q, scales = bench.quantize_int4_symmetric(linear.weight.detach(), 128)
    dequant = (q.float().reshape(64, 2, 128) * scales[..., None]).reshape(64, 256)
    x = torch.randn(3, 5, 256, dtype=torch.bfloat16)
    y = module(x)
    want = x.float() @ dequant.T
    assert y.shape == (3, 5, 64) and y.dtype == torch.bfloat16
    assert ((y.float() - want).norm() / want.norm()) < 1e-2


def test_tinygemm_module_rejects_bad_shapes():
    with pytest.raises(ValueError, match="N % 16"):
        bench.TinygemmInt4Linear.from_float(nn.Linear(256, 40, bias=False))
    with pytest.raises(ValueError, match="without bias"):
        bench.TinygemmInt4Linear.from_float(nn.Linear(256, 64, bias=True))


@pytest.mark.parametrize("argv", [["--variants", "fp32"], ["--batch", "0"], ["--batch", "x"], ["--steps", "-1"]])
def test_bad_arguments_are_rejected(argv):
    with pytest.raises(SystemExit):
        bench.parse_args(["--tiny", "--device", "cpu", *argv])


@pytest.mark.gpu
def test_tiny_gpu_compiles_and_graphs_every_variant(tmp_path):
    report = _run(tmp_path, "--device", "cuda", "--batch", "2", "--fail-fast")
    assert report["failed"] == []
    for result in report["results"]:
        for batch in result["batches"]:
            assert batch["cuda_graph"] is result["compiled"]
            assert batch["compiled_graphs"] == (1 if result["compiled"] else 0)
            assert batch["first_step_logits_rel_err_vs_eager"] < 3e-2, (result["variant"], batch)
