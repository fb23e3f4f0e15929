"""Constraints on updates and parameters: non-negative parameters, NaN-free updates."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from .._core.base import AbstractTransform, EmptyState, init_empty_state, require_params
from .._core.specs import REPLICATED
from .._util.trees import is_none, map_updates


class KeepParamsNonnegative(AbstractTransform):
    """Keeps the parameters >= 0 after the update: where `p + u < 0` the update becomes `-p`.

    Put it last in a chain, after the learning rate. Parameters that are already negative are
    moved to 0. A `None` parameter gives a `None` update.
    """

    elementwise_updates = True

    def init(self, params):
        return init_empty_state(params)

    def update(self, updates, state, params=None, **extra_args):
        require_params(params, self)

        def clamp(u, p):
            return None if p is None else jnp.where(p + u < 0.0, -p, u)

        return map_updates(clamp, updates, params), state


class ZeroNansState(NamedTuple):
    """Per parameter leaf, a boolean scalar: whether the last update had a NaN (now zeroed)."""

    found_nan: Any


class ZeroNans(AbstractTransform):
    """Replaces NaNs in the updates by 0, recording in its state which leaves had any.

    The flags are for the user (logging, skipping a step); the transform does not read them.
    A leaf whose update is `None` is flagged `False`.
    """

    def init(self, params):
        return ZeroNansState(found_nan=jax.tree_util.tree_map(lambda _: jnp.zeros([], jnp.bool_), params))

    def state_specs(self, params, param_specs):
        # One scalar flag per parameter leaf, whatever the parameter's layout: replicated.
        return ZeroNansState(found_nan=jax.tree_util.tree_map(lambda _: REPLICATED, params))

    def update(self, updates, state, params=None, **extra_args):
        def flag(u, old):
            if old is None:
                return None
            return jnp.zeros_like(old) if u is None else jnp.any(jnp.isnan(u))

        # Mapped over the updates with the old flags alongside, so the state keeps its structure.
        found_nan = jax.tree_util.tree_map(flag, updates, state.found_nan, is_leaf=is_none)
        updates = map_updates(lambda u: jnp.where(jnp.isnan(u), jnp.zeros_like(u), u), updates)
        return updates, ZeroNansState(found_nan=found_nan)


keep_params_nonnegative = KeepParamsNonnegative
zero_nans = ZeroNans

NonNegativeParamsState = EmptyState  # named as in optax
