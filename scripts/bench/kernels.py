"""Kernel benchmark: our Triton kernels against their anchors, side by side, in one run on one GPU.

What is timed (every figure is ``y = x @ W.T`` for x (M, K) and a weight of N x K):

* anchors: cuBLAS fp16 (``F.linear``); the torchao W8A8 path (per-token quantize of x in PyTorch,
  ``torch._int_mm``, dequantize with ``s_x * s_w``); tinygemm int4 (``aten._weight_int4pack_mm``,
  group 128, bf16 activations: its CUDA kernel takes bf16 only); PyTorch's Triton BSR kernel
  (``torch.sparse._triton_ops.bsr_dense_mm``, computing ``W @ x.T``) at 50/75/90% block sparsity.
* ours: ``kernels.w8a8_matmul`` (dynamic per-token scales), ``kernels.w4a16_matmul`` (g128) and
  ``kernels.bsr_matmul_parts`` at 50/75/90% block sparsity (same block masks and values as the
  torch BSR anchor); ``kernels.bsr_w8a8_matmul_parts`` (int8 blocks, per-token int8 x) at 50 and
  90% (``ours_dds_w8a8_p``: a layer both pruned and W8A8-quantized; compare with ``ours_w8a8``).

How (DESIGN.md, "how to measure"): ``triton.testing.do_bench`` medians (it also flushes L2 before
each timed call); each kernel rotates over several weight / input sets, together at least
``--rotate-mb`` (default 4x the 50 MB L2), so no weight stays cached between calls; the rotation (one
call per set) is captured in a CUDA graph (at every M by default, ``--graph-max-m`` limits it) and
the replay time is divided by the number of calls, so launch overhead does not hide the kernel (an
eager first run showed Python launch overhead, 0.5 ms for ``bsr_dense_mm``, swamping small shapes
even at M = 2048). An op that cannot be captured is timed eagerly and marked ``graph: false``. Ratios are to cuBLAS fp16 on the same shape
and M in the same run (>1 means faster than cuBLAS). TFLOP/s counts the dense 2 M N K; GB/s counts
the kernel's own weight bytes plus x and y.

Output: a JSON file (``--out``) with the GPU, versions and every figure; a printed table; with
``--markdown PATH`` a summary table with the DDS targets marked met / not met (``--from-json`` turns
an earlier JSON into Markdown without a GPU). ``--cpu-check`` runs the whole harness on tiny shapes
on the CPU with the reference ops, so the plumbing is tested in CI.
"""
from __future__ import annotations

import argparse
import fnmatch
import json
import logging
import math
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

LOG = logging.getLogger("bench_kernels")
REPO_ROOT = Path(__file__).resolve().parents[1]

SHAPES = [(1024, 1024), (4096, 4096), (4096, 11008), (11008, 4096), (8192, 8192), (8192, 28672)]  # (K, N)
MS = [1, 16, 64, 256, 2048, 8192]
SPARSITIES = (50, 75, 90)
DDS_W8A8_SPARSITIES = (50, 90)  # the sparse W8A8 kernel (a layer both pruned and W8A8-quantized)
GROUP_SIZE = 128
GRAPH_MAX_M = 1 << 30  # graphs at every M unless --graph-max-m says otherwise
MAX_SETS = 128
CHECK_ROWS = 64
BSR_BLOCK = 32

# DDS targets: minimal ratio to cuBLAS fp16, by sparsity and M range (inclusive bounds).
DDS_TARGETS = {
    90: [((1, 16), 4.0), ((64, 64), 3.0), ((2048, None), 4.0)],
    50: [((1, 16), 1.6), ((64, 64), 1.4), ((2048, None), 1.5)],
}
BIG_LLM_SHAPES = ((4096, 11008), (11008, 4096), (8192, 8192), (8192, 28672))  # K x N
# W4A16 / W8A8 targets: (kernel, label, M range, shapes (None: every shape), minimal ratio to cuBLAS fp16).
QUANT_TARGETS = [
    ("ours_w4a16_g128", "W4A16 g128", (1, 16), BIG_LLM_SHAPES, 2.5),
    ("ours_w4a16_g128", "W4A16 g128", (1, 16), ((4096, 4096),), 2.0),
    ("ours_w4a16_g128", "W4A16 g128", (64, 64), None, 1.5),
    ("ours_w4a16_g128", "W4A16 g128", (2048, None), None, 0.85),
    ("ours_w8a8", "W8A8", (1, 16), ((4096, 4096),) + BIG_LLM_SHAPES, 1.6),
    ("ours_w8a8", "W8A8", (64, 64), None, 1.3),
    ("ours_w8a8", "W8A8", (2048, None), None, 1.4),
]
# ours vs the matching PyTorch anchor at every shape and M
ANCHORS = {"ours_w4a16_g128": "tinygemm_int4_g128", "ours_w8a8": "torch_int_mm_w8a8"}


