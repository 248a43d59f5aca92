"""``model.generate`` at the kernels' speed: a static KV cache and a compiled, CUDA-graphed decode step.

Eager ``generate`` (a dynamic cache, the default) pays Python for every op of every decode step:
each of a step's few hundred small launches costs host time that a batch-1 step of a compressed
model, a few milliseconds of GPU work, cannot hide. ``transformers``' own ``generate`` (5.x) removes
that when its generation config asks for it: with ``cache_implementation="static"`` it preallocates
the KV cache (``StaticCache``, tensors at fixed addresses) and, when ``compile_config`` allows the
device, runs every decode step through ``torch.compile(model.__call__, **compile_config.to_dict())``
(``GenerationMixin._valid_auto_compile_criteria`` / ``get_compiled_call``); the prefill, whose length
varies, stays eager. :func:`compile_for_generate` sets exactly that on ``model.generation_config``:

* ``mode="reduce-overhead"`` (CUDA): inductor's CUDA graph trees replay the whole decode step, so the
  step's host work is one graph launch. The inference modules' kernels are ``torch.library`` custom
  ops with fake implementations, so they trace into the graph like any ATen op;
* ``dynamic=False``: one graph per batch size and cache length (``generate`` keeps the cache length
  at the largest seen so far, so later calls with fewer new tokens reuse the graph);
* ``fullgraph=True``: a graph break would split the step into several graphs; better to fail loudly.

The first ``generate`` call of each batch size compiles (tens of seconds for a 30-layer model); each
call after it records the graph anew once (``generate`` makes a fresh cache per call, at new
addresses) and then replays it. Off CUDA the compiled step runs without graphs (``mode=None``),
which is what the CPU tests use, with ``backend="aot_eager"``.

That path still runs ``transformers``' loop between two replays: logits processors, stopping
criteria and a host sync per token, about 1.3 ms a token on an H100 machine's host, nearly a 135M
model's whole decode step (1.5 ms; docs/journal.md). So with ``loop="graphed"`` (the default) a greedy
call runs our own loop instead (:class:`compress.eval.decode_loop.GreedyDecoder`): one CUDA graph
replay for the prompt (padded to a power-of-two bucket) and one per token, with nothing on the host in
between. ``model.generate`` is replaced on the instance (as ``transformers`` does for a
``custom_generate``) by :func:`graphed_generate`, which takes that loop when the call is plain greedy
decoding (:func:`greedy_request`) of a model the loop reproduces exactly
(:func:`compress.eval.decode_loop.unsupported_reason`, checked on every call, so a later change of
attention implementation or of train/eval mode is seen), and hands every other call to
``transformers``' own ``generate``; a model the loop does not reproduce is logged (info level) once
per reason, with the reason. Decoders are kept per batch size and cache length (the prompt plus the new tokens,
rounded up to :data:`CACHE_STEP`), each compiled (one decoder layer, ``torch.compile``) and captured
on its first call (each prompt bucket's prefill on the bucket's first use); all are dropped when
the model's parameters or buffers are moved or replaced (the graphs read the tensors they were
captured with), or its attention implementation or sliding windows change (the masks the graphs build).
"""
from __future__ import annotations

import copy
import functools
import itertools
import logging

import torch
from torch import nn

from compress.eval.decode_loop import GreedyDecoder, experts_reason, layer_windows, unsupported_reason

logger = logging.getLogger(__name__)

CUDA_BACKEND, CUDA_MODE = "inductor", "reduce-overhead"
LOOPS = ("graphed", "transformers")
CACHE_STEP = 128  # graphed decoders' cache lengths are multiples of this (one graph serves many lengths)
# generation-config fields that plain greedy decoding may set (among those that differ from GenerationConfig()
# and are not off, None or empty): the sampling knobs are ignored when do_sample is off, as transformers does
GREEDY_FIELDS = {"max_new_tokens", "min_new_tokens", "max_length", "do_sample", "num_beams", "pad_token_id",
                 "eos_token_id", "bos_token_id", "use_cache", "cache_implementation", "compile_config",
                 "disable_compile", "temperature", "top_p", "top_k", "transformers_version"}


