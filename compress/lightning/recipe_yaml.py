"""Reading recipes (YAML) within bounds: every YAML the CLI and the scripts load goes through here.

A recipe is a small text file, so anything else is refused before it is parsed into objects, with an
error that names the file and what was found:

* a file over :data:`MAX_RECIPE_BYTES`, a file that cannot be read, anything but a regular file (a
  named pipe would block the command), or bytes that are not UTF-8 text;
* YAML whose aliases expand to more than :data:`MAX_YAML_NODES` nodes. PyYAML builds an alias as a
  shared reference, so loading an "alias bomb" (each anchor a list of aliases to the one before) is
  quick, but everything that walks the result (jsonargparse's validation, ``yaml.safe_dump``) visits
  each node once per path to it and runs for hours. The count is taken on the parser's events, before
  any object is built: an anchor's size is recorded when it closes, and each alias adds that size.

:func:`bound_jsonargparse_yaml` makes jsonargparse (LightningCLI's parser) load YAML through the same
check: the config files it reads, sub-config files, and YAML given as a command-line value.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from compress.checkpoint.files import NotRegularFileError, regular_file

MAX_RECIPE_BYTES = 1 << 20  # 1 MiB; the shipped recipes are under 4 KiB
MAX_YAML_NODES = 10_000  # scalars and collections once aliases are expanded; the shipped recipes have < 300

_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_OPENING = (yaml.SequenceStartEvent, yaml.MappingStartEvent)
_CLOSING = (yaml.SequenceEndEvent, yaml.MappingEndEvent)


class RecipeFileError(ValueError):
    """A recipe (or other YAML the project reads) that is unreadable, too large or not YAML text."""


def read_recipe_text(path: str | os.PathLike) -> str:
    """The text of the recipe file at ``path``: at most :data:`MAX_RECIPE_BYTES`, readable, UTF-8."""
    try:
        with regular_file(path) as file:  # a pipe or device named as a recipe must not block the command
            data = file.read(MAX_RECIPE_BYTES + 1)
    except NotRegularFileError as error:
        raise RecipeFileError(str(error)) from None
    except OSError as error:
        raise RecipeFileError(f"{path}: expected a readable recipe file, got {type(error).__name__}: "
                              f"{error.strerror or error}") from None
    if len(data) > MAX_RECIPE_BYTES:
        raise RecipeFileError(f"{path}: expected a recipe of at most {MAX_RECIPE_BYTES} bytes, got a larger file")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise RecipeFileError(f"{path}: expected a UTF-8 text YAML recipe, got bytes that are not text "
                              f"(byte 0x{data[error.start]:02x} at offset {error.start})") from None


def check_yaml_size(text: str, source: str = "YAML") -> None:
    """Raise :class:`RecipeFileError` naming ``source`` when ``text``'s aliases expand to more than
    :data:`MAX_YAML_NODES` nodes. Malformed YAML is left for the loader to report."""
    anchor_sizes: dict[str, int] = {}
    open_sizes, open_anchors = [0], [None]  # the document, then each collection not yet closed
    try:
        for event in yaml.parse(text, Loader=_LOADER):
            if isinstance(event, _OPENING):
                open_sizes.append(1)
                open_anchors.append(event.anchor)
                continue
            if isinstance(event, _CLOSING):
                size, anchor = open_sizes.pop(), open_anchors.pop()
            elif isinstance(event, yaml.AliasEvent):
                size, anchor = anchor_sizes.get(event.anchor, 1), None
            elif isinstance(event, yaml.ScalarEvent):
                size, anchor = 1, event.anchor
            else:
                continue
            if anchor is not None:
                anchor_sizes[anchor] = size
            open_sizes[-1] += size
            if sum(open_sizes) > MAX_YAML_NODES:
                raise RecipeFileError(
                    f"{source}: expected at most {MAX_YAML_NODES} YAML nodes with aliases expanded, got more "
                    f"({len(anchor_sizes)} anchors, the largest {max(anchor_sizes.values(), default=0)} nodes); "
                    "a recipe this size is refused (aliases that nest aliases, an 'alias bomb', look like this)")
    except yaml.YAMLError:
        return


def load_yaml(text: str, source: str = "YAML") -> Any:
    """``yaml.safe_load(text)`` after :func:`check_yaml_size`; a syntax error names ``source``."""
    check_yaml_size(text, source)
    try:
        return yaml.load(text, Loader=_LOADER)
    except yaml.YAMLError as error:
        raise RecipeFileError(f"{source}: expected YAML, got a syntax error: {' '.join(str(error).split())}") from None


def load_recipe(path: str | os.PathLike) -> Any:
    """The recipe file at ``path`` loaded as YAML, within the bounds of this module."""
    return load_yaml(read_recipe_text(path), str(path))


def bound_jsonargparse_yaml() -> None:
    """Make jsonargparse check YAML with :func:`check_yaml_size` before loading it (idempotent).

    jsonargparse's public ``set_loader`` covers config files and command-line values; it also calls
    its module-level ``yaml_load`` directly (a string given for a class-typed option, jsonnet), so
    that name is replaced too. The loading itself stays jsonargparse's (its float and timestamp rules).
    """
    import jsonargparse
    from jsonargparse import _loaders_dumpers

    original = _loaders_dumpers.yaml_load
    if getattr(original, "checks_yaml_size", False):
        return

    def bounded_yaml_load(text, path: str = ""):
        if isinstance(text, str):
            check_yaml_size(text, path or "YAML")
        return original(text)

    bounded_yaml_load.checks_yaml_size = True
    jsonargparse.set_loader("yaml", bounded_yaml_load, exceptions=(yaml.YAMLError,))
    _loaders_dumpers.yaml_load = bounded_yaml_load


def config_file_args(args: list[str]) -> list[str]:
    """The values of ``--config FILE`` / ``--config=FILE`` / ``-c FILE`` in command-line ``args``."""
    found = []
    for index, arg in enumerate(args):
        if arg in ("--config", "-c") and index + 1 < len(args):
            found.append(args[index + 1])
        elif arg.startswith("--config="):
            found.append(arg.split("=", 1)[1])
    return found


def check_config_files(args: list[str]) -> None:
    """Read and bound-check every existing ``--config`` file of ``args`` before a parser does, so an
    unreadable, binary, oversized or alias-bomb recipe fails with its name; a recipe must be a mapping.
    A value that names no file is left to the parser (which reports it, or reads it as inline YAML)."""
    for value in config_file_args(args):
        if not Path(value).exists():
            continue
        recipe = load_recipe(value)
        if not isinstance(recipe, dict):
            raise RecipeFileError(f"{value}: expected a recipe mapping sections (model, data, trainer, compress) "
                                  f"to their settings, got {type(recipe).__name__}")
