"""Training text sampled from the teacher, so distillation sees more than the training split.

Why. A compressed student distilled with ``KL(teacher || student)`` per token sees only the training
split's contexts (for the SmolLM2 recipes, WikiText-2's 240 blocks of 1,024 tokens), epoch after epoch.
Sequences sampled from the teacher itself add contexts drawn from the teacher's own distribution. On a
sequence ``x ~ p_teacher`` the per-token KL summed over its positions is, by the chain rule of KL, an
unbiased sample of the sequence-level ``KL(p_teacher || p_student)``: the quantity token-level
distillation stands in for (sequence-level knowledge distillation, Kim & Rush 2016). So the samples are
plain ancestral sampling, temperature 1, no top-k / top-p truncation; the one change to the teacher's
distribution is that the end-of-sequence token is masked, so every block runs to its full length. No
outside data: each prompt is ``prompt_tokens`` consecutive tokens of a training block (a random block,
a random offset), the rest of the block the teacher's continuation.

File. One safetensors file: ``input_ids`` int32 (n, block_size); its metadata records the model,
tokenizer, block size, prompt length, temperature and seed that made it. It is written atomically (a
temporary in the same folder, fsynced, renamed) and an existing file is replaced only with
``overwrite``. :func:`load_teacher_text` checks the block size, the tokenizer and the token range;
``LanguageModelingData(teacher_text=path)`` appends the blocks to the training split (never to
validation)::

    python -m scripts.teacher_text --model runs/smollm2-wikitext-dense/float \\
        --tokenizer SmolLM2-135M-Instruct --block-size 1024 --blocks 960 \\
        --out runs/smollm2-wikitext-dense/teacher-text.safetensors
"""
from __future__ import annotations

import json
import logging
import os
import pathlib
import secrets

import torch
from torch import nn

from compress.checkpoint.files import read_safetensors, read_safetensors_metadata
from compress.checkpoint.safe_write import fsync_path

logger = logging.getLogger(__name__)

FORMAT = "compress.teacher_text/1"


def random_prompts(blocks: torch.Tensor, count: int, prompt_tokens: int, seed: int) -> torch.Tensor:
    """(count, prompt_tokens) int64: ``prompt_tokens`` consecutive tokens of a random block of ``blocks``
    (n, block_size) from a random offset, drawn with replacement by a generator seeded with ``seed``."""
    if blocks.dim() != 2 or blocks.shape[0] == 0:
        raise ValueError("teacher text: expected training blocks of shape (n > 0, block_size), "
                         f"got {tuple(blocks.shape)}")
    if not 0 < prompt_tokens < blocks.shape[1]:
        raise ValueError(f"teacher text: prompt_tokens: expected 1 to {blocks.shape[1] - 1} (below the block size), "
                         f"got {prompt_tokens}")
    generator = torch.Generator().manual_seed(seed)
    rows = torch.randint(blocks.shape[0], (count,), generator=generator)
    starts = torch.randint(blocks.shape[1] - prompt_tokens + 1, (count,), generator=generator)
    positions = starts[:, None] + torch.arange(prompt_tokens)[None, :]
    return blocks[rows[:, None], positions].long()


@torch.no_grad()
def sample_continuations(model: nn.Module, prompts: torch.Tensor, length: int, temperature: float = 1.0,
                         seed: int = 0) -> torch.Tensor:
    """(n, length) int64: each prompt (n, p) followed by tokens sampled from ``model`` (a ``transformers``
    causal LM) from ``softmax(logits / temperature)``, nothing truncated (top-k and top-p off) and no early
    stop (the end-of-sequence token is masked until ``length``), through ``generate`` with a static KV cache
    (a dynamic one copies the whole cache at every token) and no compilation (the step compiled for one
    batch size, under CUDA graphs, did not finish 992 tokens of 540 sequences in 190 s on an H200 shared
    with other runs). ``seed`` seeds torch's generator first."""
    from transformers import GenerationConfig

    if temperature <= 0:
        raise ValueError(f"teacher text: temperature: expected a positive number, got {temperature}")
    new_tokens = length - prompts.shape[1]
    if new_tokens <= 0:
        raise ValueError(f"teacher text: length {length} leaves nothing to sample after prompts of {prompts.shape[1]}")
    config = GenerationConfig(do_sample=True, temperature=temperature, top_k=0, top_p=1.0, max_new_tokens=new_tokens,
                              min_new_tokens=new_tokens, cache_implementation="static", disable_compile=True,
                              eos_token_id=model.generation_config.eos_token_id,
                              pad_token_id=model.generation_config.pad_token_id or 0)
    torch.manual_seed(seed)
    out = model.generate(input_ids=prompts, attention_mask=torch.ones_like(prompts), generation_config=config)
    return out[:, :length]


