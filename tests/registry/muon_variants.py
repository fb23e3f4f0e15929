"""Registry entries: NorMuon and AdaMuon (Muon's adaptive variants), which optax lacks.

Their reference is `pytorch_optimizer` (`NorMuon`, `AdaMuon`), compared step by step in
`test_muon_variants.py`. By default the registry's `matrix` and `big` are orthogonalized and
the vector, scalar and 3-d `cube` go to Adam; `CUBE_DIMS` makes the cube two 3x4 matrices (axis
0 a batch axis). The scale-by transforms take matrices only, so their entries run inside
`masked` (the vector and scalar pass through). NorMuon's per-neuron second moment has a
sharding rule of its own (`own_rule`): it also runs on 8 simulated devices.
"""

from __future__ import annotations

import modopt
from modopt.contrib import MuonDimensionNumbers

from ._entry import MASK, Entry, schedule

REFERENCE = "references/test_muon_variants.py"
# The cube (2, 3, 4): two 3x4 matrices; `None` entries are plain matrices for the scale-by
# transforms (and Adam's parameters for the optimizers).
CUBE_DIMS = {"matrix": None, "vector": None, "scalar": None, "cube": MuonDimensionNumbers(1, 2), "big": None}
WITH_CUBE = {**CUBE_DIMS, "matrix": MuonDimensionNumbers(0, 1), "big": MuonDimensionNumbers(0, 1)}

ENTRIES: list[Entry] = [
    Entry(
        "normuon",
        lambda: modopt.normuon(0.2),
        None,
        ("b2", 0.9),
        descent=True,
        own_rule=True,  # the neurons' second moment drops the reduction axes of the parameter's spec
        reference=REFERENCE,
    ),
    Entry(
        "normuon_preserve_norm_cube",
        lambda: modopt.normuon(
            0.5,
            "dion",
            consistent_rms=None,
            nesterov=False,
            weight_decay=1e-3,
            weight_decay_mask=MASK,
            adam_learning_rate=0.05,
            muon_weight_dimension_numbers=WITH_CUBE,
        ),
        None,
        ("beta", 0.9),
        descent=True,
        # Muon's width scaling gives fixed-size steps: crossing the distance to the target takes
        # a large rate and a few hundred steps, as for `muon`.
        steps_to_converge=400,
        own_rule=True,  # as normuon
        reference=REFERENCE,
    ),
    Entry(
        "scale_by_normuon",
        lambda: modopt.masked(modopt.scale_by_normuon(weight_dimension_numbers=CUBE_DIMS), MASK),
        None,
        ("consistent_rms", 0.3),
        own_rule=True,  # as normuon
        reference=REFERENCE,
    ),
    Entry(
        "adamuon",
        lambda: modopt.adamuon(0.2),
        None,
        ("b2", 0.9),
        descent=True,
        reference=REFERENCE,
    ),
    Entry(
        "adamuon_unsigned_cube",
        lambda: modopt.adamuon(
            schedule(),
            nesterov=False,
            sign_stabilization=False,
            preconditioning="schatten",
            weight_decay=0.01,
            weight_decay_mask=MASK,
            adam_nesterov=True,
            muon_weight_dimension_numbers=WITH_CUBE,
        ),
        None,
        ("adam_b2", 0.99),
        descent=True,
        converges=False,  # the schedule decays to ~0 after 50 steps, by design
        reference=REFERENCE,
    ),
    Entry(
        "scale_by_adamuon",
        lambda: modopt.masked(modopt.scale_by_adamuon(weight_dimension_numbers=CUBE_DIMS), MASK),
        None,
        ("consistent_rms", 0.3),
        reference=REFERENCE,
    ),
]
