"""Registry entries: the rest of optax 0.2.8's top level (`signum`,
`scale_by_distance_over_gradients`, `inject_stateful_hyperparams` and stateful schedules) and
`optax.experimental.aggregating`.

Test adapters, each applied alike to modopt's transform and to the optax oracle:

- `scale_by_distance_over_gradients`: optax 0.2.8 returns the update of a scalar leaf with
  shape `(1,)` (its per-leaf step size has that shape); modopt keeps the leaf's shape. The
  oracle's updates are reshaped to the parameters' shapes (`LeafShapes`): same numbers.
- Aggregators take per-element gradients (every leaf with a batch axis) while the shared
  checks feed gradients shaped like the parameters: `PerElementPair` hands each on as a batch
  of two elements, `g` and `g / 2`, so that means and variances are not trivial.
- `track_per_element_mean_and_variance_with_ema` reads the extra arguments an aggregator
  produces inside `process`; its entry passes them (`_tracker_args`).
- optax 0.2.8's `inject_stateful_hyperparams` warns that it is deprecated (for
  `inject_hyperparams`, the same function there): its oracle is built with the warning silenced.
"""

from __future__ import annotations

import warnings
from typing import Any

import jax
import jax.numpy as jnp
import optax
from optax.experimental import aggregating as optax_aggregating

import modopt
from modopt._core.base import AbstractTransform, Part
from modopt.experimental import aggregating

from ._entry import Entry, optax_schedule, schedule


class LeafShapes:
    """An optax transform whose updates are reshaped to the parameters' shapes."""

    def __init__(self, tx):
        self.tx = tx

    def init(self, params):
        return self.tx.init(params)

    def update(self, updates, state, params=None, **extra_args):
        new, state = self.tx.update(updates, state, params, **extra_args)
        return jax.tree.map(lambda u, g: jnp.reshape(u, jnp.shape(g)), new, updates), state


def _pair(updates):
    return jax.tree.map(lambda g: jnp.stack([g, g / 2]), updates)


class PerElementPair(AbstractTransform):
    """`inner` (which takes per-element updates) fed each update as two elements, `g` and `g / 2`."""

    inner: AbstractTransform

    def init(self, params):
        return self.inner.init(params)

    def update(self, updates, state, params=None, **extra_args):
        return self.inner.update(_pair(updates), state, params, **extra_args)

    def takes_per_example_updates(self):
        return False  # it makes the elements itself

    def state_specs(self, params, param_specs):
        return self.inner.state_specs(params, param_specs)

    def parts(self):
        return (Part("", self.inner, _same),)


def _same(state):
    return state


def _optax_pair(tx):
    def update(updates, state, params=None, **extra_args):
        return tx.update(_pair(updates), state, params, **extra_args)

    return optax.GradientTransformationExtraArgs(tx.init, update)


class HalvingSchedule:
    """A stateful schedule (optax's protocol): `0.1 / 2^k` after `k` updates, its state `k`."""

    def init(self):
        return jnp.zeros([], jnp.int32)

    def update(self, state, **extra_args):
        return state + 1

    def __call__(self, state, **extra_args):
        # float32, not weakly typed (JAX gives `0.1 / 2.0**state` a weak type eagerly only).
        return jnp.float32(0.1) * jnp.float32(0.5) ** state


HALVING = HalvingSchedule()  # one object, so that a new transform with it hashes alike


def _quiet(make):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return make()


def _tracker_args(loss: Any, params: Any) -> dict:
    """What `get_per_element_mean_and_sum_sq_diff_grads` would pass the tracker."""
    return {"sum_sq_diff_grads": jax.tree.map(lambda p: jnp.cos(p) ** 2, params), "sample_size": 4}


ENTRIES: list[Entry] = [
    Entry(
        "signum",
        lambda learning_rate=0.05: modopt.signum(learning_rate, beta=0.8),
        lambda: optax.signum(0.05, beta=0.8),
        ("learning_rate", 0.02),
        descent=True,
        steps_to_converge=600,  # sign steps of 0.05 settle within a step of the minimum
    ),
    Entry(
        "scale_by_distance_over_gradients",
        lambda reps_rel=1e-3: modopt.scale_by_distance_over_gradients(reps_rel=reps_rel),
        lambda: LeafShapes(optax.scale_by_distance_over_gradients(reps_rel=1e-3)),
        ("reps_rel", 1e-4),
        descent_lr=1.0,
        own_rule=True,  # per-leaf numbers replicated, the starting point like the params
    ),
    Entry(
        "inject_stateful_sgd_schedule",
        lambda momentum=0.9: modopt.inject_stateful_hyperparams(modopt.sgd)(
            learning_rate=schedule(), momentum=momentum
        ),
        lambda: _quiet(
            lambda: optax.inject_stateful_hyperparams(optax.sgd)(learning_rate=optax_schedule(), momentum=0.9)
        ),
        ("momentum", 0.8),
        descent=True,
        own_rule=True,  # its own scalars, the inner state by SGD's rule
    ),
    Entry(
        "inject_hyperparams_stateful_schedule",
        # float32 hyperparameters: in bf16 (the params' dtype) b2 = 0.999 would round to 1.
        lambda b1=0.9: modopt.inject_hyperparams(modopt.adam, hyperparam_dtype=jnp.float32)(
            learning_rate=HALVING, b1=b1
        ),
        lambda: optax.inject_hyperparams(optax.adam, hyperparam_dtype=jnp.float32)(
            learning_rate=HALVING, b1=0.9
        ),
        ("b1", 0.8),
        descent=True,
        converges=False,  # the learning rate halves at every step: it stops before the minimum
        own_rule=True,
    ),
    Entry(
        "aggregating_average_incrementally",
        lambda learning_rate=0.1: PerElementPair(
            aggregating.process(
                modopt.identity(), aggregating.average_incrementally_updates(0, 2), modopt.sgd(learning_rate)
            )
        ),
        lambda: _optax_pair(
            optax_aggregating.process(
                optax.identity(), optax_aggregating.average_incrementally_updates(0, 2), optax.sgd(0.1)
            )
        ),
        ("learning_rate", 0.05),
        descent=True,
        own_rule=True,  # each part's state by its own rule
    ),
    Entry(
        "aggregating_add_mean_variance",
        lambda learning_rate=0.1: PerElementPair(
            aggregating.add_mean_variance_to_opt(modopt.adam(learning_rate), ema_decay=0.8)
        ),
        lambda: _optax_pair(optax_aggregating.add_mean_variance_to_opt(optax.adam(0.1), ema_decay=0.8)),
        ("learning_rate", 0.05),
        descent=True,
        own_rule=True,
    ),
    Entry(
        "accumulate_avg_updates",
        lambda: aggregating.accumulate_avg_updates(3),
        lambda: optax_aggregating.accumulate_avg_updates(3),
        steps_to_converge=900,  # a step every third update
    ),
    Entry(
        "track_per_element_mean_and_variance_with_ema",
        lambda ema_decay=0.9: aggregating.track_per_element_mean_and_variance_with_ema(ema_decay),
        lambda: optax_aggregating.track_per_element_mean_and_variance_with_ema(0.9),
        ("ema_decay", 0.7),
        extra_args=_tracker_args,
    ),
]