def generate_teacher_text(model: nn.Module, train_blocks: torch.Tensor, count: int, prompt_tokens: int = 32,
                          temperature: float = 1.0, batch_size: int = 128, seed: int = 0) -> torch.Tensor:
    """(count, block_size) int64 blocks: prompts from ``train_blocks`` (:func:`random_prompts`), each continued
    by ``model`` (eval mode, on its device) to the training blocks' length, ``batch_size`` at a time."""
    if count < 1 or batch_size < 1:
        raise ValueError(f"teacher text: expected positive counts, got blocks={count}, batch_size={batch_size}")
    device = next(model.parameters()).device
    prompts = random_prompts(train_blocks, count, prompt_tokens, seed).to(device)
    was_training = model.training
    model.eval()
    try:
        pieces = []
        for start in range(0, count, batch_size):
            pieces.append(sample_continuations(model, prompts[start:start + batch_size], train_blocks.shape[1],
                                               temperature, seed + start).cpu())
            logger.info("teacher text: %d of %d blocks sampled", min(start + batch_size, count), count)
    finally:
        model.train(was_training)
    return torch.cat(pieces)


def check_new_file(path, overwrite: bool) -> pathlib.Path:
    """``path`` as a Path; FileExistsError if it exists, unless ``overwrite`` and it is a regular file."""
    path = pathlib.Path(path)
    if path.exists() and not (overwrite and path.is_file() and not path.is_symlink()):
        raise FileExistsError(f"teacher text: {path} exists; expected a new path (or overwrite for a regular file)")
    return path


def save_teacher_text(path, blocks: torch.Tensor, info: dict, overwrite: bool = False) -> pathlib.Path:
    """Write ``blocks`` (n, block_size) and ``info`` (JSON-able) atomically to the safetensors file ``path``."""
    from safetensors.torch import save_file

    path = check_new_file(path, overwrite)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
    try:
        metadata = {"format": FORMAT, "info": json.dumps(info, sort_keys=True)}
        save_file({"input_ids": blocks.to(torch.int32).contiguous()}, str(temporary), metadata=metadata)
        fsync_path(temporary)
        os.replace(temporary, path)
        fsync_path(path.parent)
    finally:
        temporary.unlink(missing_ok=True)
    return path


def load_teacher_text(path, block_size: int, tokenizer: str, vocabulary: int) -> tuple[torch.Tensor, dict]:
    """(blocks (n, block_size) int64, info) from :func:`save_teacher_text`'s file; ValueError saying what was
    expected when the file was made for another block size or tokenizer or holds tokens outside
    ``[0, vocabulary)``."""
    metadata = read_safetensors_metadata(path)
    if metadata.get("format") != FORMAT:
        raise ValueError(f"teacher text: {path}: expected a file written by compress.lightning.teacher_text "
                         f"(format {FORMAT!r}), got format {metadata.get('format')!r}")
    info = json.loads(metadata["info"])
    tensors = read_safetensors(path)
    blocks = tensors.get("input_ids")
    if blocks is None or blocks.dim() != 2 or blocks.shape[1] != block_size:
        raise ValueError(f"teacher text: {path}: expected input_ids of shape (n, {block_size}) for blocks of "
                         f"{block_size} tokens, got {None if blocks is None else tuple(blocks.shape)}")
    if info.get("tokenizer") != tokenizer:
        raise ValueError(f"teacher text: {path}: sampled with tokenizer {info.get('tokenizer')!r}, the data uses "
                         f"{tokenizer!r}; expected the same tokenizer")
    if blocks.numel() and not (0 <= int(blocks.min()) and int(blocks.max()) < vocabulary):
        raise ValueError(f"teacher text: {path}: token ids span [{int(blocks.min())}, {int(blocks.max())}], expected "
                         f"[0, {vocabulary}) for the tokenizer's vocabulary")
    return blocks.long(), info
