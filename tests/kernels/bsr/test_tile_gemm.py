"""DDS tile kernel (compress_kernels/bsr/tile_gemm.py) on weights pruned in tiles of block rows: every tile width,
a short last tile, empty tiles and bias against the reference; the table's choice between tiles and free blocks;
the op runs the tile kernel when the table says so and refuses tile_rows the indices do not hold. CPU: the Triton
interpreter; GPU: marked ``gpu``.
"""
import pytest
import torch

import compress_kernels
from compress_kernels.bsr import dispatch
from compress_kernels.bsr import op as bsr_op
from compress_kernels.bsr.dispatch import BsrConfig, pick
from compress_kernels.bsr.indices import tile_rows_of
from compress_kernels.bsr.tile_gemm import launch_tile_gemm
from compress_kernels.common import device as device_facts
from compress_kernels.reference import bsr_matmul_ref
from tests.kernels.helpers import DEVICE, bsr_parts

TOL = {torch.float16: dict(atol=2e-2, rtol=1e-2), torch.bfloat16: dict(atol=1e-1, rtol=2e-2)}


def tiled_dense(n, k, sparsity, tile_rows, dtype, device=DEVICE, seed=0, empty_tile=None):
    """Dense (n, k) weight whose absent 32x32 blocks come in tiles of ``tile_rows`` block rows."""
    gen = torch.Generator().manual_seed(seed)
    tiles, block_cols = -(-n // (32 * tile_rows)), k // 32
    kept = round((1 - sparsity) * block_cols)
    tile_keep = torch.rand(tiles, block_cols, generator=gen).argsort(dim=1) < kept  # each tile keeps `kept` columns
    if empty_tile is not None:
        tile_keep[empty_tile] = False
    keep = tile_keep.repeat_interleave(tile_rows, dim=0)[: n // 32]
    keep = keep.repeat_interleave(32, dim=0).repeat_interleave(32, dim=1)
    return (torch.randn(n, k, generator=gen) * keep).to(device=device, dtype=dtype)


@pytest.mark.parametrize("tile_rows, n", [(2, 96), (4, 192), (4, 160), (8, 512)])  # 160: a last tile of 1 row
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_tiles_match_the_reference(tile_rows, n, dtype):
    k, m = 160, 70
    crow, col, values = bsr_parts(tiled_dense(n, k, 0.5, tile_rows, dtype, empty_tile=1))
    assert tile_rows_of(crow, col) >= tile_rows
    x = torch.randn(m, k, device=DEVICE).to(dtype)
    bias = torch.randn(n, device=DEVICE).to(dtype)
    y = torch.full((m, n), float("nan"), device=DEVICE, dtype=dtype)  # poison: every entry must be written
    config = BsrConfig("tiles", 32, 32 * tile_rows, 1, 4, 2)
    launch_tile_gemm(x, crow, col, values, bias, y, config, tile_rows)
    torch.testing.assert_close(y, bsr_matmul_ref(x, crow, col, values, n, bias), **TOL[dtype])


@pytest.mark.parametrize("shape, expected", [
    ((1024, 4096, 4096, 4), ("tiles", 128, 4)),  # 32 tiles x 8 row blocks = 256 programs
    ((2048, 4096, 4096, 4), ("tiles", 128, 8)),  # 512 programs (2-4 per SM) over a long K loop: 8 warps
    ((8192, 576, 1536, 4), ("tiles", 128, 4)),  # 320 programs, but K = 1536: 4 warps
    ((2048, 4096, 4096, 8), ("tiles", 64, 4)),  # 256 outputs wide: 64-row tiles (128 x 256 accumulators spill)
    ((2048, 4096, 4096, 2), ("tiles", 128, 4)),  # 64 outputs wide, 1024 programs
    ((256, 11008, 4096, 4), ("tiles", 128, 4)),  # 86 tiles x 2 = 172
    ((256, 4096, 4096, 4), ("tiles", 64, 4)),  # 32 x 2 = 64 programs: fewer than the SMs, so 64-row tiles
    ((1024, 1536, 576, 4), ("tiles", 64, 4)),  # a SmolLM2 layer
    ((2048, 4096, 4096, 1), ("dense", 0, 0)),  # free blocks at 50%: the dense row
    ((64, 4096, 4096, 4), ("gemm", 64, 4)),  # up to TILES_MIN_M rows: free-block tiles ...
    ((64, 28672, 8192, 4), ("tiles", 64, 4)),  # ... unless the layer has a tile per SM (224 here)
    ((32, 28672, 8192, 4), ("gemm", 32, 4)),  # up to TILES_WIDE_MIN_M rows: free-block tiles
])
def test_the_table_takes_tiles_past_64_rows_or_past_32_on_layers_of_a_tile_per_sm(shape, expected):
    m, n, k, tile_rows = shape
    nnz = (n // 32) * (k // 32) // 2
    cfg = pick(m, n, k, nnz, torch.device("cpu"), False, tile_rows)  # CPU: an H100's 132 SMs, TMA
    assert (cfg.kernel, cfg.block_m, cfg.num_warps) == expected


def test_the_table_keeps_free_block_kernels_without_tma(monkeypatch):
    monkeypatch.setattr(device_facts, "hopper_or_newer", lambda device: False)  # an A100: no tensor descriptors
    monkeypatch.setattr(dispatch, "sm_count", lambda device: 108)
    assert pick(1024, 4096, 4096, 2**13, torch.device("cuda", 0), False, 4).kernel == "gemm"


def test_the_op_runs_the_tile_kernel_when_the_table_says_tiles_and_checks_the_pattern(monkeypatch):
    n, k, m = 128, 128, 80
    crow, col, values = bsr_parts(tiled_dense(n, k, 0.5, 4, torch.float16))
    seen = []

    def tiles_pick(*args):
        seen.append(args[-1])
        return BsrConfig("tiles", 64, 128, 1, 4, 3)

    monkeypatch.setattr(bsr_op, "cached_pick", tiles_pick)  # a small shape the table sends to the free blocks
    x = torch.randn(m, k, device=DEVICE).half()
    y = compress_kernels.bsr_matmul_parts(x, crow, col, values, n, None, 4)
    assert seen == [4]
    torch.testing.assert_close(y, bsr_matmul_ref(x, crow, col, values, n, None), **TOL[torch.float16])
    free = bsr_parts(tiled_dense(n, k, 0.5, 1, torch.float16, seed=3))
    with pytest.raises(ValueError, match=r"tile_rows=4: expected every 4 block rows .*\(their pattern: tile_rows=1\)"):
        compress_kernels.bsr_matmul_parts(x, *free, n, None, 4)
    with pytest.raises(ValueError, match=r"tile_rows: expected one of \(1, 2, 4, 8\), got 3"):
        compress_kernels.bsr_matmul_parts(x, crow, col, values, n, None, 3)


@pytest.mark.parametrize("block_n, group", [(32, 1), (64, 2)])
def test_a_config_off_the_tile_width_or_with_more_blocks_a_step_is_refused(block_n, group):
    crow, col, values = bsr_parts(tiled_dense(64, 64, 0.0, 2, torch.float16))
    with pytest.raises(ValueError, match=r"block_n = 32 \* tile_rows \(64\), one block a step \(group 1\)"):
        launch_tile_gemm(torch.zeros(16, 64, device=DEVICE).half(), crow, col, values, None,
                         torch.empty(16, 64, device=DEVICE).half(), BsrConfig("tiles", 16, block_n, group, 4, 3), 2)


def test_an_x_whose_rows_a_descriptor_cannot_hold_is_copied_first():
    n, k, m = 128, 96, 40
    crow, col, values = bsr_parts(tiled_dense(n, k, 0.5, 4, torch.float16))
    wide = torch.randn(m, k + 1, device=DEVICE).half()  # rows of 97 halves: 194 bytes, not a multiple of 16
    x = wide[:, 1:]  # unit column stride, an odd row stride and a base 2 bytes past the allocation's
    y = torch.empty(m, n, device=DEVICE).half()
    launch_tile_gemm(x, crow, col, values, None, y, BsrConfig("tiles", 32, 128, 1, 4, 2), 4)
    torch.testing.assert_close(y, bsr_matmul_ref(x, crow, col, values, n, None), **TOL[torch.float16])


@pytest.mark.gpu
@pytest.mark.parametrize("m, n, tile_rows", [(256, 4096, 4), (1024, 4096, 4), (2048, 4096, 2), (4096, 4096, 8),
                                             (48, 28672, 4), (2048, 4096, 4)])  # 48 rows, 224 tiles: the tile kernel
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_full_size_tiles(m, n, tile_rows, dtype):
    k = 4096
    crow, col, values = bsr_parts(tiled_dense(n, k, 0.5, tile_rows, dtype, device="cuda", seed=m))
    x = torch.randn(m, k, device="cuda").to(dtype)
    assert pick(m, n, k, col.shape[0], x.device, False, tile_rows).kernel == "tiles"
    y = compress_kernels.bsr_matmul_parts(x, crow, col, values, n, None, tile_rows)
    torch.testing.assert_close(y, bsr_matmul_ref(x, crow, col, values, n, None), atol=5e-1, rtol=2e-2)
