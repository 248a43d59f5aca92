"""The decode benchmark's harness: greedy decoding with a static KV cache, compiled, captured and timed.

A decode step is our own short loop over the model's parts (embedding, rotary embedding, decoder
layers, final norm, ``lm_head``, greedy argmax) with a ``transformers`` ``StaticCache``. Each decoder
layer gets a view of its own cache layer (:class:`LayerKV`) and every attention module gets
``layer_idx = 0``, so all layers trace to the same graph and ``torch.compile`` compiles one layer
(regional compilation: one layer's compile time instead of 32). The step reads its token and
position from static buffers and writes the next ones there, so one CUDA graph of the whole step
(:func:`compress.eval.timing.capture_graph`) is replayed ``steps`` times with no host work in
between. The attention mask is built from the position buffer (``key position <= query position``),
never by ``transformers``' mask code.

Timing (:func:`bench_batch`): ``repeats`` runs, each after a cache reset and a fresh prefill, of
``steps`` back-to-back steps (:func:`compress.eval.timing.total_ms`: CUDA events around the
replays on a GPU, the host clock on the CPU); the median run gives tokens/s = batch * steps / time.
A harness check compares the first decode step's logits from the compiled (and captured) step
against the eager step of the same model. On the CPU the layers compile with the ``aot_eager``
backend and without ``fullgraph`` (the BSR reference builds a sparse tensor, which dynamo cannot
trace), and nothing is captured.
"""
from __future__ import annotations

import statistics
import time
from typing import Callable

import torch
from torch import nn

from compress.eval.timing import capture_graph, total_ms
from scripts.bench.decode_variants import Variant


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
    """One decoder layer on ``hidden`` (B, T, hidden) writing into its cache view ``kv``; the new hidden states."""
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
        prompt = torch.randint(0, model.config.vocab_size, (batch, prompt_len), generator=generator)
        self.prompt = prompt.to(self.device)
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


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """``|got - want| / |want|`` (Frobenius norms, float32)."""
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
        runner.prefill()
        if runner.device.type == "cuda":  # warm-up steps (compile, autotune) on a side stream, then capture one
            graph, _ = capture_graph([runner.decode_step], warmup=args.warmup)
            run_step, graphed = graph.replay, True
        else:
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
        times.append(total_ms(run_step, runner.device, args.steps) / 1e3)
    seconds = statistics.median(times)
    return dict(batch=batch, tokens_per_s=batch * args.steps / seconds, ms_per_step=1e3 * seconds / args.steps,
                times_s=times, compile_and_capture_s=setup_s, cuda_graph=graphed, compiled_graphs=graphs,
                first_step_logits_rel_err_vs_eager=check)


