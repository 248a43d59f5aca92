"""Greedy decoding with a static KV cache and static buffers: one CUDA graph replay per token.

:class:`GreedyDecoder` decodes one batch size into a static KV cache of ``max_len`` positions
(:class:`LayerKV`, one per layer: keys and values written at the positions the decoder names),
running the model's parts itself: embedding, rotary embedding, the decoder layers, the final norm,
``lm_head`` and the argmax. It serves only what it reproduces exactly, so that its greedy tokens are
``transformers``' (:func:`unsupported_reason`, an allow-list): the ``transformers`` Llama, Mistral,
Qwen2, Qwen3, Mixtral and Qwen3-MoE causal LMs (:data:`ARCHITECTURES`, exact classes, whose model
forward is embedding, rotary embedding, layers, norm and ``lm_head``) with sdpa or eager attention, a
rotary embedding whose frequencies do not change with the sequence length, causal attention, in eval
mode. A mixture-of-experts layer must route and run its experts on the device, without a host
synchronisation (a CUDA graph cannot hold one): ``transformers``' float experts under the
``batched_mm`` implementation, or ``grouped_mm`` where torch runs it on the device (on a GPU: bf16
weights on SM90 / SM100; elsewhere torch loops over the experts with their offsets read on the host),
or ``QuantizedExperts`` on its grouped kernels (:func:`experts_reason`); the eager expert loops are
refused. Anything else
(Gemma 3's per-layer rotary embeddings and logit softcapping, flash attention, dynamic rotary
scaling, a subclass, a new architecture) is refused with the reason, and
``compress.eval.generate`` hands it to ``transformers``' ``generate``.

* Each decoder layer gets its own :class:`LayerKV` (which ignores the layer index the attention
  passes), so during compilation every attention can be given ``layer_idx = 0``
  (:meth:`GreedyDecoder.shared_layer_index`) and all layers trace to one graph: ``torch.compile``
  compiles one layer, not one per layer. The indices are restored right after.
* The attention mask comes from the position buffer (key position <= query position, and within
  the layer's sliding window where it has one: :func:`layer_windows`; shape (B, 1, T, max_len)),
  never from ``transformers``' mask code, whose host-side checks a CUDA graph cannot hold. It has the
  form ``transformers`` gives each attention implementation: a bool for sdpa, an additive float for
  eager (:meth:`GreedyDecoder.masks`).
* State between tokens lives in device buffers: ``token`` (B, 1) (the last token), ``position`` (1,)
  (where it goes), ``start`` (1,) (the prompt length), ``min_new`` (1,) and ``eos`` (vocab,) bool
  (end-of-sequence logits are set to -inf while fewer than ``min_new`` tokens are out, as
  ``transformers``' ``MinNewTokensLengthLogitsProcessor`` does) and ``generated`` (B, max_len): new
  token ``i`` is written to column ``i`` by ``index_copy_`` with ``i = position - start + 1``. A
  step reads and writes nothing else, so :meth:`GreedyDecoder.capture` records it once in a CUDA graph
  and every later token is one ``graph.replay()``, with no host work in between.

The prompt (T tokens) runs right-padded to a bucket of P positions (:func:`prefill_length`: the
power of two >= T, at least :data:`MIN_PREFILL`, at most ``max_len``) from the static buffer
``prompt`` (B, max_len), so once captured each bucket is one graph replay too
(:meth:`GreedyDecoder.prefill`; eager layers, one graph per bucket, no compilation). The padding is
harmless: it writes keys and values at positions T..P-1, which no query sees before the decode step
at that position overwrites them (a query at position p sees keys at positions <= p), and new token
0 comes from the hidden state at position ``start - 1`` (an index held on the device). An earlier
call's keys past the prompt stay hidden the same way, so nothing is reset between calls.
``compress.eval.generate`` puts all this behind ``model.generate``.
"""
from __future__ import annotations

import contextlib
import functools
import inspect
from typing import Callable

import torch
from torch import nn

from compress.eval.timing import GRAPH_WARMUP_MIN, capture_graph

