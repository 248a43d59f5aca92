"""scripts/tune_bsr.py: each tuned kernel, launched as the sweep launches it, gives the sweep's reference."""
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

import bench_kernels as bk  # noqa: E402
import tune_bsr  # noqa: E402
from compress_kernels.bsr import BsrConfig  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


@pytest.mark.parametrize("int8", [False, True])
def test_run_config_matches_the_reference_the_sweep_checks_against(int8):
    k, n, m = 128, 64, 20
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    ws = bk.make_weight_set("bsr_int8" if int8 else "bsr", k, n, gen, DEVICE, 50)
    x = torch.randn(m, k, device=DEVICE).half()
    y = torch.empty(m, n, device=DEVICE, dtype=torch.float16)
    tune_bsr.run_config(x, ws, y, BsrConfig("gemm", 16, 32, 2, 4, 3), int8)
    assert bk.rel_error(y, tune_bsr.reference(x, ws, n, k, int8)) < 5e-3  # the sweep's acceptance bound


@pytest.mark.parametrize("m", [1, 16, 64, 256, 2048])
def test_int8_candidates_launch_on_the_sparse_w8a8_kernel(m):
    cands = tune_bsr.int8_candidates(m)
    assert cands and all(c.kernel == "gemm" and c.block_m >= 16 for c in cands)  # what bsr_w8a8.launch accepts
    assert any(c.split > 1 for c in cands) == (m <= 64)
