"""The one ``compress run`` that the run, export and evaluate tests share."""
import pytest

from compress.cli import run_command
from tests.compress.cli.helpers import export, pruning, qat, tiny_recipe, write_recipe


@pytest.fixture(scope="package")
def sparse_w8a8_run(tmp_path_factory):
    """One ``compress run`` with pruning + W8A8 QAT + export (shared by the tests below)."""
    root = tmp_path_factory.mktemp("run")
    recipe = tiny_recipe(root / "out", [pruning(), qat(), export(root / "out" / "compressed")], save_float_model=True)
    path = write_recipe(root / "recipe.yaml", recipe)
    assert run_command(["run", "--config", path]) == 0
    return root, path
