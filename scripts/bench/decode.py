"""End-to-end decode benchmark: tokens/s of a Llama-2-7B-shaped model, dense vs compressed.

What it measures. A ``transformers`` ``LlamaForCausalLM`` with Llama-2-7B shapes (hidden 4096,
intermediate 11008, 32 heads, vocab 32000; ``--layers`` of them, 32 by default) and random weights
(seeded ``normal_(0, 0.02)``, built directly on the GPU: nothing is downloaded) decodes greedily
with a static KV cache: a random prompt of ``--prompt-len`` tokens is prefilled, then ``--steps``
single-token decode steps are timed at each ``--batch``. tokens/s = batch * steps / time.

Variants (``--variants``), each built from the same seeded weights, one at a time (freed after):

* ``fp16-eager``: plain eager PyTorch, no compile, no graph (the naive baseline).
* ``fp16``: cuBLAS fp16 linears.
* ``w4a16`` (ours): ``compress.convert(model, W4A16Config(group_size=128))``.
* ``w8a8`` (ours): ``compress.convert(model, W8A8Config())``, dynamic per-token activations.
* ``dds50`` / ``dds90`` (ours): ``compress.prepare(model, BlockSparseConfig(p))``, random 32x32
  block masks pruning exactly ``floor(p * blocks)`` blocks of every matrix (speed only), then
  ``compress.convert`` to ``BSRLinear``; ``dds50-w8a8``: the same 50% masks plus W8A8, exported
  to ``BSRW8A8Linear`` (int8 blocks, per-token int8 activations).
* ``int4-aten``: PyTorch's tinygemm int4 kernel (``aten._weight_int4pack_mm``, group 128, as
  torchao uses it) with the same symmetric int4 weights as ours; it takes bf16 activations only,
  so this variant's model runs in bf16.
* ``no-linears``: not a scheme; the decoder linears return zeros, so this times the rest of a step
  (attention over the cache, norms, rotary embedding, ``lm_head``): the floor every scheme adds to.

Every variant but ``fp16-eager`` runs in the same harness: ``torch.compile`` of the decoder layer
and one CUDA graph per decode step.

Sibling fusion (default; ``--no-fuse`` turns it off): in every variant, the fp16 ones included, the
attention's ``q_proj`` / ``k_proj`` / ``v_proj`` and the MLP's ``gate_proj`` / ``up_proj`` are first
fused into one linear layer each (``compress.fusion.fuse_siblings(model, dense=True)``), and the
variant then compresses those, so a step runs 4 matmuls per layer instead of 7 in every variant
and the ratios compare kernels, not layouts.

``lm_head`` and the embeddings stay in fp16 (bf16 for int4-aten) in every variant.

Harness. The decode step is our own short loop over the model's parts (embedding, rotary
embedding, decoder layers, final norm, ``lm_head``, greedy argmax) with a ``transformers``
``StaticCache``; each decoder layer gets a view of its own cache layer, and every attention module
gets ``layer_idx = 0`` so that all layers share one compiled graph (regional compilation: one
layer's compile time instead of 32). The step writes its next token and position into static
buffers, so one CUDA graph of the whole step is replayed ``steps`` times with no host work in
between. The mask is built from the position buffer (``key position <= query position``), never
by ``transformers``' mask code. Timing: CUDA events around the replays, ``--repeats`` runs (each
after a cache reset and a fresh prefill), median reported. A harness check compares the first
decode step's logits from the graph against the eager step of the same model.

Output: a JSON file (GPU, versions, config, every figure, ratios to fp16 in the same harness and to
fp16 eager) and a printed table. ``--tiny`` runs a tiny Llama on the CPU (pure-PyTorch reference
path of the modules, ``torch.compile`` with the ``aot_eager`` backend, no graph) so the harness is
tested where there is no GPU.

Example (H100)::

    python scripts/bench_decode.py --out benchmarks/results/decode-h100.json
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import json
import logging
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from torch import nn

if __package__ in (None, ""):  # run as a script: make the project importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

logger = logging.getLogger("bench_decode")

LLAMA2_7B = dict(hidden_size=4096, intermediate_size=11008, num_attention_heads=32, num_key_value_heads=32,
                 vocab_size=32000, rms_norm_eps=1e-5)
TINY_LLAMA = dict(hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=4,
                  vocab_size=512, rms_norm_eps=1e-5)
ALL_VARIANTS = ("fp16", "w4a16", "int4-aten", "w8a8", "dds90", "dds50", "dds50-w8a8", "fp16-eager", "no-linears")
INT4_GROUP = 128
INIT_STD = 0.02


# ---- model -------------------------------------------------------------------------------------
def llama_config(layers: int, tiny: bool, max_positions: int):
    """A ``LlamaConfig`` with Llama-2-7B shapes (or tiny ones) and SDPA attention."""
    from transformers import LlamaConfig

    shapes = TINY_LLAMA if tiny else LLAMA2_7B
    return LlamaConfig(num_hidden_layers=layers, max_position_embeddings=max_positions,
                       tie_word_embeddings=False, attn_implementation="sdpa", **shapes)


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype):
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


@torch.no_grad()
def build_model(config, dtype: torch.dtype, device: torch.device, seed: int) -> nn.Module:
    """Random-weight ``LlamaForCausalLM`` made on ``device`` in ``dtype``; same seed, same weights."""
    from transformers import LlamaForCausalLM

    with default_dtype(dtype), torch.device(device):
        model = LlamaForCausalLM(config)
    generator = torch.Generator(device=device).manual_seed(seed)
    for module in model.modules():
        if isinstance(module, (nn.Linear, nn.Embedding)):
            module.weight.normal_(0.0, INIT_STD, generator=generator)
        elif type(module).__name__.endswith("RMSNorm"):
            module.weight.fill_(1.0)
    return model.eval()


def weight_bytes(model: nn.Module) -> int:
    """Bytes of the decoder layers' parameters and buffers (what a decode step must read)."""
    layers = model.model.layers
    tensors = list(layers.parameters()) + list(layers.buffers())
    return sum(t.numel() * t.element_size() for t in tensors)


