"""The file tree of docs/architecture.md against the disk, both ways, and no other copy of it.

The tree is the first fenced code block after the heading ``## The tree``. A line is ``<indent><name>
<description>``: two spaces of indent per level below the top, a folder's name ends with ``/``, and
an entry's path is its name under the last folder listed one level up. The rule the doc states:
under ``compress/``, ``kernels/`` and ``scripts/`` the tree lists every ``.py`` and ``.sh`` file
except ``__init__.py`` (``__pycache__`` ignored) and every folder holding one, and nothing else; any
other line names a path of the checkout (``recipes/``, ``tests/``, ...) as one entry.
"""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"
HEADING = "## The tree"
CHECKED = ("compress", "kernels", "scripts")
SUFFIXES = (".py", ".sh")
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)
TREE_LINE = re.compile(r"^\s*(compress|kernels|scripts)/(\s|$)")


def tree_lines(text: str) -> list[str]:
    """The lines of the first fenced block after the ``## The tree`` heading."""
    start = text.find(f"\n{HEADING}\n")
    if start < 0:
        raise ValueError(f"expected a heading {HEADING!r} in {DOC.name}")
    block = FENCE.search(text, start)
    if block is None:
        raise ValueError(f"expected a fenced code block after {HEADING!r} in {DOC.name}")
    return block.group(1).splitlines()


def listed_paths(lines: list[str]) -> list[str]:
    """The path of each entry, folders ending in ``/`` (module docstring)."""
    folders: list[str] = []
    paths = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip(" "))
        if indent % 2 or indent // 2 > len(folders):
            raise ValueError(f"tree line {number}: expected an indent of 2 spaces per level under its folder, "
                             f"got {indent} spaces: {line!r}")
        del folders[indent // 2:]
        name = line.split()[0]
        paths.append("/".join(folders + [name]))
        if name.endswith("/"):
            folders.append(name.rstrip("/"))
    return paths


def modules_on_disk(root: Path) -> set[str]:
    """What the rule asks the tree to list under ``CHECKED`` (module docstring)."""
    found = set()
    for top in CHECKED:
        for path in (root / top).rglob("*"):
            relative = path.relative_to(root)
            if "__pycache__" in relative.parts or not path.is_file():
                continue
            if path.suffix in SUFFIXES and path.name != "__init__.py":
                found.add(relative.as_posix())
                found.update(f"{folder.as_posix()}/" for folder in list(relative.parents)[:-1])
    return found


def under_checked(path: str) -> bool:
    return path.split("/", 1)[0] in CHECKED


@pytest.fixture(scope="module")
def listed() -> list[str]:
    return listed_paths(tree_lines(DOC.read_text()))


def test_tree_lines_give_paths_and_bad_indents_are_refused():
    text = f"# Doc\n\n{HEADING}\n\nThe rule.\n\n```\na/     folder\n  b.py   file\n  c/\n    d.sh\n  e.py\nf/\n```\n"
    assert listed_paths(tree_lines(text)) == ["a/", "a/b.py", "a/c/", "a/c/d.sh", "a/e.py", "f/"]
    with pytest.raises(ValueError, match="tree line 2: expected an indent of 2 spaces"):
        listed_paths(["a/", "   b.py"])
    with pytest.raises(ValueError, match="tree line 2: expected an indent of 2 spaces"):
        listed_paths(["a.py", "  b.py"])
    with pytest.raises(ValueError, match="expected a heading"):
        tree_lines("# Doc\n")


def test_the_rule_finds_modules_and_their_folders(tmp_path):
    for name in ("compress/__init__.py", "compress/core/quant.py", "compress/core/__pycache__/quant.pyc",
                 "compress/README.txt", "scripts/run.sh", "kernels/w8a8/__init__.py"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    assert modules_on_disk(tmp_path) == {"compress/", "compress/core/", "compress/core/quant.py", "scripts/",
                                         "scripts/run.sh"}


def test_entries_are_listed_once(listed):
    assert sorted({p for p in listed if listed.count(p) > 1}) == []


def test_every_listed_path_exists_as_listed(listed):
    wrong = [p for p in listed if not ((ROOT / p).is_dir() if p.endswith("/") else (ROOT / p).is_file())]
    assert wrong == [], f"{DOC.name} lists paths that are not there (a folder ends with '/'): {wrong}"


def test_every_module_and_package_is_listed(listed):
    on_disk = modules_on_disk(ROOT)
    in_tree = {p for p in listed if under_checked(p)}
    assert sorted(on_disk - in_tree) == [], f"add these to the tree in {DOC.name}"
    assert sorted(in_tree - on_disk) == [], f"the tree in {DOC.name} lists what the rule leaves out"


OTHER_PAGES = [p for p in [ROOT / "README.md"] + sorted((ROOT / "docs").rglob("*.md")) if p != DOC]


@pytest.mark.parametrize("page", OTHER_PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_other_page_holds_a_copy_of_the_tree(page):
    copies = [line for block in FENCE.findall(page.read_text()) for line in block.splitlines()
              if TREE_LINE.match(line)]
    assert copies == [], f"{page.relative_to(ROOT)}: link the tree in docs/architecture.md instead of {copies}"
