"""Markdown and JSON helpers shared by the results pages' sections (:mod:`scripts.bench.pages`,
:mod:`scripts.bench.llm_sections`)."""
from __future__ import annotations

from pathlib import Path


def require(data: dict, key: str, where: str):
    """``data[key]``, or a ValueError naming the file and the key that is missing."""
    if not isinstance(data, dict):
        raise TypeError(f"{where}: expected a JSON object, got {type(data).__name__}")
    if key not in data:
        raise ValueError(f"{where}: expected a {key!r} entry, found only {sorted(data)}")
    return data[key]


def table(head: list[str], rows: list[list[str]]) -> list[str]:
    """A Markdown table (a list of lines)."""
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


VERDICT = {True: "met", False: "**not met**", None: "not measured"}


def ratio(value) -> str:
    return "-" if value is None else f"{value:.2f}x"


def provenance(report: dict) -> str:
    """The code a run measured, when its JSON says (optional ``provenance``: commit and note)."""
    code = report.get("provenance")
    return "" if not code else f" Code: commit `{code['commit']}`; {code['note']}."


def plot_lines(data: dict) -> list[str]:
    """An image link to the report's plot (``plot``: a path from the repository root; the docs' link
    test checks that it resolves) and what to know of it (``plot_note``), if the data name one."""
    plot = data.get("plot")
    if plot is None:
        return []
    note = data.get("plot_note")
    return ["", f"![{Path(plot).stem}: metric against speed, from compress evaluate](../../{plot})"] + \
        (["", note] if note else [])
