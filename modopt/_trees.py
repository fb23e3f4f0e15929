"""Pytree helpers every transform shares: one home for mapping, zeros, casts, selects and norms.

Updates may hold `None` leaves (a frozen parameter, a gradient that does not exist); the
helpers that map over updates carry them through unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp


def is_none(x: Any) -> bool:
    """`is_leaf` predicate that stops at `None` (a missing update or a frozen parameter)."""
    return x is None


def map_updates(f: Callable[..., Any], updates: Any, *rest: Any) -> Any:
    """`f(update, *others)` leaf by leaf; where an update is `None` the result is `None`.

    `rest` are trees with the structure of `updates` (states, params).
    """
    return jax.tree_util.tree_map(lambda u, *r: None if u is None else f(u, *r), updates, *rest, is_leaf=is_none)


def zeros_like(tree: Any, dtype: Any = None) -> Any:
    """Zeros shaped like each leaf of `tree` (in `dtype` if given)."""
    return jax.tree_util.tree_map(lambda x: jnp.zeros_like(x, dtype=dtype), tree)


def full_like(tree: Any, value: Any, dtype: Any = None) -> Any:
    """`value` broadcast to each leaf of `tree` (in `dtype` if given, else the leaf's)."""
    return jax.tree_util.tree_map(lambda x: jnp.full_like(x, value, dtype=dtype), tree)


def cast(tree: Any, dtype: Any) -> Any:
    """Every leaf cast to `dtype`; the tree as it is when `dtype` is `None`."""
    if dtype is None:
        return tree
    return jax.tree_util.tree_map(lambda x: x.astype(dtype), tree)


def cast_like(tree: Any, like: Any) -> Any:
    """Each leaf of `tree` cast to the dtype of the matching leaf of `like`."""
    return jax.tree_util.tree_map(lambda x, y: x.astype(jnp.asarray(y).dtype), tree, like)


def select(condition: Any, on_true: Any, on_false: Any) -> Any:
    """`on_true` where the scalar `condition` holds, else `on_false`, leaf by leaf."""
    return jax.tree_util.tree_map(lambda a, b: jnp.where(condition, a, b), on_true, on_false)


def abs_sq(x: jax.Array) -> jax.Array:
    """`|x|**2`, real-valued also for complex `x`.

    Args:
        x: an array, real or complex.
    """
    x = jnp.asarray(x)
    return (jnp.conj(x) * x).real


def sum_of_squares(tree: Any) -> jax.Array:
    """`sum |x|**2` over every element of every leaf (a real scalar; 0 for an empty tree)."""
    leaves = jax.tree_util.tree_leaves(tree)
    if not leaves:
        return jnp.zeros([], jnp.float32)
    return sum(jnp.sum(abs_sq(x)) for x in leaves)


def global_norm(tree: Any) -> jax.Array:
    """The L2 norm of all leaves of `tree` taken together (complex leaves by modulus).

    Args:
        tree: a pytree of arrays (`None` leaves are skipped).
    """
    return jnp.sqrt(sum_of_squares(tree))


def vdot(a: Any, b: Any) -> jax.Array:
    """`sum conj(a) * b` over all leaves of two trees of the same structure."""
    products = jax.tree_util.tree_leaves(jax.tree_util.tree_map(lambda x, y: jnp.vdot(x, y), a, b))
    return sum(products) if products else jnp.zeros([], jnp.float32)
