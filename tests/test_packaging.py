"""The installed project: ``kernels/`` imports as ``compress_kernels`` with every subpackage, and
Hugging Face's own ``kernels`` package (a dev dependency) imports beside it in one environment."""
import importlib
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _subpackages(folder: pathlib.Path) -> list[str]:
    return sorted(str(p.parent.relative_to(folder)).replace(os.sep, ".")
                  for p in folder.rglob("__init__.py") if "__pycache__" not in p.parts)


def test_every_kernels_subpackage_imports_as_compress_kernels():
    for sub in _subpackages(ROOT / "kernels"):
        name = "compress_kernels" if sub == "." else f"compress_kernels.{sub}"
        module = importlib.import_module(name)
        assert pathlib.Path(module.__file__).resolve().is_relative_to(ROOT / "kernels"), name


def test_project_and_hugging_face_kernels_import_side_by_side(tmp_path):
    pytest.importorskip("kernels", reason="the dev extra installs Hugging Face's kernels package")
    # a neutral working directory: both packages come from the environment, not from the checkout
    code = ("import kernels, compress_kernels, compress, transformers\n"
            "assert hasattr(kernels, 'get_kernel'), kernels.__file__\n"
            "assert hasattr(compress_kernels, 'w8a8_matmul'), compress_kernels.__file__\n"
            "print(kernels.__file__); print(compress_kernels.__file__)\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    hf_file, ours_file = out.stdout.split()
    assert not pathlib.Path(hf_file).resolve().is_relative_to(ROOT / "kernels")
    assert pathlib.Path(ours_file).resolve().is_relative_to(ROOT / "kernels")


def test_transformers_hub_kernels_integration_imports_from_the_checkout_root():
    pytest.importorskip("kernels", reason="the dev extra installs Hugging Face's kernels package")
    # the checkout's root first on sys.path ("" under python -c), as under pytest or python -m from the root
    code = "import kernels, transformers.integrations.hub_kernels; print(kernels.__file__)"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert not pathlib.Path(out.stdout.strip()).resolve().is_relative_to(ROOT / "kernels")
