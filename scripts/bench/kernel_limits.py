"""How far each kernel benchmark cell is from what the hardware allows (the kernels page's limit tables).

Small M (M <= 16) is bound by memory: a cell moves ``gbps`` (the op's own weight bytes plus x and y in fp16,
per :mod:`scripts.bench.kernel_sweep`) and its limit is cuBLAS fp16's achieved bandwidth in the same cell, so

    fraction = op GB/s / cuBLAS GB/s = ratio_to_cuBLAS / (cuBLAS bytes / op bytes)

(the limit ``L = fp16 bytes / compressed bytes`` times cuBLAS's speed; 1.0 means the op streams its smaller
weights as fast as cuBLAS streams fp16's).

Large M (M >= 2048) is bound by the tensor cores: useful TFLOP/s counts ``2 M N K`` times the fraction of
32x32 blocks present (DDS) and is divided by the dense peak of the unit the op multiplies on: int8 for the
W8A8 kernels (int8 x int8 dots), fp16 for the others (W4A16, W8A16 and DDS convert their weights to fp16
before the dot).

Peaks (dense, no 2:4 sparsity; NVIDIA H100 and H200 Tensor Core GPU datasheets, SXM, half of the "with
sparsity" figures): H100 SXM and H200 989.4 TFLOP/s fp16 / bf16, 1,978.9 TOP/s int8. A GPU not in the table
gets no large-M fraction.
"""
from __future__ import annotations

from scripts.bench.markdown import table

SMALL_M, LARGE_M = 16, 2048
LARGE_SHAPE = 4096  # the summary's shapes: K and N at least this
SMALL_M_GOAL = 0.8  # the small-M goal: 80% of the limit
PEAK_TFLOPS = {  # GPU name substring -> (fp16 dense peak, int8 dense peak)
    "H100 80GB HBM3": (989.4, 1978.9),
    "H200": (989.4, 1978.9),
}


def peaks(gpu: str | None) -> tuple[float, float] | None:
    """(fp16, int8) dense tensor-core peaks of ``gpu`` (its name as the benchmark records it), or None."""
    return next((p for name, p in PEAK_TFLOPS.items() if gpu and name in gpu), None)


def multiplies_int8(kernel: str) -> bool:
    return "w8a8" in kernel


def useful_tflops(record: dict) -> float:
    """Dense TFLOP/s of the record times the fraction of blocks present."""
    return record["tflops"] * (1.0 - (record.get("sparsity") or 0) / 100.0)


def bandwidth_fraction(record: dict, cublas: dict | None) -> float | None:
    """The op's GB/s over cuBLAS fp16's in the same cell (None without both figures)."""
    if cublas is None or not cublas.get("gbps") or "gbps" not in record:
        return None
    return record["gbps"] / cublas["gbps"]


def compute_fraction(record: dict, gpu: str | None) -> float | None:
    """Useful TFLOP/s over the dense peak of the unit the op multiplies on (None for an unknown GPU)."""
    peak = peaks(gpu)
    if peak is None or "tflops" not in record:
        return None
    return useful_tflops(record) / peak[1 if multiplies_int8(record["kernel"]) else 0]


def add_limits(results: list[dict], gpu: str | None) -> None:
    """Set ``fraction_of_limit`` on each timed record at M <= 16 (bandwidth) and M >= 2048 (peak), where known."""
    cublas = {(r["K"], r["N"], r["M"]): r for r in results if r["kernel"] == "cublas_fp16" and "ms" in r}
    for r in results:
        if "ms" not in r:
            continue
        if r["M"] <= SMALL_M:
            fraction = bandwidth_fraction(r, cublas.get((r["K"], r["N"], r["M"])))
        elif r["M"] >= LARGE_M:
            fraction = compute_fraction(r, gpu)
        else:
            fraction = None
        if fraction is not None:
            r["fraction_of_limit"] = fraction


