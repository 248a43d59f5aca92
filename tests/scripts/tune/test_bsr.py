"""scripts/tune/bsr.py on the CPU (Triton's interpreter), a tiny shape: rows come out for DDS and DDS +
W8A8 and DDS + W4A16 (past 16 rows also de-quantized for the DDS op, up to 64 the planes kernel), checked, and
bad arguments are refused. The neighbours are cut to one per case, the planes grid to one config."""
import pytest

from compress_kernels.bsr.dispatch import DENSE, BsrConfig
from scripts.tune import bsr


@pytest.fixture
def few_neighbours(monkeypatch):
    full = bsr.candidates
    monkeypatch.setattr(bsr, "candidates", lambda cfg, int4=False: full(cfg, int4)[:2])
    monkeypatch.setattr(bsr, "planes_candidates", lambda m: [BsrConfig("planes", 4, 32, 4, 2, 3)])


@pytest.mark.parametrize("mode,op", [([], "bsr"), (["--int8"], "bsr_w8a8"), (["--int4"], "bsr_w4a16")])
@pytest.mark.parametrize("m", [1, 17])
def test_rows_for_the_pick_and_a_neighbour(mode, op, m, few_neighbours):
    rows = bsr.main(["--shapes", "64x64", "--m", str(m), "--sparsity", "50", "--max-sets", "1", "--warmup-ms", "0",
                     "--rep-ms", "1", *mode])
    dequant = op == "bsr_w4a16" and m > 16  # int4 blocks past 16 rows: also de-quantized for the DDS op
    planes = op == "bsr_w4a16"  # int4 blocks up to 64 rows: the planes kernel's grid too
    extra = (["dequant"] if dequant else []) + (["planes"] if planes else [])
    assert [r["picked"] for r in rows] == [True] + [False] * (1 + len(extra))
    assert [r["config"]["kernel"] for r in rows][2:] == extra
    assert all(r["ok"] and r["sparsity"] == 50 and r["op"] == op for r in rows)


def test_int4_one_row_candidates_cover_the_split_grid():
    pick = BsrConfig("gemv", 1, 8, 8, 4, 3)
    grid = bsr.candidates(pick, True)
    assert grid[0] == pick and len(grid) == len(set(grid))
    assert {(c.block_n, c.group, c.split) for c in grid} >= {(bn, g, s) for bn in (8, 16, 32) for g in (4, 8, 16)
                                                             for s in (1, 2, 4, 8)}


@pytest.mark.parametrize(("m", "rows"), [(1, {4}), (4, {4}), (5, {4, 8}), (16, {4, 8, 16}), (64, {4, 8, 16})])
def test_planes_grid_rows_and_no_config_twice(m, rows):
    grid = bsr.planes_candidates(m)
    assert len(grid) == len(set(grid)) == 48 * len(rows)
    assert {c.block_m for c in grid} == rows and all(c.kernel == "planes" and c.group % 4 == 0 for c in grid)


def test_neighbours_stay_on_the_kernel():
    assert bsr.candidates(DENSE) == [DENSE]
    gemv = bsr.candidates(BsrConfig("gemv", 1, 8, 16, 4, 3))
    assert all(c.kernel == "gemv" and c.block_m == 1 and c.split == 1 and 8 <= c.block_n <= 32 for c in gemv)


@pytest.mark.parametrize("argv", [["--sparsity", "120"], ["--sparsity", "x"], ["--shapes", "48x64"]])
def test_bad_arguments_are_refused(argv):
    with pytest.raises(SystemExit):
        bsr.main([*argv, "--m", "1", "--max-sets", "1"])


def test_tiled_blocks_time_the_pick_and_the_tile_kernel(monkeypatch):
    monkeypatch.setattr(bsr, "tile_candidates", lambda r: [BsrConfig("tiles", 32, 32 * r, 1, 4, 2)])
    monkeypatch.setattr(bsr, "candidates", lambda cfg, int4=False: [cfg])
    rows = bsr.main(["--shapes", "64x128", "--m", "80", "--sparsity", "50", "--tile-rows", "2", "--max-sets", "1",
                     "--warmup-ms", "0", "--rep-ms", "1"])
    assert len(rows) == 2 and rows[1]["config"]["kernel"] == "tiles" and rows[1]["config"]["block_m"] == 32
    assert all(r["ok"] and r["tile_rows"] == 2 for r in rows)


def test_tiled_weights_hold_the_pattern_and_the_sparsity():
    import torch

    from compress_kernels.bsr.indices import tile_rows_of
    crow, col, _ = bsr.block_parts(128, 160, 50, torch.float16, torch.Generator().manual_seed(0), "cpu", 4)
    assert tile_rows_of(crow, col) >= 4
    per_row = (crow[1:] - crow[:-1]).tolist()  # 5 block rows: a tile of 4 and a tile of 1, 4 block columns
    assert per_row[:4] == [per_row[0]] * 4 and per_row[0] + per_row[4] == 4  # half of the 8 tile columns kept
