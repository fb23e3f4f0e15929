"""Registry entries: `with_diagnostics`, against optax's inner optimizer with the diagnostics
computed in NumPy (float64) from its gradients and updates."""

from __future__ import annotations

import jax
import numpy as np
import optax

import modopt

from ._entry import Entry, optax_schedule, schedule


class DiagnosticsReference:
    """optax's `inner`, its state wrapped as `modopt.DiagnosticsState` computed independently."""

    def __init__(self, inner, learning_rate):
        self.inner, self.learning_rate = inner, learning_rate  # learning_rate(step) -> the rate applied

    def init(self, params):
        nan = np.float32(np.nan)
        return modopt.DiagnosticsState(np.int32(0), np.int32(0), nan, nan, nan, self.inner.init(params))

    def update(self, updates, state, params=None, **extra_args):
        new_updates, inner_state = self.inner.update(updates, state.inner_state, params, **extra_args)
        norm = lambda tree: np.float32(np.sqrt(sum(np.sum(np.asarray(x, np.float64) ** 2) for x in jax.tree.leaves(tree))))  # noqa: E731
        return new_updates, modopt.DiagnosticsState(
            np.int32(state.steps + 1),
            np.int32(state.skipped_steps),  # these inner optimizers never skip
            norm(updates),
            norm(new_updates),
            np.float32(self.learning_rate(int(state.steps))),
            inner_state,
        )


ENTRIES = [
    Entry(
        "with_diagnostics_adamw_schedule",
        lambda: modopt.with_diagnostics(modopt.chain(modopt.clip_by_global_norm(100.0), modopt.adamw(schedule(), weight_decay=1e-2))),
        lambda: DiagnosticsReference(
            optax.chain(optax.clip_by_global_norm(100.0), optax.adamw(optax_schedule(), weight_decay=1e-2)), optax_schedule()
        ),
        ("peak_value", 0.07),
        descent=True,
        converges=False,  # the schedule decays to ~0 after 50 steps, by design
    ),
    Entry(
        "with_diagnostics_sgd",
        lambda learning_rate=0.1: modopt.with_diagnostics(modopt.sgd(learning_rate, momentum=0.5)),
        lambda: DiagnosticsReference(optax.sgd(0.1, momentum=0.5), lambda step: 0.1),
        ("learning_rate", 0.05),
        descent=True,
    ),
]
