"""Registry entries: Shampoo with grafting (`shampoo`, `scale_by_shampoo`), which optax lacks;
compared step by step with `precondition.distributed_shampoo` in `test_shampoo.py`.

Both start preconditioning at step 1, so the shared checks (5 steps, the resume after 2) use
Shampoo's update, and cut the registry's leaves into blocks: with `block_size=32` the 130 x 136
matrix is a 5 x 5 grid of blocks whose last row and column are padded; the (3, 5) matrix and the
(2, 3, 4) cube are merged into vectors of 15 and 24 (the reference's default), the scalar takes
the grafting update. `shampoo` grafts onto RMSProp and recomputes its roots every 2 steps.
Statistics and preconditioners are stacks of block x block matrices: both entries declare their
own sharding rule (replicated stacks).

The sharded checks compare steps on a mesh with one device's. Inverse roots in float32 amplify
the rounding differences of XLA's sharded reductions by up to the statistics' condition number,
and the early statistics (a few rank-one Gram matrices of the vector, low-rank ones of the edge
blocks) are nearly singular: both entries damp them by `matrix_epsilon=1e-3` of their largest
eigenvalue (the default 1e-6 leaves roots that differ by ~1e-2 of their largest entry between
the two), and compare within 1e-4 (`shampoo`'s states differ by up to ~5e-5 otherwise).
"""

from __future__ import annotations

import modopt

from ._entry import Entry

ENTRIES: list[Entry] = [
    Entry(
        "scale_by_shampoo",
        lambda: modopt.scale_by_shampoo(block_size=32, start_preconditioning_step=1, matrix_epsilon=1e-3),
        None,
        ("beta2", 0.99),
        steps_to_converge=40,  # reaches 5% of the starting loss in 10 steps
        tolerance=1e-4,  # see the module's docstring
        own_rule=True,
        reference="test_shampoo.py",
    ),
    Entry(
        "shampoo",
        lambda: modopt.shampoo(
            0.02,
            block_size=32,
            start_preconditioning_step=1,
            preconditioning_compute_steps=2,
            graft_type="rmsprop",
            matrix_epsilon=1e-3,
        ),
        None,
        ("learning_rate", 0.01),
        descent=True,
        steps_to_converge=40,  # reaches 5% of the starting loss in 7 steps
        tolerance=1e-4,  # see the module's docstring
        own_rule=True,
        reference="test_shampoo.py",
        eager=False,  # the default entry runs the eager step
    ),
]
