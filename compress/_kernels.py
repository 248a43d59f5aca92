"""The one place where ``compress`` imports the project's ``kernels`` package.

Hugging Face ships an unrelated package that is also imported as ``kernels``. This module checks
that the ``kernels`` found on the path is the project's (it defines ``w8a8_matmul``) and raises an
``ImportError`` that explains the clash otherwise.

``reference`` (the pure-PyTorch contract, :mod:`kernels.reference`) is always available to the
rest of ``compress``; the Triton launchers are looked up lazily by :func:`launcher`, only when an
inference module sees a CUDA input. While the Triton kernels are not importable (for example in a
tree where ``kernels/w8a8.py`` does not exist yet), the reference still loads straight from its file,
and :func:`launcher` raises an ``ImportError`` naming the cause.
"""
from __future__ import annotations

import importlib
import importlib.util
import logging
import pathlib
import sys
from types import ModuleType

logger = logging.getLogger(__name__)

_CLASH_MESSAGE = (
    "the module imported as `kernels` ({origin}) is not this project's kernels package (it has no "
    "`w8a8_matmul`); Hugging Face's `kernels` package uses the same import name. Run from the "
    "project's root or install it with `pip install -e .` so that its `kernels/` comes first on "
    "sys.path (or uninstall the other package)."
)

_package: ModuleType | None = None
_package_error: BaseException | None = None


def _load_reference_from_file() -> ModuleType:
    """Load ``kernels/reference.py`` next to this package without importing ``kernels/__init__``."""
    path = pathlib.Path(__file__).resolve().parent.parent / "kernels" / "reference.py"
    if not path.is_file():
        raise ImportError(f"cannot find the project's kernels/reference.py (looked at {path})")
    spec = importlib.util.spec_from_file_location("_compress_kernels_reference", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _import_package() -> ModuleType | None:
    """Import ``kernels``; None (error kept for :func:`launcher`) when one of its submodules is missing."""
    global _package, _package_error
    try:
        package = importlib.import_module("kernels")
    except ModuleNotFoundError as error:
        if error.name and error.name.startswith("kernels."):
            _package_error = error
            logger.info("project kernels not importable (%s); using kernels/reference.py only", error)
            return None
        raise
    if not hasattr(package, "w8a8_matmul"):
        raise ImportError(_CLASH_MESSAGE.format(origin=getattr(package, "__file__", "?")))
    _package = package
    return package


_imported = _import_package()
reference = importlib.import_module("kernels.reference") if _imported is not None else _load_reference_from_file()


def launcher(name: str):
    """The Triton launcher ``kernels.<name>`` (e.g. ``"w8a8_matmul"``); ImportError if unavailable."""
    if _package is None:
        raise ImportError(f"kernels.{name} is not available: {_package_error}")
    if not getattr(_package, "TRITON_AVAILABLE", False):
        raise ImportError(f"kernels.{name} needs Triton, which is not installed")
    return getattr(_package, name)
