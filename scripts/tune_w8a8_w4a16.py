"""Time the W8A8 and W4A16 kernels against their anchors, and sweep tile configs (GPU only).

For each weight shape K x N and each M it times, side by side in one run:
  * ``fp16``   cuBLAS ``F.linear`` in fp16 (the baseline every ratio is taken against),
  * ``w8a8``   our ``w8a8_matmul`` (dynamic per-token quantization included),
  * ``int_mm`` ``torch._int_mm`` with the same per-token quantize / dequantize around it (torchao W8A8),
  * ``w4a16``  our ``w4a16_matmul`` with G = 128,
  * ``int4pk`` ``torch.ops.aten._weight_int4pack_mm`` (tinygemm, bf16 activations, G = 128).

Method: each timed unit is a CUDA graph that calls the op once on each of R rotating input sets
(weights and activations), R chosen so the sets together exceed L2 several times; the graph is
replayed under ``triton.testing.do_bench`` (median) and the time divided by R. Graphs remove launch
gaps, rotation defeats L2 reuse. Results go to ``$OUT`` (or ``--out``) as JSON and a Markdown table.

``--sweep chunk`` times the tiled kernel with CHUNK K tiles per loop step (one scale load per step,
see docs/kernels-notes.md, call 5) against the current default, fp16 and tinygemm columns alongside.
``--sweep fused`` times the W8A8 one-launch path (``kernels/w8a8_fused.py``: activation quantization
inside the GEMM) against the two-launch path as it was before it (pre-pass + GEMM, ``legacy_w8_config``)
and cuBLAS fp16, at M <= 64 on the large shapes and at MiniLM's small layers (384 / 1536).
``--sweep`` additionally times explicit ``TileConfig`` variants at chosen shapes, to pick the
heuristics in ``kernels.w4a16.pick_config`` / ``kernels.w8a8.pick_config``. ``--sweep skinny`` times
only the W4A16 small-M variants (``kernels/w4a16_gemv.py``: tile, warps, stages, split-K, inline-PTX
vs plain unpack) against the previous default; ``--methods fp16,w4a16,int4pk`` limits the table.
``--sweep decode`` times W8A8 / W4A16 alternatives at the decode benchmark's fused layer shapes
(q/k/v 4096x12288, gate/up 4096x22016, o 4096x4096, down 11008x4096) at M = 1 and 8, tinygemm alongside.
``--sweep split16`` times W8A8 16-row tiles with K splits (summed in the kernel) at M = 4 and 16.
``--sweep tma`` times the W8A8 large-M GEMM with TMA tile loads (``kernels/w8a8_tma.py``) in several tiles
against the current pick (pointer loads), quantize pass included, at M = 2048 and 8192.
``--sweep quant`` times W8A8's per-token quantize pass reading x once (whole rows in registers) against
the two-pass version, alone and with the GEMM after it, at M = 16 to 8192.
``--sweep planes`` times the W4A16 tiled kernel with the K tile taken as 8 nibble planes (packed words
loaded straight into the dot operand, no unpacked tile in shared memory) against the current pick.
``--sweep wgmma`` times the swapped nibble planes (``kernels/w4a16_wgmma.py``: the weight as the register
operand of wgmma, x permuted into plane order first) in several tiles against the current pick.
``--sweep scales`` times the current W4A16 pick with fp32 and fp16 scales, with and without the scale row
loaded one K tile ahead.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import time

import torch
import torch.nn.functional as F
import triton
from triton.testing import do_bench

from compress_kernels import w4a16 as w4
from compress_kernels import w8a8 as w8
from compress_kernels._tiles import prefetch_split_k, split_k_for

SHAPES = [(1024, 1024), (4096, 4096), (4096, 11008), (11008, 4096), (8192, 8192), (8192, 28672)]  # K x N
MS = [1, 16, 64, 256, 2048, 8192]
L2_BYTES = 50 * 2**20
GROUP = 128


def rotations(k: int, n: int) -> int:
    """Input sets per graph so the int4 weights alone span 4x L2 (at most 16)."""
    return max(1, min(16, math.ceil(4 * L2_BYTES / (k * n // 2))))


def time_graph(fn, arg_sets, warmup_ms=5, rep_ms=30) -> float:
    """Median microseconds per call of ``fn`` over rotating ``arg_sets``, timed as one CUDA graph."""
    for args in arg_sets:
        fn(*args)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for args in arg_sets:
            fn(*args)
    ms = do_bench(graph.replay, warmup=warmup_ms, rep=rep_ms, return_mode="median")
    del graph
    return ms * 1000 / len(arg_sets)


def int_mm_w8a8(x, w_q_t, w_scale):
    """torchao-style W8A8: per-token quantize in PyTorch ops, torch._int_mm, dequantize."""
    s_x = (x.abs().amax(-1, keepdim=True).float() / 127).clamp_min(1e-12)
    xq = torch.clamp(torch.round(x.float() / s_x), -128, 127).to(torch.int8)
    m = xq.shape[0]
    if m <= 16:  # _int_mm needs M > 16
        xq = F.pad(xq, (0, 0, 0, 32 - m))
    acc = torch._int_mm(xq, w_q_t)[:m]
    return (acc.float() * s_x * w_scale).to(x.dtype)


def make_weights(k, n, r, dev="cuda"):
    """R sets of every method's weights for one K x N shape."""
    sets = []
    for _ in range(r):
        w16 = torch.randn(n, k, device=dev, dtype=torch.float16) * 0.02
        w_q = torch.randint(-127, 128, (n, k), dtype=torch.int8, device=dev)
        qweight = torch.randint(-(2**31), 2**31 - 1, (k // 8, n), dtype=torch.int32, device=dev)
        scales = torch.rand(k // GROUP, n, device=dev) * 0.01
        packed = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device=dev)
        try:
            int4pk = torch.ops.aten._convert_weight_to_int4pack(packed, 8)
        except Exception as err:  # noqa: BLE001 - record why the anchor is missing
            int4pk = repr(err)[:120]
        sz = torch.rand(k // GROUP, n, 2, device=dev).to(torch.bfloat16)
        sets.append(dict(w16=w16, w_q=w_q, w_q_t=w_q.t(), w_scale=torch.rand(n, device=dev) * 0.01,
                         qweight=qweight, scales=scales, int4pk=int4pk, sz=sz))
    return sets


METHODS = ("fp16", "w8a8", "int_mm", "w4a16", "int4pk")


def bench_cell(k, n, m, wsets, methods=METHODS):
    """All methods at one (K, N, M); returns {method: microseconds or error string}."""
    xs = [torch.randn(m, k, device="cuda", dtype=torch.float16) for _ in wsets]
    xb = [x.bfloat16() for x in xs]
    row = {}
    cases = {
        "fp16": (F.linear, [(x, w["w16"]) for x, w in zip(xs, wsets)]),
        "w8a8": (w8.w8a8_matmul, [(x, w["w_q"], w["w_scale"]) for x, w in zip(xs, wsets)]),
        "int_mm": (int_mm_w8a8, [(x, w["w_q_t"], w["w_scale"]) for x, w in zip(xs, wsets)]),
        "w4a16": (w4.w4a16_matmul, [(x, w["qweight"], w["scales"], GROUP) for x, w in zip(xs, wsets)]),
        "int4pk": (torch.ops.aten._weight_int4pack_mm, [(x, w["int4pk"], GROUP, w["sz"]) for x, w in zip(xb, wsets)]),
    }
    for name, (fn, arg_sets) in cases.items():
        if name not in methods:
            row[name] = "skipped"
            continue
        if name == "int4pk" and isinstance(wsets[0]["int4pk"], str):
            row[name] = wsets[0]["int4pk"]
            continue
        try:
            row[name] = time_graph(fn, arg_sets)
        except Exception as err:  # noqa: BLE001 - one failing anchor must not stop the table
            row[name] = repr(err)[:160]
    return row


def ratio(base, t):
    return f"{base / t:.2f}" if isinstance(base, float) and isinstance(t, float) else "-"


def markdown(results) -> str:
    lines = [
        "| K x N | M | fp16 us | w8a8 us | int_mm us | w4a16 us | int4pk us | w8a8 x | int_mm x | w4a16 x | int4pk x |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        t = {k: (f"{v:.1f}" if isinstance(v, float) else ("-" if v == "skipped" else "err")) for k, v in r["us"].items()}
        b = r["us"]["fp16"]
        lines.append(
            f"| {r['k']}x{r['n']} | {r['m']} | {t['fp16']} | {t['w8a8']} | {t['int_mm']} | {t['w4a16']} | {t['int4pk']} "
            f"| {ratio(b, r['us']['w8a8'])} | {ratio(b, r['us']['int_mm'])} | {ratio(b, r['us']['w4a16'])} "
            f"| {ratio(b, r['us']['int4pk'])} |"
        )
    return "\n".join(lines)


T4 = w4.TileConfig
SWEEP_W4 = {  # M bucket -> configs (split_k None = heuristic)
    "m1": [
        T4(1, 64, 128, None, num_warps=4, num_stages=3, path="fma"),
        T4(1, 128, 128, None, num_warps=4, num_stages=3, path="fma"),
        T4(16, 64, 128, None, num_warps=4, num_stages=4, scale_after_dot=True),
    ],
    "small": [
        T4(16, 64, 128, None, num_warps=4, num_stages=4, scale_after_dot=True),
        T4(16, 64, 128, None, num_warps=4, num_stages=6, scale_after_dot=True),
        T4(16, 128, 128, None, num_warps=8, num_stages=4, scale_after_dot=True),
    ],
    "mid": [
        T4(64, 64, 128, None, num_warps=4, num_stages=4, scale_after_dot=True),
        T4(64, 128, 128, None, num_warps=4, num_stages=4, scale_after_dot=True),
        T4(64, 64, 128, None, num_warps=4, num_stages=5, scale_after_dot=True),
    ],
    "large": [
        T4(128, 128, 64, 1, num_warps=8, num_stages=4, magic_unpack=True),
        T4(0, 0, 0, 1, path="dequant"),
    ],
}
SWEEP_W8 = {
    "small": [
        w8.TileConfig(16, 64, 256, None, num_warps=4, num_stages=4),
        w8.TileConfig(16, 32, 256, None, num_warps=4, num_stages=4),
        w8.TileConfig(16, 128, 256, None, num_warps=4, num_stages=4),
        w8.TileConfig(16, 64, 512, None, num_warps=4, num_stages=3),
        w8.TileConfig(16, 64, 256, 1, num_warps=4, num_stages=5),
    ],
    "mid": [
        w8.TileConfig(64, 64, 256, None, num_warps=4, num_stages=4),
        w8.TileConfig(64, 128, 256, None, num_warps=4, num_stages=4),
        w8.TileConfig(32, 64, 256, None, num_warps=4, num_stages=4),
    ],
    "large": [
        w8.TileConfig(128, 256, 128, 1, num_warps=8, num_stages=3),
        w8.TileConfig(128, 128, 128, 1, num_warps=8, num_stages=4),
        w8.TileConfig(256, 128, 128, 1, num_warps=8, num_stages=3),
        w8.TileConfig(128, 256, 64, 1, num_warps=8, num_stages=4),
    ],
}
SWEEP_CELLS = [((4096, 4096), 1, "m1"), ((8192, 28672), 1, "m1"), ((4096, 4096), 16, "small")]
SWEEP_W8["m1"] = SWEEP_W8["small"]


def time_variants(kernel, launch, variants, arg_sets, cell) -> list[dict]:
    """Time ``launch(*args, cfg)`` over the rotating ``arg_sets`` for each (label, cfg) of ``variants``.

    One row per variant with the ``cell`` fields (k, n, m, fp16_us, ...); a variant that fails records
    its error instead of a time, so one bad config does not stop a sweep."""
    rows = []
    for label, cfg in variants:
        try:
            us = time_graph(launch, [args + (cfg,) for args in arg_sets])
        except Exception as err:  # noqa: BLE001 - one failing variant must not stop the sweep
            us = repr(err)[:160]
        rows.append(dict(cell, kernel=kernel, cfg=cfg._asdict(), us=us, **({"label": label} if label else {})))
    return rows


def w4_args(xs, wsets):
    return [(x, w["qweight"], w["scales"], GROUP, None) for x, w in zip(xs, wsets)]


def w8_args(xs, wsets):
    return [(x, w["w_q"], w["w_scale"], None, None) for x, w in zip(xs, wsets)]


def write_sweep(out_dir, name, meta, rows) -> None:
    """Rewrite ``name``.json and ``name``.md (called after every cell: a killed run keeps what it timed)."""
    with open(os.path.join(out_dir, f"{name}.json"), "w") as f:
        json.dump(dict(meta=meta, rows=rows), f, indent=1)
    with open(os.path.join(out_dir, f"{name}.md"), "w") as f:
        f.write(sweep_markdown(rows) + "\n")


def sweep_cells(cells, deadline, weights, time_cell, out_dir=None, name=None, meta=None, device="cuda"):
    """The loop every sweep shares. For each ((K, N), M) of ``cells`` started before ``deadline``:
    ``weights(K, N)`` rotating weight sets, one fp16 input per set, cuBLAS fp16 timed over them, then
    ``time_cell(K, N, M, wsets, xs, fp16_us)`` -> result rows; the cell's rows are printed at once and,
    with ``out_dir``, the ``name`` files rewritten (a killed run keeps what it timed). Cells past the
    deadline leave a ``skipped`` row."""
    rows = []
    for (k, n), m in cells:
        if time.time() > deadline:
            rows.append(dict(skipped=f"{k}x{n} M={m}: out of time"))
            continue
        wsets = weights(k, n)
        xs = [torch.randn(m, k, device=device, dtype=torch.float16) for _ in wsets]
        fp16_us = time_graph(F.linear, [(x, w["w16"]) for x, w in zip(xs, wsets)])
        new = time_cell(k, n, m, wsets, xs, fp16_us)
        rows += new
        print("\n".join(sweep_markdown(new).splitlines()[2:]), flush=True)
        del wsets, xs
        if device == "cuda":
            torch.cuda.empty_cache()
        if out_dir is not None:
            write_sweep(out_dir, name, meta, rows)
    return rows


def skinny_variants(m, n, k):
    """Small-M W4A16 variants around ``skinny_config``'s choice, plus the current default (tiled)."""
    base = w4.skinny_config(m, n, k, GROUP)
    split = lambda cfg: cfg._replace(split_k=w4._balanced_split_k(m, n, k, cfg))  # noqa: E731
    return [
        base,
        base._replace(asm_unpack=False),
        base._replace(prefetch_scale=True),
        split(base._replace(block_n=128, num_warps=4, prefetch_scale=True)),
        split(base._replace(block_n=128, num_warps=8)),
        split(base._replace(block_n=128, num_warps=4)),
        split(base._replace(block_n=32, num_warps=2)),
        base._replace(num_stages=3),
        base._replace(num_stages=6),
        base._replace(split_k=max(1, base.split_k // 2)),
        base._replace(split_k=min(16, base.split_k * 2)),
        w4.pick_config(m, n, k, GROUP),
    ]


SKINNY_CELLS = [((8192, 28672), 1), ((4096, 4096), 1), ((8192, 28672), 16), ((4096, 4096), 16),
                ((8192, 8192), 64), ((11008, 4096), 1)]  # most telling first: a short run keeps these


def sweep_skinny(deadline):
    def time_cell(k, n, m, wsets, xs, fp16_us):
        return time_variants("w4a16", w4.launch, [(None, c) for c in skinny_variants(m, n, k)], w4_args(xs, wsets),
                             dict(k=k, n=n, m=m, fp16_us=fp16_us))

    return sweep_cells(SKINNY_CELLS, deadline, lambda k, n: make_weights(k, n, rotations(k, n)), time_cell)


def time_tinygemm(xs, wsets):
    """us per call of PyTorch's int4 kernel (tinygemm, bf16 x) over the rotating sets, or the error text."""
    try:
        return time_graph(torch.ops.aten._weight_int4pack_mm,
                          [(x.bfloat16(), w["int4pk"], GROUP, w["sz"]) for x, w in zip(xs, wsets)])
    except Exception as err:  # noqa: BLE001 - the anchor may be missing
        return repr(err)[:160]


def chunk_variants(m, n, k):
    """Tiled W4A16 with CHUNK K tiles per loop step (one scale load per step) vs the current default."""
    base = w4.pick_config(m, n, k, GROUP)
    balanced = lambda cfg: cfg._replace(split_k=w4._balanced_split_k(m, n, k, cfg))  # noqa: E731
    return [
        base,
        balanced(base._replace(chunk=1)),  # control: the split alone
        balanced(base._replace(chunk=2, num_stages=3)),
        balanced(base._replace(chunk=2, num_stages=4)),
        balanced(base._replace(chunk=4, num_stages=3)),
        balanced(base._replace(block_n=32, chunk=4, num_stages=3)),
    ]


CHUNK_CELLS = [((8192, 28672), 1), ((4096, 4096), 1), ((11008, 4096), 1), ((8192, 28672), 16),
               ((4096, 4096), 16), ((11008, 4096), 16), ((8192, 28672), 64), ((4096, 4096), 64),
               ((11008, 4096), 64)]  # most telling first: a run cut short keeps these


def sweep_chunk(deadline, out_dir, meta):
    """Time ``chunk_variants`` with fp16 and tinygemm alongside; rewrite the result files after every cell."""
    def time_cell(k, n, m, wsets, xs, fp16_us):
        tiny = time_tinygemm(xs, wsets)
        return time_variants("w4a16", w4.launch, [(None, c) for c in chunk_variants(m, n, k)], w4_args(xs, wsets),
                             dict(k=k, n=n, m=m, fp16_us=fp16_us, int4pk_us=tiny))

    return sweep_cells(CHUNK_CELLS, deadline, lambda k, n: make_weights(k, n, rotations(k, n)), time_cell,
                       out_dir, "chunk_sweep", meta)


def legacy_w8_config(m, n, k):
    """The W8A8 two-launch tiles before the fused path existed (the baseline of ``--sweep fused``)."""
    T8 = w8.TileConfig
    if m <= 16:
        return T8(16, 64, 256, split_k=1, num_warps=4, num_stages=5)
    cfg = T8(32, 64, 256, num_warps=4, num_stages=4) if m <= 64 else (
        T8(128, 128, 128, num_warps=8, num_stages=4) if m <= 256 else T8(256, 128, 128, num_warps=8, num_stages=3))
    return cfg._replace(split_k=split_k_for(m, n, k, cfg))


def fused_variants(m, n, k):
    """(label, TileConfig) pairs timed at one cell: the old two-launch default, fused and pre-pass alternatives."""
    T8 = w8.TileConfig
    old = legacy_w8_config(m, n, k)
    out = [("two-launch old", old)]
    if n * k <= w8.SMALL_LAYER:
        for t in (T8(32, 64, 128, num_warps=4, num_stages=3), T8(64, 64, 128, num_warps=4, num_stages=3)):
            tag = f"{t.block_m}x{t.block_n}x{t.block_k}"
            out += [(f"pre-pass {tag}", t), (f"fused {tag}", t._replace(fused=True))]
        if m <= 64:
            out.append(("fused old tiles", old._replace(fused=True)))
        return out
    first = T8(16, 64, 256, num_warps=4, num_stages=5) if m <= 16 else T8(32, 64, 256, num_warps=4, num_stages=4)
    second = T8(16, 128, 256, num_warps=4, num_stages=4) if m <= 16 else T8(16, 64, 256, num_warps=4, num_stages=5)
    split = first._replace(split_k=split_k_for(m, n, k, first))
    for t in (first, second, split):
        out.append((f"fused {t.block_m}x{t.block_n}x{t.block_k} sk{t.split_k}", t._replace(fused=True)))
    return out


FUSED_CELLS = [((4096, 4096), 1), ((4096, 4096), 16), ((4096, 4096), 64),
               ((8192, 28672), 1), ((8192, 28672), 16), ((8192, 28672), 64),
               ((384, 384), 64), ((384, 1536), 64), ((1536, 384), 64),
               ((384, 384), 256), ((384, 1536), 256), ((1536, 384), 256),
               ((384, 384), 2048), ((384, 1536), 2048), ((1536, 384), 2048),
               ((8192, 8192), 1), ((8192, 8192), 16), ((8192, 8192), 64),
               ((4096, 11008), 1), ((4096, 11008), 16), ((4096, 11008), 64),
               ((11008, 4096), 1), ((11008, 4096), 16), ((11008, 4096), 64)]  # most telling first


def w8_weights(k, n):
    """Rotating fp16 and int8 weight sets for one K x N shape (int8 sets span 4x L2, at most 16)."""
    r = max(1, min(16, math.ceil(4 * L2_BYTES / (k * n))))
    return [dict(w16=torch.randn(n, k, device="cuda", dtype=torch.float16) * 0.02,
                 w_q=torch.randint(-127, 128, (n, k), dtype=torch.int8, device="cuda"),
                 w_scale=torch.rand(n, device="cuda") * 0.01 + 0.001) for _ in range(r)]


def sweep_w8(cells, variants, name, deadline, out_dir, meta):
    """Time the W8A8 ``variants(m, n, k)`` -> [(label, TileConfig)] and cuBLAS fp16 at ``cells`` with
    rotating int8 weight sets; rewrite the ``name`` result files after every cell."""
    def time_cell(k, n, m, wsets, xs, fp16_us):
        return time_variants("w8a8", w8.launch, variants(m, n, k), w8_args(xs, wsets),
                             dict(k=k, n=n, m=m, r=len(wsets), fp16_us=fp16_us))

    return sweep_cells(cells, deadline, w8_weights, time_cell, out_dir, name, meta)


DECODE_CELLS = [((4096, 4096), 1), ((11008, 4096), 1), ((4096, 12288), 1), ((4096, 22016), 1),
                ((4096, 4096), 8), ((11008, 4096), 8)]  # Llama-2-7B decode, q/k/v and gate/up fused


def decode_variants(m, n, k):
    """W8A8 and W4A16 alternatives at the decode benchmark's fused layer shapes, next to the current picks.

    W8A8 at M <= 16 runs 16x64 tiles without split-K, so a 4096-wide layer gives only 64 programs;
    narrower tiles or a split-K give more, and at M <= 2 the one-row kernel (``gemv_config``) drops
    the quantize launch. W4A16 at M = 1 runs the CUDA-core kernel; its split and
    column tile are varied around the current choice."""
    T8 = w8.TileConfig
    w8_tiles = [T8(16, 32, 256, 1, num_warps=4, num_stages=5), T8(16, 32, 256, 1, num_warps=2, num_stages=5),
                T8(16, 64, 512, 1, num_warps=4, num_stages=3), T8(16, 128, 256, 1, num_warps=4, num_stages=4),
                T8(16, 64, 256, 2, num_warps=4, num_stages=5), T8(16, 64, 256, 4, num_warps=4, num_stages=5)]
    if m <= 2:  # the one-row CUDA-core kernel with the row quantized inside (kernels/w8a8_gemv.py)
        gemv = [w8.gemv_config(m, n, k, block_n=bn, block_k=bk) for bn, bk in ((32, 128), (64, 128), (64, 256),
                                                                                (128, 128))]
        w8_tiles += gemv + [gemv[0]._replace(split_k=max(1, gemv[0].split_k // 2)),
                            gemv[0]._replace(num_warps=2), gemv[0]._replace(block_k=256)]
    current4 = w4.pick_config(m, n, k, GROUP)
    w4_tiles = []
    if current4.path == "fma":
        w4_tiles = [with_split(current4._replace(block_n=bn, split_k=None), m, n, k) for bn in (32, 64, 128)]
        w4_tiles += [current4._replace(split_k=max(1, current4.split_k // 2)),
                     current4._replace(split_k=min(32, current4.split_k * 2)),
                     current4._replace(num_stages=current4.num_stages + 1), current4._replace(num_warps=2),
                     current4._replace(num_warps=8)]
    return ([("w8a8", "current", w8.pick_config(m, n, k))] + [("w8a8", "alt", t) for t in w8_tiles]
            + [("w4a16", "current", current4)] + [("w4a16", "alt", t) for t in w4_tiles])


def sweep_decode(deadline, out_dir, meta):
    """Time ``decode_variants``, cuBLAS fp16 and tinygemm at ``DECODE_CELLS``; rewrite the files after every cell."""
    def time_cell(k, n, m, wsets, xs, fp16_us):
        tiny = time_tinygemm(xs, wsets)
        rows = []
        for kernel, label, cfg in decode_variants(m, n, k):
            launch, args = (w4.launch, w4_args(xs, wsets)) if kernel == "w4a16" else (w8.launch, w8_args(xs, wsets))
            rows += time_variants(kernel, launch, [(label, cfg)], args,
                                  dict(k=k, n=n, m=m, fp16_us=fp16_us, int4pk_us=tiny))
        return rows

    return sweep_cells(DECODE_CELLS, deadline, lambda k, n: make_weights(k, n, rotations(k, n)), time_cell,
                       out_dir, "decode_sweep", meta)


SPLIT16_CELLS = [(shape, m) for shape in SHAPES for m in (4, 16)]


def planes_variants(m, n, k):
    """Nibble-plane tiles at the balanced split, next to the current pick: the columns each warp covers
    (BLOCK_N / warps: the x tile's split into planes is paid once per warp and K tile), stages, the
    magic-number unpack instead of inline PTX, and (M > 16) taller row tiles."""
    current = w4.pick_config(m, n, k, GROUP)
    base = w4.TileConfig(16, 64, 128, num_warps=4, num_stages=3, scale_after_dot=True, planes=True)
    tiles = [base, base._replace(num_warps=2), base._replace(num_warps=1),
             base._replace(block_n=128, num_stages=4), base._replace(block_n=128, asm_unpack=False, magic_unpack=True),
             base._replace(block_n=128, num_warps=2), base._replace(block_n=128, num_warps=2, num_stages=4),
             base._replace(block_n=128, num_warps=1), base._replace(block_n=256),
             base._replace(block_n=256, num_warps=2),
             base._replace(block_n=512), base._replace(block_n=256, num_warps=2, num_stages=4)]
    if m > 16:
        tiles += [t._replace(block_m=bm) for bm in (32, 64) for t in (base, base._replace(block_n=128))]
    balanced = [t._replace(split_k=w4._balanced_split_k(m, n, k, t)) for t in tiles]
    doubled = [balanced[i]._replace(split_k=2 * balanced[i].split_k) for i in (5, 8)]
    return [("current", current)] + [("planes", t) for t in balanced + doubled]


PLANES_CELLS = [((8192, 28672), 16), ((4096, 4096), 16), ((11008, 4096), 16), ((4096, 11008), 16),
                ((8192, 8192), 16), ((8192, 28672), 4), ((4096, 4096), 4), ((8192, 8192), 4), ((11008, 4096), 4),
                ((1024, 1024), 16), ((1024, 1024), 1), ((8192, 28672), 1), ((4096, 4096), 1)]


def sweep_w4(cells, variants, name, deadline, out_dir, meta):
    """Time the W4A16 ``variants(m, n, k)`` -> [(label, TileConfig)] with cuBLAS fp16 and tinygemm
    alongside at ``cells``; rewrite the ``name`` result files after every cell."""
    def time_cell(k, n, m, wsets, xs, fp16_us):
        tiny = time_tinygemm(xs, wsets)
        return time_variants("w4a16", w4.launch, variants(m, n, k), w4_args(xs, wsets),
                             dict(k=k, n=n, m=m, r=len(wsets), fp16_us=fp16_us, int4pk_us=tiny))

    return sweep_cells(cells, deadline, lambda k, n: make_weights(k, n, rotations(k, n)), time_cell,
                       out_dir, name, meta)


def wgmma_variants(m, n, k):
    """Swapped nibble-pair tiles (``kernels/w4a16_wgmma.py``: the weight as wgmma's register operand)
    next to the current pick: token tile (the wgmma's N side), channel tile (64 per warp group) and
    warps, pipeline stages, at the balanced split (and twice it for 128-channel tiles); the scale is
    applied before the dot, and after it for the 3-stage tiles."""
    current = w4.pick_config(m, n, k, GROUP)
    top = min(max(16, triton.next_power_of_2(m)), 128)
    token_tiles = sorted({top, max(16, top // 2)})
    tiles = [w4.TileConfig(bm, bn, 128, num_warps=warps, num_stages=stages, path="wgmma")
             for bm in token_tiles for bn, warps in ((64, 4), (128, 4), (256, 8)) for stages in (2, 3, 4)]
    tiles += [t._replace(scale_after_dot=True) for t in tiles if t.num_stages == 3]
    balanced = [t._replace(split_k=w4._balanced_split_k(m, n, k, t)) for t in tiles]
    doubled = [t._replace(split_k=2 * t.split_k) for t in balanced if t.block_n == 128 and t.num_stages == 3]
    return [("current", current)] + [("wgmma", t) for t in balanced + doubled]


WGMMA_CELLS = [((8192, 28672), 64), ((4096, 11008), 64), ((11008, 4096), 64), ((8192, 8192), 64),
               ((4096, 4096), 64), ((8192, 28672), 32), ((4096, 4096), 32), ((8192, 8192), 128),
               ((4096, 4096), 128), ((8192, 28672), 256), ((8192, 8192), 256), ((1024, 1024), 64)]


SCALE_CELLS = [((8192, 28672), 16), ((8192, 8192), 16), ((4096, 11008), 16), ((11008, 4096), 16), ((4096, 4096), 16),
               ((8192, 28672), 4), ((4096, 4096), 4), ((8192, 28672), 64), ((4096, 11008), 64), ((8192, 8192), 64),
               ((11008, 4096), 64)]


def sweep_scales(deadline, out_dir, meta):
    """The current W4A16 pick with fp32 and with fp16 scales (the kernel benchmark passes them in x's
    dtype, the exported modules in fp32), each also with the scale row loaded one K tile ahead."""
    def time_cell(k, n, m, wsets, xs, fp16_us):
        current = w4.pick_config(m, n, k, GROUP)
        rows = []
        for scale_dtype in (torch.float32, torch.float16):
            sets = [dict(w, scales=w["scales"].to(scale_dtype)) for w in wsets]
            variants = [("current", current)]
            if current.path == "tiled":
                variants.append(("prefetch", current._replace(prefetch_scale=True)))
            rows += time_variants("w4a16", w4.launch, variants, w4_args(xs, sets),
                                  dict(k=k, n=n, m=m, r=len(wsets), fp16_us=fp16_us, scales=str(scale_dtype)))
            for row in rows[-len(variants):]:
                row["label"] += f" {str(scale_dtype)[6:]} scales"
        return rows

    return sweep_cells(SCALE_CELLS, deadline, lambda k, n: make_weights(k, n, rotations(k, n)), time_cell,
                       out_dir, "scales_sweep", meta)


TMA_CELLS = [((4096, 4096), 2048), ((4096, 11008), 2048), ((11008, 4096), 2048), ((8192, 8192), 2048),
             ((4096, 4096), 8192), ((8192, 28672), 2048), ((4096, 11008), 8192), ((11008, 4096), 8192),
             ((8192, 8192), 8192), ((8192, 28672), 8192)]


def tma_variants(m, n, k):
    """W8A8 large-M tiles with TMA loads (tiles x warps x stages), next to the current pick."""
    T8 = w8.TileConfig
    tiles = [T8(128, 256, 128, num_warps=8, num_stages=3), T8(128, 256, 128, num_warps=8, num_stages=4),
             T8(256, 128, 128, num_warps=8, num_stages=3), T8(256, 128, 128, num_warps=8, num_stages=4),
             T8(128, 128, 128, num_warps=8, num_stages=4), T8(128, 128, 128, num_warps=4, num_stages=5),
             T8(128, 256, 64, num_warps=8, num_stages=5), T8(256, 128, 64, num_warps=8, num_stages=5),
             T8(128, 256, 128, num_warps=8, num_stages=3, group_m=16), T8(256, 256, 64, num_warps=8, num_stages=3)]
    return [("current", w8.pick_config(m, n, k))] + [("tma", t._replace(tma=True)) for t in tiles]


QUANT_CELLS = [((4096, 4096), 2048), ((4096, 11008), 2048), ((11008, 4096), 2048), ((4096, 4096), 8192),
               ((11008, 4096), 8192), ((4096, 4096), 16), ((8192, 8192), 64), ((1536, 384), 2048)]


def sweep_quant(deadline, out_dir, meta):
    """One- vs two-pass quantization (``kernels.w8a8.quantize_rows``), alone and followed by the GEMM."""
    def time_cell(k, n, m, wsets, xs, fp16_us):
        rows = []
        for one_pass in (False, True):
            cfg = w8.TileConfig(0, 0, 0)  # placeholder: the row records the pass, not a tile
            quant = time_graph(lambda x: w8.quantize_rows(x, None, one_pass), [(x,) for x in xs])
            full = time_graph(lambda x, w: w8.launch_gemm(*w8.quantize_rows(x, None, one_pass), w["w_q"], w["w_scale"],
                                                          None, w8.pick_config(m, n, k),
                                                          torch.empty(m, n, dtype=x.dtype, device=x.device)),
                              list(zip(xs, wsets)))
            rows.append(dict(k=k, n=n, m=m, r=len(wsets), fp16_us=fp16_us, kernel="w8a8", cfg=cfg._asdict(),
                             label=f"{'one' if one_pass else 'two'}-pass quantize {quant:.1f} us; with GEMM",
                             us=full))
        return rows

    return sweep_cells(QUANT_CELLS, deadline, w8_weights, time_cell, out_dir, "quant_sweep", meta)


def split16_variants(m, n, k):
    """W8A8 16-row tiles with K splits, next to the current pick (no split at M <= 16). Since the
    16-row tiles sum their K splits in the kernel (``kernels._splitk.reduces_in_kernel``), a split
    no longer costs a reduce launch, so it may now beat the 64 programs a 4096-wide layer gets."""
    T8 = w8.TileConfig
    tiles = [T8(16, bn, 256, sk, num_warps=4, num_stages=5) for bn, splits in ((64, (2, 4, 8)), (32, (2, 4)),
                                                                              (128, (2, 4))) for sk in splits]
    return [("current", w8.pick_config(m, n, k))] + [("split", t) for t in tiles]


SMALL_CELLS = [((384, 384), 64), ((384, 1536), 64), ((1536, 384), 64),
               ((384, 384), 512), ((384, 1536), 512), ((1536, 384), 512),
               ((384, 384), 2048), ((384, 1536), 2048), ((1536, 384), 2048)]  # MiniLM at batch 1, 8, 32


def small_variants(m, n, k):
    """W4A16 and W8A8 variants without split-K at MiniLM's layers, next to the current picks.

    Small layers sit in L2, so the split-K reduce launch (or W4A16's dequantize launch at M >= 128)
    may cost more than the parallelism it buys."""
    T4, T8 = w4.TileConfig, w8.TileConfig
    w4_tiles = [T4(bm, bn, 128, num_warps=w, num_stages=3, scale_after_dot=True)
                for bm, bn, w in ((16, 64, 4), (32, 32, 4), (32, 64, 4), (64, 64, 4), (64, 32, 4))]
    if m > 64:
        w4_tiles += [T4(128, 64, 128, num_warps=8, num_stages=3), T4(128, 128, 64, num_warps=8, num_stages=3)]
    w8_tiles = [T8(bm, bn, bk, num_warps=4, num_stages=3) for bm, bn in ((32, 32), (32, 64), (64, 64))
                for bk in ((128, 256) if k >= 1024 else (128,))]
    if m > 64:
        w8_tiles += [T8(128, 64, 128, num_warps=8, num_stages=3), T8(128, 128, 128, num_warps=8, num_stages=3)]
    return ([("w4a16", "current", w4.pick_config(m, n, k, GROUP))] + [("w4a16", "sk1", t) for t in w4_tiles]
            + [("w8a8", "current", w8.pick_config(m, n, k))] + [("w8a8", "sk1", t) for t in w8_tiles])


def sweep_small(deadline, out_dir, meta):
    """Time ``small_variants`` and cuBLAS fp16 at ``SMALL_CELLS``; rewrite the result files after every cell."""
    def time_cell(k, n, m, wsets, xs, fp16_us):
        rows = []
        for kernel, label, cfg in small_variants(m, n, k):
            launch, args = (w4.launch, w4_args(xs, wsets)) if kernel == "w4a16" else (w8.launch, w8_args(xs, wsets))
            rows += time_variants(kernel, launch, [(label, cfg)], args, dict(k=k, n=n, m=m, fp16_us=fp16_us))
        return rows

    return sweep_cells(SMALL_CELLS, deadline, lambda k, n: make_weights(k, n, 16), time_cell,
                       out_dir, "small_sweep", meta)


def with_split(cfg, m, n, k):
    if cfg.split_k is not None or getattr(cfg, "path", "") == "dequant":
        return cfg
    if getattr(cfg, "path", "") == "fma":  # the fma kernel's own rule (runs of prefetched K tiles)
        return cfg._replace(split_k=prefetch_split_k(m, n, k, cfg._replace(split_k=1)))
    return cfg._replace(split_k=split_k_for(m, n, k, cfg._replace(split_k=1)))


def sweep(deadline):
    buckets = {(k, n, m): bucket for (k, n), m, bucket in SWEEP_CELLS}

    def time_cell(k, n, m, wsets, xs, fp16_us):
        cell, bucket = dict(k=k, n=n, m=m, fp16_us=fp16_us), buckets[(k, n, m)]
        w4_cfgs = [(None, with_split(c, m, n, k)) for c in SWEEP_W4[bucket]]
        w8_cfgs = [(None, with_split(c, m, n, k)) for c in SWEEP_W8[bucket]]
        return (time_variants("w4a16", w4.launch, w4_cfgs, w4_args(xs, wsets), cell)
                + time_variants("w8a8", w8.launch, w8_cfgs, w8_args(xs, wsets), cell))

    return sweep_cells([(shape, m) for shape, m, _ in SWEEP_CELLS], deadline,
                       lambda k, n: make_weights(k, n, rotations(k, n)), time_cell)


def sweep_markdown(rows) -> str:
    lines = ["| kernel | K x N | M | config | us | x fp16 |", "|---|---|---|---|---|---|"]
    for r in rows:
        if "skipped" in r:
            lines.append(f"| skipped: {r['skipped']} | | | | | |")
            continue
        c = r["cfg"]
        desc = f"{c['block_m']}x{c['block_n']}x{c['block_k']} sk{c['split_k']} w{c['num_warps']} s{c['num_stages']}"
        if r["kernel"] == "w8a8" and "label" in r:
            desc = (f"{r['label']}: {desc} g{c['group_m']}{' fused' if c.get('fused') else ''}"
                    f"{' gemv' if c.get('gemv') else ''}{' tma' if c.get('tma') else ''}")
        if r["kernel"] == "w4a16" and c["path"] == "skinny":
            desc += f" skinny asm{int(c['asm_unpack'])}"
        elif r["kernel"] == "w4a16":
            desc += f" sad{int(c['scale_after_dot'])} magic{int(c['magic_unpack'])} exp{int(c['expanded_load'])} {c['path']}"
            desc += f" chunk{c.get('chunk', 1)}" if c.get("chunk", 1) > 1 else ""
            desc += f" planes asm{int(c['asm_unpack'])}" if c.get("planes") else ""
        if r["kernel"] == "w4a16" and "label" in r:
            desc = f"{r['label']}: {desc}"
        us = f"{r['us']:.1f}" if isinstance(r["us"], float) else f"err {r['us']}"
        tiny = r.get("int4pk_us")
        tiny = f" (tinygemm {tiny:.1f})" if isinstance(tiny, float) else ""
        lines.append(f"| {r['kernel']} | {r['k']}x{r['n']} | {r['m']} | {desc} | {us} | {ratio(r['fp16_us'], r['us'])}{tiny} |")
    return "\n".join(lines)


def run_sweep(name, deadline, out_dir, meta):
    """The rows of sweep ``name`` (``--sweep``); the named sweeps also write their own result files."""
    w8_sweeps = {"fused": (FUSED_CELLS, fused_variants), "split16": (SPLIT16_CELLS, split16_variants),
                 "tma": (TMA_CELLS, tma_variants)}
    w4_sweeps = {"planes": (PLANES_CELLS, planes_variants), "wgmma": (WGMMA_CELLS, wgmma_variants)}
    named = {"chunk": sweep_chunk, "small": sweep_small, "decode": sweep_decode, "scales": sweep_scales,
             "quant": sweep_quant}
    if name in w8_sweeps:
        cells, variants = w8_sweeps[name]
        return sweep_w8(cells, variants, f"{name}_sweep", deadline, out_dir, meta)
    if name in w4_sweeps:
        cells, variants = w4_sweeps[name]
        return sweep_w4(cells, variants, f"{name}_sweep", deadline, out_dir, meta)
    if name in named:
        return named[name](deadline, out_dir, meta)
    return sweep_skinny(deadline) if name == "skinny" else sweep(deadline)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    parser.add_argument("--sweep", nargs="?", const="all", choices=["all", "skinny", "chunk", "fused", "small", "decode", "split16", "planes", "wgmma", "scales", "tma", "quant"], default=None)
    parser.add_argument("--deadline-epoch", type=float, default=None, help="absolute stop time (overrides budgets)")
    parser.add_argument("--methods", default=",".join(METHODS), help="table columns to time, e.g. fp16,w4a16,int4pk")
    parser.add_argument("--no-table", action="store_true")
    parser.add_argument("--budget-s", type=float, default=200.0, help="stop starting new work after this")
    parser.add_argument("--sweep-budget-s", type=float, default=120.0, help="sweep cells start until budget + this")
    parser.add_argument("--shapes", default="all", help="'all' or e.g. 4096x4096,8192x8192")
    parser.add_argument("--ms", default=",".join(map(str, MS)))
    args = parser.parse_args()
    deadline = time.time() + args.budget_s
    os.makedirs(args.out, exist_ok=True)
    torch.manual_seed(0)
    props = torch.cuda.get_device_properties(0)
    meta = dict(gpu=props.name, sms=props.multi_processor_count, torch=torch.__version__, triton=triton.__version__)
    print(meta, flush=True)
    shapes = SHAPES if args.shapes == "all" else [tuple(map(int, s.split("x"))) for s in args.shapes.split(",")]
    ms = [int(v) for v in args.ms.split(",")]
    methods = tuple(args.methods.split(","))
    results = []
    if not args.no_table:
        for k, n in shapes:
            wsets = make_weights(k, n, rotations(k, n))
            for m in ms:
                if time.time() > deadline:
                    print(f"out of time at {k}x{n} M={m}", flush=True)
                    break
                results.append(dict(k=k, n=n, m=m, r=len(wsets), us=bench_cell(k, n, m, wsets, methods)))
                print(markdown(results[-1:]).splitlines()[-1], flush=True)
            del wsets
            torch.cuda.empty_cache()
        with open(os.path.join(args.out, "kernel_times.json"), "w") as f:
            json.dump(dict(meta=meta, results=results), f, indent=1)
        table = markdown(results)
        with open(os.path.join(args.out, "kernel_times.md"), "w") as f:
            f.write(table + "\n")
    if args.sweep:
        sweep_deadline = deadline + args.sweep_budget_s
        if args.deadline_epoch is not None:
            sweep_deadline = args.deadline_epoch
        rows = run_sweep(args.sweep, sweep_deadline, args.out, meta)
        write_sweep(args.out, "sweep", meta, rows)
        print(sweep_markdown(rows))
    if results:
        print(table)


if __name__ == "__main__":
    main()
