"""Every relative link in README.md and docs/**/*.md points to a file or folder of the checkout.

Links are Markdown inline links ``[text](target)`` outside code spans and fenced code blocks; web
addresses and in-page anchors are not checked, and a ``#fragment`` after a path is dropped.
"""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md"] + sorted((ROOT / "docs").rglob("*.md"))
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
CODE_SPAN = re.compile(r"`[^`]*`")


def relative_links(text: str) -> list[str]:
    """The relative link targets of a Markdown text, without their ``#fragment``."""
    text = CODE_SPAN.sub("", FENCE.sub("", text))
    targets = (t.split("#", 1)[0] for t in LINK.findall(text))
    return [t for t in targets if t and not re.match(r"^[a-z][a-z0-9+.-]*:", t)]


def test_relative_links_are_found_outside_code_only():
    text = "[a](docs/x.md#part) [b](https://example.org) [c](#top) `[d](nowhere.md)`\n```\n[e](no.md)\n```\n"
    assert relative_links(text) == ["docs/x.md"]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    missing = [t for t in relative_links(page.read_text()) if not (page.parent / t).exists()]
    assert missing == [], f"{page.relative_to(ROOT)}: links to missing files {missing}"
