"""Where a forward pass spends its GPU time: kernel durations of saved models, grouped by kind.

    python -m scripts.profile_forward runs/oneshot/dense runs/oneshot/w8a8 --batch-size 1 --seq-len 64

For each model directory (anything ``compress evaluate`` loads) it builds the evaluation harness's
inputs (:func:`compress.eval.evaluate.latency_inputs`, fp16 on CUDA), runs warm-up forwards, then records
``--repeats`` forwards with ``torch.profiler`` (CUDA activity) and sums the device time of every
kernel per forward. Kernels are grouped by name into our Triton kernels (one group per kernel
function), cuBLAS / other GEMMs, and everything else (norms, softmax, elementwise, copies). The sum
of kernel time is not the latency: under CUDA graphs the gaps between kernels are ~1 us each, so a
forward of many small kernels also pays for their count, which is printed too. Compressed sibling
layers are fused first, as ``compress evaluate`` runs them (``--no-fuse`` keeps them apart).
"""
from __future__ import annotations

import argparse
import json
import re
from collections import defaultdict
from pathlib import Path

import torch

from compress.checkpoint import load_model_dir
from compress.eval.evaluate import cast_for_inference, latency_inputs
from compress.nn.fusion import fuse_siblings

GEMM_NAME = re.compile(r"gemm|sm90_xmma|cutlass|cublas|nvjet", re.IGNORECASE)


def kernel_group(name: str) -> str:
    """A short label for a kernel name: ``ours:<triton function>``, ``gemm`` or ``other:<op>``."""
    if name.startswith("_") and "kernel" in name:  # our Triton kernels are named _<what>_kernel
        return "ours:" + name.split("_0d")[0].split("_1d")[0]
    if GEMM_NAME.search(name):
        return "gemm (cuBLAS)"
    head = re.sub(r"<.*", "", name.replace("(anonymous namespace)::", "").split("(")[0]).strip()
    return "other:" + head[-60:]


def profile_model(model, inputs: dict, repeats: int) -> dict:
    """Per-forward kernel time and count, by group, averaged over ``repeats`` forwards."""
    from torch.profiler import ProfilerActivity, profile

    with torch.no_grad():
        for _ in range(5):
            model(**inputs)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(repeats):
                model(**inputs)
            torch.cuda.synchronize()
    time_us: dict[str, float] = defaultdict(float)
    count: dict[str, float] = defaultdict(float)
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA and event.device_time > 0:
            group = kernel_group(event.name)
            time_us[group] += event.device_time / repeats
            count[group] += 1 / repeats
    return {"kernel_us": sum(time_us.values()), "kernels": sum(count.values()),
            "groups": {g: {"us": time_us[g], "count": count[g]}
                       for g in sorted(time_us, key=time_us.get, reverse=True)}}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m scripts.profile_forward", description=__doc__.split("\n")[0])
    parser.add_argument("models", nargs="+", type=Path, help="saved model directories")
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--no-fuse", dest="fuse", action="store_false", help="keep compressed q/k/v layers apart")
    parser.add_argument("--out", type=Path, default=None, help="write every figure as JSON here")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU (it profiles GPU kernels)")
    device = torch.device("cuda")
    results = {}
    for path in args.models:
        model = cast_for_inference(load_model_dir(path), device, torch.float16)
        if args.fuse:
            fuse_siblings(model)
        inputs = latency_inputs(model, args.batch_size, args.seq_len, device)
        result = profile_model(model, inputs, args.repeats)
        results[str(path)] = result
        print(f"\n{path}: {result['kernel_us']:.1f} us of kernels in {result['kernels']:.0f} kernels per forward")
        for group, figures in result["groups"].items():
            print(f"  {figures['us']:8.1f} us  {figures['count']:5.0f}x  {group}")
    if args.out is not None:
        args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