def compile_for_generate(model: nn.Module, *, backend: str | None = None, mode: str | None = None,
                         fullgraph: bool = True, dynamic: bool = False, loop: str = "graphed") -> nn.Module:
    """Make ``model.generate(...)`` use a static KV cache and a compiled decode step (module docstring),
    where that step can be one graph (:func:`compiled_step_refusal`; elsewhere ``generate`` stays eager
    and the reason is logged).

    ``backend`` / ``mode``: ``torch.compile``'s; by default ``"inductor"`` everywhere, and
    ``"reduce-overhead"`` (CUDA graphs) on a CUDA model, the default mode elsewhere. ``loop``:
    ``"graphed"`` also routes greedy calls through our CUDA-graph loop where it reproduces the model
    (other calls and models keep ``transformers``' path; the reason logged); ``"transformers"`` only
    sets the generation config.
    Returns ``model`` (changed in place: its ``generation_config`` and, graphed, its ``generate``).
    Undo with :func:`uncompile_for_generate`.
    """
    from transformers import CompileConfig

    if not hasattr(model, "generation_config"):
        raise TypeError(f"model: expected a transformers model with a generation_config (a GenerationMixin), "
                        f"got {type(model).__name__}")
    if loop not in LOOPS:
        raise ValueError(f"loop: expected one of {LOOPS}, got {loop!r}")
    model.__dict__.pop("generate", None)
    if loop == "graphed":
        options = dict(backend=backend or CUDA_BACKEND, fullgraph=fullgraph)
        model.generate = functools.partial(graphed_generate, model, type(model).generate.__get__(model), options)
        model._graphed_decoders = {}
        model._graphed_refusal = None
        loop_refusal(model)
    refusal = compiled_step_refusal(model)
    if refusal is not None:
        logger.info("compile_for_generate: %s keeps transformers' eager decode step: %s", type(model).__name__,
                    refusal)
        return model
    on_cuda = next(model.parameters()).device.type == "cuda"
    config = CompileConfig(fullgraph=fullgraph, dynamic=dynamic, backend=backend or CUDA_BACKEND,
                           mode=mode if mode is not None else (CUDA_MODE if on_cuda else None))
    config._compile_all_devices = True  # transformers compiles on CUDA only unless told (the CPU tests)
    model.generation_config.cache_implementation = "static"
    model.generation_config.compile_config = config
    model.generation_config.disable_compile = False
    return model


def compiled_step_refusal(model: nn.Module) -> str | None:
    """Why ``transformers``' compiled decode step (static cache, ``fullgraph``) cannot be one graph for
    ``model``, None when it can; :func:`compile_for_generate` then leaves ``generate``'s cache and step as
    they were (eager), so calls the graphed loop does not take still run. It can be one graph where
    ``transformers`` says the model compiles whole (``_can_compile_fullgraph``), every layer of its static
    cache is a full-attention one (a sliding-window cache layer keeps its length in a Python int that
    dynamo guards on: one recompilation per token, then failure), no rotary embedding recomputes its
    frequencies from the positions (dynamic and longrope scaling: a data-dependent branch), and every experts
    block runs on the device (:func:`compress.eval.decode_loop.experts_reason`: an expert loop branches on
    which experts got tokens)."""
    if not getattr(model, "_can_compile_fullgraph", False):
        return f"transformers does not mark {type(model).__name__} as compilable in one graph"
    config = model.config.get_text_config(decoder=True)
    kinds = getattr(config, "layer_types", None) or [
        "sliding_attention" if getattr(config, "sliding_window", None) is not None
        else "chunked_attention" if getattr(config, "attention_chunk_size", None) is not None else "full_attention"]
    if set(kinds) != {"full_attention"}:
        return (f"its static cache would hold {sorted(set(kinds) - {'full_attention'})} layers, whose compiled step "
                f"recompiles at every token")
    for name, module in model.named_modules():
        rope_types = getattr(module, "rope_type", None)
        rope_types = list(rope_types.values()) if isinstance(rope_types, dict) else [rope_types]
        if any(isinstance(kind, str) and ("dynamic" in kind or kind == "longrope") for kind in rope_types):
            return f"{name}'s rotary embedding ({', '.join(map(str, rope_types))}) branches on the positions"
    return experts_reason(model)


def uncompile_for_generate(model: nn.Module) -> nn.Module:
    """Back to ``transformers``' defaults: a dynamic cache and an eager decode step (the compiled call dropped)."""
    model.generation_config.cache_implementation = None
    model.generation_config.compile_config = None
    for name in ("_compiled_call", "_last_compile_config", "generate", "_graphed_decoders", "_graphed_refusal"):
        model.__dict__.pop(name, None)
    return model


