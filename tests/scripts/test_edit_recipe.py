"""scripts.edit_recipe: a recipe copy with a callback's init args and dotted-path values changed."""
from pathlib import Path

import pytest
import yaml

from scripts import edit_recipe as edit

REPO = Path(__file__).resolve().parents[2]
SPARSE = REPO / "recipes" / "minilm-sst2-sparse50-w8a8.yaml"


def _callbacks(recipe):
    return {c["class_path"].rsplit(".", 1)[-1]: c.get("init_args", {}) for c in recipe["trainer"]["callbacks"]}


def test_edits_reach_callbacks_and_dotted_paths(tmp_path):
    out = tmp_path / "copy.yaml"
    code = edit.main([str(SPARSE), str(out), "BlockPruning.allocation=global", "BlockPruning.spread=0.25",
                      "model.init_args.learning_rate=5.0e-5", "trainer.max_epochs=4"])
    assert code == 0
    recipe = yaml.safe_load(out.read_text())
    callbacks = _callbacks(recipe)
    assert callbacks["BlockPruning"]["allocation"] == "global" and callbacks["BlockPruning"]["spread"] == 0.25
    assert callbacks["BlockPruning"]["sparsity"] == 0.5  # the rest kept
    assert "allocation" not in callbacks["QuantizationAware"]  # only the named callback
    assert recipe["model"]["init_args"]["learning_rate"] == 5.0e-5 and recipe["trainer"]["max_epochs"] == 4


def test_the_edited_recipe_still_parses_with_the_cli(tmp_path, capsys):
    from compress.cli import run_command

    out = tmp_path / "copy.yaml"
    assert edit.main([str(SPARSE), str(out), "BlockPruning.allocation=global"]) == 0
    with pytest.raises(SystemExit) as done:
        run_command(["fit", "--config", str(out), "--print_config"])
    assert done.value.code in (0, None)
    assert "allocation: global" in capsys.readouterr().out


@pytest.mark.parametrize("bad, words", [
    ("Pruning.allocation=global", "no Pruning callback"),
    ("model.no_such.key=1", "no 'no_such'"),
    ("learning_rate", "expected KEY=VALUE"),
    ("epochs=3", "Callback.arg or a dotted path"),
])
def test_bad_edits_are_refused_without_writing(tmp_path, capsys, bad, words):
    out = tmp_path / "copy.yaml"
    assert edit.main([str(SPARSE), str(out), bad]) == 2
    assert words in capsys.readouterr().err and not out.exists()


def test_a_recipe_beyond_the_bounds_is_refused_naming_it(tmp_path, capsys):
    """The same bounded reader as the CLI (compress.lightning.recipe_yaml): an alias bomb fails at once."""
    from tests.compress.lightning.test_recipe_yaml import alias_bomb

    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(alias_bomb())
    out = tmp_path / "copy.yaml"
    assert edit.main([str(bomb), str(out), "trainer.max_epochs=1"]) == 2
    assert f"scripts.edit_recipe: {bomb}: expected at most 10000 YAML nodes" in capsys.readouterr().err
    assert edit.main([str(SPARSE), str(out), f"trainer.max_epochs={alias_bomb()}"]) == 2
    assert "the value of trainer.max_epochs: expected at most 10000 YAML nodes" in capsys.readouterr().err
    assert not out.exists()
