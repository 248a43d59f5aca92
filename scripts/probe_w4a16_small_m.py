"""Where does the W4A16 small-M time go? Variants side by side with a pure-load ceiling (GPU only).

For each (K x N, M) cell it times, with the method of ``scripts/tune_w8a8_w4a16.py`` (CUDA graph of
rotating weight sets replayed under ``do_bench``):
  * ``fp16``    cuBLAS ``F.linear`` (the baseline of every ratio) and ``int4pk`` (tinygemm),
  * ``tiled``   the default W4A16 config (``kernels.w4a16.pick_config``),
  * ``fma ...`` the CUDA-core kernel for M = 1 (``kernels/w4a16_fma.py``) in several tile configs,
  * ``tiled ...`` (``--tiled``) the tensor-core kernel in 16/32/64-wide N tiles and K splits 1-8,
  * ``wholek ...`` (``--wholek``) the whole-K-strip kernel (``kernels/w4a16_wholek.py``) in 8/16/32-wide
    N tiles and 2/4/8 warps, at K <= its cap,
  * ``stream``  a kernel that only loads the packed weight in the tiled kernel's tiles and folds them
    with XOR: the bandwidth this access pattern reaches in Triton with no math at all.

``--ncu KxN`` instead runs the default M = 1 kernel twice at one shape, for ``ncu`` to profile.
"""
from __future__ import annotations

import argparse
import json
import os
import time

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from compress_kernels import w4a16 as w4
from compress_kernels.w4a16_wholek import WHOLEK_MAX_K, wholek_block_k
from compress_kernels._splitk import splitk_reduce  # noqa: F401  (imported so a broken import fails early)
from scripts.tune_w8a8_w4a16 import GROUP, make_weights, rotations, time_graph

STREAM = False  # the pure-load ceiling rows (measured once; see docs/kernels-notes.md)
TILED = False  # --tiled: also the tensor-core kernel in narrower N tiles and every K split
WHOLEK = False  # --wholek: also the whole-K-strip kernel
CELLS = [((8192, 28672), 1), ((4096, 4096), 1), ((11008, 4096), 1), ((4096, 11008), 1), ((8192, 8192), 1),
         ((1024, 1024), 1), ((4096, 4096), 2), ((8192, 28672), 2)]


