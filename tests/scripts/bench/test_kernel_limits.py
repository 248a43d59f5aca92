"""scripts/bench/kernel_limits.py: fractions of the limit from fixture records, the tables and the summary."""
import pytest

from scripts.bench import kernel_limits as lim


def record(kernel, m, ms, gbps=None, tflops=None, sparsity=None, k=4096, n=4096):
    return {"kernel": kernel, "K": k, "N": n, "M": m, "sparsity": sparsity, "ms": ms, "gbps": gbps, "tflops": tflops}


def test_small_m_fraction_is_bandwidth_over_cublas():
    """cuBLAS streams 2.0 TB/s in the cell; an op moving 1.25 TB/s there is at 62.5% of its limit."""
    cublas = record("cublas_fp16", 1, 0.02, gbps=2000.0)
    ours = record("ours_w4a16_g128", 1, 0.008, gbps=1250.0)
    assert lim.bandwidth_fraction(ours, cublas) == pytest.approx(0.625)
    assert lim.bandwidth_fraction(ours, None) is None
    assert lim.small_m_cell(ours, cublas) == "1.25 (62%)"


def test_large_m_counts_present_blocks_and_the_unit_it_multiplies_on():
    dds = record("ours_dds_50", 2048, 1.0, tflops=800.0, sparsity=50)
    w8a8 = record("ours_w8a8", 2048, 1.0, tflops=989.45)
    assert lim.useful_tflops(dds) == 400.0
    assert lim.compute_fraction(dds, "NVIDIA H200") == pytest.approx(400.0 / 989.4)
    assert lim.compute_fraction(w8a8, "NVIDIA H100 80GB HBM3") == pytest.approx(0.5)  # the int8 peak
    assert lim.compute_fraction(w8a8, "NVIDIA A10") is None and lim.large_m_cell(w8a8, None) == "989"


def test_add_limits_sets_fractions_where_a_limit_is_defined():
    results = [record("cublas_fp16", 1, 0.02, gbps=2000.0), record("ours_w8a8", 1, 0.01, gbps=1800.0),
               record("ours_w8a8", 64, 0.05, gbps=1000.0), record("ours_w8a8", 2048, 1.0, tflops=989.45),
               {"kernel": "ours_dds_50", "K": 4096, "N": 4096, "M": 1, "error": "skipped"}]
    lim.add_limits(results, "NVIDIA H200")
    assert results[1]["fraction_of_limit"] == pytest.approx(0.9) and results[0]["fraction_of_limit"] == 1.0
    assert "fraction_of_limit" not in results[2] and "fraction_of_limit" not in results[4]
    assert results[3]["fraction_of_limit"] == pytest.approx(0.5)


def test_tables_and_summary_cover_small_and_large_m():
    results = [record("cublas_fp16", 1, 0.02, gbps=2000.0), record("ours_w8a8", 1, 0.01, gbps=1800.0),
               record("cublas_fp16", 16, 0.02, gbps=2000.0), record("ours_w8a8", 16, 0.01, gbps=1400.0),
               record("cublas_fp16", 2048, 1.0, tflops=700.0), record("ours_w8a8", 2048, 1.0, tflops=989.45),
               record("cublas_fp16", 1, 0.01, gbps=500.0, k=1024, n=1024),
               record("ours_w8a8", 1, 0.01, gbps=100.0, k=1024, n=1024)]
    lines = lim.limit_tables(results, ["ours_w8a8"], "NVIDIA H200")
    assert "| ours_w8a8 | 70-90%, 1 of 2 >= 80% | 50-50% |" in lines  # 1024x1024 left out of the summary
    assert "| 4096x4096 | 1 | 2.00 (100%) | 1.80 (90%) |" in lines
    assert "| 1024x1024 | 1 | 0.50 (100%) | 0.10 (20%) |" in lines
    assert "| 4096x4096 | 2048 | 700 (71%) | 989 (50%) |" in lines