def loop_refusal(model: nn.Module) -> str | None:
    """Why the graphed loop does not reproduce ``model`` now (:func:`unsupported_reason`), None when it does;
    each new reason is logged at info level once (repeated calls for the same reason stay quiet)."""
    reason = unsupported_reason(model)
    if reason is not None and reason != model.__dict__.get("_graphed_refusal"):
        logger.info("generate: %s keeps transformers' generate, the graphed loop would not give its tokens: %s",
                    type(model).__name__, reason)
    model.__dict__["_graphed_refusal"] = reason
    return reason


def greedy_request(model: nn.Module, inputs, kwargs: dict) -> dict | None:
    """The plain greedy call ``generate(inputs, **kwargs)`` asks for, as ``dict(prompt, new_tokens,
    min_new_tokens, eos, pad)``; None when the call asks for anything else (sampling, beams, a logits
    processor, a padded batch, other inputs ...), which then goes to ``transformers``."""
    settings = dict(kwargs)
    prompt = inputs if inputs is not None else settings.pop("input_ids", None)
    mask = settings.pop("attention_mask", None)
    if not isinstance(prompt, torch.Tensor) or prompt.dim() != 2 or prompt.dtype != torch.long or not prompt.shape[1]:
        return None
    if mask is not None and not bool((mask == 1).all()):
        return None
    config = copy.deepcopy(model.generation_config)
    if config.update(**settings):  # arguments that are not generation settings (model inputs, processors, ...)
        return None
    asked = {key for key, value in config.to_diff_dict().items() if value and not key.startswith("_")}
    if config.do_sample or (config.num_beams or 1) != 1 or not asked <= GREEDY_FIELDS:
        return None
    new_tokens = config.max_new_tokens
    if new_tokens is None:
        new_tokens = (config.max_length or 0) - prompt.shape[1]
    if new_tokens < 1:
        return None
    eos = config.eos_token_id
    eos = [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))
    pad = config.pad_token_id if config.pad_token_id is not None else (eos[0] if eos else None)
    return dict(prompt=prompt, new_tokens=new_tokens, min_new_tokens=config.min_new_tokens or 0, eos=eos, pad=pad)


def finish_sequences(prompt: torch.Tensor, tokens: torch.Tensor, eos: list, pad: int | None) -> torch.Tensor:
    """``transformers``' greedy output from our ``tokens`` (B, N): after a sequence's first end-of-sequence
    token, ``pad``; the length cut where every sequence has ended (if all have)."""
    if eos:
        ended = torch.isin(tokens, torch.as_tensor(eos, device=tokens.device))
        after = ended.cumsum(dim=1) - ended.long() > 0  # positions after the first end of sequence
        tokens = tokens.masked_fill(after, pad)
        if bool(ended.any(dim=1).all()):
            tokens = tokens[:, : int(ended.long().argmax(dim=1).max()) + 1]
    return torch.cat([prompt, tokens], dim=1)


@torch.no_grad()
def graphed_generate(model: nn.Module, fallback, options: dict, inputs=None, **kwargs):
    """``model.generate`` after :func:`compile_for_generate` (``loop="graphed"``): a plain greedy call
    (:func:`greedy_request`: token ids alone or with an all-ones mask; only the settings of
    :data:`GREEDY_FIELDS`, no sampling, one beam) runs :class:`GreedyDecoder` and returns what
    ``transformers`` returns for it, (B, T + new tokens) ids with the same end-of-sequence handling;
    any other call, and every call while the loop does not reproduce the model (:func:`loop_refusal`), goes
    to ``fallback`` (``transformers``' own ``generate``) unchanged."""
    request = greedy_request(model, inputs, kwargs)
    if request is None or loop_refusal(model) is not None:
        return fallback(inputs, **kwargs)
    prompt = request["prompt"]
    batch, length = prompt.shape
    max_len = -(-(length + request["new_tokens"]) // CACHE_STEP) * CACHE_STEP
    tensors = tuple(t.data_ptr() for t in itertools.chain(model.parameters(), model.buffers()))
    state = (tensors, model.config._attn_implementation, layer_windows(model))
    if model._graphed_decoders.get("state") != state:  # weights moved or replaced, masks changed: graphs are stale
        model._graphed_decoders = {"state": state}
    decoder = model._graphed_decoders.get((batch, max_len))
    if decoder is None:
        decoder = GreedyDecoder(model, batch, max_len)
        if decoder.device.type == "cuda":
            decoder.compile_layers(options["backend"], fullgraph=options["fullgraph"])
            decoder.capture()
        model._graphed_decoders[(batch, max_len)] = decoder
    tokens = decoder.generate(prompt, request["new_tokens"], request["min_new_tokens"], request["eos"])
    return finish_sequences(prompt, tokens, request["eos"], request["pad"])
