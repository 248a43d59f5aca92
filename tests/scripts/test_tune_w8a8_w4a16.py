"""CPU checks of the sweep plumbing of scripts/tune_w8a8_w4a16.py (its timings need a GPU): one row per
variant with the cell's fields, a failing variant recorded as an error, result files rewritten."""
import json

import pytest

from compress_kernels._splitk import reduces_in_kernel

tune = pytest.importorskip("scripts.tune_w8a8_w4a16")


def test_time_variants_rows_and_errors(monkeypatch, tmp_path):
    monkeypatch.setattr(tune, "time_graph", lambda fn, arg_sets: float(len(arg_sets)) + fn(*arg_sets[0]))

    def launch(x, cfg):
        if cfg.split_k == 3:
            raise RuntimeError("out of shared memory")
        return 0.5

    good, bad = tune.w4.TileConfig(16, 64, 128, split_k=1), tune.w4.TileConfig(16, 64, 128, split_k=3)
    rows = tune.time_variants("w4a16", launch, [(None, good), ("bad tiles", bad)], [(1,), (2,)],
                              dict(k=256, n=64, m=1, fp16_us=5.0))
    assert [r["us"] for r in rows[:1]] == [2.5] and "out of shared memory" in rows[1]["us"]
    assert rows[1]["label"] == "bad tiles" and "label" not in rows[0]
    assert all(r["kernel"] == "w4a16" and r["k"] == 256 and r["cfg"]["block_n"] == 64 for r in rows)
    tune.write_sweep(str(tmp_path), "demo", {"gpu": "none"}, rows)
    assert json.loads((tmp_path / "demo.json").read_text())["rows"] == rows
    table = (tmp_path / "demo.md").read_text().splitlines()
    assert len(table) == 4 and "2.00" in table[2] and "err" in table[3]  # 5.0 / 2.5 us = 2.00x


@pytest.mark.parametrize("m,k,n", [(64, 384, 384), (2048, 1536, 384)])
def test_small_variants_time_current_picks_against_unsplit_tiles(m, k, n):
    variants = tune.small_variants(m, n, k)
    kernels = [v[0] for v in variants]
    assert kernels.count("w4a16") >= 6 and kernels.count("w8a8") >= 4
    assert variants[0] == ("w4a16", "current", tune.w4.pick_config(m, n, k, tune.GROUP))
    assert ("w8a8", "current", tune.w8.pick_config(m, n, k)) in variants
    assert all(cfg.split_k == 1 for _, label, cfg in variants if label == "sk1")
    assert all(k % cfg.block_k == 0 for _, label, cfg in variants if label == "sk1")


def test_sweep_cells_times_each_cell_skips_late_ones_and_rewrites_files(monkeypatch, tmp_path):
    import torch

    monkeypatch.setattr(tune, "time_graph", lambda fn, arg_sets: 10.0)
    weights = lambda k, n: [dict(w16=torch.zeros(n, k, dtype=torch.float16)) for _ in range(2)]  # noqa: E731
    seen = []

    def time_cell(k, n, m, wsets, xs, fp16_us):
        seen.append((k, n, m, len(wsets), tuple(xs[0].shape), fp16_us))
        return [dict(k=k, n=n, m=m, fp16_us=fp16_us, kernel="w8a8", cfg=tune.w8.TileConfig(16, 64, 128)._asdict(),
                     us=5.0)]

    rows = tune.sweep_cells([((32, 16), 2), ((64, 32), 1)], float("inf"), weights, time_cell,
                            str(tmp_path), "demo", {"gpu": "none"}, device="cpu")
    assert seen == [(32, 16, 2, 2, (2, 32), 10.0), (64, 32, 1, 2, (1, 64), 10.0)]
    assert [r["us"] for r in rows] == [5.0, 5.0]
    assert json.loads((tmp_path / "demo.json").read_text())["rows"] == rows
    late = tune.sweep_cells([((32, 16), 2)], 0.0, weights, time_cell, device="cpu")
    assert late == [dict(skipped="32x16 M=2: out of time")] and len(seen) == 2