# ---- PyTorch's int4 path (tinygemm), the anchor ---------------------------------------------------
def quantize_int4_symmetric(weight: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, K) -> (q (N, K) int32 in [-8, 7], scales (N, K/G) float32), ``s = max|w| / 7`` per group."""
    n, k = weight.shape
    groups = weight.float().reshape(n, k // group_size, group_size)
    scales = groups.abs().amax(dim=-1) / 7.0
    scales = torch.where(scales == 0, torch.ones_like(scales), scales)
    q = torch.clamp(torch.round(groups / scales[..., None]), -8, 7)
    return q.reshape(n, k).to(torch.int32), scales


class TinygemmInt4Linear(nn.Module):
    """``aten._weight_int4pack_mm`` with group-wise symmetric int4 weights (torchao's int4 path).

    tinygemm stores ``u = q + 8`` in [0, 15] and dequantizes ``(u - 8) * scale + zero``; with
    ``zero = 0`` that is exactly our symmetric ``q * scale``. ``scales_and_zeros`` is (K/G, N, 2)
    bf16. On CUDA the weight is packed from (N, K/2) uint8 (two nibbles per byte, even k high);
    on the CPU the ``_for_cpu`` ops take the (N, K) int32 values. Activations must be bf16.
    """

    def __init__(self, in_features: int, out_features: int, group_size: int, packed: torch.Tensor,
                 scales_and_zeros: torch.Tensor):
        super().__init__()
        self.in_features, self.out_features, self.group_size = in_features, out_features, group_size
        self.register_buffer("packed", packed)
        self.register_buffer("scales_and_zeros", scales_and_zeros)

    @classmethod
    @torch.no_grad()
    def from_float(cls, linear: nn.Linear, group_size: int = INT4_GROUP, inner_k_tiles: int = 8):
        if linear.bias is not None:
            raise ValueError("TinygemmInt4Linear: expected a linear layer without bias")
        n, k = linear.weight.shape
        if k % group_size or k % (inner_k_tiles * 16) or n % 16:
            raise ValueError(f"TinygemmInt4Linear: expected K % {group_size} == 0, K % {inner_k_tiles * 16} == 0 "
                             f"and N % 16 == 0, got (N, K) = ({n}, {k})")
        q, scales = quantize_int4_symmetric(linear.weight, group_size)
        unsigned = q + 8
        if linear.weight.is_cuda:
            nibbles = (unsigned[:, ::2] << 4 | unsigned[:, 1::2]).to(torch.uint8)  # (N, K/2)
            packed = torch.ops.aten._convert_weight_to_int4pack(nibbles.contiguous(), inner_k_tiles)
        else:
            packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(unsigned.contiguous(), inner_k_tiles)
        scales_t = scales.t().contiguous()  # (K/G, N)
        scales_and_zeros = torch.stack([scales_t, torch.zeros_like(scales_t)], dim=-1).to(torch.bfloat16)
        return cls(k, n, group_size, packed, scales_and_zeros.contiguous())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, self.in_features).to(torch.bfloat16).contiguous()
        if x2.is_cuda:
            y = torch.ops.aten._weight_int4pack_mm(x2, self.packed, self.group_size, self.scales_and_zeros)
        else:
            y = torch.ops.aten._weight_int4pack_mm_for_cpu(x2, self.packed, self.group_size, self.scales_and_zeros)
        return y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, group_size={self.group_size}"


def swap_decoder_linears(model: nn.Module, make: Callable[[nn.Linear], nn.Module]) -> int:
    """Replace every ``nn.Linear`` inside the decoder layers (``lm_head`` untouched)."""
    count = 0
    for layer in model.model.layers:
        for name, child in list(layer.named_modules()):
            if isinstance(child, nn.Linear):
                parent_name, _, attr = name.rpartition(".")
                setattr(layer.get_submodule(parent_name) if parent_name else layer, attr, make(child))
                count += 1
    return count


class SkippedLinear(nn.Module):
    """Stands in for a linear layer and returns zeros: times everything in a step except the linears."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features

    @classmethod
    def from_float(cls, linear: nn.Linear) -> "SkippedLinear":
        return cls(linear.in_features, linear.out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.new_zeros(*x.shape[:-1], self.out_features)


# ---- variants ----------------------------------------------------------------------------------
def apply_w4a16(model: nn.Module, seed: int) -> None:
    import compress

    compress.convert(model, compress.W4A16Config(group_size=INT4_GROUP))


def apply_w8a8(model: nn.Module, seed: int) -> None:
    import compress

    compress.convert(model, compress.W8A8Config())


def apply_random_block_sparsity(model: nn.Module, sparsity: float, seed: int, w8a8: bool = False) -> None:
    """Prune exactly ``floor(sparsity * blocks)`` random 32x32 blocks of every decoder matrix, export BSR
    (``w8a8``: also quantized to W8A8, exported as int8 blocks)."""
    import compress
    from compress.plan import compressed_layers
    from compress.sparsity import mask_from_scores

    configs = [compress.BlockSparseConfig(sparsity=sparsity)] + ([compress.W8A8Config()] if w8a8 else [])
    compress.prepare(model, configs)
    generator = torch.Generator().manual_seed(seed)
    for layer in compressed_layers(model).values():
        scores = torch.rand(tuple(layer.mask.shape), generator=generator)
        layer.set_mask(mask_from_scores(scores, sparsity).to(layer.mask.device))
    compress.convert(model)


def apply_int4_aten(model: nn.Module, seed: int) -> None:
    swap_decoder_linears(model, TinygemmInt4Linear.from_float)


def apply_no_linears(model: nn.Module, seed: int) -> None:
    swap_decoder_linears(model, SkippedLinear.from_float)


@dataclass(frozen=True)
class Variant:
    dtype: torch.dtype
    compiled: bool  # torch.compile + CUDA graph (the common harness) or plain eager
    apply: Callable[[nn.Module, int], None] | None


VARIANTS = {
    "fp16-eager": Variant(torch.float16, False, None),
    "fp16": Variant(torch.float16, True, None),
    "w4a16": Variant(torch.float16, True, apply_w4a16),
    "w8a8": Variant(torch.float16, True, apply_w8a8),
    "dds50": Variant(torch.float16, True, lambda m, s: apply_random_block_sparsity(m, 0.5, s)),
    "dds90": Variant(torch.float16, True, lambda m, s: apply_random_block_sparsity(m, 0.9, s)),
    "dds50-w8a8": Variant(torch.float16, True, lambda m, s: apply_random_block_sparsity(m, 0.5, s, w8a8=True)),
    "int4-aten": Variant(torch.bfloat16, True, apply_int4_aten),
    "no-linears": Variant(torch.float16, True, apply_no_linears),
}


# ---- decode harness ----------------------------------------------------------------------------
class LayerKV:
    """One layer's slice of a ``StaticCache``: what a decoder layer calls ``update`` on.

    The layer index the attention passes is ignored (every layer owns its view), so all decoder
    layers trace to the same graph.
    """

    def __init__(self, cache_layer):
        self.layer = cache_layer

    def update(self, key_states, value_states, *args, **kwargs):
        return self.layer.update(key_states, value_states)


def run_layer(layer, hidden, mask, position_ids, kv, position_embeddings):
    out = layer(hidden, attention_mask=mask, position_ids=position_ids, past_key_values=kv, use_cache=True,
                position_embeddings=position_embeddings)
    return out[0] if isinstance(out, tuple) else out


class DecodeRunner:
    """Greedy decoding of one model at one batch size with a static cache and static buffers."""

    def __init__(self, model: nn.Module, batch: int, prompt_len: int, max_len: int, seed: int):
        from transformers import StaticCache

        self.model, self.batch, self.prompt_len, self.max_len = model, batch, prompt_len, max_len
        self.device = model.lm_head.weight.device
        self.cache = StaticCache(config=model.config, max_cache_len=max_len)
        self.kv = [LayerKV(cache_layer) for cache_layer in self.cache.layers]
        for layer in model.model.layers:
            layer.self_attn.layer_idx = 0  # every layer has its own LayerKV: one shared compiled graph
        generator = torch.Generator().manual_seed(seed)
        self.prompt = torch.randint(0, model.config.vocab_size, (batch, prompt_len), generator=generator).to(self.device)
        self.key_positions = torch.arange(max_len, device=self.device)
        self.token = torch.zeros(batch, 1, dtype=torch.long, device=self.device)
        self.position = torch.zeros(1, dtype=torch.long, device=self.device)
        self.logits = torch.zeros(batch, model.config.vocab_size, dtype=model.lm_head.weight.dtype, device=self.device)
        self.layer_fn = run_layer

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, layer_fn: Callable = run_layer) -> torch.Tensor:
        """Logits (B, vocab) of the last token; writes the tokens' keys/values into the cache."""
        batch, length = tokens.shape
        inner = self.model.model
        hidden = inner.embed_tokens(tokens)
        position_ids = positions[None, :].expand(batch, length)
        position_embeddings = inner.rotary_emb(hidden, position_ids)
        visible = self.key_positions[None, :] <= positions[:, None]  # (T, max_len)
        mask = visible[None, None].expand(batch, 1, length, self.max_len)
        for layer, kv in zip(inner.layers, self.kv):
            hidden = layer_fn(layer, hidden, mask, position_ids, kv, position_embeddings)
        return self.model.lm_head(inner.norm(hidden[:, -1:]))[:, -1]

    @torch.no_grad()
    def prefill(self) -> None:
        """Reset the cache and run the prompt (eager layers): position = prompt_len, token = its argmax."""
        self.cache.reset()
        positions = torch.arange(self.prompt_len, device=self.device)
        logits = self.forward(self.prompt, positions, run_layer)
        self.token.copy_(logits.argmax(dim=-1, keepdim=True))
        self.position.fill_(self.prompt_len)

    @torch.no_grad()
    def decode_step(self) -> None:
        """One token for every sequence; all state lives in static buffers (graph-replayable)."""
        logits = self.forward(self.token, self.position, self.layer_fn)
        self.logits.copy_(logits)
        self.token.copy_(logits.argmax(dim=-1, keepdim=True))
        self.position.add_(1)

    def compile_layers(self, backend: str, mode: str | None, fullgraph: bool) -> None:
        self.layer_fn = torch.compile(run_layer, backend=backend, mode=mode, fullgraph=fullgraph, dynamic=False)

    def eager_reference_logits(self) -> torch.Tensor:
        """Logits of the first decode step with the plain (uncompiled) layers."""
        compiled, self.layer_fn = self.layer_fn, run_layer
        try:
            self.prefill()
            self.decode_step()
            return self.logits.float().clone()
        finally:
            self.layer_fn = compiled


def capture_step_graph(runner: DecodeRunner, warmup: int) -> "torch.cuda.CUDAGraph":
    """Warm up (compiles, autotunes) on a side stream, then capture one decode step."""
    runner.prefill()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            runner.decode_step()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        runner.decode_step()
    torch.cuda.synchronize()
    return graph


def time_steps(run_step: Callable[[], None], steps: int, device: torch.device) -> float:
    """Seconds for ``steps`` decode steps (CUDA events on the GPU, a host clock on the CPU)."""
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for _ in range(steps):
            run_step()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3
    began = time.perf_counter()
    for _ in range(steps):
        run_step()
    return time.perf_counter() - began


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want.float()).norm() / want.float().norm().clamp_min(1e-12))


