"""The import graph of the project: no cycles, kernels independent of ``compress``, layers respected.

Every ``.py`` file under ``compress/`` and ``kernels/`` (imported as ``compress_kernels``) is parsed
with ``ast``; every ``import`` and ``from ... import`` in it counts, at module level or inside a
function (relative ones resolved against the file's package). ``from package import name`` is an
edge to ``package.name`` when that is a module of the project, else to ``package``. Only edges
between the project's own modules are kept.

Asserted:

* no cycle (the message lists the modules of the first one found);
* ``compress_kernels`` never imports ``compress``;
* the layers of ``compress/``: ``core`` (math on tensors) reaches no ``nn``, ``schedule``,
  ``integrations``, ``lightning``, ``eval`` or the CLI, even through other modules; ``nn`` (module
  swaps) reaches none of those but ``core``; ``schedule`` (training-aware steps for any loop) reaches
  no ``integrations``, ``lightning``, ``eval`` or the CLI; ``eval`` reaches no ``integrations``,
  ``lightning`` or the CLI.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"compress": ROOT / "compress", "compress_kernels": ROOT / "kernels"}
FORBIDDEN_LAYERS = {
    "core": {"nn", "schedule", "integrations", "lightning", "eval", "cli"},
    "nn": {"schedule", "integrations", "lightning", "eval", "cli"},
    "schedule": {"integrations", "lightning", "eval", "cli"},
    "eval": {"integrations", "lightning", "cli"},
}


def module_files(packages: dict[str, Path]) -> dict[str, tuple[Path, bool]]:
    """``{dotted module name: (file, is a package's __init__)}`` for every ``.py`` file of ``packages``."""
    found = {}
    for package, folder in packages.items():
        for path in sorted(folder.rglob("*.py")):
            parts = [package, *path.relative_to(folder).with_suffix("").parts]
            is_init = parts[-1] == "__init__"
            found[".".join(parts[:-1] if is_init else parts)] = (path, is_init)
    return found


def _absolute(node: ast.ImportFrom, module: str, is_init: bool) -> str:
    """The absolute module a ``from`` import names (``from ..x import y`` in ``a.b.c`` -> ``a.x``)."""
    if node.level == 0:
        return node.module or ""
    package = module.split(".") if is_init else module.split(".")[:-1]
    base = package[: len(package) - (node.level - 1)]
    if node.level - 1 > len(package) - 1:
        raise ValueError(f"{module}: relative import beyond the top-level package (level {node.level})")
    return ".".join(base + ([node.module] if node.module else []))


def _known_prefix(name: str, modules) -> str | None:
    """``name`` or its longest prefix that is a module of the project (``a.b.Class`` -> ``a.b``)."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in modules:
            return candidate
    return None


def imports_of(module: str, source: str, is_init: bool, modules) -> set[str]:
    """The project modules that ``source`` (the text of ``module``) imports, anywhere in the file."""
    targets = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            targets.update(_known_prefix(alias.name, modules) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node, module, is_init)
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                targets.add(submodule if submodule in modules else _known_prefix(base, modules))
    targets.discard(None)
    targets.discard(module)
    return targets


def import_graph(packages: dict[str, Path]) -> dict[str, set[str]]:
    """``{module: the project modules it imports}`` over every module of ``packages``."""
    files = module_files(packages)
    return {name: imports_of(name, path.read_text(), is_init, files) for name, (path, is_init) in files.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle ``[m0, m1, ..., m0]`` of ``graph`` (depth-first, modules in sorted order), or None."""
    state: dict[str, str] = {}  # "open" while on the current path, "done" once fully explored
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        path.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == "open":
                return path[path.index(target):] + [target]
            if target not in state:
                cycle = visit(target)
                if cycle:
                    return cycle
        path.pop()
        state[node] = "done"
        return None

    for start in sorted(graph):
        if start not in state:
            cycle = visit(start)
            if cycle:
                return cycle
    return None


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    """Every module ``start`` imports, directly or through others."""
    seen, stack = set(), [start]
    while stack:
        for target in graph.get(stack.pop(), ()):
            if target not in seen:
                seen.add(target)
                stack.append(target)
    return seen


def layer(module: str) -> str | None:
    """``core`` / ``nn`` / ``schedule`` / ``integrations`` / ``lightning`` / ``eval`` / ``cli`` for a module
    of ``compress``, else None."""
    parts = module.split(".")
    if parts[0] != "compress" or len(parts) < 2:
        return None
    return parts[1] if parts[1] in {"core", "nn", "schedule", "integrations", "lightning", "eval", "cli"} else None


@pytest.fixture(scope="module")
def graph():
    return import_graph(PACKAGES)


def test_the_graph_covers_both_packages(graph):
    assert {"compress.core.quant", "compress.nn.inference.w8a8", "compress.lightning.callbacks", "compress.eval.timing",
            "compress.cli", "compress_kernels"} <= set(graph)
    assert "compress.core.quant" in graph["compress.nn.inference.w8a8"]


def test_no_import_cycle(graph):
    cycle = find_cycle(graph)
    assert cycle is None, f"import cycle: {' -> '.join(cycle)}"


def test_kernels_never_import_compress(graph):
    offending = {m: sorted(t for t in targets if t.split(".")[0] == "compress")
                 for m, targets in graph.items() if m.split(".")[0] == "compress_kernels"}
    assert not {m: t for m, t in offending.items() if t}


@pytest.mark.parametrize("lower", sorted(FORBIDDEN_LAYERS))
def test_a_layer_reaches_no_layer_built_on_it(graph, lower):
    violations = {module: sorted(t for t in reachable(graph, module) if layer(t) in FORBIDDEN_LAYERS[lower])
                  for module in graph if layer(module) == lower}
    assert not {m: t for m, t in violations.items() if t}, f"{lower} reaches {violations}"


# ---- the finder itself, on made-up graphs and packages -------------------------------------------


def test_find_cycle_reports_the_modules_of_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None
    assert find_cycle({"x": {"x2"}, "x2": {"x"}}) == ["x", "x2", "x"]


def test_a_cycle_through_relative_and_function_level_imports_is_found(tmp_path):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("from .leaf import VALUE\n")
    (package / "sub" / "leaf.py").write_text("def late():\n    from ..top import helper\n    return helper\n")
    (package / "top.py").write_text("from pkg.sub import leaf\n\ndef helper():\n    return leaf\n")
    graph = import_graph({"pkg": package})
    assert graph == {"pkg": set(), "pkg.sub": {"pkg.sub.leaf"}, "pkg.sub.leaf": {"pkg.top"},
                     "pkg.top": {"pkg.sub.leaf"}}
    assert find_cycle(graph) == ["pkg.sub.leaf", "pkg.top", "pkg.sub.leaf"]


def test_a_layer_violation_through_another_module_is_found():
    graph = {"compress.core.quant": {"compress.plan"}, "compress.plan": {"compress.nn.qat"}, "compress.nn.qat": set()}
    assert layer("compress.nn.qat") in FORBIDDEN_LAYERS["core"]
    assert "compress.nn.qat" in reachable(graph, "compress.core.quant")
