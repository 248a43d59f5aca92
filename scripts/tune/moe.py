"""Sweep the grouped MoE ops (``compress_kernels.moe``): the dispatch table's pick and its neighbours per shape and T.

    python -m scripts.tune.moe --scheme w4a16 --shapes 4096x14336,2048x7168 --m 1,8,64,512 --out moe-w4a16.json

A shape is ``HxI`` (hidden x intermediate) of a layer of ``--experts`` experts, ``--top-k`` per token; M is
the number of tokens. For each case it times :func:`compress_kernels.moe.op.launch` with the config
:func:`compress_kernels.moe.dispatch.pick` gives, the table's tiles for the other BLOCK_M values, and the
pick with one launch parameter of one projection changed (columns per program, K tile, K split of the
down projection, warps, stages), each checked against the op's reference (``reference.moe_<scheme>_ref``)
on the same routing. The routing is a random top-k over the experts (seeded): each expert gets about
T k / E rows, as the table assumes. Timing: :func:`compress.eval.timing.rotation_ms`, the call captured in a
CUDA graph and replayed under ``do_bench`` with L2 flushed before each replay (one input set: the experts'
weights exceed L2 at the shapes this is for). One JSON row per config::

    {"op": "moe_<scheme>", "H", "I", "E", "top_k", "M", "dtype", "group", "config": {...}, "picked": bool,
     "ms": float | None, "graph": bool, "rel_err": float | None, "ok": bool, "error": str | None}

Runs on a GPU; on the CPU (Triton's interpreter, ``TRITON_INTERPRET=1``) only tiny shapes are practical.
"""
from __future__ import annotations

import json

import torch

from compress.core.quant import pack_int4
from compress.eval.timing import rotation_ms
from compress_kernels import reference
from compress_kernels.moe.dispatch import MoeConfig, pick
from compress_kernels.moe.op import launch
from scripts.tune import sweep

TOL = {torch.float16: 4e-3, torch.bfloat16: 2e-2}  # the MoE op tests' (tests/kernels/moe/test_op.py)
REFERENCES = {"w4a16": reference.moe_w4a16_ref, "w8a8": reference.moe_w8a8_ref, "w8a16": reference.moe_w8a16_ref}
BLOCK_MS = {"w4a16": (1, 16, 32, 64, 128), "w8a8": (16, 32, 64, 128), "w8a16": (16, 32, 64, 128)}


def projection_neighbours(cfg: MoeConfig, which: str, scheme: str, group: int) -> list[MoeConfig]:
    """``cfg`` with one field of its ``which`` ("gate_up" or "down") tiles changed, within what the kernels take."""
    tiles = getattr(cfg, which)
    deepest = 256 if scheme == "w8a8" else 128  # W4A16 / W8A16: K tiles inside a scale group
    if scheme == "w4a16":
        deepest = min(deepest, group)
    elif scheme == "w8a16" and group:
        deepest = 128
    steps = {"block_n": sweep.halve_double(16, 256), "num_warps": sweep.halve_double(2, 8)}
    if cfg.block_m != 1:
        steps.update(num_stages=sweep.stages)
        if not tiles.planes:  # the planes need 128-deep tiles
            steps.update(block_k=sweep.halve_double(32 if scheme != "w8a8" else 64, deepest))
    if which == "down":
        steps.update(split_k=sweep.halve_double(1, 32))
    if cfg.block_m >= 64:  # the tile rows of an expert's short last block (0: none)
        steps.update(short_rows=lambda rows: [r for r in (0, 16, 32) if r != rows])
    return [cfg._replace(**{which: t}) for t in sweep.neighbours(tiles, steps)]


def candidates(picked: MoeConfig, others: list[MoeConfig], scheme: str, group: int) -> list[MoeConfig]:
    """The pick, the table's tiles at the other BLOCK_M values, then the pick's one-field neighbours."""
    out = [picked]
    for cfg in others + projection_neighbours(picked, "gate_up", scheme, group) + \
            projection_neighbours(picked, "down", scheme, group):
        if cfg not in out:
            out.append(cfg)
    return out