# ---- weights and inputs ------------------------------------------------------------------------

def random_block_mask(n, k, sparsity_pct, gen, device):
    """(N/32, K/32) bool mask with exactly round(p * blocks) blocks absent."""
    rows, cols = n // BSR_BLOCK, k // BSR_BLOCK
    total = rows * cols
    keep = torch.ones(total, dtype=torch.bool, device=device)
    keep[torch.randperm(total, generator=gen, device=device)[: round(sparsity_pct / 100 * total)]] = False
    return keep.reshape(rows, cols)


def bsr_parts_from_mask(mask, dtype, gen, device):
    """BSR parts (crow int32, col int32, values (nnz, 32, 32)) of a random weight on ``mask``'s blocks."""
    counts = mask.sum(dim=1)
    crow = torch.zeros(mask.shape[0] + 1, dtype=torch.int32, device=device)
    crow[1:] = torch.cumsum(counts, 0).to(torch.int32)
    col = mask.nonzero()[:, 1].to(torch.int32).contiguous()  # row-major order = sorted within a row
    nnz = col.shape[0]
    values = (torch.randn(nnz, BSR_BLOCK, BSR_BLOCK, generator=gen, device=device) * 0.02).to(dtype)
    return crow, col, values


def make_weight_set(kind, k, n, gen, device, sparsity_pct=None):
    """One set of weight operands for ``kind`` in {'fp16', 'int8', 'int4', 'bsr'}."""
    if kind == "fp16":
        return {"w": (torch.randn(n, k, generator=gen, device=device) * 0.02).to(torch.float16)}
    if kind == "int8":
        w_q = torch.randint(-127, 128, (n, k), generator=gen, dtype=torch.int8, device=device)
        w_scale = torch.rand(n, generator=gen, device=device) * 1e-3 + 1e-4
        return {"w_q": w_q, "w_scale": w_scale}
    if kind == "int4":
        qweight = torch.randint(-2**31, 2**31 - 1, (k // 8, n), generator=gen, dtype=torch.int32, device=device)
        scales = (torch.rand(k // GROUP_SIZE, n, generator=gen, device=device) * 1e-2 + 1e-3).to(torch.float16)
        return {"qweight": qweight, "scales": scales}
    if kind == "int4_tinygemm":
        w_u8 = torch.randint(0, 256, (n, k // 2), generator=gen, dtype=torch.uint8, device=device)
        packed = torch.ops.aten._convert_weight_to_int4pack(w_u8, 8) if device.type == "cuda" else w_u8
        sz = torch.rand(k // GROUP_SIZE, n, 2, generator=gen, device=device) * 1e-2
        return {"packed": packed, "scales_zeros": sz.to(torch.bfloat16)}
    if kind in ("bsr", "bsr_int8"):
        mask = random_block_mask(n, k, sparsity_pct, gen, device)
        crow, col, values = bsr_parts_from_mask(mask, torch.float16, gen, device)
        if kind == "bsr":
            return {"crow": crow, "col": col, "values": values, "n": n, "k": k}
        values = torch.randint(-127, 128, values.shape, generator=gen, dtype=torch.int8, device=device)
        w_scale = torch.rand(n, generator=gen, device=device) * 1e-3 + 1e-4
        return {"crow": crow, "col": col, "values": values, "w_scale": w_scale, "n": n, "k": k}
    raise ValueError(f"weight kind: expected fp16, int8, int4, int4_tinygemm, bsr or bsr_int8, got {kind!r}")


def weight_bytes(ws) -> int:
    return sum(t.numel() * t.element_size() for t in ws.values()
               if isinstance(t, torch.Tensor) and t.layout == torch.strided)


# ---- the kernels -------------------------------------------------------------------------------

@dataclass(frozen=True)
class KernelSpec:
    """A timed op: which weights it takes, its call on the GPU and its reference stand-in on the CPU."""

    name: str
    weight_kind: str
    gpu_call: Callable  # (x, weight_set) -> y
    cpu_call: Callable  # reference ops with the same operands (for --cpu-check)
    sparsity: int | None = None
    x_dtype: torch.dtype = torch.float16


def _cublas(x, ws):
    return F.linear(x, ws["w"])


def _int_mm_w8a8(x, ws):
    """torchao's dynamic W8A8 path: quantize x per token, _int_mm, dequantize with s_x * s_w."""
    m = x.shape[0]
    s_x = x.abs().amax(dim=-1, keepdim=True).float().clamp(min=1e-8) / 127
    xq = torch.clamp(torch.round(x.float() / s_x), -128, 127).to(torch.int8)
    if m <= 16:  # cuBLASLt int8 needs M > 16: pad rows, as wrappers around _int_mm do
        xq = F.pad(xq, (0, 0, 0, 32 - m))
    acc = torch._int_mm(xq, ws["w_q"].t())[:m]
    return (acc.float() * s_x * ws["w_scale"][None, :]).to(x.dtype)


def _int_mm_w8a8_cpu(x, ws):
    import compress_kernels.reference as ref

    return ref.w8a8_matmul_ref(x, ws["w_q"], ws["w_scale"])


def _tinygemm(x, ws):
    return torch.ops.aten._weight_int4pack_mm(x, ws["packed"], GROUP_SIZE, ws["scales_zeros"])


def _tinygemm_cpu(x, ws):  # stand-in with the same shapes: dequantize the uint8 nibbles, matmul
    w = torch.stack([ws["packed"] >> 4, ws["packed"] & 0xF], dim=-1).reshape(ws["packed"].shape[0], -1)
    return (x.float() @ (w.float() - 8).T * 1e-2).to(x.dtype)


def _torch_bsr(x, ws):
    from torch.sparse._triton_ops import bsr_dense_mm

    bsr = ws.get("bsr")
    if bsr is None:
        bsr = torch.sparse_bsr_tensor(ws["crow"], ws["col"], ws["values"], size=(ws["n"], ws["k"]))
        ws["bsr"] = bsr
    m = x.shape[0]
    pad = (-m) % 16  # bsr_dense_mm needs the dense operand's columns (our M) divisible by 16
    xt = F.pad(x, (0, 0, 0, pad)).t() if pad else x.t()
    return bsr_dense_mm(bsr, xt)[:, :m].t()


def _bsr_ref(x, ws):
    import compress_kernels.reference as ref

    return ref.bsr_matmul_ref(x, ws["crow"], ws["col"], ws["values"], ws["n"])


def _ours_w8a8(x, ws):
    import compress_kernels as kernels

    return kernels.w8a8_matmul(x, ws["w_q"], ws["w_scale"])


def _ours_w4a16(x, ws):
    import compress_kernels as kernels

    return kernels.w4a16_matmul(x, ws["qweight"], ws["scales"], GROUP_SIZE)


def _ours_w4a16_cpu(x, ws):
    import compress_kernels.reference as ref

    return ref.w4a16_matmul_ref(x, ws["qweight"], ws["scales"], GROUP_SIZE)


def _ours_dds(x, ws):
    import compress_kernels as kernels

    return kernels.bsr_matmul_parts(x, ws["crow"], ws["col"], ws["values"], ws["n"])


def _ours_dds_w8a8(x, ws):
    import compress_kernels as kernels

    return kernels.bsr_w8a8_matmul_parts(x, ws["crow"], ws["col"], ws["values"], ws["w_scale"], ws["n"])


def _dds_w8a8_ref(x, ws):
    import compress_kernels.reference as ref

    return ref.bsr_w8a8_matmul_ref(x, ws["crow"], ws["col"], ws["values"], ws["w_scale"], ws["n"])


def kernel_specs() -> list[KernelSpec]:
    specs = [
        KernelSpec("cublas_fp16", "fp16", _cublas, _cublas),
        KernelSpec("torch_int_mm_w8a8", "int8", _int_mm_w8a8, _int_mm_w8a8_cpu),
        KernelSpec("tinygemm_int4_g128", "int4_tinygemm", _tinygemm, _tinygemm_cpu, x_dtype=torch.bfloat16),
    ]
    specs += [KernelSpec(f"torch_bsr_{p}", "bsr", _torch_bsr, _bsr_ref, sparsity=p) for p in SPARSITIES]
    specs += [
        KernelSpec("ours_w8a8", "int8", _ours_w8a8, _int_mm_w8a8_cpu),
        KernelSpec("ours_w4a16_g128", "int4", _ours_w4a16, _ours_w4a16_cpu),
    ]
    specs += [KernelSpec(f"ours_dds_{p}", "bsr", _ours_dds, _bsr_ref, sparsity=p) for p in SPARSITIES]
    specs += [KernelSpec(f"ours_dds_w8a8_{p}", "bsr_int8", _ours_dds_w8a8, _dds_w8a8_ref, sparsity=p)
              for p in DDS_W8A8_SPARSITIES]
    return specs


# ---- timing ------------------------------------------------------------------------------------

def _cuda_graph_of(calls):
    """Capture every call of the rotation in one CUDA graph (after a warm-up on a side stream)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for call in calls:
            call()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    return graph


def time_gpu(calls, use_graph, warmup_ms, rep_ms):
    """Median ms per call over a rotation of ``calls``; returns (ms, graph_used)."""
    from triton.testing import do_bench

    for call in calls:  # compile / first-call work outside timing and capture
        call()
    torch.cuda.synchronize()
    if use_graph:
        try:
            graph = _cuda_graph_of(calls)
            ms = do_bench(graph.replay, warmup=warmup_ms, rep=rep_ms, return_mode="median")
            return ms / len(calls), True
        except Exception as err:  # some anchors cannot be captured: time them eagerly
            LOG.warning("CUDA graph capture failed (%s); timing eagerly", str(err).splitlines()[0][:120])
            torch.cuda.synchronize()
    state = {"i": 0}

    def rotate():
        calls[state["i"] % len(calls)]()
        state["i"] += 1

    return do_bench(rotate, warmup=warmup_ms, rep=rep_ms, return_mode="median"), False


def time_cpu(calls, reps=3):
    """Median ms per call on the CPU (the --cpu-check plumbing test)."""
    calls[0]()  # warm-up
    samples = []
    for i in range(reps * len(calls)):
        start = time.perf_counter()
        calls[i % len(calls)]()
        samples.append((time.perf_counter() - start) * 1e3)
    return statistics.median(samples), False


# ---- the sweep ---------------------------------------------------------------------------------

@dataclass
class SweepOptions:
    kernels: list[str]
    shapes: list[tuple[int, int]]
    ms: list[int]
    rotate_mb: float = 200.0
    warmup_ms: float = 10.0
    rep_ms: float = 40.0
    time_budget_s: float = 540.0
    graphs: bool = True
    graph_max_m: int = GRAPH_MAX_M
    cpu: bool = False


def rel_error(y, ref) -> float:
    ref = ref.float()
    return float((y.float() - ref).norm() / ref.norm().clamp(min=1e-12))


def _reference_for(spec, x, ws):
    """Dense fp32 result the op should give, where one exists (None for random tinygemm packing)."""
    if spec.weight_kind == "fp16":
        return x.float() @ ws["w"].float().T
    if spec.weight_kind in ("int8", "bsr_int8"):
        return None  # activation quantization noise: compared by the kernel tests, not here
    if spec.weight_kind == "bsr":
        dense = torch.sparse_bsr_tensor(ws["crow"], ws["col"], ws["values"].float(), size=(ws["n"], ws["k"]))
        return x.float() @ dense.to_dense().T
    return None


def n_sets(per_set_bytes, rotate_mb):
    return max(1, min(MAX_SETS, math.ceil(rotate_mb * 2**20 / max(per_set_bytes, 1))))


def fits_in_memory(spec, k, n, m, device) -> bool:
    if device.type != "cuda":
        return True
    free, _ = torch.cuda.mem_get_info()
    need = (m * k + 2 * m * n) * 2 + 3 * n * k * 2  # x, y (and a padded copy), weights and temporaries
    return need < 0.8 * free


def bench_point(spec, weight_sets, k, n, m, opts, device, gen):
    """Time one kernel at one shape and M; returns the result record."""
    record = {"kernel": spec.name, "K": k, "N": n, "M": m, "sparsity": spec.sparsity}
    per_set = weight_bytes(weight_sets[0]) + m * (k + n) * 2
    count = n_sets(per_set, opts.rotate_mb)
    xs = [torch.randn(m, k, generator=gen, device=device).to(spec.x_dtype) for _ in range(min(count, 8))]
    call = spec.cpu_call if opts.cpu else spec.gpu_call
    calls = [(lambda x=xs[i % len(xs)], ws=weight_sets[i % len(weight_sets)]: call(x, ws)) for i in range(count)]
    # correctness at this M (so with this M's tiles), on a few rows to keep the fp32 reference cheap
    ref = _reference_for(spec, xs[0][:CHECK_ROWS], weight_sets[0])
    if ref is not None:
        record["rel_err"] = rel_error(call(xs[0], weight_sets[0])[:CHECK_ROWS], ref)
    use_graph = opts.graphs and m <= opts.graph_max_m
    ms, graphed = time_cpu(calls) if opts.cpu else time_gpu(calls, use_graph, opts.warmup_ms, opts.rep_ms)
    flops = 2.0 * m * n * k
    moved = weight_bytes(weight_sets[0]) + m * (k + n) * 2
    record.update(ms=ms, tflops=flops / ms / 1e9, gbps=moved / ms / 1e6, graph=graphed, sets=count)
    return record


def select(names, patterns):
    if not patterns:
        return names
    return [n for n in names if any(fnmatch.fnmatch(n, p) for p in patterns)]


def run_sweep(opts: SweepOptions, progress=True) -> list[dict]:
    device = torch.device("cpu" if opts.cpu else "cuda")
    specs = [s for s in kernel_specs() if s.name in opts.kernels]
    if not any(s.name == "cublas_fp16" for s in specs):
        specs.insert(0, next(s for s in kernel_specs() if s.name == "cublas_fp16"))  # ratios need it
    total = len(opts.shapes) * len(opts.ms) * len(specs)
    bar = _progress(total, progress)
    started = time.monotonic()
    results = []
    for k, n in opts.shapes:
        gen = torch.Generator(device=device).manual_seed(k * 100003 + n)
        for spec in specs:
            weight_sets, err = _weights_for(spec, k, n, opts, device, gen)
            for m in opts.ms:
                bar.update(1)
                bar.set_postfix_str(f"{spec.name} {k}x{n} M={m}")
                record = {"kernel": spec.name, "K": k, "N": n, "M": m, "sparsity": spec.sparsity}
                if err is not None:
                    results.append({**record, "error": err})
                    continue
                if time.monotonic() - started > opts.time_budget_s:
                    results.append({**record, "error": "skipped: time budget spent"})
                    continue
                if not fits_in_memory(spec, k, n, m, device):
                    results.append({**record, "error": "skipped: would not fit in GPU memory"})
                    continue
                try:
                    results.append(bench_point(spec, weight_sets, k, n, m, opts, device, gen))
                except Exception as e:  # keep going: report what ran
                    results.append({**record, "error": f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"})
                    if device.type == "cuda":
                        torch.cuda.synchronize()
            del weight_sets
            if device.type == "cuda":
                torch.cuda.empty_cache()
    bar.close()
    add_ratios(results)
    return results


def _weights_for(spec, k, n, opts, device, gen):
    """Weight sets for one kernel and shape (enough to rotate past L2 at M = 1), or an error string."""
    try:
        first = make_weight_set(spec.weight_kind, k, n, gen, device, spec.sparsity)
        sets = [first] + [
            make_weight_set(spec.weight_kind, k, n, gen, device, spec.sparsity)
            for _ in range(n_sets(weight_bytes(first), opts.rotate_mb) - 1)
        ]
        return sets, None
    except Exception as e:
        return None, f"weights: {type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"


def _progress(total, enabled):
    try:
        from tqdm import tqdm

        return tqdm(total=total, disable=not enabled, dynamic_ncols=True, file=sys.stderr)
    except ImportError:  # pragma: no cover - tqdm is a dependency
        class _Null:
            def update(self, _):
                pass

            def set_postfix_str(self, _):
                pass

            def close(self):
                pass

        return _Null()


def add_ratios(results):
    """ratio = cuBLAS ms / kernel ms at the same (K, N, M); also ours vs torch BSR at the same sparsity."""
    by_key = {(r["kernel"], r["K"], r["N"], r["M"]): r for r in results if "ms" in r}
    for r in results:
        if "ms" not in r:
            continue
        base = by_key.get(("cublas_fp16", r["K"], r["N"], r["M"]))
        if base is not None:
            r["ratio_vs_cublas"] = base["ms"] / r["ms"]
        if r["kernel"].startswith("ours_dds_"):
            anchor = by_key.get((f"torch_bsr_{r['sparsity']}", r["K"], r["N"], r["M"]))
            if anchor is not None:
                r["ratio_vs_torch_bsr"] = anchor["ms"] / r["ms"]
        if r["kernel"] in ANCHORS:
            anchor = by_key.get((ANCHORS[r["kernel"]], r["K"], r["N"], r["M"]))
            if anchor is not None:
                r["ratio_vs_anchor"] = anchor["ms"] / r["ms"]


# ---- targets and reports -----------------------------------------------------------------------

def _m_label(lo, hi):
    return f"M<={hi}" if lo == 1 else (f"M={lo}" if lo == hi else f"M>={lo}")


def evaluate_targets(results) -> list[dict]:
    """Targets per kernel and M range: worst ratio over the shapes, met when every cell is."""
    out = []
    for kernel, label, (lo, hi), shapes, need in QUANT_TARGETS:
        cells = [r for r in results if r["kernel"] == kernel and "ratio_vs_cublas" in r and r["M"] >= lo
                 and (hi is None or r["M"] <= hi) and (shapes is None or (r["K"], r["N"]) in shapes)]
        where = "every shape" if shapes is None else ", ".join(f"{k}x{n}" for k, n in shapes)
        out.append(_target_row(f"{label} vs cuBLAS fp16, {_m_label(lo, hi)} ({where})", f">= {need}x", cells,
                               "ratio_vs_cublas", need))
    for kernel, anchor in ANCHORS.items():
        cells = [r for r in results if r["kernel"] == kernel and "ratio_vs_anchor" in r]
        out.append(_target_row(f"{kernel} vs {anchor}, every shape and M", "> 1x", cells, "ratio_vs_anchor",
                               1.0, strict=True))
    for pct, ranges in DDS_TARGETS.items():
        for (lo, hi), need in ranges:
            cells = [r for r in results if r["kernel"] == f"ours_dds_{pct}" and "ratio_vs_cublas" in r
                     and r["M"] >= lo and (hi is None or r["M"] <= hi)]
            out.append(_target_row(f"DDS {pct}% vs cuBLAS fp16, {_m_label(lo, hi)}", f">= {need}x", cells, "ratio_vs_cublas", need))
    for pct in SPARSITIES:
        cells = [r for r in results if r["kernel"] == f"ours_dds_{pct}" and "ratio_vs_torch_bsr" in r]
        out.append(_target_row(f"DDS {pct}% vs torch bsr_dense_mm, every shape and M", "> 1x", cells,
                               "ratio_vs_torch_bsr", 1.0, strict=True))
    return out


def _target_row(name, goal, cells, key, need, strict=False):
    if not cells:
        return {"target": name, "goal": goal, "cells": 0, "met": None}
    worst = min(cells, key=lambda r: r[key])
    passed = [r for r in cells if (r[key] > need if strict else r[key] >= need)]
    return {"target": name, "goal": goal, "cells": len(cells), "cells_met": len(passed),
            "worst": round(worst[key], 3), "worst_at": f"{worst['K']}x{worst['N']} M={worst['M']}",
            "met": len(passed) == len(cells)}


def environment(cpu: bool) -> dict:
    import triton

    env = {"torch": torch.__version__, "triton": triton.__version__, "cuda": torch.version.cuda,
           "python": platform.python_version(), "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    if not cpu and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        env.update(gpu=props.name, sm_count=props.multi_processor_count,
                   memory_gib=round(props.total_memory / 2**30, 1))
    else:
        env["gpu"] = None
    return env


def format_table(results) -> str:
    """Plain-text table: one line per (shape, M), ms of cuBLAS then every kernel's ratio to it."""
    names = list(dict.fromkeys(r["kernel"] for r in results))
    head = f"{'K x N':>12} {'M':>5} {'cuBLAS ms':>10} " + " ".join(f"{n[:15]:>15}" for n in names if n != "cublas_fp16")
    lines = [head]
    cells = {(r["kernel"], r["K"], r["N"], r["M"]): r for r in results}
    for k, n, m in dict.fromkeys((r["K"], r["N"], r["M"]) for r in results):
        base = cells.get(("cublas_fp16", k, n, m), {})
        row = f"{f'{k}x{n}':>12} {m:>5} {base.get('ms', float('nan')):>10.4f} "
        row += " ".join(f"{_ratio_text(cells.get((name, k, n, m))):>15}" for name in names if name != "cublas_fp16")
        lines.append(row)
    return "\n".join(lines)


def _ratio_text(r):
    if r is None:
        return "-"
    if "ratio_vs_cublas" in r:
        return f"{r['ratio_vs_cublas']:.2f}x"
    return "err" if "error" in r else "-"


def _graph_scope(env) -> str:
    limit = env.get("settings", {}).get("graph_max_m", 0)
    return "at every M" if limit >= GRAPH_MAX_M else f"up to M = {limit}"


def markdown(report: dict, notes: str = "") -> str:
    """The docs summary: environment, the targets (met / not met), ratios per shape, then ``notes``."""
    env, results, targets = report["environment"], report["results"], report["targets"]
    lines = ["# Kernel benchmark", "",
             "Generated by `scripts/bench_kernels.py --markdown` from "
             f"`{report.get('json_path', 'the run')}`. Ratios are cuBLAS fp16 time / kernel time on the same "
             "shape and M in the same run (>1 is faster than cuBLAS); `torch_bsr_*` is "
             "`torch.sparse._triton_ops.bsr_dense_mm`, `tinygemm` is `aten._weight_int4pack_mm` (bf16 x).", "",
             f"GPU: **{env.get('gpu')}**; torch {env.get('torch')}, Triton {env.get('triton')}, "
             f"CUDA {env.get('cuda')}; {env.get('date')}; sweep {env.get('sweep_seconds')} s.", "",
             "Method: `triton.testing.do_bench` medians (L2 flushed before each timed call); each kernel "
             "rotates over weight/input sets totalling >= "
             f"{env.get('settings', {}).get('rotate_mb')} MB; {_graph_scope(env)} "
             "the rotation is one CUDA graph and its replay time is divided by the number of calls (`graph` in the "
             "JSON says where capture failed and the op was timed eagerly). Anchors that "
             "need it are padded: `torch._int_mm` to 32 rows at M <= 16, `bsr_dense_mm` to a multiple of 16 "
             "columns. Block masks are uniformly random with exactly p% of the 32x32 blocks absent, shared by "
             "`torch_bsr_p` and `ours_dds_p`.", "", "## Targets", "",
             "| target | goal | worst ratio (where) | cells met | status |", "|---|---|---|---|---|"]
    for t in targets:
        status = {True: "met", False: "**not met**", None: "not measured"}[t["met"]]
        worst = f"{t['worst']}x ({t['worst_at']})" if t.get("cells") else "-"
        met = f"{t.get('cells_met', 0)}/{t['cells']}"
        lines.append(f"| {t['target']} | {t['goal']} | {worst} | {met} | {status} |")
    names = [n for n in dict.fromkeys(r["kernel"] for r in results) if n != "cublas_fp16"]
    cells = {(r["kernel"], r["K"], r["N"], r["M"]): r for r in results}
    lines += ["", "## Ratio to cuBLAS fp16", "", "| K x N | M | cuBLAS ms | " + " | ".join(names) + " |",
              "|---|---|---|" + "---|" * len(names)]
    for k, n, m in dict.fromkeys((r["K"], r["N"], r["M"]) for r in results):
        base = cells.get(("cublas_fp16", k, n, m), {})
        ms = f"{base['ms']:.4f}" if "ms" in base else "-"
        lines.append(f"| {k}x{n} | {m} | {ms} | " + " | ".join(_ratio_text(cells.get((nm, k, n, m))) for nm in names) + " |")
    errors = sorted({f"{r['kernel']}: {r['error']}" for r in results if "error" in r})
    if errors:
        lines += ["", "## Not measured", ""] + [f"- {e}" for e in errors[:40]]
    if notes:
        lines += ["", notes.strip()]
    return "\n".join(lines) + "\n"


# ---- command line ------------------------------------------------------------------------------

def parse_shapes(text):
    shapes = []
    for item in text.split(","):
        try:
            k, n = (int(v) for v in item.lower().split("x"))
        except ValueError:
            raise argparse.ArgumentTypeError(f"--shapes: expected KxN[,KxN...] like 4096x11008, got {item!r}")
        shapes.append((k, n))
    return shapes


def parse_ints(text):
    try:
        return [int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}")


def build_parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--kernels", default="*", help="comma-separated names or globs (e.g. 'ours_dds_*,torch_bsr_*')")
    p.add_argument("--shapes", type=parse_shapes, default=None, help="KxN list, e.g. 4096x4096,8192x28672")
    p.add_argument("--m", type=parse_ints, default=None, help="M values, e.g. 1,16,2048")
    p.add_argument("--out", type=Path, default=None, help="write the JSON results here")
    p.add_argument("--markdown", type=Path, default=None, help="write the Markdown summary here")
    p.add_argument("--from-json", type=Path, default=None, help="no timing: read an earlier --out file")
    p.add_argument("--notes", type=Path, default=None, help="Markdown file appended to the --markdown summary")
    p.add_argument("--rotate-mb", type=float, default=200.0, help="bytes of weights+inputs to rotate over")
    p.add_argument("--warmup-ms", type=float, default=10.0)
    p.add_argument("--rep-ms", type=float, default=40.0)
    p.add_argument("--time-budget-s", type=float, default=540.0, help="skip what is left after this long")
    p.add_argument("--no-graph", action="store_true", help="never use CUDA graphs")
    p.add_argument("--graph-max-m", type=int, default=GRAPH_MAX_M, help="use CUDA graphs up to this M")
    p.add_argument("--cpu-check", action="store_true", help="tiny shapes on the CPU with reference ops")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--list", action="store_true", help="print the kernel names and exit")
    return p


def main(argv=None) -> dict:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    names = [s.name for s in kernel_specs()]
    if args.list:
        print("\n".join(names))
        return {}
    if args.from_json is not None:
        report = json.loads(args.from_json.read_text())
        report["json_path"] = str(args.from_json)
        add_ratios(report["results"])  # targets re-evaluated with today's list, on the stored times
        report["targets"] = evaluate_targets(report["results"])
    else:
        report = _measure(args, names)
    print(format_table(report["results"]))
    for t in report["targets"]:
        print(f"{'MET ' if t['met'] else 'MISS' if t['met'] is False else '  - '} {t['target']}: {t['goal']}, "
              f"worst {t.get('worst')} at {t.get('worst_at')}")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({k: v for k, v in report.items() if k != "json_path"}, indent=1))
        report.setdefault("json_path", str(args.out))
    if args.markdown is not None:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        notes = args.notes.read_text() if args.notes is not None else ""
        args.markdown.write_text(markdown(report, notes))
    return report


def _measure(args, names) -> dict:
    if args.cpu_check:
        os.environ.setdefault("TRITON_INTERPRET", "1")
        shapes, ms = args.shapes or [(128, 64), (256, 96)], args.m or [1, 16]
    else:
        if not torch.cuda.is_available():
            raise SystemExit("bench_kernels: no CUDA GPU here; use --cpu-check for the plumbing test")
        shapes, ms = args.shapes or SHAPES, args.m or MS
    if str(REPO_ROOT) not in sys.path:
        sys.path.insert(0, str(REPO_ROOT))
    opts = SweepOptions(kernels=select(names, args.kernels.split(",")), shapes=shapes, ms=ms,
                        rotate_mb=args.rotate_mb if not args.cpu_check else 0.1,
                        warmup_ms=args.warmup_ms, rep_ms=args.rep_ms, time_budget_s=args.time_budget_s,
                        graphs=not args.no_graph, graph_max_m=args.graph_max_m, cpu=args.cpu_check)
    started = time.monotonic()
    results = run_sweep(opts, progress=not args.no_progress)
    env = environment(args.cpu_check)
    env["sweep_seconds"] = round(time.monotonic() - started, 1)
    env["settings"] = {"rotate_mb": opts.rotate_mb, "warmup_ms": opts.warmup_ms, "rep_ms": opts.rep_ms,
                       "graph_max_m": opts.graph_max_m if opts.graphs else 0, "cpu_check": opts.cpu}
    return {"environment": env, "results": results, "targets": evaluate_targets(results)}


if __name__ == "__main__":
    main()
