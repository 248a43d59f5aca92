"""kernels/ imported by its folder name hands over to the ``kernels`` package found outside the checkout."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from compress_kernels.common import hub_kernels

ROOT = Path(__file__).resolve().parents[3]


def _fake_package(folder: Path) -> Path:
    """A package named kernels under ``folder`` that marks itself."""
    (folder / "kernels").mkdir()
    (folder / "kernels" / "__init__.py").write_text("MARK = 'outside'\n")
    return folder


def test_the_checkout_root_is_the_folder_holding_kernels():
    assert hub_kernels.CHECKOUT_ROOT == ROOT


def test_find_outside_skips_the_checkout_root_and_finds_the_next_package(tmp_path, monkeypatch):
    assert hub_kernels.find_outside([str(ROOT)]) is None
    monkeypatch.chdir(ROOT)
    assert hub_kernels.find_outside([""]) is None  # the working directory, when it is the root
    outside = _fake_package(tmp_path)
    spec = hub_kernels.find_outside(["", str(ROOT), str(outside)])
    assert Path(spec.origin).resolve() == (outside / "kernels" / "__init__.py").resolve()


def test_load_in_place_without_a_package_outside_raises_module_not_found(monkeypatch):
    monkeypatch.setattr(sys, "path", [str(ROOT)])
    with pytest.raises(ModuleNotFoundError, match="compress_kernels") as err:
        hub_kernels.load_in_place()
    assert err.value.name == "kernels"


def test_import_kernels_from_the_checkout_root_returns_the_package_outside(tmp_path):
    outside = _fake_package(tmp_path)
    env = dict(os.environ, PYTHONPATH=str(outside))  # after the working directory ("" comes first)
    code = "import sys, kernels; assert sys.path[0] == ''; print(kernels.MARK, kernels.__file__)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    mark, path = out.stdout.split()
    assert mark == "outside"
    assert Path(path).resolve().is_relative_to(outside.resolve())


def test_a_failing_package_outside_leaves_no_kernels_module_behind(tmp_path):
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "__init__.py").write_text("raise RuntimeError('outside failed')\n")
    code = ("import sys\n"
            "try:\n    import kernels\nexcept RuntimeError as err:\n    print(err, 'kernels' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(tmp_path)),
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["outside", "failed", "False"]
