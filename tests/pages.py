"""The README's and the docs pages' sections and Python blocks, for the tests that run them."""

from __future__ import annotations

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent


def read(page: str) -> str:
    """The text of `page`, a path from the repository root (`README.md`, `docs/...`)."""
    return (ROOT / page).read_text()


def section(page: str, title: str) -> str:
    """The section `## title` of `page`, up to the next `## ` heading."""
    text = read(page)
    marker = f"\n## {title}\n"
    assert marker in text, f"{page} has no section {title!r}"
    return text.split(marker, 1)[1].split("\n## ", 1)[0]


def python_blocks(text: str) -> list[str]:
    """The fenced Python blocks of `text`, in order."""
    return re.findall(r"```python\n(.*?)```", text, re.S)
