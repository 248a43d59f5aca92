"""scripts.bench.kernel_sweep on the CPU: weight sets in every format, the rotation size, the op
list and its filter, one timed point (CPU branch of the timing), and bad input refused."""
import pytest
import torch

from scripts.bench import kernel_sweep as sweep

CPU = torch.device("cpu")


def test_block_mask_has_exact_sparsity():
    mask = sweep.random_block_mask(256, 512, 75, torch.Generator().manual_seed(0), CPU)
    assert mask.shape == (8, 16) and int((~mask).sum()) == round(0.75 * 128)
    crow, col, values = sweep.bsr_parts_from_mask(mask, torch.float16, torch.Generator().manual_seed(1), CPU)
    assert crow[-1] == col.shape[0] == values.shape[0] == int(mask.sum())
    dense_mask = torch.zeros_like(mask)
    for row in range(mask.shape[0]):
        dense_mask[row, col[crow[row]:crow[row + 1]].long()] = True
    assert torch.equal(dense_mask, mask)  # the parts hold exactly the kept blocks, row by row


@pytest.mark.parametrize("kind, keys", [
    ("fp16", {"w"}), ("int8", {"w_q", "w_scale"}), ("int8_g128", {"w_q", "w_scale"}),
    ("int8_fp16_scales", {"w_q", "w_scale"}), ("int8_block", {"w_q", "w_scale"}), ("int4", {"qweight", "scales"}),
    ("int4_tinygemm", {"packed", "scales_zeros"}), ("bsr", {"crow", "col", "values", "bsr", "n", "k"}),
    ("bsr_int8", {"crow", "col", "values", "w_scale", "n", "k"}),
    ("bsr_int4", {"crow", "col", "values", "scales", "n", "k"}),
])
def test_weight_sets_hold_each_format(kind, keys):
    ws = sweep.make_weight_set(kind, 256, 64, torch.Generator().manual_seed(0), CPU, sparsity_pct=50)
    assert set(ws) == keys and sweep.weight_bytes(ws) > 0
    if kind.startswith("int8"):  # the scale layouts of W8A16 (per channel, per group of 128) and its anchor
        expected = {"int8": ((64,), torch.float32), "int8_g128": ((64, 2), torch.float32),
                    "int8_fp16_scales": ((64,), torch.float16), "int8_block": ((1, 2), torch.float32)}[kind]
        assert (tuple(ws["w_scale"].shape), ws["w_scale"].dtype) == expected


def test_weight_bytes_count_dense_tensors_once():
    ws = sweep.make_weight_set("bsr", 256, 64, torch.Generator().manual_seed(0), CPU, sparsity_pct=50)
    parts = ws["crow"].numel() * 4 + ws["col"].numel() * 4 + ws["values"].numel() * 2
    assert sweep.weight_bytes(ws) == parts  # the sparse view adds nothing
    tinygemm = sweep.make_weight_set("int4_tinygemm", 256, 64, torch.Generator().manual_seed(0), CPU)
    assert sweep.weight_bytes(tinygemm) == 64 * 256 // 2 + (256 // 128) * 64 * 2 * 2  # nibbles + bf16 scales/zeros


def test_unknown_weight_kind_is_refused():
    with pytest.raises(ValueError, match="expected one of fp16, int8, int8_g128"):
        sweep.make_weight_set("int3", 256, 64, torch.Generator(), CPU)


def test_rotation_size_is_bounded():
    assert sweep.n_sets(2**20, 200) == sweep.MAX_SETS
    assert sweep.n_sets(100 * 2**20, 200) == 2
    assert sweep.n_sets(10**12, 200) == 1


def test_select_matches_globs_and_keeps_order():
    names = [s.name for s in sweep.kernel_specs()]
    assert sweep.select(names, ["ours_dds_*"]) == ["ours_dds_50", "ours_dds_75", "ours_dds_90", "ours_dds_w8a8_50",
                                                   "ours_dds_w8a8_90", "ours_dds_w4a16_50", "ours_dds_w4a16_90",
                                                   "ours_dds_tiles4_50", "ours_dds_tiles4_75"]
    assert sweep.select(names, []) == names and len(names) == len(set(names)) == 22
    assert sweep.select(names, ["*w8a8_block"]) == ["torch_int_mm_w8a8_block", "ours_w8a8_block"]
    assert sweep.select(names, ["ours_w8a16*"]) == ["ours_w8a16", "ours_w8a16_g128"]


def test_one_point_on_the_cpu_checks_and_times():
    spec = next(s for s in sweep.kernel_specs() if s.name == "torch_bsr_75")
    opts = sweep.SweepOptions(kernels=[spec.name], shapes=[(128, 64)], ms=[3], rotate_mb=0.05, cpu=True)
    gen = torch.Generator().manual_seed(0)
    sets = [sweep.make_weight_set("bsr", 128, 64, gen, CPU, 75) for _ in range(2)]
    record = sweep.bench_point(spec, sets, 128, 64, 3, opts, CPU, gen)
    assert record["rel_err"] < 1e-2 and record["ms"] > 0 and record["graph"] is False
    assert record["sets"] == sweep.n_sets(sweep.weight_bytes(sets[0]) + 3 * (128 + 64) * 2, 0.05)


def test_cpu_rotation_times_every_call_in_turn():
    seen = []
    calls = [lambda i=i: seen.append(i) for i in range(3)]
    ms, graphed = sweep.time_rotation(calls, sweep.SweepOptions(kernels=[], shapes=[], ms=[], cpu=True))
    assert ms >= 0 and graphed is False
    assert seen == [0] + [1, 2, 0] * 3  # one warm-up call, then three rounds of the rotation in order


def test_tiled_masks_drop_whole_tiles_of_block_rows():
    mask = sweep.random_block_mask(6 * 32, 8 * 32, 50, torch.Generator().manual_seed(0), torch.device("cpu"), 4)
    assert mask.shape == (6, 8) and torch.equal(mask[0], mask[3]) and torch.equal(mask[4], mask[5])
    assert int((~mask[::4]).sum()) == 8  # half of the 2 x 8 tiles
