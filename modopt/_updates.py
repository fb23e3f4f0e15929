"""Applying updates to parameters, and averaged copies of parameters."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from ._trees import is_none, map_updates


def apply_updates(params: Any, updates: Any) -> Any:
    """`params + updates`, leaf by leaf, each result cast back to its parameter's dtype.

    `None` leaves in `params` stay `None`.
    """
    return jax.tree_util.tree_map(
        lambda p, u: None if p is None else jnp.asarray(p + u).astype(jnp.asarray(p).dtype),
        params,
        updates,
        is_leaf=is_none,
    )


def incremental_update(new_tensors: Any, old_tensors: Any, step_size: Any) -> Any:
    """Polyak averaging: `step_size * new + (1 - step_size) * old`, leaf by leaf."""
    return map_updates(lambda new, old: step_size * new + (1.0 - step_size) * old, new_tensors, old_tensors)


def periodic_update(new_tensors: Any, old_tensors: Any, steps: Any, update_period: Any) -> Any:
    """`new_tensors` when `steps` is a multiple of `update_period`, else `old_tensors`."""
    return jax.lax.cond(
        jnp.mod(steps, update_period) == 0, lambda: new_tensors, lambda: old_tensors
    )
