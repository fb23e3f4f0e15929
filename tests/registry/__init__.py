"""One registry of every transform and optimizer, with what each supports.

The shared checks in `test_registry.py` (and the sharded ones in `test_sharded.py`) run over
every entry; adding a transform means adding one `Entry` to its family's module here. Nothing
is skipped by name: an entry's fields say what applies to it.
"""

from __future__ import annotations

from . import adaptive, contrib, contrib_adaptive, core, diagnostics, inject, layerwise, linesearch, monitoring, privacy, special, trax, wrappers
from . import contrib_parameter_free
from . import contrib_second_order
from . import contrib_muon_adopt
from . import muon_variants
from . import kron
from . import beyond_adam
from . import toplevel
from . import soap
from . import shampoo
from . import quantized
from ._entry import LABELS as LABELS
from ._entry import MASK as MASK
from ._entry import Entry as Entry

ENTRIES: list[Entry] = [
    *core.ENTRIES,
    *adaptive.ENTRIES,
    *layerwise.ENTRIES,
    *special.ENTRIES,
    *wrappers.ENTRIES,
    *monitoring.ENTRIES,
    *linesearch.ENTRIES,
    *inject.ENTRIES,
    *diagnostics.ENTRIES,
    *privacy.ENTRIES,
    *contrib.ENTRIES,
    *contrib_adaptive.ENTRIES,
    *contrib_parameter_free.ENTRIES,
    *contrib_second_order.ENTRIES,
    *contrib_muon_adopt.ENTRIES,
    *muon_variants.ENTRIES,
    *kron.ENTRIES,
    *trax.ENTRIES,
    *beyond_adam.ENTRIES,
    *toplevel.ENTRIES,
    *soap.ENTRIES,
    *shampoo.ENTRIES,
    *quantized.ENTRIES,
]

BY_NAME = {e.name: e for e in ENTRIES}
assert len(BY_NAME) == len(ENTRIES), "registry names must be unique"
