"""compress/lightning/recipe_yaml.py: recipes read within bounds (size, UTF-8, alias expansion), in our
loader and in jsonargparse's, with errors that name the file."""
import time

import jsonargparse
import pytest

from compress.lightning import recipe_yaml
from compress.lightning.recipe_yaml import (
    MAX_YAML_NODES,
    RecipeFileError,
    bound_jsonargparse_yaml,
    check_config_files,
    config_file_args,
    load_recipe,
    load_yaml,
)


def alias_bomb(levels: int = 9, width: int = 9) -> str:
    """'Billion laughs': each anchor a list of ``width`` aliases to the one before: width**levels strings."""
    lines = ["l0: &l0 [" + ", ".join(["lol"] * width) + "]"]
    for level in range(1, levels + 1):
        lines.append(f"l{level}: &l{level} [" + ", ".join([f"*l{level - 1}"] * width) + "]")
    return "\n".join(lines) + "\n"


def test_an_alias_bomb_is_refused_fast_naming_the_file(tmp_path):
    path = tmp_path / "bomb.yaml"
    path.write_text(alias_bomb())
    started = time.perf_counter()
    with pytest.raises(RecipeFileError, match=rf"bomb.yaml: expected at most {MAX_YAML_NODES} YAML nodes with aliases "
                                              r"expanded, got more \(\d+ anchors"):
        load_recipe(path)
    assert time.perf_counter() - started < 1.0


def test_aliases_within_the_bound_load_as_before():
    text = "base: &base {lr: 0.1, epochs: 2}\nfit: {<<: *base, epochs: 3}\nother: *base\n"
    assert load_yaml(text) == {"base": {"lr": 0.1, "epochs": 2}, "fit": {"lr": 0.1, "epochs": 3},
                               "other": {"lr": 0.1, "epochs": 2}}
    wide = "a: &a [" + ", ".join(["1"] * 100) + "]\nb: [" + ", ".join(["*a"] * (MAX_YAML_NODES // 101 - 2)) + "]\n"
    assert len(load_yaml(wide)["b"]) == MAX_YAML_NODES // 101 - 2  # just under the bound
    with pytest.raises(RecipeFileError, match="the value of x: expected at most"):
        load_yaml(wide.replace("]\n", ", *a, *a, *a]\n", 2)[:-1] + "\n", "the value of x")


def test_a_binary_recipe_is_refused_naming_the_file(tmp_path):
    path = tmp_path / "recipe.yaml"
    path.write_bytes(b"model:\n  x: 1\n\xff\xfe\x00garbage")
    with pytest.raises(RecipeFileError, match=r"recipe.yaml: expected a UTF-8 text YAML recipe, got bytes that are "
                                              r"not text \(byte 0xff at offset 14\)"):
        load_recipe(path)


def test_an_unreadable_recipe_is_refused_naming_the_file(tmp_path):
    (tmp_path / "folder.yaml").mkdir()
    with pytest.raises(RecipeFileError, match=r"folder.yaml: expected a regular file, got a directory"):
        load_recipe(tmp_path / "folder.yaml")
    with pytest.raises(RecipeFileError, match=r"missing.yaml: expected a readable recipe file, got FileNotFoundError"):
        load_recipe(tmp_path / "missing.yaml")


def test_an_oversized_recipe_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(recipe_yaml, "MAX_RECIPE_BYTES", 64)
    path = tmp_path / "big.yaml"
    path.write_text("a: " + "x" * 64 + "\n")
    with pytest.raises(RecipeFileError, match="big.yaml: expected a recipe of at most 64 bytes, got a larger file"):
        load_recipe(path)


def test_a_syntax_error_names_the_file(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("model: [1, 2\n")
    with pytest.raises(RecipeFileError, match=r"broken.yaml: expected YAML, got a syntax error: .*line 2"):
        load_recipe(path)


def test_jsonargparse_loads_yaml_through_the_bound(tmp_path):
    bound_jsonargparse_yaml()
    bound_jsonargparse_yaml()  # idempotent: wrapped once
    loader = jsonargparse.get_loader("yaml")
    assert loader.checks_yaml_size
    assert jsonargparse.get_loader("yaml") is loader
    parser = jsonargparse.ArgumentParser(exit_on_error=False)
    parser.add_argument("--l0", type=list)
    assert parser.parse_string("l0: [1, 2]").l0 == [1, 2]
    started = time.perf_counter()
    with pytest.raises(RecipeFileError, match=r"bomb.yaml: expected at most"):
        parser.parse_string(alias_bomb(), path="bomb.yaml")
    assert time.perf_counter() - started < 1.0
    from jsonargparse import _loaders_dumpers
    with pytest.raises(RecipeFileError, match="YAML: expected at most"):  # what jsonargparse calls directly
        _loaders_dumpers.json_or_yaml_load(alias_bomb())


def test_config_files_are_found_and_checked(tmp_path):
    assert config_file_args(["--config", "a.yaml", "--x", "1", "--config=b.yaml", "-c", "c.yaml"]) == [
        "a.yaml", "b.yaml", "c.yaml"]
    listed = tmp_path / "list.yaml"
    listed.write_text("- 1\n- 2\n")
    with pytest.raises(RecipeFileError, match=r"list.yaml: expected a recipe mapping sections .* got list"):
        check_config_files(["--config", str(listed)])
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("trainer: {max_epochs: 1}\n")
    check_config_files(["--config", str(recipe), "--config", "{inline: yaml}"])  # not a file: left to the parser


def test_a_named_pipe_as_recipe_is_refused_without_blocking(tmp_path):
    import os
    import signal

    os.mkfifo(tmp_path / "pipe.yaml")
    signal.signal(signal.SIGALRM, lambda *_: pytest.fail("reading a named pipe as a recipe blocked"))
    signal.alarm(5)
    try:
        with pytest.raises(RecipeFileError, match=r"pipe.yaml: expected a regular file, got a named pipe"):
            load_recipe(tmp_path / "pipe.yaml")
    finally:
        signal.alarm(0)