def compiled_graph_count() -> int:
    """Graphs dynamo compiled since the last ``torch._dynamo.reset()`` (1 when the layers share one)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def bench_batch(model: nn.Module, variant: Variant, batch: int, args) -> dict:
    """Compile / capture (if the variant asks) and time one batch size; returns its figures."""
    runner = DecodeRunner(model, batch, args.prompt_len, args.prompt_len + args.steps + args.warmup + 2, args.seed)
    reference = runner.eager_reference_logits()
    began = time.perf_counter()
    run_step, graphed = runner.decode_step, False
    if variant.compiled:
        # fullgraph on CUDA, where the modules call the custom ops; on the CPU they run the
        # pure-PyTorch references, and the BSR one builds a sparse tensor, which dynamo cannot trace
        runner.compile_layers(args.compile_backend, args.compile_mode, fullgraph=runner.device.type == "cuda")
        if runner.device.type == "cuda":
            graph = capture_step_graph(runner, args.warmup)
            run_step, graphed = graph.replay, True
        else:
            runner.prefill()
            for _ in range(args.warmup):
                runner.decode_step()
    setup_s = time.perf_counter() - began
    graphs = compiled_graph_count()
    runner.prefill()
    run_step()
    check = relative_error(runner.logits, reference)
    times = []
    for _ in range(args.repeats):
        runner.prefill()
        times.append(time_steps(run_step, args.steps, runner.device))
    seconds = statistics.median(times)
    return dict(batch=batch, tokens_per_s=batch * args.steps / seconds, ms_per_step=1e3 * seconds / args.steps,
                times_s=times, compile_and_capture_s=setup_s, cuda_graph=graphed, compiled_graphs=graphs,
                first_step_logits_rel_err_vs_eager=check)


def bench_variant(name: str, config, args) -> dict:
    """Build the variant from the seeded weights, time every batch size, free everything."""
    variant = VARIANTS[name]
    began = time.perf_counter()
    model = build_model(config, variant.dtype, args.device, args.seed)
    if args.fuse:
        from compress.fusion import fuse_siblings

        fuse_siblings(model, dense=True)
    if variant.apply is not None:
        variant.apply(model, args.seed)
    build_s = time.perf_counter() - began
    result = dict(variant=name, dtype=str(variant.dtype).replace("torch.", ""), build_s=build_s,
                  compiled=variant.compiled, weight_bytes=weight_bytes(model), batches=[])
    try:
        for batch in args.batch:
            figures = bench_batch(model, variant, batch, args)
            # decoder weights streamed per second: how close a step is to the memory-bandwidth floor
            figures["decoder_weight_tb_per_s"] = result["weight_bytes"] / (figures["ms_per_step"] * 1e-3) / 1e12
            result["batches"].append(figures)
            reset_compiler()
    finally:
        del model
        release_memory(args.device)
    return result


def reset_compiler() -> None:
    """Forget compiled graphs and their counters (each variant and batch compiles afresh)."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()