@triton.jit
def _stream_kernel(qw_ptr, out_ptr, N, K, stride_qk, SPLIT_K, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """XOR of every packed word a (BLOCK_K/8, BLOCK_N) tile walk over this split's K range touches."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    cols = tl.max_contiguous(tl.multiple_of(pid_n * BLOCK_N + tl.arange(0, BLOCK_N), BLOCK_N), BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    per_split = tl.cdiv(k_tiles, SPLIT_K)
    r0 = pid_k * per_split * (BLOCK_K // 8)
    r1 = min(K // 8, r0 + per_split * (BLOCK_K // 8))
    offs_r = tl.arange(0, BLOCK_K // 8)
    acc = tl.zeros((BLOCK_K // 8, BLOCK_N), dtype=tl.int32)
    for r in range(r0, r1, BLOCK_K // 8):
        acc ^= tl.load(qw_ptr + (r + offs_r)[:, None] * stride_qk + cols[None, :])
    tl.store(out_ptr + pid_k * N + cols, tl.xor_sum(acc, axis=0))


def stream(qweight, out, block_n, block_k, split_k, num_warps, num_stages):
    n = qweight.shape[1]
    k = qweight.shape[0] * 8
    _stream_kernel[(n // block_n, split_k)](qweight, out, n, k, qweight.stride(0), split_k,
                                            BLOCK_N=block_n, BLOCK_K=block_k, num_warps=num_warps,
                                            num_stages=num_stages)


def fma_configs(m, n, k):
    """The CUDA-core kernel (kernels/w4a16_fma.py): tile width, warps and every K split from ~2 programs per SM."""
    out = []
    for bn, nw in ((64, 4), (128, 4)):
        tiles = triton.cdiv(n, bn) * m
        for split in (1, 2, 4, 8, 16, 32):
            if tiles * split >= 264 and (k // 128) // split >= 2 and tiles * split <= 8192:
                out.append(w4.TileConfig(1, bn, 128, split_k=split, num_warps=nw, num_stages=3, path="fma"))
    return out


def tiled_configs(m, n, k):
    """The tensor-core kernel in narrower N tiles and every K split (one launch more when split)."""
    out = []
    for bn, nw in ((16, 2), (32, 4), (64, 4)):
        for split in (1, 2, 4, 8):
            if (k // 128) // split >= 1:
                out.append(w4.TileConfig(16, bn, 128, split_k=split, num_warps=nw, num_stages=3, scale_after_dot=True))
    return out


def wholek_configs(m, n, k):
    """The whole-K-strip kernel: every tile width and warp count that keeps a warp's rows filled."""
    if k > WHOLEK_MAX_K:
        return []
    return [w4.TileConfig(1, bn, wholek_block_k(k), num_warps=nw, path="wholek")
            for bn in (8, 16, 32) for nw in (2, 4, 8) if wholek_block_k(k) // 8 >= 8 * nw]


def label(cfg):
    step = f" step{cfg.chunk}" if cfg.chunk > 1 else ""
    return f"{cfg.path} {cfg.block_m}x{cfg.block_n}x{cfg.block_k} sk{cfg.split_k} w{cfg.num_warps} s{cfg.num_stages}{step}"


def run_cell(k, n, m):
    wsets = make_weights(k, n, rotations(k, n))
    xs = [torch.randn(m, k, device="cuda", dtype=torch.float16) for _ in wsets]
    row = dict(k=k, n=n, m=m, us={})

    def timed(name, fn, args):
        try:
            row["us"][name] = time_graph(fn, args)
        except Exception as err:  # noqa: BLE001 - one failing variant must not stop the table
            row["us"][name] = repr(err)[:160]

    timed("fp16", F.linear, [(x, w["w16"]) for x, w in zip(xs, wsets)])
    timed("int4pk", torch.ops.aten._weight_int4pack_mm,
          [(x.bfloat16(), w["int4pk"], GROUP, w["sz"]) for x, w in zip(xs, wsets)])
    default = w4.pick_config(m, n, k, GROUP)
    timed("tiled " + label(default), w4.launch, [(x, w["qweight"], w["scales"], GROUP, None, default)
                                                 for x, w in zip(xs, wsets)])
    extra = (tiled_configs(m, n, k) if TILED else []) + (wholek_configs(m, n, k) if WHOLEK else [])
    for cfg in (fma_configs(m, n, k) if m <= 2 else []) + extra:
        if cfg != default:
            timed(label(cfg), w4.launch, [(x, w["qweight"], w["scales"], GROUP, None, cfg) for x, w in zip(xs, wsets)])
    if m == 1 and STREAM:
        for bn, bk, sk, nw, ns in ((64, 128, default.split_k, 4, 4), (128, 128, default.split_k, 4, 4),
                                   (64, 256, default.split_k, 4, 4), (256, 128, 1, 8, 4)):
            outs = [torch.empty(sk, n, dtype=torch.int32, device="cuda") for _ in wsets]
            timed(f"stream {bn}x{bk} sk{sk} w{nw} s{ns}", lambda q, o: stream(q, o, bn, bk, sk, nw, ns),
                  [(w["qweight"], o) for w, o in zip(wsets, outs)])
    del wsets, xs
    torch.cuda.empty_cache()
    return row


def markdown(rows):
    lines = ["| K x N | M | variant | us | x fp16 | GB/s (int4 bytes) |", "|---|---|---|---|---|---|"]
    for row in rows:
        base = row["us"].get("fp16")
        for name, us in row["us"].items():
            if isinstance(us, float):
                gbs = row["k"] * row["n"] / 2 / us / 1e3
                lines.append(f"| {row['k']}x{row['n']} | {row['m']} | {name} | {us:.1f} | {base / us:.2f} | {gbs:.0f} |")
            else:
                lines.append(f"| {row['k']}x{row['n']} | {row['m']} | {name} | {us} | - | - |")
    return "\n".join(lines)


def ncu_once(k, n, m):
    """Two launches of the default kernel at one shape (the first compiles), for ncu."""
    x = torch.randn(m, k, device="cuda", dtype=torch.float16)
    w = make_weights(k, n, 1)[0]
    for _ in range(2):  # the second is the one to profile (ncu --launch-skip 1)
        w4.launch(x, w["qweight"], w["scales"], GROUP, None, w4.pick_config(m, n, k, GROUP))
        torch.cuda.synchronize()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    parser.add_argument("--budget-s", type=float, default=300.0)
    parser.add_argument("--ncu", default=None, help="KxN: two launches of the default M = 1 kernel, nothing timed")
    parser.add_argument("--cells", default=None, help="KxN:M list, e.g. 1024x1024:1,4096x4096:1 (default: CELLS)")
    parser.add_argument("--tiled", action="store_true", help="also time tiled_configs (narrow N tiles, K splits)")
    parser.add_argument("--wholek", action="store_true", help="also time wholek_configs (the whole K strip per program)")
    args = parser.parse_args()
    global TILED, WHOLEK
    TILED, WHOLEK = args.tiled, args.wholek
    cells = CELLS if args.cells is None else [
        (tuple(int(v) for v in shape.split("x")), int(m)) for shape, m in (c.split(":") for c in args.cells.split(","))]
    if args.ncu:
        k, n = (int(v) for v in args.ncu.split("x"))
        ncu_once(k, n, 1)
        return
    meta = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__)
    deadline = time.time() + args.budget_s
    rows = []
    for (k, n), m in cells:
        if time.time() > deadline:
            break
        rows.append(run_cell(k, n, m))
        print(markdown(rows[-1:]), flush=True)
        with open(os.path.join(args.out, "probe.json"), "w") as f:
            json.dump(dict(meta=meta, rows=rows), f, indent=1)
        with open(os.path.join(args.out, "probe.md"), "w") as f:
            f.write(f"{meta}\n\n{markdown(rows)}\n")


if __name__ == "__main__":
    main()
