"""Lightning checkpoints on the command line: ``--ckpt_path`` (a file, or for ``compress run`` the
directory of a sharded FSDP2 checkpoint), and a checkpoint file read as plain data
(``torch.load(weights_only=True)``), so a pickled object that would run code is refused and its code
does not run.
"""
from __future__ import annotations

import pickle
from pathlib import Path

import torch

from compress.cli.recipe import split_option

# What marks a sharded (FSDP2, ModelParallelStrategy) Lightning checkpoint directory.
SHARDED_CHECKPOINT_META = "meta.pt"


def is_sharded_checkpoint(path) -> bool:
    """Whether ``path`` is a sharded Lightning checkpoint: a directory of per-rank tensor files and ``meta.pt``."""
    return Path(path).is_dir() and (Path(path) / SHARDED_CHECKPOINT_META).is_file()


def checkpoint_option(args: list[str], command: str, sharded: bool = False) -> tuple[str | None, list[str]]:
    """``--ckpt_path CKPT`` taken out of ``args``: (the checkpoint or None, the other args). A missing
    file or more than one path fails here, before the recipe is built or any step is trained.
    ``sharded``: a sharded checkpoint directory (FSDP2) is accepted too."""
    ckpt, rest = split_option(args, "ckpt_path")
    if len(ckpt) > 1:
        raise ValueError(f"compress {command}: expected at most one --ckpt_path CHECKPOINT, got {ckpt}")
    if ckpt and is_sharded_checkpoint(ckpt[0]) and not sharded:
        raise ValueError(f"compress {command}: --ckpt_path: {ckpt[0]!r} is a sharded (FSDP2) checkpoint directory, "
                         "whose metadata torch.distributed.checkpoint reads with pickle, which can run code; "
                         "export needs a checkpoint file it reads as plain data: if you trust the directory, "
                         "convert it with torch.distributed.checkpoint.format_utils.dcp_to_torch_save(DIR, FILE) "
                         "and pass FILE")
    if ckpt and not (Path(ckpt[0]).is_file() or (sharded and is_sharded_checkpoint(ckpt[0]))):
        kind = "file or sharded checkpoint directory" if sharded else "file"
        raise ValueError(f"compress {command}: --ckpt_path: expected an existing Lightning checkpoint {kind}, "
                         f"got {ckpt[0]!r}")
    return (ckpt[0] if ckpt else None), rest


def _unpickler_detail(message: str) -> str:
    """The one line of torch's multi-paragraph weights_only refusal that says what was refused."""
    tail = message.split("WeightsUnpickler error:", 1)[-1]
    line = next((line.strip() for line in tail.splitlines() if line.strip()), "refused by weights_only=True")
    return line.split(" was not an allowed global")[0]


def load_lightning_checkpoint(path) -> dict:
    """A Lightning checkpoint read with ``torch.load(weights_only=True)``: tensors and plain data only,
    so a pickled object that would run code is refused (and its code does not run)."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        detail = _unpickler_detail(str(error))
        if detail.startswith("Unsupported global"):
            raise ValueError(f"{path}: refused to load: the checkpoint holds a pickled object that is not plain data "
                             f"({detail}); checkpoints are loaded without running any code they hold") from None
        raise ValueError(f"{path}: expected a Lightning checkpoint written by torch.save, got a file that "
                         f"torch.load(weights_only=True) refuses ({detail})") from None
    except (RuntimeError, EOFError, KeyError, ValueError, OSError) as error:
        raise ValueError(f"{path}: expected a Lightning checkpoint written by torch.save, got an unreadable file "
                         f"({type(error).__name__}: {error})") from None
    if not isinstance(state, dict) or "state_dict" not in state:
        found = sorted(state)[:8] if isinstance(state, dict) else type(state).__name__
        raise ValueError(f"{path}: expected a Lightning checkpoint with a 'state_dict', got {found}")
    return state