@contextlib.contextmanager
def strict_recompiles():
    """Fail loudly, not fall back to eager, if the layers ever stop sharing their graph (restored after)."""
    config = torch._dynamo.config
    if not hasattr(config, "fail_on_recompile_limit_hit"):
        yield
        return
    previous = config.fail_on_recompile_limit_hit
    config.fail_on_recompile_limit_hit = True
    try:
        yield
    finally:
        config.fail_on_recompile_limit_hit = previous


def release_memory(device: torch.device) -> None:
    reset_compiler()
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


# ---- report --------------------------------------------------------------------------------------
def environment(device: torch.device) -> dict:
    import transformers
    import triton

    info = dict(torch=torch.__version__, triton=triton.__version__, transformers=transformers.__version__,
                python=platform.python_version(), device=str(device))
    if device.type == "cuda":
        info.update(gpu=torch.cuda.get_device_name(device), cuda=torch.version.cuda,
                    sm_count=torch.cuda.get_device_properties(device).multi_processor_count)
    return info


def ratios(results: list[dict]) -> dict:
    """{batch: {variant: {vs_fp16, vs_fp16_eager}}} from tokens/s measured in this run."""
    speed = {(r["variant"], b["batch"]): b["tokens_per_s"] for r in results for b in r["batches"]}
    table: dict = {}
    for (variant, batch), tps in speed.items():
        row = table.setdefault(str(batch), {}).setdefault(variant, {})
        for base in ("fp16", "fp16-eager"):
            if (base, batch) in speed:
                row[f"vs_{base.replace('-', '_')}"] = tps / speed[(base, batch)]
    return table


