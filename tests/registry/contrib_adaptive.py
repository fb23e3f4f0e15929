"""Registry entries: contrib's adaptive and parameter-free optimizers (see `_entry.Entry`):
AdEMAMix and its simplified form, ACProp, DoG, DoWG and COCOB, against `optax.contrib`.

DoG and DoWG keep a copy of the parameters and scalars (placed by the generic rule); their
step sizes come from global norms, so they are not elementwise. Schedules for AdEMAMix's `b3`
and `alpha`, masks, and errors are in `test_contrib_adaptive.py`.
"""

from __future__ import annotations

import optax

from modopt import contrib

from ._entry import MASK, Entry

ENTRIES: list[Entry] = [
    Entry(
        "scale_by_ademamix",
        lambda b3=0.999: contrib.scale_by_ademamix(b3=b3),
        lambda: optax.contrib.scale_by_ademamix(b3=0.999),
        ("b3", 0.99),
        descent_lr=0.01,
    ),
    Entry(
        "ademamix",
        lambda: contrib.ademamix(0.01, b3=0.99, alpha=2.0, weight_decay=0.01, mask=MASK),
        lambda: optax.contrib.ademamix(0.01, b3=0.99, alpha=2.0, weight_decay=0.01, mask=MASK),
        ("alpha", 3.0),
        descent=True,
    ),
    Entry(
        "scale_by_simplified_ademamix",
        lambda: contrib.scale_by_simplified_ademamix(b1=0.9, alpha=1.0),
        lambda: optax.contrib.scale_by_simplified_ademamix(b1=0.9, alpha=1.0),
        ("alpha", 2.0),
        descent_lr=0.005,
    ),
    Entry(
        "simplified_ademamix",
        lambda: contrib.simplified_ademamix(0.005, b1=0.9, alpha=1.0, weight_decay=0.01),
        lambda: optax.contrib.simplified_ademamix(0.005, b1=0.9, alpha=1.0, weight_decay=0.01),
        ("b2", 0.9),
        descent=True,
    ),
    Entry(
        "scale_by_acprop",
        lambda: contrib.scale_by_acprop(),
        lambda: optax.contrib.scale_by_acprop(),
        ("eps", 1e-8),
        descent_lr=0.02,
    ),
    Entry(
        "acprop",
        lambda: contrib.acprop(0.02, weight_decay=0.01, mask=MASK),
        lambda: optax.contrib.acprop(0.02, weight_decay=0.01, mask=MASK),
        ("b1", 0.8),
        descent=True,
    ),
    Entry(
        "dog",
        lambda: contrib.dog(),
        lambda: optax.contrib.dog(),
        ("init_step_value", 1e-5),
        descent=True,
    ),
    Entry(
        "dog_learning_rate_weight_decay",
        lambda: contrib.dog(0.5, init_step=("learning_rate", 0.01), weight_decay=1e-3, mask=MASK),
        lambda: optax.contrib.dog(0.5, init_step=("learning_rate", 0.01), weight_decay=1e-3, mask=MASK),
        ("weight_decay", 2e-3),
        descent=True,
    ),
    Entry(
        "dog_distance",
        lambda: contrib.dog(init_step=("distance", 0.01)),
        lambda: optax.contrib.dog(init_step=("distance", 0.01)),
        ("eps", 1e-6),
        descent=True,
    ),
    Entry(
        "dowg",
        lambda: contrib.dowg(),
        lambda: optax.contrib.dowg(),
        ("eps", 1e-3),
        descent=True,
    ),
    Entry(
        "dowg_init_estim_weight_decay",
        lambda: contrib.dowg(init_estim_sq_dist=0.01, weight_decay=1e-3),
        lambda: optax.contrib.dowg(init_estim_sq_dist=0.01, weight_decay=1e-3),
        ("init_estim_sq_dist", 0.02),
        descent=True,
    ),
    Entry(
        "cocob",
        lambda: contrib.cocob(),
        lambda: optax.contrib.cocob(),
        ("alpha", 50.0),
        descent=True,
    ),
    Entry(
        "cocob_weight_decay",
        lambda: contrib.cocob(0.5, alpha=10.0, weight_decay=1e-3, mask=MASK),
        lambda: optax.contrib.cocob(0.5, alpha=10.0, weight_decay=1e-3, mask=MASK),
        ("learning_rate", 0.8),
        descent=True,
    ),
]
