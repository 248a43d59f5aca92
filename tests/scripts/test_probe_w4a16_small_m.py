"""CPU checks of scripts/probe_w4a16_small_m.py (the timing itself needs a GPU): the load-only kernel
really reads every packed word of its split (XOR against NumPy, under Triton's interpreter), and the
fma tile sweep keeps to the kernel's rules (>= 2 K tiles per split, enough programs)."""
import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "probe_w4a16_small_m.py"


@pytest.fixture(scope="module")
def probe():
    spec = importlib.util.spec_from_file_location("probe_w4a16_small_m", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(torch.cuda.is_available(), reason="interpreter check (CPU tensors)")
def test_stream_kernel_folds_every_word_of_its_split(probe):
    qweight = torch.randint(-(2**31), 2**31 - 1, (48, 128), dtype=torch.int32)  # K = 384: 3 K tiles of 128
    out = torch.empty(3, 128, dtype=torch.int32)
    probe.stream(qweight, out, 64, 128, 3, 4, 4)
    for split in range(3):
        rows = qweight[16 * split: 16 * (split + 1)].numpy()
        assert np.array_equal(out[split].numpy(), np.bitwise_xor.reduce(rows, axis=0))


def test_fma_sweep_configs_follow_the_kernel_rules(probe):
    for k, n in [(4096, 4096), (8192, 28672)]:
        configs = probe.fma_configs(1, n, k)
        assert configs and all(c.path == "fma" and c.block_m == 1 for c in configs)
        assert all((k // c.block_k) // c.split_k >= 2 and (n // c.block_n) * c.split_k >= 264 for c in configs)
        assert probe.label(configs[0]).startswith("fma 1x")


def test_tiled_sweep_configs_give_the_reference_result(probe):
    """Every narrow-tile / K-split config the --tiled sweep times computes the reference's product
    (Triton's interpreter on the CPU, or the GPU)."""
    from compress_kernels import w4a16 as w4
    from compress_kernels.reference import w4a16_matmul_ref
    from tests.kernels.helpers import random_int4_weight, rel_error

    device = "cuda" if torch.cuda.is_available() else "cpu"
    k, n, m = 512, 64, 3
    qweight, _, scales = random_int4_weight(k, n, 128, device=device)
    x = torch.randn(m, k, device=device).half()
    ref = w4a16_matmul_ref(x, qweight, scales, 128)
    configs = probe.tiled_configs(m, n, k)
    assert {c.block_n for c in configs} == {16, 32, 64} and max(c.split_k for c in configs) == 4
    for cfg in configs:
        assert rel_error(w4.launch(x, qweight, scales, 128, None, cfg), ref) <= 1e-3, cfg


def test_wholek_sweep_configs_hold_k_and_fill_their_warps(probe):
    from compress_kernels.w4a16_wholek import WHOLEK_MAX_K

    configs = probe.wholek_configs(1, 1024, 384)
    assert configs and all(c.path == "wholek" and c.split_k == 1 and c.block_k == 512 for c in configs)
    assert all(c.block_k // 8 >= 8 * c.num_warps for c in configs)  # every warp gets packed rows
    assert {c.block_n for c in configs} == {8, 16, 32}
    assert probe.wholek_configs(1, 1024, WHOLEK_MAX_K + 8) == []