def targets(ratio_table: dict) -> dict:
    """The issue's batch-1 targets, judged on this run's ratios (None when a figure is missing)."""
    row = ratio_table.get("1", {})

    def vs_fp16(variant):
        return row.get(variant, {}).get("vs_fp16")

    w4, anchor, w8, dds90 = vs_fp16("w4a16"), vs_fp16("int4-aten"), vs_fp16("w8a8"), vs_fp16("dds90")
    return {
        "w4a16 >= 2.0x fp16 (batch 1)": None if w4 is None else w4 >= 2.0,
        "w4a16 ahead of int4-aten (batch 1)": None if w4 is None or anchor is None else w4 > anchor,
        "w8a8 >= 1.5x fp16 (batch 1)": None if w8 is None else w8 >= 1.5,
        "dds90 >= 3x fp16 (batch 1)": None if dds90 is None else dds90 >= 3.0,
    }


def format_table(results: list[dict], ratio_table: dict) -> str:
    lines = ["| variant | batch | tokens/s | ms/step | vs fp16 | vs fp16 eager | weights GB | graph |",
             "|---|---|---|---|---|---|---|---|"]
    for r in results:
        for b in r["batches"]:
            row = ratio_table.get(str(b["batch"]), {}).get(r["variant"], {})
            rel = " | ".join(f"{row[k]:.2f}x" if k in row else "-" for k in ("vs_fp16", "vs_fp16_eager"))
            lines.append(f"| {r['variant']} | {b['batch']} | {b['tokens_per_s']:.1f} | {b['ms_per_step']:.3f} | {rel} | "
                         f"{r['weight_bytes'] / 1e9:.2f} | {'yes' if b['cuda_graph'] else 'no'} |")
    return "\n".join(lines)


