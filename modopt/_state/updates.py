"""Applying updates to parameters, and averaged copies of parameters."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from .._core.checks import check_update_shapes
from .compensated import apply_updates_stochastic
from .._core.types import Params, Updates
from .._util.trees import is_none, map_updates


def apply_updates(params: Params, updates: Updates, *, key: jax.Array | None = None) -> Params:
    """`params + updates`, leaf by leaf, each result cast back to its parameter's dtype.

    `None` leaves in `params` stay `None`. Without `key` (optax's behaviour) each sum is rounded
    to nearest. With `key`, each `bfloat16` and `float16` parameter's sum is formed in float32
    and rounded stochastically to one of its two neighbouring values, up with probability
    equal to its distance from the lower one over their spacing (unbiased: an update too
    small to move the parameter still moves it, on average); other leaves are rounded as
    without a key. Use a new key every step. `apply_updates_kahan` is the other remedy.

    An update must have its parameter's shape (or one broadcasting to it, a scalar); another
    shape is a `ValueError` naming the parameter's path, with or without `key`.

    Args:
        params: the parameters, a pytree of arrays (possibly with `None` leaves).
        updates: the updates, with the structure of `params`.
        key: a PRNG key to round low-precision parameters stochastically, or `None`.

    Example:
        >>> params = modopt.apply_updates(params, updates)
        >>> key, now = jax.random.split(key)
        >>> params = modopt.apply_updates(params, updates, key=now)  # bfloat16 params

    Reference:
        Gupta, Agrawal, Gopalakrishnan, Narayanan, [Deep Learning with Limited Numerical
        Precision](https://arxiv.org/abs/1502.02551), 2015.
    """
    check_update_shapes(params, updates, "apply_updates")
    if key is not None:
        return apply_updates_stochastic(params, updates, key)
    return jax.tree_util.tree_map(
        lambda p, u: None if p is None else jnp.asarray(p + u).astype(jnp.asarray(p).dtype),
        params,
        updates,
        is_leaf=is_none,
    )


def incremental_update(new_tensors: Any, old_tensors: Any, step_size: Any) -> Any:
    """Polyak averaging: `step_size * new + (1 - step_size) * old`, leaf by leaf.

    Args:
        new_tensors: the new values, a pytree.
        old_tensors: the running average, with the structure of `new_tensors`.
        step_size: the weight of the new values, in [0, 1].
    """
    return map_updates(lambda new, old: step_size * new + (1.0 - step_size) * old, new_tensors, old_tensors)


def periodic_update(new_tensors: Any, old_tensors: Any, steps: Any, update_period: Any) -> Any:
    """`new_tensors` when `steps` is a multiple of `update_period`, else `old_tensors`.

    Args:
        new_tensors: the values taken at the update steps, a pytree.
        old_tensors: the values kept otherwise, with the structure of `new_tensors`.
        steps: the step count, an integer scalar.
        update_period: the period, an integer > 0.
    """
    return jax.lax.cond(
        jnp.mod(steps, update_period) == 0, lambda: new_tensors, lambda: old_tensors
    )
