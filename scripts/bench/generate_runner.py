"""The generate benchmark's measurements: the models, ``model.generate`` eager and compiled, and the harness.

Models (:class:`ModelSource`), each built afresh per variant in the variant's dtype on the device,
then the variant applied (:data:`scripts.bench.decode_variants.VARIANTS`: ``compress.convert`` for
``w8a8`` / ``w4a16``, random 50% block masks for ``dds50``), then sibling fusion as ``fuse`` says:
``"compressed"`` (the default) fuses the variant's compressed q/k/v and gate/up layers with
``compress.fuse_siblings(model)``, the inference step the README gives after loading a compressed
model (and ``compress evaluate``'s default), while fp16 stays as ``transformers`` builds it, as a user
without the toolkit runs it; ``"all"`` also fuses the dense layers (fp16 too, as the decode
benchmark); ``"none"`` fuses nothing:

* ``smollm2``: SmolLM2-135M-Instruct, real weights, loaded once through the project's model sources
  (``compress.lightning.tasks.build_model``: the Q4_1 GGUF in ``$SMOLLM2_DIR``, de-quantized) and
  copied per variant;
* ``llama2-7b``: the decode benchmark's random-weight Llama with Llama-2-7B shapes
  (:func:`scripts.bench.decode_variants.build_model`), ``layers`` decoder layers;
* ``mixtral``: a random-weight Mixtral of the MoE benchmark's small model (2 layers of hidden 2048,
  intermediate 7168, 8 experts, top-2, 16 heads / 8 KV heads, vocabulary 32000), its float experts as
  ``transformers`` runs them (``grouped_mm``; the float model in bf16 on a GPU, where torch's grouped_mm
  runs on the device: :meth:`ModelSource.dtype`); the variants convert the experts too
  (``QuantizedExperts`` on the grouped kernels).

With ``tiny`` they are tiny random models (``smollm2`` keeps its grouped-query attention and tied
embeddings; ``mixtral`` 4 experts), for the CPU tests.

Timing of ``model.generate(prompt, max_new_tokens=T, min_new_tokens=T)`` (greedy; ``min_new_tokens``
keeps end-of-sequence from stopping it early, so every call makes exactly T tokens per sequence):
the median wall time of ``repeats`` calls, each synchronised before and after, gives tokens/s =
batch * T / time (the prefill included, as a user sees it).

* eager (:func:`bench_eager`): ``transformers``' default (a dynamic cache), after one warm-up call of
  the timed length (Triton compiles the kernels there, and the launch plans of every input layout
  are recorded); a variant other than fp16 is timed in ``eager_rounds`` rounds against the fp16 model
  kept by its source (:func:`paired_generates`: ``vs_fp16_paired``, the ratio the report uses);
* compiled (:func:`bench_compiled`): :func:`compress.eval.generate.compile_for_generate` with
  ``compiled_loop``: ``"graphed"`` (its default: these greedy calls run our loop, one CUDA graph
  replay per token) or ``"transformers"`` (a static cache, transformers' loop around its compiled,
  CUDA-graphed step); the first call, which compiles, is timed apart (``compile_s``). With
  ``fullgraph`` a failed compile is retried once without it (the figures say which ran);
* harness (:func:`bench_harness`): :func:`scripts.bench.decode_runner.bench_batch` on the same
  model: the project's own static-cache loop, one compiled decoder layer, one CUDA graph per step.
"""
from __future__ import annotations

import copy
import logging
import statistics
import time
from types import SimpleNamespace

import torch
from torch import nn

from compress.eval.generate import compile_for_generate, uncompile_for_generate
from compress.eval.timing import synchronize
from compress.nn.fusion import fuse_siblings
from scripts.bench.decode_runner import bench_batch
from scripts.bench.decode_variants import VARIANTS, Variant, build_model, llama_config

logger = logging.getLogger(__name__)

MODELS = ("smollm2", "llama2-7b", "mixtral")
MIXTRAL = dict(hidden_size=2048, intermediate_size=7168, num_local_experts=8, num_experts_per_tok=2,
               num_attention_heads=16, num_key_value_heads=8, vocab_size=32000, num_hidden_layers=2)
TINY_MIXTRAL = dict(hidden_size=64, intermediate_size=96, num_local_experts=4, num_experts_per_tok=2,
                    num_attention_heads=4, num_key_value_heads=2, vocab_size=256, num_hidden_layers=2)