def random_weights(scheme: str, experts: int, hidden: int, inter: int, group: int, device) -> tuple:
    """Random stacked weights (gate_up, its scales, down, its scales) in the layout the op takes, seeded;
    ``group``: W4A16's G (0: per channel), W8A16's 128 (0: per channel). H and I must need no padding."""
    gen = torch.Generator().manual_seed(0)
    out = []
    for n, k in ((2 * inter, hidden), (hidden, inter)):
        if scheme == "w4a16":
            g = group or k
            q = torch.randint(-8, 8, (experts, k, n), generator=gen, dtype=torch.int8)
            out += [torch.stack([pack_int4(q[e]) for e in range(experts)]),
                    torch.rand(experts, k // g, n, generator=gen) * 0.02 + 1e-3]
        else:
            scales = (experts, n) if scheme == "w8a8" or not group else (experts, n, k // group)
            out += [torch.randint(-127, 128, (experts, n, k), generator=gen, dtype=torch.int8),
                    torch.rand(scales, generator=gen) * 1e-2 + 1e-3]
    return tuple(t.to(device) for t in out)


def routed_inputs(hidden: int, tokens: int, experts: int, top_k: int, dtype, device) -> tuple:
    """x (T, H) and a random top-k routing (distinct experts per token, weights summing to 1), seeded by T."""
    gen = torch.Generator().manual_seed(tokens)
    ids = torch.stack([torch.randperm(experts, generator=gen)[:top_k] for _ in range(tokens)])
    weights = torch.rand(tokens, top_k, generator=gen) + 0.1
    x = torch.randn(tokens, hidden, generator=gen)
    return x.to(device, dtype), ids.to(device), (weights / weights.sum(-1, keepdim=True)).to(device, dtype)


def sweep_case(hidden: int, inter: int, m: int, args, device) -> list[dict]:
    scheme = args.scheme
    dtype = sweep.DTYPES[args.dtype]
    weights = random_weights(scheme, args.experts, hidden, inter, args.group, device)
    x, ids, topk_weights = routed_inputs(hidden, m, args.experts, args.top_k, dtype, device)
    if scheme == "w4a16":
        ks = (weights[0].shape[1] * 8, weights[2].shape[1] * 8)
        groups = (ks[0] // weights[1].shape[1], ks[1] // weights[3].shape[1])
    else:
        ks = (weights[0].shape[2], weights[2].shape[2])
        groups = tuple(128 if w.dim() == 3 else 0 for w in (weights[1], weights[3]))
    args_pick = (scheme, m * args.top_k, args.experts, hidden, *ks, *groups, device)
    picked = pick(*args_pick)
    others = [pick(*args_pick, block_m=b) for b in BLOCK_MS[scheme] if b != picked.block_m]
    ref = REFERENCES[scheme](x, ids, topk_weights, *weights)
    case = {"op": f"moe_{scheme}", "H": hidden, "I": inter, "E": args.experts, "top_k": args.top_k, "M": m,
            "dtype": args.dtype, "group": args.group}
    rows = []
    for cfg in candidates(picked, others, scheme, groups[0] or 128):
        row = {**case, "config": {"block_m": cfg.block_m, "gate_up": cfg.gate_up._asdict(),
                                  "down": cfg.down._asdict()}, "picked": cfg == picked}
        try:
            err = sweep.rel_error(launch(scheme, x, ids, topk_weights, weights, cfg), ref)
            ms, graph = rotation_ms([lambda cfg=cfg: launch(scheme, x, ids, topk_weights, weights, cfg)], True,
                                    args.warmup_ms, args.rep_ms)
            row.update(ms=ms, graph=graph, rel_err=err, ok=err <= TOL[dtype], error=None)
        except Exception as exc:  # noqa: BLE001 - a config that cannot compile or launch is a row, not the end
            row.update(ms=None, graph=False, rel_err=None, ok=False, error=f"{type(exc).__name__}: {exc}"[:300])
        rows.append(row)
    return rows


def report(rows: list[dict], args) -> None:
    """One line per row (``*``: the table's pick), and the rows as JSON to ``--out``."""
    for r in rows:
        timing = f"{r['ms'] * 1e3:9.1f} us" if r["ms"] is not None else r["error"]
        c = r["config"]
        tiles = " ".join(f"{name}=" + ",".join(f"{k}:{v}" for k, v in c[name].items()) for name in ("gate_up", "down"))
        print(f"{'*' if r['picked'] else ' '} {r['op']} {r['H']}x{r['I']} T={r['M']} block_m={c['block_m']} "
              f"{tiles}: {timing}{'' if r['ok'] else '  (not ok)'}")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(rows, indent=1))


def main(argv=None) -> list[dict]:
    parser = sweep.argument_parser("moe", __doc__.splitlines()[0], "4096x14336,2048x7168", "1,8,64,512")
    parser.add_argument("--scheme", choices=sorted(REFERENCES), default="w4a16")
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--top-k", type=int, default=2)
    parser.add_argument("--group", type=int, default=128,
                        help="W4A16 scale group (32, 64, 128; 0: per channel); W8A16: 128 for group scales, 0 per "
                             "channel; W8A8: ignored")
    args = parser.parse_args(argv)
    sweep.check_common(args)
    if args.experts < 1 or not 1 <= args.top_k <= args.experts:
        raise SystemExit(f"--experts / --top-k: expected 1 <= top-k <= experts, got {args.experts} / {args.top_k}")
    allowed = {"w4a16": (0, 32, 64, 128), "w8a16": (0, 128), "w8a8": (0, 128)}[args.scheme]
    if args.group not in allowed:
        raise SystemExit(f"--group: expected one of {allowed} for {args.scheme}, got {args.group}")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    rows = [row for hidden, inter in args.shapes for m in args.m for row in sweep_case(hidden, inter, m, args, device)]
    report(rows, args)
    return rows


if __name__ == "__main__":
    main()