PARTS = ("embed_tokens", "rotary_emb", "layers", "norm")
CACHE_KEYWORDS = ("cache", "past_key_values", "past_key_value")  # cache_keyword's, newest transformers first
# architectures the loop reproduces, by class-name prefix: (transformers' model family, how its model reads
# each layer's sliding window: "full" none, "every_layer" config.sliding_window on every layer when set,
# "layer_types" config.sliding_window on the layers config.layer_types names "sliding_attention")
ARCHITECTURES = {"Llama": ("llama", "full"), "Mistral": ("mistral", "every_layer"),
                 "Qwen2": ("qwen2", "layer_types"), "Qwen3": ("qwen3", "layer_types"),
                 "Mixtral": ("mixtral", "every_layer"), "Qwen3Moe": ("qwen3_moe", "every_layer")}
DEVICE_EXPERTS = ("grouped_mm", "batched_mm")  # transformers' float experts implementations with no host sync
ATTENTION_IMPLEMENTATIONS = ("sdpa", "eager")  # each gets the mask transformers builds for it (a bool, a float)
ROPE_TYPES = ("default", "linear", "llama3", "yarn")  # frequencies fixed at construction (not dynamic, longrope)
MIN_PREFILL = 16  # the smallest prompt bucket (prefill_length)


def prefill_length(length: int, max_len: int) -> int:
    """Positions a prompt of ``length`` tokens runs at: the power of two >= ``length`` (at least
    :data:`MIN_PREFILL`), capped at ``max_len``; few buckets, so few prefill graphs."""
    return min(max(MIN_PREFILL, 1 << (length - 1).bit_length()), max_len)


def _is_transformers_class(module, family: str, name: str) -> bool:
    """True when ``module`` is exactly ``transformers``' class ``name`` of model family ``family`` (no subclass:
    a subclass may change the forward the loop reproduces)."""
    kind = type(module)
    return kind.__name__ == name and kind.__module__ == f"transformers.models.{family}.modeling_{family}"


def _architecture_reason(model: nn.Module) -> str | None:
    """Why ``model``'s classes are not those of an architecture in :data:`ARCHITECTURES`; None when they are."""
    name = type(model).__name__
    family, _ = ARCHITECTURES.get(name.removesuffix("ForCausalLM"), (None, None))
    if family is None or not _is_transformers_class(model, family, name):
        return (f"{type(model).__module__}.{name} is not one of the architectures the loop models "
                f"({', '.join(prefix + 'ForCausalLM' for prefix in ARCHITECTURES)} of transformers)")
    prefix = name.removesuffix("ForCausalLM")
    inner = getattr(model, "model", None)
    if not _is_transformers_class(inner, family, prefix + "Model"):
        return f"model.model is a {type(inner).__name__}, not the {prefix}Model the loop runs"
    if not all(hasattr(inner, part) for part in PARTS) or not hasattr(model, "lm_head"):
        return f"{name} lacks one of model.model.{{{', '.join(PARTS)}}} or lm_head"
    if len(inner.layers) != model.config.num_hidden_layers:
        return f"{len(inner.layers)} decoder layers but config.num_hidden_layers {model.config.num_hidden_layers}"
    for index, layer in enumerate(inner.layers):
        attention = getattr(layer, "self_attn", None)
        if not (_is_transformers_class(layer, family, prefix + "DecoderLayer")
                and _is_transformers_class(attention, family, prefix + "Attention")):
            return (f"decoder layer {index} is a {type(layer).__name__} with a {type(attention).__name__}, not a "
                    f"{prefix}DecoderLayer with a {prefix}Attention")
    if inner.layers and cache_keyword(inner.layers[0]) is None:
        return f"{prefix}DecoderLayer.forward takes its cache by none of {', '.join(CACHE_KEYWORDS)}"
    return None


