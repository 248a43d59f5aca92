"""Hugging Face's ``kernels`` package in place of this folder when the folder is imported by its own name.

This folder installs as ``compress_kernels`` (setup.py). A checkout's root on ``sys.path`` (``python -m ...``
or pytest run from the root) also makes it importable as ``kernels``, the import name of Hugging Face's
hub-kernels package, which transformers imports whenever that package is installed
(``from kernels import CUDAProperties, ...`` in its hub-kernels integration). Found first, this folder would
shadow it and break every model transformers builds. So ``kernels/__init__.py``, run under the name
``kernels``, calls :func:`load_in_place`: the first ``kernels`` package on ``sys.path`` outside the checkout
is loaded and put in ``sys.modules["kernels"]``, which the import statement then returns. Where there is
none, the import raises ``ModuleNotFoundError``, as it would without this folder, so code that tries the
import and falls back keeps working.
"""
from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
from pathlib import Path

NAME = "kernels"
CHECKOUT_ROOT = Path(__file__).resolve().parents[2]  # the folder holding kernels/


def find_outside(search_path: list[str], checkout_root: Path = CHECKOUT_ROOT):
    """The module spec of the first ``kernels`` on ``search_path`` whose entry is not ``checkout_root``
    ("" is the working directory), or None."""
    for entry in search_path:
        if not isinstance(entry, str) or Path(entry or os.curdir).resolve() == checkout_root:
            continue
        spec = importlib.machinery.PathFinder.find_spec(NAME, [entry])
        if spec is not None:
            return spec
    return None


def load_in_place() -> None:
    """Load the ``kernels`` package found outside the checkout into ``sys.modules["kernels"]`` (module
    docstring); ``ModuleNotFoundError`` when there is none."""
    spec = find_outside(sys.path)
    if spec is None:
        raise ModuleNotFoundError(
            f"No module named {NAME!r} outside this checkout: its kernels/ folder is the package "
            f"'compress_kernels' (import that); Hugging Face's 'kernels' is not installed", name=NAME)
    module = importlib.util.module_from_spec(spec)
    sys.modules[NAME] = module  # should it fail, the import of kernels/__init__.py removes the entry
    spec.loader.exec_module(module)
