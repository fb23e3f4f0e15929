"""Skipping steps whose gradients are not finite: `apply_if_finite`."""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from .._core.base import AbstractTransform, AbstractWrapper, inner_transform
from .._core.fields import NONNEGATIVE_INTEGER, hyperparameter
from .._util.numerics import safe_increment
from ._accumulate import same_types, zeros_like_output
from .._core.fields import Scalar


class ApplyIfFiniteState(NamedTuple):
    """The state of `apply_if_finite`.

    notfinite_count: consecutive updates with an `inf` or `NaN` so far (0 after a finite one).
    last_finite: whether the last update was finite.
    total_notfinite: updates with an `inf` or `NaN` since `init`; never reset.
    inner_state: the wrapped transform's state.
    """

    notfinite_count: jax.Array
    last_finite: jax.Array
    total_notfinite: jax.Array
    inner_state: Any


def all_finite(tree: Any) -> jax.Array:
    """True when every element of every leaf of `tree` is finite (True for an empty tree)."""
    checks = [jnp.all(jnp.isfinite(leaf)) for leaf in jax.tree_util.tree_leaves(tree)]
    return functools.reduce(jnp.logical_and, checks, jnp.array(True))


class ApplyIfFinite(AbstractWrapper):
    """Drops updates holding an `inf` or `NaN`, unless that keeps happening.

    When any element of the incoming updates is not finite, the update is zero and the inner
    state does not change; the step is counted in `notfinite_count` (consecutive) and
    `total_notfinite`. After more than `max_consecutive_errors` non-finite updates in a row,
    the wrapper gives up and lets them through to `inner` (and so into the parameters). A
    finite update resets `notfinite_count`.

    Skipped steps do not advance the inner state, so a scheduled learning rate continues
    where it was (and `Optimizer.learning_rate` reports it so).

    Args:
        inner: the wrapped transform (a modopt or optax one).
        max_consecutive_errors: how many non-finite updates in a row are dropped, an integer
            >= 0 (a hyperparameter: changing it does not retrace).

    Example:
        >>> tx = modopt.apply_if_finite(modopt.adam(1e-3), max_consecutive_errors=5)
    """

    inner: AbstractTransform = inner_transform()
    max_consecutive_errors: Scalar = hyperparameter(check=NONNEGATIVE_INTEGER)

    def init(self, params):
        return ApplyIfFiniteState(
            notfinite_count=jnp.zeros([], jnp.int32),
            last_finite=jnp.array(True),
            total_notfinite=jnp.zeros([], jnp.int32),
            inner_state=self.inner.init(params),
        )

    def acts_elementwise(self) -> bool:
        # Whether all elements are finite is the same however they are grouped into leaves.
        return self.inner.acts_elementwise()

    def skipped_last_step(self, state: ApplyIfFiniteState) -> jax.Array:
        """True when the last update was dropped as non-finite (or the inner transform skipped it)."""
        dropped = jnp.logical_and(~state.last_finite, state.notfinite_count <= self.max_consecutive_errors)
        return jnp.logical_or(dropped, self.inner.skipped_last_step(state.inner_state))

    def update(self, updates, state, params=None, **extra_args):
        finite = all_finite(updates)
        notfinite_count = jnp.where(
            finite, jnp.zeros_like(state.notfinite_count), safe_increment(state.notfinite_count)
        )

        def inner_update(updates, inner_state):
            return self.inner.update(updates, inner_state, params, **extra_args)

        def step():
            new_updates, inner_state = inner_update(updates, state.inner_state)
            return new_updates, same_types(inner_state, state.inner_state)

        def skip():
            return zeros_like_output(inner_update, updates, state.inner_state), state.inner_state

        accept = jnp.logical_or(finite, notfinite_count > self.max_consecutive_errors)
        new_updates, inner_state = jax.lax.cond(accept, step, skip)
        return new_updates, ApplyIfFiniteState(
            notfinite_count=notfinite_count,
            last_finite=finite,
            total_notfinite=jnp.where(finite, state.total_notfinite, safe_increment(state.total_notfinite)),
            inner_state=inner_state,
        )


apply_if_finite = ApplyIfFinite