FUSE_CHOICES = ("compressed", "all", "none")
SMOLLM2_NAME = "SmolLM2-135M-Instruct"
TINY_SMOLLM2 = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                    vocab_size=256, tie_word_embeddings=True, attn_implementation="sdpa")
HARNESS_WARMUP = 3  # decode steps before the harness captures its graph (the timing module's minimum)


class ModelSource:
    """Builds model ``name`` for each variant: the SmolLM2 weights are loaded once and copied."""

    def __init__(self, name: str, args):
        if name not in MODELS:
            raise ValueError(f"model: expected one of {MODELS}, got {name!r}")
        self.name, self.args, self._base, self._reference = name, args, None, None
        if name == "smollm2" and not args.tiny:
            from transformers import AutoModelForCausalLM

            from compress.lightning.tasks import build_model as build_pretrained

            self._base = build_pretrained(AutoModelForCausalLM, SMOLLM2_NAME, None, "float32").eval()

    def dtype(self, variant: str) -> torch.dtype:
        """The variant's dtype, except ``mixtral``'s float model on a GPU: bf16, the one dtype in which torch's
        grouped_mm runs the float experts on the device (in fp16 it reads the expert offsets on the host,
        which no CUDA graph holds, so the fp16 anchor would be an eager one)."""
        dtype = VARIANTS[variant].dtype
        if self.name == "mixtral" and variant == "fp16" and self.args.device != "cpu":
            return torch.bfloat16
        return dtype

    def build(self, variant: str) -> nn.Module:
        """The model in :meth:`dtype` on the device, the variant applied, siblings fused as ``fuse`` says."""
        spec, args, dtype = VARIANTS[variant], self.args, self.dtype(variant)
        if self._base is not None:
            model = copy.deepcopy(self._base).to(device=args.device, dtype=dtype).eval()
        else:
            model = build_model(self.config(), dtype, args.device, args.seed)
        if args.fuse not in FUSE_CHOICES:
            raise ValueError(f"fuse: expected one of {FUSE_CHOICES}, got {args.fuse!r}")
        if args.fuse == "all":
            fuse_siblings(model, dense=True)
        if spec.apply is not None:
            spec.apply(model, args.seed)
        if args.fuse == "compressed":
            fuse_siblings(model)
        return model

    def reference(self) -> nn.Module:
        """The fp16 variant, built once and kept (eager only) for the paired eager timing."""
        if self._reference is None:
            self._reference = self.build("fp16")
        return self._reference

    def config(self):
        """The random model's config (``llama2-7b``, ``mixtral``, or a tiny ``smollm2`` stand-in)."""
        positions = self.args.prompt_len + self.args.new_tokens + HARNESS_WARMUP + 8
        if self.name == "llama2-7b":
            return llama_config(self.args.layers, self.args.tiny, positions)
        if self.name == "mixtral":
            from transformers import MixtralConfig

            config = MixtralConfig(max_position_embeddings=positions, sliding_window=None,
                                   **(TINY_MIXTRAL if self.args.tiny else MIXTRAL))
            config._attn_implementation = "sdpa"
            config._experts_implementation = "grouped_mm"
            return config
        from transformers import LlamaConfig

        return LlamaConfig(num_hidden_layers=2, max_position_embeddings=positions, **TINY_SMOLLM2)