def write_report(path: Path | None, report: dict) -> None:
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(report, indent=2) + "\n")
    os.replace(tmp, path)


# ---- command line --------------------------------------------------------------------------------
def int_list(text: str) -> list[int]:
    values = [int(v) for v in text.split(",") if v.strip()]
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected comma-separated positive ints, got {text!r}")
    return values


def variant_list(text: str) -> list[str]:
    names = [v.strip() for v in text.split(",") if v.strip()]
    unknown = [n for n in names if n not in VARIANTS]
    if not names or unknown:
        raise argparse.ArgumentTypeError(f"expected variants from {', '.join(ALL_VARIANTS)}, got {text!r}")
    return names


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=None, help="decoder layers (default 32; 2 with --tiny)")
    parser.add_argument("--batch", type=int_list, default=None, help="batch sizes (default 1,8; 1,2 with --tiny)")
    parser.add_argument("--variants", type=variant_list, default=list(ALL_VARIANTS), help=", ".join(ALL_VARIANTS))
    parser.add_argument("--steps", type=int, default=None, help="timed decode steps (default 128; 4 with --tiny)")
    parser.add_argument("--prompt-len", type=int, default=None, help="prompt tokens (default 16; 4 with --tiny)")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per figure (median reported)")
    parser.add_argument("--warmup", type=int, default=3, help="decode steps before capture / timing")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tiny", action="store_true", help="tiny Llama for CPU smoke tests")
    parser.add_argument("--device", default=None, help="cuda (default when available) or cpu")
    parser.add_argument("--compile-backend", default=None, help="torch.compile backend (inductor; aot_eager on CPU)")
    parser.add_argument("--compile-mode", default=None, help="torch.compile mode (default: inductor's default)")
    parser.add_argument("--time-budget", type=float, default=float("inf"),
                        help="seconds; variants not started by then are skipped (and listed as skipped)")
    parser.add_argument("--fail-fast", action="store_true", help="stop at the first failing variant")
    parser.add_argument("--no-fuse", dest="fuse", action="store_false",
                        help="keep q/k/v and gate/up as separate linear layers (default: fused in every variant)")
    parser.add_argument("--out", type=Path, default=None, help="JSON report path")
    args = parser.parse_args(argv)
    return finish_args(parser, args)


