"""Write a copy of a recipe with some values changed, including a callback's init args.

    python -m scripts.edit_recipe RECIPE OUT KEY=VALUE [KEY=VALUE ...]

LightningCLI overrides cannot reach into ``trainer.callbacks`` (a list), so sweeps over a callback's
settings edit a copy of the recipe instead. A KEY is either

* ``Callback.arg`` (e.g. ``BlockPruning.allocation``): ``init_args.arg`` of every callback whose
  ``class_path`` ends in ``.Callback`` (the recipe must have one), or
* a dotted path into the YAML (e.g. ``model.init_args.learning_rate``, ``trainer.max_epochs``):
  the mapping entries along it must exist except the last.

VALUE is parsed as YAML (``0.5`` is a float, ``global`` a string, ``[1, 2]`` a list). Comments are
not kept in the copy.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

from compress.lightning.recipe_yaml import load_recipe, load_yaml


def set_value(recipe: dict, key: str, value) -> None:
    """Set ``key`` (``Callback.arg`` or a dotted path, module docstring) in ``recipe`` in place."""
    head, _, rest = key.partition(".")
    if not rest:
        raise ValueError(f"{key!r}: expected Callback.arg or a dotted path such as trainer.max_epochs")
    if head[:1].isupper():
        callbacks = [c for c in (recipe.get("trainer") or {}).get("callbacks") or []
                     if isinstance(c, dict) and str(c.get("class_path", "")).endswith("." + head)]
        if not callbacks:
            raise ValueError(f"{key!r}: the recipe has no {head} callback")
        for callback in callbacks:
            callback.setdefault("init_args", {})[rest] = value
        return
    node, parts = recipe, key.split(".")
    for part in parts[:-1]:
        if not isinstance(node, dict) or part not in node:
            raise ValueError(f"{key!r}: the recipe has no {part!r} there")
        node = node[part]
    if not isinstance(node, dict):
        raise ValueError(f"{key!r}: expected a mapping above {parts[-1]!r}, got {type(node).__name__}")
    node[parts[-1]] = value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.edit_recipe", description=__doc__.split("\n")[0])
    parser.add_argument("recipe", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("edits", nargs="*", help="KEY=VALUE")
    args = parser.parse_args(argv)
    try:
        recipe = load_recipe(args.recipe)
    except ValueError as error:
        print(f"scripts.edit_recipe: {error}", file=sys.stderr)
        return 2
    try:
        for edit in args.edits:
            key, sep, text = edit.partition("=")
            if not sep:
                raise ValueError(f"{edit!r}: expected KEY=VALUE")
            set_value(recipe, key, load_yaml(text, f"the value of {key}"))
    except ValueError as error:
        print(f"scripts.edit_recipe: {args.recipe}: {error}", file=sys.stderr)
        return 2
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
