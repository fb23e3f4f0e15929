"""Registry entries: `inject_hyperparams` around modopt and optax factories.

optax 0.2.8's `inject_hyperparams` keeps a fourth state field (`hyperparams_states`, the step
count of each schedule); the seeds' `InjectHyperparamsState` has three. The oracle is optax's
transform seen through the seeds' layout: each schedule's count is the state's count.
"""

from __future__ import annotations

import jax.numpy as jnp
import optax
from optax.schedules._inject import InjectStatefulHyperparamsState, WrappedScheduleState

import modopt

from ._entry import MASK, Entry, optax_schedule, schedule


class SeedsLayout:
    """optax's `inject_hyperparams(...)` with the state as `InjectHyperparamsState(count, hyperparams, inner_state)`."""

    def __init__(self, tx, scheduled=()):
        self.tx, self.scheduled = tx, tuple(scheduled)

    def init(self, params):
        state = self.tx.init(params)
        return modopt.InjectHyperparamsState(state.count, state.hyperparams, state.inner_state)

    def update(self, updates, state, params=None, **extra_args):
        schedules = {name: WrappedScheduleState(state.count) for name in self.scheduled}
        full = InjectStatefulHyperparamsState(state.count, dict(state.hyperparams), schedules, state.inner_state)
        updates, new = self.tx.update(updates, full, params, **extra_args)
        return updates, modopt.InjectHyperparamsState(new.count, new.hyperparams, new.inner_state)


ENTRIES = [
    Entry(
        "inject_adam",
        # float32 hyperparameters: in bf16 (the params' dtype) b2 = 0.999 would round to 1.
        lambda learning_rate=0.05: modopt.inject_hyperparams(modopt.adam, hyperparam_dtype=jnp.float32)(
            learning_rate=learning_rate, b1=0.8
        ),
        lambda: SeedsLayout(optax.inject_hyperparams(optax.adam, hyperparam_dtype=jnp.float32)(learning_rate=0.05, b1=0.8)),
        ("learning_rate", 0.01),  # lives in the state: `set` writes it there
        descent=True,
    ),
    Entry(
        "inject_sgd_schedule_momentum",
        lambda: modopt.inject_hyperparams(modopt.sgd)(learning_rate=schedule(), momentum=0.9),
        lambda: SeedsLayout(optax.inject_hyperparams(optax.sgd)(learning_rate=optax_schedule(), momentum=0.9), ["learning_rate"]),
        ("peak_value", 0.07),  # a number of the schedule, in the transform
        descent=True,
        converges=False,  # the schedule decays to ~0 after 50 steps, by design
    ),
    Entry(
        "inject_adamw_static_mask",
        lambda: modopt.inject_hyperparams(modopt.adamw, static_args="mask", hyperparam_dtype=jnp.float32)(
            0.05, weight_decay=1e-2, mask=MASK
        ),
        lambda: SeedsLayout(
            optax.inject_hyperparams(optax.adamw, static_args="mask", hyperparam_dtype=jnp.float32)(
                0.05, weight_decay=1e-2, mask=MASK
            )
        ),
        ("weight_decay", 1e-3),
        descent=True,
    ),
    Entry(
        "inject_optax_factory",
        lambda: modopt.inject_hyperparams(optax.rmsprop)(learning_rate=0.01, decay=0.8),
        lambda: SeedsLayout(optax.inject_hyperparams(optax.rmsprop)(learning_rate=0.01, decay=0.8)),
        ("decay", 0.7),
        descent=True,
    ),
    Entry(
        "inject_scale_by_adam_scheduled_b1",
        lambda: modopt.inject_hyperparams(modopt.scale_by_adam)(b1=modopt.linear_schedule(0.5, 0.9, 10), b2=0.99),
        lambda: SeedsLayout(optax.inject_hyperparams(optax.scale_by_adam)(b1=optax.linear_schedule(0.5, 0.9, 10), b2=0.99), ["b1"]),
        ("b2", 0.98),
        descent_lr=0.05,
    ),
]
