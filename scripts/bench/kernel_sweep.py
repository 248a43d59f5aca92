"""The kernel benchmark's sweep: every op at every weight shape and M, timed over rotating weight sets.

Every op computes ``y = x @ W.T`` for x (M, K) and a weight of N x K, in its own format:

* anchors (:mod:`scripts.bench.anchors`): ``cublas_fp16``; ``torch_int_mm_w8a8`` (torchao's
  dynamic W8A8); ``torch_int_mm_w8a8_block`` (block-scaled W8A8 in PyTorch ops, one ``torch._int_mm``
  per 128-deep K block); ``tinygemm_int4_g128`` (group 128, bf16 activations); ``torch_weight_int8pack_w8a16``
  (``torch._weight_int8pack_mm``, int8 weights per channel, timed up to M = 256); ``torch_bsr_{50,75,90}``
  (PyTorch's Triton BSR kernel at 50/75/90% block sparsity).
* ours (``compress_kernels``): ``ours_w8a8`` (dynamic per-token scales), ``ours_w8a8_block`` (1 x 128
  activation and 128 x 128 weight scales; compare with ``ours_w8a8``), ``ours_w4a16_g128``,
  ``ours_w8a16`` (int8 weights, one scale per output channel), ``ours_w8a16_g128`` (one per 128 inputs),
  ``ours_dds_{50,75,90}`` (block-sparse fp16), ``ours_dds_w8a8_{50,90}`` (int8 blocks, per-token
  int8 x: a layer both pruned and W8A8-quantized; compare with ``ours_w8a8``) and ``ours_dds_w4a16_{50,90}``
  (int4 blocks with one fp32 scale per row of each block, fp16 x: a layer both pruned and W4A16-quantized;
  compare with ``ours_w4a16_g128``); ``ours_dds_tiles4_{50,75}`` (block-sparse fp16 pruned in tiles of 4 block
  rows, ``BlockSparseConfig(tile_rows=4)``: the tile kernel from M = 65; compare with ``ours_dds_p``).

Weights are random in each op's format (values do not change the time): fp16 ``N(0, 0.02)``;
int8 uniform with per-channel (or per-group, or per-128 x 128-block) scales; packed int4 from uniform
words; 32x32 block masks drawn uniformly with exactly ``round(p * blocks)`` blocks absent, the same
way for ``torch_bsr_p`` and ``ours_dds_p``. One generator per shape, seeded from K and N, makes every
op's sets in turn.

Method (:func:`compress.eval.timing.rotation_ms`): each op rotates over several weight / input
sets, together at least ``rotate_mb`` (default 200 MB, 4x the H100's 50 MB L2), so no weight
stays in L2 between calls; the rotation (one call per set) is captured in one CUDA graph, replayed
under ``triton.testing.do_bench`` (median, L2 flushed before each replay) and the time divided by
the number of calls, so Python launch overhead (about 0.5 ms for ``bsr_dense_mm``, more than the
kernel at small shapes) does not hide the kernel. An op that cannot be captured is timed eagerly
and its record says ``graph: false``. Each point also checks ``rel_err`` against an fp32 reference on
its first rows where one exists (fp16 and fp16 BSR weights). TFLOP/s counts the dense 2 M N K;
GB/s counts the op's own weight bytes plus x and y in fp16.

CPU check (``cpu=True``): tiny shapes, the anchors' CPU branches and our kernels' pure-PyTorch
references instead of the Triton kernels, each timed as the median of host-timed calls; it tests
the plumbing, not speed.
"""
from __future__ import annotations

import fnmatch
import math
import time
from dataclasses import dataclass
from typing import Callable

import torch
from tqdm import tqdm

import compress_kernels
from compress.eval.timing import rotation_ms
from compress_kernels import reference
from scripts.bench import anchors