def experts_reason(model: nn.Module) -> str | None:
    """Why an experts block of ``model`` would synchronise with the host (which a CUDA graph cannot hold);
    None when every one runs on the device: ``QuantizedExperts`` on its grouped path, ``transformers``' float
    experts under an implementation of :data:`DEVICE_EXPERTS`."""
    from compress.nn.experts import QuantizedExperts

    implementation = getattr(model.config, "_experts_implementation", None)
    for name, module in model.named_modules():
        if isinstance(module, QuantizedExperts):
            if module.grouped_scheme is None:
                return (f"{name} runs QuantizedExperts' expert loop, which synchronises with the host (the grouped "
                        f"kernels take experts all W4A16, dynamic W8A8 or W8A16, without bias, under SiLU; "
                        f"block-sparse experts and set_grouped(False) keep the loop)")
        elif type(module).__name__.endswith("Experts") and type(module).__module__.startswith("transformers."):
            if implementation not in DEVICE_EXPERTS:
                return (f"{name} runs transformers' experts as {implementation!r}, which synchronises with the "
                        f"host (the loop models {', '.join(DEVICE_EXPERTS)})")
            if implementation == "grouped_mm" and not _grouped_mm_on_device(module):
                weight = next(module.parameters())
                return (f"{name} runs transformers' grouped_mm experts in {weight.dtype} on "
                        f"{torch.cuda.get_device_name(weight.device)}, where torch's grouped_mm loops over the "
                        f"experts with their offsets read on the host (it runs on the device only in bf16 on "
                        f"SM90 / SM100): use bf16 weights or set_experts_implementation('batched_mm')")
    return None


def _grouped_mm_on_device(experts: nn.Module) -> bool:
    """Whether torch's grouped_mm runs ``experts`` without reading the group offsets on the host: always off a
    GPU (no host synchronisation to avoid), on a GPU only its bf16 CUTLASS kernels (SM90 and SM100); every
    other case takes torch's fallback, which copies the offsets to the host and loops over the groups."""
    weight = next(experts.parameters())
    if weight.device.type != "cuda":
        return True
    return weight.dtype == torch.bfloat16 and torch.cuda.get_device_capability(weight.device)[0] in (9, 10)


def _config_reason(model: nn.Module) -> str | None:
    """Why ``model``'s settings are not ones the loop models (attention implementation, rotary type, causal
    attention, sliding windows, inference mode); None when they are."""
    config = model.config
    attention = getattr(config, "_attn_implementation", None)
    if attention not in ATTENTION_IMPLEMENTATIONS:
        return f"attention implementation {attention!r} (the loop models {', '.join(ATTENTION_IMPLEMENTATIONS)})"
    rope_type = getattr(model.model.rotary_emb, "rope_type", None)
    if rope_type not in ROPE_TYPES:
        return f"rotary embedding type {rope_type!r} (the loop models {', '.join(ROPE_TYPES)})"
    if getattr(config, "is_causal", True) is not True:
        return "config.is_causal is not True (the loop models causal attention only)"
    if model.training:
        return "the model is in training mode (the loop models inference: call model.eval())"
    try:
        layer_windows(model)
    except ValueError as error:
        return str(error)
    return None


def unsupported_reason(model: nn.Module) -> str | None:
    """Why :class:`GreedyDecoder` cannot give ``transformers``' greedy tokens for ``model``; None when it can.

    An allow-list: the exact ``transformers`` classes of :data:`ARCHITECTURES` (the model, its inner model,
    decoder layers and attentions, whose forwards the loop reproduces), an attention implementation of
    :data:`ATTENTION_IMPLEMENTATIONS`, a rotary embedding of :data:`ROPE_TYPES` (frequencies fixed at
    construction), causal attention, eval mode and sliding windows as :func:`layer_windows` reads them.
    Anything else (another model, a new setting) steps aside to ``transformers``' ``generate``."""
    if not isinstance(model, nn.Module) or not hasattr(model, "config"):
        return f"{type(model).__name__} is not a transformers model (no config)"
    return _architecture_reason(model) or _config_reason(model) or experts_reason(model)


def supports(model: nn.Module) -> bool:
    """True when :class:`GreedyDecoder` gives ``transformers``' greedy tokens for ``model``
    (:func:`unsupported_reason` says why not)."""
    return unsupported_reason(model) is None


