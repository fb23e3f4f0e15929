"""Registry entries: privacy (filled in by its family)."""

from __future__ import annotations

from ._entry import Entry

ENTRIES: list[Entry] = []