def finish_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.Namespace:
    """Fill the defaults that depend on ``--tiny`` and the device; validate."""
    args.device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if args.device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is available")
    args.layers = args.layers or (2 if args.tiny else 32)
    args.batch = args.batch or ([1, 2] if args.tiny else [1, 8])
    args.steps = args.steps or (4 if args.tiny else 128)
    args.prompt_len = args.prompt_len or (4 if args.tiny else 16)
    args.compile_backend = args.compile_backend or ("inductor" if args.device.type == "cuda" else "aot_eager")
    for name in ("layers", "steps", "prompt_len", "repeats"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name.replace('_', '-')}: expected a positive int, got {getattr(args, name)}")
    if args.warmup < 1:
        parser.error(f"--warmup: expected at least 1 (the compile happens there), got {args.warmup}")
    if not args.tiny and args.device.type != "cuda":
        logger.warning("the 7B-shaped model on %s will be very slow; use --tiny for a smoke test", args.device)
    return args


def run(args: argparse.Namespace) -> dict:
    """The whole benchmark; returns (and writes after every variant) the report."""
    config = llama_config(args.layers, args.tiny, args.prompt_len + args.steps + args.warmup + 2)
    report = dict(benchmark="decode", environment=environment(args.device),
                  config=dict(layers=args.layers, tiny=args.tiny, batch=args.batch, steps=args.steps,
                              prompt_len=args.prompt_len, repeats=args.repeats, warmup=args.warmup, seed=args.seed,
                              compile_backend=args.compile_backend, compile_mode=args.compile_mode,
                              fused_siblings=args.fuse,
                              model={k: getattr(config, k) for k in ("hidden_size", "intermediate_size",
                                                                   "num_attention_heads", "vocab_size")}),
                  results=[], skipped=[], failed=[])
    reset_compiler()
    started = time.perf_counter()
    with strict_recompiles():
        run_variants(args, config, report, started)
    finish_report(report, args.out, started)
    return report


def run_variants(args: argparse.Namespace, config, report: dict, started: float) -> None:
    """Bench each variant in turn, writing the report after each one."""
    for name in args.variants:
        if time.perf_counter() - started > args.time_budget:
            report["skipped"].append(dict(variant=name, reason=f"time budget of {args.time_budget:.0f} s spent"))
            continue
        logger.info("variant %s ...", name)
        try:
            report["results"].append(bench_variant(name, config, args))
        except Exception as error:  # noqa: BLE001 - one broken variant must not cost the others' figures
            if args.fail_fast:
                raise
            logger.exception("variant %s failed", name)
            report["failed"].append(dict(variant=name, error=f"{type(error).__name__}: {error}"[:2000]))
            release_memory(args.device)
        finish_report(report, args.out, started)


def finish_report(report: dict, out: Path | None, started: float) -> None:
    """Recompute ratios and target verdicts, stamp the elapsed time, write the JSON."""
    report["ratios"] = ratios(report["results"])
    report["targets"] = targets(report["ratios"])
    report["elapsed_s"] = time.perf_counter() - started
    write_report(out, report)


def main(argv=None) -> dict:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    args = parse_args(argv)
    report = run(args)
    print(format_table(report["results"], report["ratios"]))
    for target, ok in report["targets"].items():
        print(f"target {target}: {'n/a' if ok is None else ('met' if ok else 'NOT met')}")
    for skipped in report["skipped"]:
        print(f"skipped {skipped['variant']}: {skipped['reason']}")
    for failed in report["failed"]:
        print(f"FAILED {failed['variant']}: {failed['error'][:300]}")
    return report


if __name__ == "__main__":
    sys.exit(1 if main()["failed"] else 0)