def layer_windows(model: nn.Module) -> tuple[int | None, ...]:
    """Each decoder layer's sliding window (a query at position p sees keys at positions in (p - window, p]),
    None for full causal attention, read as the architecture's model does (:data:`ARCHITECTURES`);
    ValueError for a window setting it does not read that way."""
    config, layers = model.config, len(model.model.layers)
    _, rule = ARCHITECTURES[type(model).__name__.removesuffix("ForCausalLM")]
    window = getattr(config, "sliding_window", None)
    if rule == "full":
        return (None,) * layers
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        raise ValueError(f"config.sliding_window: expected None or a positive int, got {window!r}")
    if rule == "every_layer":
        return (window,) * layers
    types = list(getattr(config, "layer_types", None) or [])
    if len(types) != layers or not set(types) <= {"full_attention", "sliding_attention"}:
        raise ValueError(f"config.layer_types: expected {layers} of 'full_attention' / 'sliding_attention', "
                         f"got {types}")
    if "sliding_attention" in types and window is None:
        raise ValueError("config.layer_types has sliding_attention layers but config.sliding_window is None")
    return tuple(window if kind == "sliding_attention" else None for kind in types)


class LayerKV:
    """One decoder layer's keys and values, (B, KV heads, ``max_len``, head dim) each, zeros at first:
    what the layer's attention calls ``update`` on (with any layer index). The new keys and values go
    to the sequence positions ``positions`` (a device tensor the decoder sets before each forward)."""

    def __init__(self, max_len: int):
        self.max_len = max_len
        self.keys = self.values = self.positions = None

    def update(self, key_states, value_states, *args, **kwargs):
        if self.keys is None:  # shapes and dtype from the first call (an eager prefill)
            self.keys = key_states.new_zeros(*key_states.shape[:2], self.max_len, key_states.shape[3])
            self.values = value_states.new_zeros(*value_states.shape[:2], self.max_len, value_states.shape[3])
        self.keys.index_copy_(2, self.positions, key_states)
        self.values.index_copy_(2, self.positions, value_states)
        return self.keys, self.values


def cache_keyword(layer: nn.Module) -> str | None:
    """The keyword ``layer``'s forward takes its cache by (``cache`` in ``transformers`` 5.x, formerly
    ``past_key_values``, before that ``past_key_value``); None if none. A cache passed by a keyword the
    layer no longer names would vanish into its ``**kwargs`` and the attention would run without it."""
    try:
        parameters = inspect.signature(type(layer).forward).parameters
    except (TypeError, ValueError):
        return None
    return next((name for name in CACHE_KEYWORDS if name in parameters), None)


def run_layer(layer, hidden, mask, position_ids, kv, position_embeddings, cache_keyword: str = CACHE_KEYWORDS[0]):
    """One decoder layer on ``hidden`` (B, T, hidden) writing into its cache view ``kv`` (passed as
    ``cache_keyword``); the new hidden states."""
    out = layer(hidden, attention_mask=mask, position_ids=position_ids, use_cache=True,
                position_embeddings=position_embeddings, **{cache_keyword: kv})
    return out[0] if isinstance(out, tuple) else out


