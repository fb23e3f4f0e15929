"""Registry entries: PSGD Kron (`kron`, `scale_by_kron`), an algorithm optax lacks.

Parity is in `test_kron.py` (kron_torch fed the same probes, and NumPy from the paper); the
shared checks here run dtype, retrace, convergence, placement and Orbax resume. The
preconditioner's factors are `(d, d)` and `(d,)` arrays per axis, not shaped like the
parameters: the transform has its own sharding rule (`own_rule`), so both entries also run on
8 simulated devices. The registry's 130 x 136 leaf gets two triangular factors; the 2 x 3 x 4
cube is merged to 6 x 4.
"""

from __future__ import annotations

import jax.numpy as jnp

import modopt

from ._entry import MASK, Entry, schedule

ENTRIES: list[Entry] = [
    Entry(
        "kron",
        lambda: modopt.kron(0.2),
        None,
        ("learning_rate", 0.1),
        descent=True,
        steps_to_converge=60,  # reaches 5% of the starting loss in 18 steps
        own_rule=True,  # the factors follow the parameter's axis they precondition
        reference="references/test_kron.py",
    ),
    Entry(
        "scale_by_kron_options",
        lambda: modopt.scale_by_kron(
            b1=0.5,
            preconditioner_update_probability=0.5,
            memory_save_mode="one_diag",
            momentum_into_precond_update=False,
            precond_lr=0.3,
            mu_dtype=jnp.bfloat16,
            balance_prob=0.5,
            key=7,
        ),
        None,
        ("precond_lr", 0.2),
        descent_lr=0.05,
        steps_to_converge=120,  # reaches 5% of the starting loss in 49 steps
        own_rule=True,  # as kron
        reference="references/test_kron.py",
        eager=False,  # the default entry runs the eager step
    ),
    Entry(
        "kron_scheduled_decay",
        lambda: modopt.kron(
            schedule(), weight_decay=0.01, weight_decay_mask=MASK, preconditioner_update_probability=modopt.precond_update_prob_schedule(0.9, 0.1, 0.5, 2), merge_dims=False
        ),
        None,
        ("b1", 0.8),
        descent=True,
        converges=False,  # the schedule decays to ~0 after 50 steps, by design
        own_rule=True,  # as kron
        reference="references/test_kron.py",
        eager=False,  # the default entry runs the eager step
    ),
]