@pytest.mark.parametrize("m,k,n", [(1, 4096, 4096), (1, 4096, 22016), (8, 11008, 4096)])
def test_decode_variants_time_current_picks_against_alternatives(m, k, n):
    variants = tune.decode_variants(m, n, k)
    assert ("w8a8", "current", tune.w8.pick_config(m, n, k)) in variants
    assert ("w4a16", "current", tune.w4.pick_config(m, n, k, tune.GROUP)) in variants
    alternatives = [(kernel, cfg) for kernel, label, cfg in variants if label == "alt"]
    assert sum(kernel == "w8a8" for kernel, _ in alternatives) == (13 if m <= 2 else 6)
    assert any(cfg.gemv for kernel, cfg in alternatives if kernel == "w8a8") == (m <= 2)
    assert all(cfg.split_k is not None and cfg.split_k >= 1 for _, cfg in alternatives)
    if tune.w4.pick_config(m, n, k, tune.GROUP).path == "fma":  # M = 1: the CUDA-core kernel's neighbours
        assert sum(kernel == "w4a16" for kernel, _ in alternatives) == 8
    assert {(m, k, n) for (k, n), m in tune.DECODE_CELLS} >= {(1, 4096, 12288), (1, 11008, 4096)}


@pytest.mark.parametrize("m", [4, 16])
def test_split16_variants_split_16_row_tiles_summed_in_the_kernel(m):
    variants = tune.split16_variants(m, 4096, 4096)
    assert variants[0] == ("current", tune.w8.pick_config(m, 4096, 4096))
    splits = [cfg for label, cfg in variants if label == "split"]
    assert splits and all(cfg.block_m == 16 and cfg.split_k > 1 for cfg in splits)
    assert all(reduces_in_kernel(cfg.split_k, cfg.block_m) for cfg in splits)  # no reduce launch
    assert len(tune.SPLIT16_CELLS) == 2 * len(tune.SHAPES)


@pytest.mark.parametrize("m", [4, 16, 64])
def test_planes_variants_time_nibble_planes_next_to_the_current_pick(m):
    variants = tune.planes_variants(m, 8192, 8192)
    assert variants[0] == ("current", tune.w4.pick_config(m, 8192, 8192, tune.GROUP))
    planes = [cfg for label, cfg in variants if label == "planes"]
    assert len(planes) >= 12 and all(cfg.planes for cfg in planes)
    assert {cfg.asm_unpack for cfg in planes} == {True, False}
    assert all(cfg.block_k >= 128 and cfg.scale_after_dot and cfg.split_k >= 1 for cfg in planes)
    assert {cfg.block_m for cfg in planes} == ({16} if m <= 16 else {16, 32, 64})


@pytest.mark.parametrize("m", [4, 16, 64, 256])
def test_wgmma_variants_time_swapped_planes_next_to_the_current_pick(m):
    variants = tune.wgmma_variants(m, 8192, 8192)
    assert variants[0] == ("current", tune.w4.pick_config(m, 8192, 8192, tune.GROUP))
    tiles = [cfg for label, cfg in variants if label == "wgmma"]
    assert len(tiles) >= 8 and all(cfg.path == "wgmma" and cfg.block_k == 128 and cfg.split_k >= 1 for cfg in tiles)
    assert all(16 <= cfg.block_m <= 128 and cfg.block_n >= 16 * cfg.num_warps for cfg in tiles)
    assert {cfg.scale_after_dot for cfg in tiles} == {True, False}


def test_tma_variants_time_tma_tiles_next_to_the_current_pick():
    variants = tune.tma_variants(2048, 4096, 4096)
    assert variants[0] == ("current", tune.w8.pick_config(2048, 4096, 4096))
    tiles = [cfg for label, cfg in variants if label == "tma"]
    assert len(tiles) >= 8 and all(cfg.tma and cfg.split_k == 1 for cfg in tiles)
    assert all(m >= 2048 for _, m in tune.TMA_CELLS)


def test_run_sweep_dispatches_every_name(monkeypatch):
    calls = []
    monkeypatch.setattr(tune, "sweep_w8", lambda cells, variants, name, *rest: calls.append((name, variants)) or [])
    monkeypatch.setattr(tune, "sweep_w4", lambda cells, variants, name, *rest: calls.append((name, variants)) or [])
    for fn in ("sweep_chunk", "sweep_small", "sweep_decode", "sweep_scales", "sweep_quant", "sweep_skinny", "sweep"):
        monkeypatch.setattr(tune, fn, lambda *args, fn=fn: calls.append((fn,)) or [])
    for name in ("fused", "split16", "tma", "planes", "wgmma", "chunk", "small", "decode", "scales", "quant", "skinny",
                 "all"):
        tune.run_sweep(name, 0.0, ".", {})
    assert calls[:5] == [("fused_sweep", tune.fused_variants), ("split16_sweep", tune.split16_variants),
                         ("tma_sweep", tune.tma_variants), ("planes_sweep", tune.planes_variants),
                         ("wgmma_sweep", tune.wgmma_variants)]
    assert calls[5:] == [("sweep_chunk",), ("sweep_small",), ("sweep_decode",), ("sweep_scales",), ("sweep_quant",),
                         ("sweep_skinny",), ("sweep",)]
