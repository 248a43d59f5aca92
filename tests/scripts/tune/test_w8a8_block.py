"""scripts/tune/w8a8_block.py on the CPU (Triton's interpreter), a tiny shape: rows come out, checked, and
each path keeps to the configs it takes. The neighbours are cut to one per case to keep the interpreter short."""
import pytest

from compress_kernels.w8a8_block.dispatch import TMA_TILE, TileConfig
from scripts.tune import w8a8_block


@pytest.fixture
def few_neighbours(monkeypatch):
    full = w8a8_block.candidates
    monkeypatch.setattr(w8a8_block, "candidates", lambda cfg, int8_out=False: full(cfg, int8_out)[:2])


@pytest.mark.parametrize("int8_out", [False, True])
def test_rows_for_the_pick_and_a_neighbour(int8_out, few_neighbours):
    argv = ["--shapes", "256x128", "--m", "3", "--max-sets", "1", "--warmup-ms", "0", "--rep-ms", "1"]
    rows = w8a8_block.main(argv + (["--int8-out"] if int8_out else []))
    assert len(rows) == 2 and [r["picked"] for r in rows] == [True, False]
    assert all(r["ok"] and r["ms"] > 0 and r["int8_out"] is int8_out for r in rows), rows


def test_each_path_keeps_to_the_configs_it_takes():
    tiled = w8a8_block.candidates(TileConfig(16, 64, split_k=4, quantize_x=True))
    assert any(not c.quantize_x for c in tiled) and all(c.block_k == 128 for c in tiled)
    assert all(c.block_n == 128 for c in w8a8_block.candidates(TileConfig(16, 128), int8_out=True))
    tma = w8a8_block.candidates(TMA_TILE)
    assert all(c.path == "tma" and c.split_k == 1 and c.block_n == 128 for c in tma) and len(tma) > 1
