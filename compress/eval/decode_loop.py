"""Greedy decoding with a static KV cache and static buffers: one CUDA graph replay per token.

:class:`GreedyDecoder` decodes one batch size into one ``transformers`` ``StaticCache`` of
``max_len`` positions, running the model's parts itself: embedding, rotary embedding, the decoder
layers, the final norm, ``lm_head`` and the argmax. It serves Llama-style decoder-only models
(:func:`supports`: ``model.model`` with ``embed_tokens``, ``rotary_emb``, ``layers`` and ``norm``,
each layer's attention with a ``layer_idx``, and ``lm_head``).

* Each decoder layer gets a view of its own cache layer (:class:`LayerKV`, which ignores the layer
  index the attention passes), so during compilation every attention can be given ``layer_idx = 0``
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

:meth:`GreedyDecoder.prefill` resets the cache and runs the prompt (T tokens, eager layers: its
length varies), giving new token 0. ``compress.eval.generate`` puts this behind ``model.generate``.
"""
from __future__ import annotations

import contextlib
from typing import Callable

import torch
from torch import nn

from compress.eval.timing import GRAPH_WARMUP_MIN, capture_graph

PARTS = ("embed_tokens", "rotary_emb", "layers", "norm")


def supports(model: nn.Module) -> bool:
    """True for a Llama-style decoder-only model (module docstring) whose layers this loop can run."""
    inner = getattr(model, "model", None)
    if inner is None or not hasattr(model, "lm_head") or not all(hasattr(inner, part) for part in PARTS):
        return False
    return all(hasattr(getattr(layer, "self_attn", None), "layer_idx") for layer in inner.layers)


class LayerKV:
    """One layer's slice of a ``StaticCache``: what a decoder layer calls ``update`` on (any layer index)."""

    def __init__(self, cache_layer):
        self.layer = cache_layer

    def update(self, key_states, value_states, *args, **kwargs):
        return self.layer.update(key_states, value_states)


def run_layer(layer, hidden, mask, position_ids, kv, position_embeddings):
    """One decoder layer on ``hidden`` (B, T, hidden) writing into its cache view ``kv``; the new hidden states."""
    out = layer(hidden, attention_mask=mask, position_ids=position_ids, past_key_values=kv, use_cache=True,
                position_embeddings=position_embeddings)
    return out[0] if isinstance(out, tuple) else out


class GreedyDecoder:
    """Greedy decoding of ``model`` at one batch size into a static cache of ``max_len`` positions."""

    def __init__(self, model: nn.Module, batch: int, max_len: int):
        from transformers import StaticCache

        if not supports(model):
            raise TypeError(f"GreedyDecoder: expected a Llama-style decoder-only model (model.model with "
                            f"{', '.join(PARTS)}; lm_head), got {type(model).__name__}")
        if batch < 1 or max_len < 2:
            raise ValueError(f"GreedyDecoder: expected batch >= 1 and max_len >= 2, got {batch} and {max_len}")
        self.model, self.batch, self.max_len = model, batch, max_len
        self.device = model.lm_head.weight.device
        self.cache = StaticCache(config=model.config, max_cache_len=max_len)
        self.kv = [LayerKV(cache_layer) for cache_layer in self.cache.layers]
        vocab, long = model.config.vocab_size, dict(dtype=torch.long, device=self.device)
        self.key_positions = torch.arange(max_len, device=self.device)
        self.token = torch.zeros(batch, 1, **long)
        self.position, self.start, self.min_new = (torch.zeros(1, **long) for _ in range(3))
        self.eos = torch.zeros(vocab, dtype=torch.bool, device=self.device)
        self.generated = torch.zeros(batch, max_len, **long)
        self.logits = torch.zeros(batch, vocab, dtype=model.lm_head.weight.dtype, device=self.device)
        self.layer_fn: Callable = run_layer
        self.graph = None

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

    def _choose(self, logits: torch.Tensor, index: torch.Tensor) -> None:
        """New token ``index`` from ``logits``: end-of-sequence barred below ``min_new``, the argmax kept."""
        barred = self.eos[None, :] & (index < self.min_new)
        logits = logits.masked_fill(barred, float("-inf"))
        self.logits.copy_(logits)
        self.token.copy_(logits.argmax(dim=-1, keepdim=True))
        self.generated.index_copy_(1, index, self.token)

    @torch.no_grad()
    def prefill(self, prompt: torch.Tensor, min_new_tokens: int = 0, eos_token_ids=()) -> None:
        """Reset the cache and run ``prompt`` (B, T) eagerly: new token 0, position T."""
        batch, length = prompt.shape
        if batch != self.batch or not 0 < length < self.max_len:
            raise ValueError(f"prompt: expected shape ({self.batch}, 1..{self.max_len - 1}), got {tuple(prompt.shape)}")
        self.cache.reset()
        self.eos.zero_()
        if len(eos_token_ids):
            self.eos[torch.as_tensor(list(eos_token_ids), device=self.device)] = True
        self.min_new.fill_(min_new_tokens)
        self.start.fill_(length)
        self.position.fill_(length)
        logits = self.forward(prompt, torch.arange(length, device=self.device))
        self._choose(logits, torch.zeros(1, dtype=torch.long, device=self.device))

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