def with_fraction(figure: str, fraction: float | None) -> str:
    return figure if fraction is None else f"{figure} ({100 * fraction:.0f}%)"


def small_m_cell(record: dict | None, cublas: dict | None) -> str:
    if record is None or "gbps" not in record:
        return "-"
    return with_fraction(f"{record['gbps'] / 1e3:.2f}", bandwidth_fraction(record, cublas))


def large_m_cell(record: dict | None, gpu: str | None) -> str:
    if record is None or "tflops" not in record:
        return "-"
    return with_fraction(f"{useful_tflops(record):.0f}", compute_fraction(record, gpu))


def fraction_range(values: list[float], goal: float | None = None) -> str:
    if not values:
        return "-"
    text = f"{100 * min(values):.0f}-{100 * max(values):.0f}%"
    return text if goal is None else f"{text}, {sum(v >= goal for v in values)} of {len(values)} >= {100 * goal:.0f}%"


def limit_summary(results: list[dict], names: list[str], gpu: str | None) -> list[str]:
    """A row per kernel: its fractions at M <= 16 (against ``SMALL_M_GOAL``) and at M >= 2048, over the shapes
    with K and N >= ``LARGE_SHAPE`` (the issue's cells)."""
    cublas = {(r["K"], r["N"], r["M"]): r for r in results if r["kernel"] == "cublas_fp16"}
    rows = []
    for name in names:
        mine = [r for r in results if r["kernel"] == name and min(r["K"], r["N"]) >= LARGE_SHAPE and "ms" in r]
        small = [bandwidth_fraction(r, cublas.get((r["K"], r["N"], r["M"]))) for r in mine if r["M"] <= SMALL_M]
        large = [compute_fraction(r, gpu) for r in mine if r["M"] >= LARGE_M]
        rows.append([name, fraction_range([v for v in small if v is not None], SMALL_M_GOAL),
                     fraction_range([v for v in large if v is not None])])
    return table(["kernel", f"M <= {SMALL_M}: fraction of the limit", f"M >= {LARGE_M}: fraction of the peak"], rows)


def limit_tables(results: list[dict], names: list[str], gpu: str | None) -> list[str]:
    """Markdown lines: the small-M table (TB/s and fraction of the limit) and the large-M table (useful
    TFLOP/s and fraction of the peak), a row per shape and M, a column per kernel in ``names``."""
    cells = {(r["kernel"], r["K"], r["N"], r["M"]): r for r in results}
    keys = list(dict.fromkeys((r["K"], r["N"], r["M"]) for r in results))
    small = [[f"{k}x{n}", str(m)] + [small_m_cell(cells.get((nm, k, n, m)), cells.get(("cublas_fp16", k, n, m)))
                                     for nm in ["cublas_fp16"] + names] for k, n, m in keys if m <= SMALL_M]
    large = [[f"{k}x{n}", str(m)] + [large_m_cell(cells.get((nm, k, n, m)), gpu) for nm in ["cublas_fp16"] + names]
             for k, n, m in keys if m >= LARGE_M]
    head = ["K x N", "M", "cublas_fp16"] + names
    lines = [f"Shapes with K and N >= {LARGE_SHAPE}:", ""] + limit_summary(results, names, gpu) + [""]
    lines += [f"Small M (<= {SMALL_M}): achieved TB/s (weights, x and y) and, in brackets, the fraction of the "
             "cell's limit (the op's bytes streamed at cuBLAS fp16's bandwidth in the same cell).", ""]
    lines += table(head, small) + [""]
    peak = peaks(gpu)
    where = ("no peak known for this GPU" if peak is None else
             f"fraction of the dense peak, {peak[0]:.0f} TFLOP/s fp16 or {peak[1]:.0f} TOP/s int8 for the W8A8 ops")
    lines += [f"Large M (>= {LARGE_M}): useful TFLOP/s (2 M N K times the blocks present) and, in brackets, the "
              f"{where}.", ""]
    return lines + table(head, large)
