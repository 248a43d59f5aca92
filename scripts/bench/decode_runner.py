"""The decode benchmark's harness: greedy decoding with a static KV cache, compiled, captured and timed.

The decode loop is the one ``compress.eval.generate`` runs behind ``model.generate``
(:class:`compress.eval.decode_loop.GreedyDecoder`: our own loop over the model's parts with its own
static KV cache, static buffers, one compiled decoder layer shared by all layers, and one CUDA graph
per step). Here it decodes a seeded random prompt.

Timing (:func:`bench_batch`): ``repeats`` runs, each after a fresh prefill, of
``steps`` back-to-back steps (:func:`compress.eval.timing.total_ms`: CUDA events around the
replays on a GPU, the host clock on the CPU); the median run gives tokens/s = batch * steps / time.
A harness check compares the first decode step's logits from the compiled (and captured) step
against the eager step of the same model. On the CPU the layers compile with the ``aot_eager``
backend and without ``fullgraph`` (the BSR reference builds a sparse tensor, which dynamo cannot
trace), and nothing is captured; the layers then share one layer index for the whole run (one
compiled graph), restored at the end.
"""
from __future__ import annotations

import contextlib
import statistics
import time

import torch
from torch import nn

from compress.eval.decode_loop import GreedyDecoder, run_layer
from compress.eval.timing import total_ms
from scripts.bench.decode_variants import Variant


def random_prompt(model: nn.Module, batch: int, length: int, seed: int) -> torch.Tensor:
    """Seeded random token ids (batch, length) on the model's device."""
    generator = torch.Generator().manual_seed(seed)
    prompt = torch.randint(0, model.config.vocab_size, (batch, length), generator=generator)
    return prompt.to(model.lm_head.weight.device)


@torch.no_grad()
def eager_reference_logits(decoder: GreedyDecoder, prompt: torch.Tensor) -> torch.Tensor:
    """Logits of the first decode step with the plain (uncompiled) layers."""
    compiled, decoder.layer_fn = decoder.layer_fn, run_layer
    try:
        decoder.prefill(prompt)
        decoder.decode_step()
        return decoder.logits.float().clone()
    finally:
        decoder.layer_fn = compiled


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """``|got - want| / |want|`` (Frobenius norms, float32)."""
    return float((got.float() - want.float()).norm() / want.float().norm().clamp_min(1e-12))


def compiled_graph_count() -> int:
    """Graphs dynamo compiled since the last ``torch._dynamo.reset()`` (1 when the layers share one)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def bench_batch(model: nn.Module, variant: Variant, batch: int, args) -> dict:
    """Compile / capture (if the variant asks) and time one batch size; returns its figures."""
    decoder = GreedyDecoder(model, batch, args.prompt_len + args.steps + args.warmup + 3)
    prompt = random_prompt(model, batch, args.prompt_len, args.seed)
    reference = eager_reference_logits(decoder, prompt)
    on_cuda = decoder.device.type == "cuda"
    with contextlib.ExitStack() as stack:
        began = time.perf_counter()
        if variant.compiled:
            # fullgraph on CUDA, where the modules call the custom ops; on the CPU they run the
            # pure-PyTorch references, and the BSR one builds a sparse tensor, which dynamo cannot trace
            decoder.compile_layers(args.compile_backend, args.compile_mode, fullgraph=on_cuda)
            if on_cuda:  # warm-up steps (compile, autotune) on a side stream, then one step captured
                decoder.capture(warmup=args.warmup)
            else:
                stack.enter_context(decoder.shared_layer_index())
                decoder.prefill(prompt)
                for _ in range(args.warmup):
                    decoder.decode_step()
        setup_s = time.perf_counter() - began
        graphs = compiled_graph_count()
        decoder.prefill(prompt)
        decoder.step()
        check = relative_error(decoder.logits, reference)
        times = []
        for _ in range(args.repeats):
            decoder.prefill(prompt)
            times.append(total_ms(decoder.step, decoder.device, args.steps) / 1e3)
    seconds = statistics.median(times)
    return dict(batch=batch, tokens_per_s=batch * args.steps / seconds, ms_per_step=1e3 * seconds / args.steps,
                times_s=times, compile_and_capture_s=setup_s, cuda_graph=decoder.graph is not None,
                compiled_graphs=graphs, first_step_logits_rel_err_vs_eager=check)
