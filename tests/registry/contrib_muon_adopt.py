"""Registry entries: contrib's Muon, ADOPT, MADGRAD and normalize, against `optax.contrib`.

Muon's default labels send the registry's `matrix` and `big` to Newton-Schulz and the vector,
scalar and 3-d `cube` to Adam; `muon_cube_dims` gives the cube `MuonDimensionNumbers` (axis 0
a batch axis: two 3x4 matrices) and sends the vector and scalar to Adam. Muon declares its
own sharding rule (momentum like the parameters), so its entries also run on 8 simulated
devices, where Newton-Schulz multiplies matrices split over the "model" axis. Orthogonality,
dimension numbers on other layouts and bad arguments are in `test_contrib_muon.py`.
"""

from __future__ import annotations

import optax

from modopt import contrib

from ._entry import MASK, Entry, optax_schedule, schedule

CUBE_DIMS = {"matrix": (0, 1), "vector": None, "scalar": None, "cube": (1, 2), "big": (0, 1)}


def dims(kind):
    """`CUBE_DIMS` as `kind` (modopt's or optax's `MuonDimensionNumbers`)."""
    return {name: None if axes is None else kind(*axes) for name, axes in CUBE_DIMS.items()}


def half_quarter_power(count):
    """A clipping bound for ADOPT: `0.5 * count ** 0.25` (module level: the same function each time)."""
    return 0.5 * count**0.25


ENTRIES: list[Entry] = [
    Entry(
        "muon",
        lambda: contrib.muon(0.5),
        lambda: optax.contrib.muon(0.5),
        ("learning_rate", 0.2),
        descent=True,
        # Orthogonalized steps have a fixed spectral size, whatever the gradient's: crossing the
        # distance to the random 130x136 target takes a large rate and a few hundred steps.
        steps_to_converge=400,
        # Five Newton-Schulz iterations amplify rounding: compiled without LLVM's optimizations
        # (as the suite compiles, see conftest.py), one of the 17680 entries of the first
        # eager step is 1e-5 (relative) off optax's jitted one.
        tolerance=1e-5,
        own_rule=True,  # the momentum follows each matrix; count and coefficients replicated
    ),
    Entry(
        "muon_cube_dims",
        lambda: contrib.muon(
            schedule(),
            nesterov=False,
            weight_decay=0.01,
            weight_decay_mask=MASK,
            preconditioning="aol",
            consistent_rms=0.2,
            adam_learning_rate=0.05,
            muon_weight_dimension_numbers=dims(contrib.MuonDimensionNumbers),
        ),
        lambda: optax.contrib.muon(
            optax_schedule(),
            nesterov=False,
            weight_decay=0.01,
            weight_decay_mask=MASK,
            preconditioning="aol",
            consistent_rms=0.2,
            adam_learning_rate=0.05,
            muon_weight_dimension_numbers=dims(optax.contrib.MuonDimensionNumbers),
        ),
        ("beta", 0.9),
        descent=True,
        converges=False,  # the schedule decays to ~0 after 50 steps, by design
        own_rule=True,  # as muon
    ),
    Entry(
        "muon_dion_adaptive",
        lambda: contrib.muon(0.1, "dion", adaptive=True, adam_b2=0.99),
        lambda: optax.contrib.muon(0.1, "dion", adaptive=True, adam_b2=0.99),
        ("adam_b2", 0.95),
        descent=True,
        converges=False,  # <M, O> grows with the momentum's size: the step does not shrink near the minimum
        # <M, O> sums 17680 products, in an order jit changes: ~1e-5 relative in every update.
        tolerance=1e-4,
        own_rule=True,  # as muon
    ),
    Entry(
        "scale_by_adopt",
        lambda: contrib.scale_by_adopt(),
        lambda: optax.contrib.scale_by_adopt(),
        ("b2", 0.999),
        descent_lr=0.05,
    ),
    Entry(
        "adopt",
        lambda: contrib.adopt(0.05, b1=0.8, nesterov=True, clip_value_fn=half_quarter_power),
        lambda: optax.contrib.adopt(0.05, b1=0.8, nesterov=True, clip_value_fn=half_quarter_power),
        ("learning_rate", 0.02),
        descent=True,
    ),
    Entry(
        "adopt_unclipped",
        lambda: contrib.adopt(schedule(), b2=0.99, use_clipping=False),
        lambda: optax.contrib.adopt(optax_schedule(), b2=0.99, use_clipping=False),
        ("eps", 1e-5),
        descent=True,
        converges=False,  # the schedule decays to ~0 after 50 steps, by design
        # Unclipped, g / sqrt(v) reaches ~40 where v is small, and the momentum's sums cancel
        # to ~1e-2 of that: float rounding (jitted against eager) shows at ~1e-5.
        tolerance=1e-5,
    ),
    Entry(
        "scale_by_madgrad",
        lambda: contrib.scale_by_madgrad(0.05),
        lambda: optax.contrib.scale_by_madgrad(0.05),
        ("momentum", 0.8),
        descent=True,
    ),
    Entry(
        "madgrad",
        lambda: contrib.madgrad(schedule(), momentum=0.5, weight_decay=1e-3),
        lambda: optax.contrib.madgrad(optax_schedule(), momentum=0.5, weight_decay=1e-3),
        ("weight_decay", 1e-2),
        descent=True,
    ),
    Entry(
        "normalize",
        lambda: contrib.normalize(),
        lambda: optax.contrib.normalize(),
        descent_lr=1.0,  # unit global norm: the steps of a fixed size must cross the distance
    ),
]
