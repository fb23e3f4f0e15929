"""Registry entries: Adam-mini, MARS, LaProp, cautious updates and cautious weight decay (see
`_entry.Entry`).

optax 0.2.8 lacks these algorithms: each entry names `test_beyond_adam.py`, which compares them
step by step with their reference implementations (adam-mini, pytorch-optimizer, heavyball) and
with NumPy from the papers. Adam-mini's second moment is one number per block, not shaped like
the parameters: its sharding rule is its own (`own_rule`).
"""

from __future__ import annotations

import modopt

from ._entry import MASK, Entry, schedule

REFERENCE = "references/test_beyond_adam.py"

# One block rule of each kind over the registry's parameters: per column of "matrix" (split
# like its last axis on the sharded mesh), Adam's for "vector", one for "scalar", two heads of
# two along the last axis of "cube", per row of "big".
PARTITION = {
    "matrix": -1,
    "vector": "element",
    "scalar": "leaf",
    "cube": modopt.AdamMiniHeads(2, axis=-1),
    "big": 0,
}

ENTRIES: list[Entry] = [
    Entry("scale_by_laprop", lambda: modopt.scale_by_laprop(), None, ("b1", 0.8), reference=REFERENCE),
    Entry(
        "laprop",
        lambda: modopt.laprop(0.05, weight_decay=1e-3, mask=MASK),
        None,
        ("learning_rate", 0.02),
        descent=True,
        reference=REFERENCE,
    ),
    Entry("scale_by_mars", lambda: modopt.scale_by_mars(), None, ("gamma", 0.05), reference=REFERENCE),
    Entry("mars", lambda: modopt.mars(0.05), None, ("gamma", 0.05), descent=True, reference=REFERENCE),
    Entry(
        "mars_optimize_1d",
        lambda: modopt.mars(modopt.constant_schedule(0.05), weight_decay=1e-3, optimize_1d=True),
        None,
        ("max_norm", 2.0),
        descent=True,
        reference=REFERENCE,
    ),
    Entry(
        "scale_by_adam_mini",
        lambda: modopt.scale_by_adam_mini(),
        None,
        ("b2", 0.99),
        own_rule=True,  # a scalar second moment per parameter
        reference=REFERENCE,
    ),
    Entry(
        "adam_mini_partition",
        lambda: modopt.adam_mini(0.05, weight_decay=1e-3, mask=MASK, partition=PARTITION),
        None,
        ("learning_rate", 0.02),
        descent=True,
        own_rule=True,  # second moments per column, per element, per leaf, per head, per row
        reference=REFERENCE,
    ),
    Entry(
        "cautious_adamw",
        lambda: modopt.cautious(modopt.adamw(0.05)),
        None,
        ("learning_rate", 0.02),
        descent=True,
        reference=REFERENCE,
    ),
    Entry(
        "cautious_lion_direction",
        lambda: modopt.chain(
            modopt.cautious(modopt.scale_by_lion(), negated=False),
            modopt.add_cautious_decayed_weights(1e-3),
            modopt.scale_by_learning_rate(0.02),
        ),
        None,
        ("weight_decay", 2e-3),
        descent=True,
        reference=REFERENCE,
    ),
    Entry(
        "add_cautious_decayed_weights",
        lambda: modopt.add_cautious_decayed_weights(0.01),
        None,
        ("weight_decay", 0.02),
        reference=REFERENCE,
    ),
    Entry(
        "add_cautious_decayed_weights_scheduled_masked",
        lambda: modopt.add_cautious_decayed_weights(schedule(), mask=MASK),
        None,
        reference=REFERENCE,
    ),
]