@torch.no_grad()
def generate(model: nn.Module, prompt: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """Greedy ``model.generate`` making exactly ``new_tokens`` tokens per sequence."""
    out = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new_tokens,
                         min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
    if out.shape != (prompt.shape[0], prompt.shape[1] + new_tokens):
        raise RuntimeError(f"generate: expected {new_tokens} new tokens per sequence, got shape {tuple(out.shape)}")
    return out


def timed_generate(model: nn.Module, prompt: torch.Tensor, new_tokens: int) -> tuple[float, torch.Tensor]:
    """``(seconds, output)`` of one :func:`generate` call, synchronised before and after."""
    synchronize(prompt.device)
    start = time.perf_counter()
    out = generate(model, prompt, new_tokens)
    synchronize(prompt.device)
    return time.perf_counter() - start, out


def _figures(times: list[float], batch: int, new_tokens: int) -> dict:
    seconds = statistics.median(times)
    return dict(tokens_per_s=batch * new_tokens / seconds, ms_per_token=1e3 * seconds / new_tokens, times_s=times)


def timed_generates(model: nn.Module, prompt: torch.Tensor, new_tokens: int, repeats: int) -> tuple[dict, torch.Tensor]:
    """``(figures, last output)`` of ``repeats`` timed :func:`generate` calls (see the module docstring)."""
    times, out = [], None
    for _ in range(repeats):
        seconds, out = timed_generate(model, prompt, new_tokens)
        times.append(seconds)
    return _figures(times, prompt.shape[0], new_tokens), out


def paired_generates(model: nn.Module, reference: nn.Module, prompt: torch.Tensor, new_tokens: int,
                     repeats: int) -> tuple[dict, torch.Tensor]:
    """:func:`timed_generates` of ``model`` in rounds, each timing ``reference`` (the fp16 model) first:
    ``vs_fp16_paired`` is the median over rounds of reference time / model time. Eager ``generate`` is
    host-bound, and the host's speed drifts between one variant's calls and the next's (fp16 alone
    gave 105-140 tokens/s in two back-to-back runs on one H100 machine); a round's two calls share it."""
    times, reference_times, out = [], [], None
    for _ in range(repeats):
        reference_times.append(timed_generate(reference, prompt, new_tokens)[0])
        seconds, out = timed_generate(model, prompt, new_tokens)
        times.append(seconds)
    figures = _figures(times, prompt.shape[0], new_tokens)
    figures.update(fp16_times_s=reference_times,
                   vs_fp16_paired=statistics.median(r / t for r, t in zip(reference_times, times)))
    return figures, out


def bench_eager(model: nn.Module, prompt: torch.Tensor, args,
                reference: nn.Module | None = None) -> tuple[dict, torch.Tensor]:
    """The default ``generate`` (dynamic cache, eager), after one warm-up call of the same length (a short
    one left the first timed call of fp16 several times slower than the others: new cache lengths);
    with ``reference`` (the fp16 model, eager) timed in rounds against it (:func:`paired_generates`)."""
    uncompile_for_generate(model)
    began = time.perf_counter()
    generate(model, prompt, args.new_tokens)
    synchronize(prompt.device)
    warmup_s = time.perf_counter() - began
    if reference is None:
        figures, out = timed_generates(model, prompt, args.new_tokens, args.repeats)
    else:
        generate(reference, prompt, args.new_tokens)  # its warm-up for this prompt's shape
        figures, out = paired_generates(model, reference, prompt, args.new_tokens, args.eager_rounds)
    return dict(figures, warmup_s=warmup_s), out


def bench_compiled(model: nn.Module, prompt: torch.Tensor, args, eager_out: torch.Tensor | None) -> dict:
    """``generate`` after :func:`compile_for_generate`; the first (compiling) call timed as ``compile_s``."""
    from scripts.bench.decode import reset_compiler

    fullgraph, error = args.fullgraph, None
    while True:
        reset_compiler()
        compile_for_generate(model, backend=args.compile_backend, mode=args.compile_mode, fullgraph=fullgraph,
                             loop=args.compiled_loop)
        mode = model.generation_config.compile_config.mode
        try:
            began = time.perf_counter()
            generate(model, prompt, args.new_tokens)
            synchronize(prompt.device)
            compile_s = time.perf_counter() - began
            break
        except Exception as err:  # noqa: BLE001 - a graph break under fullgraph: once more without it
            uncompile_for_generate(model)
            if not fullgraph:
                raise
            logger.warning("fullgraph compile failed (%s); retrying with fullgraph=False", str(err).splitlines()[0])
            fullgraph, error = False, f"{type(err).__name__}: {err}"[:1000]
    try:
        figures, out = timed_generates(model, prompt, args.new_tokens, args.repeats)
    finally:
        uncompile_for_generate(model)
        reset_compiler()
    figures.update(compile_s=compile_s, fullgraph=fullgraph, backend=args.compile_backend, mode=mode,
                   loop=args.compiled_loop)
    if error is not None:
        figures["fullgraph_error"] = error
    if eager_out is not None:  # greedy tokens agree unless a near-tie flips under other rounding
        new = slice(prompt.shape[1], None)
        figures["tokens_equal_to_eager"] = float((out[:, new] == eager_out[:, new]).float().mean())
    return figures


def bench_harness(model: nn.Module, variant: str, batch: int, args) -> dict:
    """The decode harness's tokens/s on ``model`` (same batch, prompt length and new tokens)."""
    from scripts.bench.decode import reset_compiler, strict_recompiles

    harness_args = SimpleNamespace(prompt_len=args.prompt_len, steps=args.new_tokens, warmup=HARNESS_WARMUP,
                                   seed=args.seed, repeats=args.repeats, compile_backend=args.compile_backend,
                                   compile_mode=None)
    reset_compiler()
    try:
        with strict_recompiles():
            return bench_batch(model, Variant(VARIANTS[variant].dtype, True, None), batch, harness_args)
    finally:
        reset_compiler()