SHAPES = [(1024, 1024), (4096, 4096), (4096, 11008), (11008, 4096), (8192, 8192), (8192, 28672)]  # (K, N)
MS = [1, 16, 64, 256, 2048, 8192]
CPU_SHAPES, CPU_MS = [(128, 64), (256, 96)], [1, 16]
SPARSITIES = (50, 75, 90)
DDS_W8A8_SPARSITIES = (50, 90)
DDS_W4A16_SPARSITIES = (50, 90)
DDS_TILES_SPARSITIES = (50, 75)
TILE_ROWS = 4  # block rows per pruned tile of the ``bsr_tiles`` weights
GROUP_SIZE = 128
BSR_BLOCK = 32
MAX_SETS = 128
CHECK_ROWS = 64  # rows of x checked against the fp32 reference (keeps the reference cheap)
CPU_ROTATE_MB = 0.1
WEIGHT_KINDS = ("fp16", "int8", "int8_g128", "int8_fp16_scales", "int8_block", "int4", "int4_tinygemm", "bsr",
                "bsr_int8", "bsr_int4", "bsr_tiles")


# ---- weights -------------------------------------------------------------------------------------
def random_block_mask(n, k, sparsity_pct, gen, device, tile_rows: int = 1):
    """(N/32, K/32) bool mask (True = block kept) with exactly ``round(p * blocks)`` blocks absent (with
    ``tile_rows``: ``round(p * tiles)`` tiles of that many block rows, a whole block column each)."""
    rows, cols = -(-(n // BSR_BLOCK) // tile_rows), k // BSR_BLOCK
    total = rows * cols
    keep = torch.ones(total, dtype=torch.bool, device=device)
    keep[torch.randperm(total, generator=gen, device=device)[: round(sparsity_pct / 100 * total)]] = False
    return keep.reshape(rows, cols).repeat_interleave(tile_rows, dim=0)[: n // BSR_BLOCK]


def bsr_parts_from_mask(mask, dtype, gen, device):
    """BSR parts (crow int32 (N/32 + 1,), col int32 (nnz,), values (nnz, 32, 32)) of a random weight on ``mask``."""
    counts = mask.sum(dim=1)
    crow = torch.zeros(mask.shape[0] + 1, dtype=torch.int32, device=device)
    crow[1:] = torch.cumsum(counts, 0).to(torch.int32)
    col = mask.nonzero()[:, 1].to(torch.int32).contiguous()  # row-major order = sorted within a row
    values = (torch.randn(col.shape[0], BSR_BLOCK, BSR_BLOCK, generator=gen, device=device) * 0.02).to(dtype)
    return crow, col, values


def make_weight_set(kind, k, n, gen, device, sparsity_pct=None) -> dict:
    """One set of weight operands for ``kind`` in :data:`WEIGHT_KINDS`."""
    if kind == "fp16":
        return {"w": (torch.randn(n, k, generator=gen, device=device) * 0.02).to(torch.float16)}
    if kind in ("int8", "int8_g128", "int8_fp16_scales"):  # scales (N,) fp32, (N, K/128) fp32 or (N,) fp16
        w_q = torch.randint(-127, 128, (n, k), generator=gen, dtype=torch.int8, device=device)
        groups = (k // GROUP_SIZE,) if kind == "int8_g128" else ()
        w_scale = torch.rand(n, *groups, generator=gen, device=device) * 1e-3 + 1e-4
        return {"w_q": w_q, "w_scale": w_scale.half() if kind == "int8_fp16_scales" else w_scale}
    if kind == "int8_block":  # (N, K) int8 in [-127, 127], one fp32 scale per 128 x 128 block
        w_q = torch.randint(-127, 128, (n, k), generator=gen, dtype=torch.int8, device=device)
        blocks = (-(-n // GROUP_SIZE), -(-k // GROUP_SIZE))
        return {"w_q": w_q, "w_scale": torch.rand(*blocks, generator=gen, device=device) * 1e-3 + 1e-4}
    if kind == "int4":  # our layout: (K/8, N) int32 words of 8 nibbles, (K/G, N) scales
        qweight = torch.randint(-2**31, 2**31 - 1, (k // 8, n), generator=gen, dtype=torch.int32, device=device)
        scales = (torch.rand(k // GROUP_SIZE, n, generator=gen, device=device) * 1e-2 + 1e-3).to(torch.float16)
        return {"qweight": qweight, "scales": scales}
    if kind == "int4_tinygemm":  # uniform bytes = two uniform nibbles each, split into (N, K) int4 values
        pairs = torch.randint(0, 256, (n, k // 2), generator=gen, dtype=torch.uint8, device=device)
        q = torch.stack([pairs >> 4, pairs & 0xF], dim=-1).reshape(n, k).to(torch.int8) - 8
        scales_zeros = torch.rand(k // GROUP_SIZE, n, 2, generator=gen, device=device) * 1e-2
        return {"packed": anchors.tinygemm_pack(q), "scales_zeros": scales_zeros.to(torch.bfloat16)}
    if kind in ("bsr", "bsr_int8", "bsr_int4", "bsr_tiles"):
        tile_rows = TILE_ROWS if kind == "bsr_tiles" else 1
        crow, col, values = bsr_parts_from_mask(random_block_mask(n, k, sparsity_pct, gen, device, tile_rows),
                                                torch.float16, gen, device)
        if kind == "bsr_tiles":
            return {"crow": crow, "col": col, "values": values, "n": n, "k": k, "tile_rows": tile_rows}
        if kind == "bsr":  # also as a torch.sparse_bsr_tensor (a view of the same parts) for torch's kernel
            bsr = torch.sparse_bsr_tensor(crow, col, values, size=(n, k), check_invariants=False)
            return {"crow": crow, "col": col, "values": values, "bsr": bsr, "n": n, "k": k}
        if kind == "bsr_int4":  # (nnz, 32, 4) words of 8 nibbles, one fp32 scale per row of each block (as stored)
            nnz = values.shape[0]
            words = torch.randint(-2**31, 2**31 - 1, (nnz, BSR_BLOCK, BSR_BLOCK // 8), generator=gen,
                                  dtype=torch.int32, device=device)
            scales = torch.rand(nnz, BSR_BLOCK, generator=gen, device=device) * 1e-2 + 1e-3
            return {"crow": crow, "col": col, "values": words, "scales": scales, "n": n, "k": k}
        values = torch.randint(-127, 128, values.shape, generator=gen, dtype=torch.int8, device=device)
        w_scale = torch.rand(n, generator=gen, device=device) * 1e-3 + 1e-4
        return {"crow": crow, "col": col, "values": values, "w_scale": w_scale, "n": n, "k": k}
    raise ValueError(f"weight kind: expected one of {', '.join(WEIGHT_KINDS)}, got {kind!r}")


def weight_bytes(ws) -> int:
    """Bytes of a weight set's dense tensors (the sparse BSR view shares its parts' storage)."""
    return sum(t.numel() * t.element_size() for t in ws.values()
               if isinstance(t, torch.Tensor) and t.layout == torch.strided)


# ---- the ops ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class KernelSpec:
    """A timed op: its weight kind, its call on the GPU and on the CPU (both ``(x, weight_set) -> y``)."""

    name: str
    weight_kind: str
    gpu_call: Callable
    cpu_call: Callable
    sparsity: int | None = None
    x_dtype: torch.dtype = torch.float16
    max_m: int | None = None  # not timed above this many rows (an anchor whose kernel does not scale)


def _cublas(x, ws):
    return anchors.cublas_fp16(x, ws["w"])


def _int_mm(x, ws):
    return anchors.int_mm_w8a8(x, ws["w_q"], ws["w_scale"])


def _tinygemm(x, ws):
    return anchors.tinygemm_int4_matmul(x, ws["packed"], GROUP_SIZE, ws["scales_zeros"])


def _int8pack(x, ws):
    return anchors.weight_int8pack_mm(x, ws["w_q"], ws["w_scale"])


def _torch_bsr(x, ws):
    return anchors.torch_bsr_matmul(x, ws["bsr"])


def _ours_w8a8(x, ws):
    return compress_kernels.w8a8_matmul(x, ws["w_q"], ws["w_scale"])


def _w8a8_ref(x, ws):
    return reference.w8a8_matmul_ref(x, ws["w_q"], ws["w_scale"])


def _int_mm_block(x, ws):
    return anchors.int_mm_w8a8_block(x, ws["w_q"], ws["w_scale"])


def _ours_w8a8_block(x, ws):
    return compress_kernels.w8a8_block_matmul(x, ws["w_q"], ws["w_scale"])


def _w8a8_block_ref(x, ws):
    return reference.w8a8_block_matmul_ref(x, ws["w_q"], ws["w_scale"])


def _ours_w4a16(x, ws):
    return compress_kernels.w4a16_matmul(x, ws["qweight"], ws["scales"], GROUP_SIZE)


def _w4a16_ref(x, ws):
    return reference.w4a16_matmul_ref(x, ws["qweight"], ws["scales"], GROUP_SIZE)


def _ours_w8a16(x, ws):
    return compress_kernels.w8a16_matmul(x, ws["w_q"], ws["w_scale"])


def _w8a16_ref(x, ws):
    return reference.w8a16_matmul_ref(x, ws["w_q"], ws["w_scale"])


def _ours_dds(x, ws):
    return compress_kernels.bsr_matmul_parts(x, ws["crow"], ws["col"], ws["values"], ws["n"], check_indices=False)


def _ours_dds_tiles(x, ws):
    return compress_kernels.bsr_matmul_parts(x, ws["crow"], ws["col"], ws["values"], ws["n"], None, ws["tile_rows"],
                                             check_indices=False)


def _dds_ref(x, ws):
    return reference.bsr_matmul_ref(x, ws["crow"], ws["col"], ws["values"], ws["n"])


def _ours_dds_w8a8(x, ws):
    return compress_kernels.bsr_w8a8_matmul_parts(x, ws["crow"], ws["col"], ws["values"], ws["w_scale"], ws["n"],
                                                  check_indices=False)


def _dds_w8a8_ref(x, ws):
    return reference.bsr_w8a8_matmul_ref(x, ws["crow"], ws["col"], ws["values"], ws["w_scale"], ws["n"])


def _ours_dds_w4a16(x, ws):
    return compress_kernels.bsr_w4a16_matmul(x, ws["crow"], ws["col"], ws["values"], ws["scales"], ws["n"],
                                             check_indices=False)


def _dds_w4a16_ref(x, ws):
    return reference.bsr_w4a16_matmul_ref(x, ws["crow"], ws["col"], ws["values"], ws["scales"], ws["n"])


def kernel_specs() -> list[KernelSpec]:
    """Every op, anchors first (anchors run on both devices; ours fall back to the references on the CPU)."""
    specs = [
        KernelSpec("cublas_fp16", "fp16", _cublas, _cublas),
        KernelSpec("torch_int_mm_w8a8", "int8", _int_mm, _int_mm),
        KernelSpec("torch_int_mm_w8a8_block", "int8_block", _int_mm_block, _int_mm_block),
        KernelSpec("tinygemm_int4_g128", "int4_tinygemm", _tinygemm, _tinygemm, x_dtype=torch.bfloat16),
        KernelSpec("torch_weight_int8pack_w8a16", "int8_fp16_scales", _int8pack, _int8pack,
                   max_m=anchors.INT8PACK_MAX_M),
    ]
    specs += [KernelSpec(f"torch_bsr_{p}", "bsr", _torch_bsr, _torch_bsr, sparsity=p) for p in SPARSITIES]
    specs += [
        KernelSpec("ours_w8a8", "int8", _ours_w8a8, _w8a8_ref),
        KernelSpec("ours_w8a8_block", "int8_block", _ours_w8a8_block, _w8a8_block_ref),
        KernelSpec("ours_w4a16_g128", "int4", _ours_w4a16, _w4a16_ref),
        KernelSpec("ours_w8a16", "int8", _ours_w8a16, _w8a16_ref),
        KernelSpec("ours_w8a16_g128", "int8_g128", _ours_w8a16, _w8a16_ref),
    ]
    specs += [KernelSpec(f"ours_dds_{p}", "bsr", _ours_dds, _dds_ref, sparsity=p) for p in SPARSITIES]
    specs += [KernelSpec(f"ours_dds_w8a8_{p}", "bsr_int8", _ours_dds_w8a8, _dds_w8a8_ref, sparsity=p)
              for p in DDS_W8A8_SPARSITIES]
    specs += [KernelSpec(f"ours_dds_w4a16_{p}", "bsr_int4", _ours_dds_w4a16, _dds_w4a16_ref, sparsity=p)
              for p in DDS_W4A16_SPARSITIES]
    specs += [KernelSpec(f"ours_dds_tiles{TILE_ROWS}_{p}", "bsr_tiles", _ours_dds_tiles, _dds_ref, sparsity=p)
              for p in DDS_TILES_SPARSITIES]
    return specs


def select(names, patterns) -> list[str]:
    """The names matching any of the glob ``patterns`` (all names when there are none)."""
    if not patterns:
        return names
    return [n for n in names if any(fnmatch.fnmatch(n, p) for p in patterns)]


# ---- one point ---------------------------------------------------------------------------------------
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
    cpu: bool = False


def rel_error(y, ref) -> float:
    """``|y - ref| / |ref|`` (Frobenius norms, float32)."""
    ref = ref.float()
    return float((y.float() - ref).norm() / ref.norm().clamp(min=1e-12))


def _reference_for(spec, x, ws):
    """The dense fp32 result the op should give, where one is exact (fp16 weights); None otherwise
    (quantized activations and random tinygemm zero points: the kernel tests compare those)."""
    if spec.weight_kind == "fp16":
        return x.float() @ ws["w"].float().T
    if spec.weight_kind == "bsr":
        return x.float() @ ws["bsr"].to_dense().float().T
    return None


def n_sets(per_set_bytes, rotate_mb) -> int:
    """Sets to rotate over so that together they hold ``rotate_mb`` (1 to :data:`MAX_SETS`)."""
    return max(1, min(MAX_SETS, math.ceil(rotate_mb * 2**20 / max(per_set_bytes, 1))))


def fits_in_memory(k, n, m, device) -> bool:
    """Whether x, y (and a padded copy), the weights and temporaries fit in 80% of free GPU memory."""
    if device.type != "cuda":
        return True
    free, _ = torch.cuda.mem_get_info()
    return (m * k + 2 * m * n) * 2 + 3 * n * k * 2 < 0.8 * free


def time_rotation(calls, opts: SweepOptions) -> tuple[float, bool]:
    """``(ms per call, graph used)``: :func:`rotation_ms`; the CPU check times host calls (also on a GPU host)."""
    device = torch.device("cpu") if opts.cpu else None
    return rotation_ms(calls, opts.graphs, opts.warmup_ms, opts.rep_ms, device=device)


def bench_point(spec, weight_sets, k, n, m, opts, device, gen) -> dict:
    """Time one op at one shape and M; returns its result record."""
    record = {"kernel": spec.name, "K": k, "N": n, "M": m, "sparsity": spec.sparsity}
    moved = weight_bytes(weight_sets[0]) + m * (k + n) * 2
    count = n_sets(moved, opts.rotate_mb)
    xs = [torch.randn(m, k, generator=gen, device=device).to(spec.x_dtype) for _ in range(min(count, 8))]
    call = spec.cpu_call if opts.cpu else spec.gpu_call
    calls = [(lambda x=xs[i % len(xs)], ws=weight_sets[i % len(weight_sets)]: call(x, ws)) for i in range(count)]
    # correctness at this M (so with this M's tiles), on a few rows to keep the fp32 reference cheap
    ref = _reference_for(spec, xs[0][:CHECK_ROWS], weight_sets[0])
    if ref is not None:
        record["rel_err"] = rel_error(call(xs[0], weight_sets[0])[:CHECK_ROWS], ref)
    ms, graphed = time_rotation(calls, opts)
    record.update(ms=ms, tflops=2.0 * m * n * k / ms / 1e9, gbps=moved / ms / 1e6, graph=graphed, sets=count)
    return record


# ---- the sweep -------------------------------------------------------------------------------------
def _error_text(err: Exception) -> str:
    first = str(err).splitlines()[0][:300] if str(err) else ""
    return f"{type(err).__name__}: {first}"


def _weights_for(spec, k, n, opts, device, gen):
    """``(weight sets, None)`` for one op and shape (enough to rotate past L2 at M = 1), or ``(None, error)``."""
    try:
        first = make_weight_set(spec.weight_kind, k, n, gen, device, spec.sparsity)
        rest = [make_weight_set(spec.weight_kind, k, n, gen, device, spec.sparsity)
                for _ in range(n_sets(weight_bytes(first), opts.rotate_mb) - 1)]
        return [first] + rest, None
    except Exception as err:  # noqa: BLE001 - an op whose weights cannot be made is reported, not fatal
        return None, f"weights: {_error_text(err)}"


def _point_or_skip(spec, weight_sets, k, n, m, opts, device, gen, started) -> dict:
    """The point's record, or the record with an ``error`` saying why it was not measured."""
    record = {"kernel": spec.name, "K": k, "N": n, "M": m, "sparsity": spec.sparsity}
    if time.monotonic() - started > opts.time_budget_s:
        return {**record, "error": "skipped: time budget spent"}
    if spec.max_m is not None and m > spec.max_m:
        return {**record, "error": f"skipped: timed up to M = {spec.max_m} only"}
    if not fits_in_memory(k, n, m, device):
        return {**record, "error": "skipped: would not fit in GPU memory"}
    try:
        return bench_point(spec, weight_sets, k, n, m, opts, device, gen)
    except Exception as err:  # noqa: BLE001 - keep going: report what ran
        if device.type == "cuda":
            torch.cuda.synchronize()
        return {**record, "error": _error_text(err)}


def run_sweep(opts: SweepOptions, progress: bool = True) -> list[dict]:
    """One record per (shape, op, M), cuBLAS fp16 always included (every ratio is taken against it)."""
    device = torch.device("cpu" if opts.cpu else "cuda")
    specs = [s for s in kernel_specs() if s.name in opts.kernels]
    if not any(s.name == "cublas_fp16" for s in specs):
        specs.insert(0, kernel_specs()[0])
    bar = tqdm(total=len(opts.shapes) * len(opts.ms) * len(specs), disable=not progress, dynamic_ncols=True)
    started = time.monotonic()
    results = []
    for k, n in opts.shapes:
        gen = torch.Generator(device=device).manual_seed(k * 100003 + n)
        for spec in specs:
            weight_sets, err = _weights_for(spec, k, n, opts, device, gen)
            for m in opts.ms:
                bar.update(1)
                bar.set_postfix_str(f"{spec.name} {k}x{n} M={m}")
                if err is not None:
                    results.append({"kernel": spec.name, "K": k, "N": n, "M": m, "sparsity": spec.sparsity,
                                    "error": err})
                    continue
                results.append(_point_or_skip(spec, weight_sets, k, n, m, opts, device, gen, started))
            del weight_sets
            if device.type == "cuda":
                torch.cuda.empty_cache()
    bar.close()
    return results
