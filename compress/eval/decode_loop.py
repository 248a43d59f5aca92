"""Greedy decoding with a static KV cache and static buffers: one CUDA graph replay per token.

:class:`GreedyDecoder` decodes one batch size into a static KV cache of ``max_len`` positions
(:class:`LayerKV`, one per layer: keys and values written at the positions the decoder names),
running the model's parts itself: embedding, rotary embedding, the decoder layers, the final norm,
``lm_head`` and the argmax. It serves Llama-style decoder-only models
(:func:`supports`: ``model.model`` with ``embed_tokens``, ``rotary_emb``, ``layers`` and ``norm``,
each layer's attention with a ``layer_idx``, and ``lm_head``).

* Each decoder layer gets its own :class:`LayerKV` (which ignores the layer index the attention
  passes), so during compilation every attention can be given ``layer_idx = 0``
  (:meth:`GreedyDecoder.shared_layer_index`) and all layers trace to one graph: ``torch.compile``
  compiles one layer, not one per layer. The indices are restored right after.
* The attention mask comes from the position buffer (key position <= query position, shape
  (B, 1, T, max_len)), never from ``transformers``' mask code, whose host-side checks a CUDA graph
  cannot hold.
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
from typing import Callable

import torch
from torch import nn

from compress.eval.timing import GRAPH_WARMUP_MIN, capture_graph

PARTS = ("embed_tokens", "rotary_emb", "layers", "norm")
MIN_PREFILL = 16  # the smallest prompt bucket (prefill_length)


def prefill_length(length: int, max_len: int) -> int:
    """Positions a prompt of ``length`` tokens runs at: the power of two >= ``length`` (at least
    :data:`MIN_PREFILL`), capped at ``max_len``; few buckets, so few prefill graphs."""
    return min(max(MIN_PREFILL, 1 << (length - 1).bit_length()), max_len)


def supports(model: nn.Module) -> bool:
    """True for a Llama-style decoder-only model (module docstring) whose layers this loop can run."""
    inner = getattr(model, "model", None)
    if inner is None or not hasattr(model, "lm_head") or not all(hasattr(inner, part) for part in PARTS):
        return False
    return all(hasattr(getattr(layer, "self_attn", None), "layer_idx") for layer in inner.layers)


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


def run_layer(layer, hidden, mask, position_ids, kv, position_embeddings):
    """One decoder layer on ``hidden`` (B, T, hidden) writing into its cache view ``kv``; the new hidden states."""
    out = layer(hidden, attention_mask=mask, position_ids=position_ids, past_key_values=kv, use_cache=True,
                position_embeddings=position_embeddings)
    return out[0] if isinstance(out, tuple) else out


class GreedyDecoder:
    """Greedy decoding of ``model`` at one batch size into a static cache of ``max_len`` positions."""

    def __init__(self, model: nn.Module, batch: int, max_len: int):
        if not supports(model):
            raise TypeError(f"GreedyDecoder: expected a Llama-style decoder-only model (model.model with "
                            f"{', '.join(PARTS)}; lm_head), got {type(model).__name__}")
        if batch < 1 or max_len < 2:
            raise ValueError(f"GreedyDecoder: expected batch >= 1 and max_len >= 2, got {batch} and {max_len}")
        self.model, self.batch, self.max_len = model, batch, max_len
        self.device = model.lm_head.weight.device
        self.kv = [LayerKV(max_len) for _ in model.model.layers]
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
        visible = self.key_positions[None, :] <= positions[:, None]  # (T, max_len)
        mask = visible[None, None].expand(batch, 1, length, self.max_len)
        for layer, kv in zip(inner.layers, self.kv):
            kv.positions = positions
            hidden = layer_fn(layer, hidden, mask, position_ids, kv, position_embeddings)
        hidden = hidden[:, -1:] if last is None else hidden.index_select(1, last)
        return self.model.lm_head(inner.norm(hidden))[:, -1]

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
            return
        if bucket not in self.prefill_graphs:
            self.prefill_graphs[bucket], _ = capture_graph([functools.partial(self.prefill_step, bucket)])
        self.prefill_graphs[bucket].replay()

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