class GreedyDecoder:
    """Greedy decoding of ``model`` at one batch size into a static cache of ``max_len`` positions."""

    def __init__(self, model: nn.Module, batch: int, max_len: int):
        reason = unsupported_reason(model)
        if reason is not None:
            raise TypeError(f"GreedyDecoder: cannot give transformers' greedy tokens for {type(model).__name__}: "
                            f"{reason}")
        if batch < 1 or max_len < 2:
            raise ValueError(f"GreedyDecoder: expected batch >= 1 and max_len >= 2, got {batch} and {max_len}")
        self.model, self.batch, self.max_len = model, batch, max_len
        self.device = model.lm_head.weight.device
        self.kv = [LayerKV(max_len) for _ in model.model.layers]
        self.windows = layer_windows(model)
        self.additive_mask = model.config._attn_implementation == "eager"  # transformers' eager adds its mask
        self.cache_keyword = cache_keyword(model.model.layers[0])
        vocab, long = model.config.vocab_size, dict(dtype=torch.long, device=self.device)
        self.key_positions = torch.arange(max_len, device=self.device)
        self.token = torch.zeros(batch, 1, **long)
        self.position, self.start, self.min_new = (torch.zeros(1, **long) for _ in range(3))
        self.eos = torch.zeros(vocab, dtype=torch.bool, device=self.device)
        self.generated = torch.zeros(batch, max_len, **long)
        self.prompt = torch.zeros(batch, max_len, **long)
        self.logits = torch.zeros(batch, vocab, dtype=model.lm_head.weight.dtype, device=self.device)
        self.layer_fn: Callable = run_layer
        self.graph = None
        self.prefill_graphs: dict[int, torch.cuda.CUDAGraph] = {}  # bucket length -> captured prefill

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, layer_fn: Callable = run_layer,
                last: torch.Tensor | None = None) -> torch.Tensor:
        """Logits (B, vocab) at sequence index ``last`` ((1,) on the device; the last token if None);
        writes the tokens' keys/values into the cache."""
        batch, length = tokens.shape
        inner = self.model.model
        hidden = inner.embed_tokens(tokens)
        position_ids = positions[None, :].expand(batch, length)
        position_embeddings = inner.rotary_emb(hidden, position_ids)
        masks = self.masks(positions, batch, hidden.dtype)
        for layer, kv, mask in zip(inner.layers, self.kv, masks):
            kv.positions = positions
            hidden = layer_fn(layer, hidden, mask, position_ids, kv, position_embeddings, self.cache_keyword)
        hidden = hidden[:, -1:] if last is None else hidden.index_select(1, last)
        return self.model.lm_head(inner.norm(hidden))[:, -1]

    def masks(self, positions: torch.Tensor, batch: int, dtype: torch.dtype) -> list[torch.Tensor]:
        """Each layer's attention mask (B, 1, T, ``max_len``) for queries at ``positions`` (T,), as
        ``transformers`` builds it for the attention implementation: a query at position p sees the keys at
        positions <= p (and > p - window for a layer with a sliding window); sdpa takes it as a bool (True:
        seen), eager adds it (0 seen, the dtype's minimum not)."""
        keys, queries = self.key_positions[None, :], positions[:, None]
        by_window = {}
        for window in dict.fromkeys(self.windows):
            visible = keys <= queries
            if window is not None:
                visible = visible & (keys > queries - window)
            if self.additive_mask:
                visible = torch.where(visible, torch.zeros((), dtype=dtype, device=self.device),
                                      torch.finfo(dtype).min)
            by_window[window] = visible[None, None].expand(batch, 1, len(positions), self.max_len)
        return [by_window[window] for window in self.windows]

    def _choose(self, logits: torch.Tensor, index: torch.Tensor) -> None:
        """New token ``index`` from ``logits``: end-of-sequence barred below ``min_new``, the argmax kept."""
        barred = self.eos[None, :] & (index < self.min_new)
        logits = logits.masked_fill(barred, float("-inf"))
        self.logits.copy_(logits)
        self.token.copy_(logits.argmax(dim=-1, keepdim=True))
        self.generated.index_copy_(1, index, self.token)

    @torch.no_grad()
    def prefill(self, prompt: torch.Tensor, min_new_tokens: int = 0, eos_token_ids=()) -> None:
        """Run ``prompt`` (B, T) right-padded to its bucket (module docstring): new token 0, position T.
        Once :meth:`capture` has run, each bucket's prefill is captured on its first use and replayed."""
        batch, length = prompt.shape
        if batch != self.batch or not 0 < length < self.max_len:
            raise ValueError(f"prompt: expected shape ({self.batch}, 1..{self.max_len - 1}), got {tuple(prompt.shape)}")
        self.eos.zero_()
        if len(eos_token_ids):
            self.eos[torch.as_tensor(list(eos_token_ids), device=self.device)] = True
        self.min_new.fill_(min_new_tokens)
        self.start.fill_(length)
        self.position.fill_(length)
        self.prompt[:, :length].copy_(prompt)
        bucket = prefill_length(length, self.max_len)
        if self.graph is None:
            self.prefill_step(bucket)
            self._check_cache_written()
            return
        if bucket not in self.prefill_graphs:
            self.prefill_graphs[bucket], _ = capture_graph([functools.partial(self.prefill_step, bucket)])
        self.prefill_graphs[bucket].replay()

    def _check_cache_written(self) -> None:
        """RuntimeError unless every layer wrote its keys and values through its :class:`LayerKV` (an attention
        that ignored the cache would make every later token wrong, not fail)."""
        unwritten = [index for index, kv in enumerate(self.kv) if kv.keys is None]
        if unwritten:
            raise RuntimeError(f"GreedyDecoder: decoder layers {unwritten} never called the cache's update (passed "
                               f"as {self.cache_keyword!r}); their attention ran without the cache")

    def prefill_step(self, bucket: int) -> None:
        """The prompt's ``bucket`` positions through eager layers; new token 0 from position ``start - 1``."""
        logits = self.forward(self.prompt[:, :bucket], self.key_positions[:bucket], last=self.start - 1)
        self._choose(logits, self.min_new.new_zeros(1))

    @torch.no_grad()
    def decode_step(self) -> None:
        """The next token of every sequence; all state in static buffers (graph-replayable)."""
        logits = self.forward(self.token, self.position, self.layer_fn)
        self._choose(logits, self.position - self.start + 1)
        self.position.add_(1)

    @contextlib.contextmanager
    def shared_layer_index(self):
        """Every attention's ``layer_idx`` at 0 inside (one compiled graph for all layers), restored after."""
        attentions = [layer.self_attn for layer in self.model.model.layers]
        indices = [attention.layer_idx for attention in attentions]
        for attention in attentions:
            attention.layer_idx = 0
        try:
            yield
        finally:
            for attention, index in zip(attentions, indices):
                attention.layer_idx = index

    def compile_layers(self, backend: str, mode: str | None = None, fullgraph: bool = True) -> None:
        """Run the decode step's layers through one ``torch.compile``d :func:`run_layer`."""
        self.layer_fn = torch.compile(run_layer, backend=backend, mode=mode, fullgraph=fullgraph, dynamic=False)

    def capture(self, warmup: int = 3) -> None:
        """CUDA: record one decode step in a CUDA graph (warm-up steps first, from a one-token prefill);
        :meth:`step` replays it from then on. Every layer runs under one shared layer index meanwhile."""
        if self.device.type != "cuda":
            raise RuntimeError(f"capture: CUDA graphs need a CUDA model, this one is on {self.device}")
        warmup = max(warmup, GRAPH_WARMUP_MIN)  # capture_graph's floor: these steps write the cache too
        if self.max_len < warmup + 3:
            raise ValueError(f"capture: {warmup} warm-up steps after a one-token prompt need max_len >= {warmup + 3}, "
                             f"got {self.max_len}")
        with self.shared_layer_index():
            self.prefill(torch.zeros(self.batch, 1, dtype=torch.long, device=self.device))
            self.graph, _ = capture_graph([self.decode_step], warmup=warmup)

    def step(self) -> None:
        """One decode step: the graph's replay once captured, else :meth:`decode_step`."""
        if self.graph is not None:
            self.graph.replay()
        else:
            self.decode_step()

    def generate(self, prompt: torch.Tensor, new_tokens: int, min_new_tokens: int = 0,
                 eos_token_ids=()) -> torch.Tensor:
        """(B, new_tokens) greedy tokens after ``prompt`` (B, T); T + new_tokens must fit ``max_len``."""
        if not 0 < new_tokens <= self.max_len - prompt.shape[1]:
            raise ValueError(f"new_tokens: expected 1..{self.max_len - prompt.shape[1]} (max_len {self.max_len} "
                             f"minus the prompt's {prompt.shape[1]}), got {new_tokens}")
        self.prefill(prompt, min_new_tokens, eos_token_ids)
        for _ in range(new_tokens - 1):
            self.step()
        return self.generated[:, :new_tokens].clone()
