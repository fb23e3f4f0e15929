"""Registry entries: wrappers family (see `_entry.Entry`)."""

from __future__ import annotations

from ._entry import Entry

ENTRIES: list[Entry] = []
