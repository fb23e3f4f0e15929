"""trax's weight trees: its flatten order, and its global-norm utilities `l2_norm` and `clip_grads`.

trax flattens lists and tuples in order and dicts by the insertion order of their values (not
by sorted keys, as `jax.tree_util` does); anything else, `None` included, is one leaf. Slots
are stored per weight in that order, so the order is part of trax's slot layout.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp

from .._core.fields import Scalar


def flatten(tree: Any) -> list[Any]:
    """The leaves of a trax weight tree, in trax's order (dicts by insertion order)."""
    if isinstance(tree, (list, tuple)):
        return [leaf for child in tree for leaf in flatten(child)]
    if isinstance(tree, dict):
        return [leaf for child in tree.values() for leaf in flatten(child)]
    return [tree]


def unflatten(leaves: Any, like: Any) -> Any:
    """`leaves` (in trax's order) put back into the structure of `like`.

    Lists stay lists, tuples (named ones included) stay tuples of their type, and dicts keep
    their type and key order.
    """
    leaves = list(leaves)
    tree, used = _unflatten(leaves, 0, like)
    if used != len(leaves):
        raise ValueError(f"The tree has {used} leaves but {len(leaves)} values were given.")
    return tree


def _unflatten(leaves: list[Any], start: int, like: Any) -> tuple[Any, int]:
    if isinstance(like, (list, tuple)):
        children = []
        for child in like:
            value, start = _unflatten(leaves, start, child)
            children.append(value)
        if isinstance(like, list):
            return children, start
        return (like._make(children) if hasattr(like, "_make") else type(like)(children)), start
    if isinstance(like, dict):
        items = []
        for key, child in like.items():
            value, start = _unflatten(leaves, start, child)
            items.append((key, value))
        return type(like)(items), start
    if start >= len(leaves):
        raise ValueError(f"The tree has more leaves than the {len(leaves)} values given.")
    return leaves[start], start + 1


def l2_norm_of_leaves(leaves: list[Any]) -> jnp.ndarray:
    """`sqrt(sum vdot(x, x))` over a list of arrays (0 for an empty list)."""
    if not leaves:
        return jnp.zeros([], jnp.float32)
    return jnp.sqrt(sum(jnp.vdot(x, x) for x in leaves))


def clip_leaves(leaves: list[Any], max_norm: Any, norm: Any) -> list[Any]:
    """trax's global-norm clipping: each leaf kept when `norm < max_norm` (strictly), else
    multiplied by `max_norm / norm`."""
    return [jnp.where(norm < max_norm, g, g * (max_norm / norm)) for g in leaves]


def l2_norm(tree: Any) -> jnp.ndarray:
    """The L2 norm of all the arrays of `tree` taken as one vector: `sqrt(sum vdot(x, x))`.

    trax's `base.l2_norm`.

    Args:
        tree: a trax tree (nested lists, tuples and dicts of arrays).

    Example:
        >>> modopt.trax.l2_norm({"w": jnp.ones((2, 2)), "b": [jnp.ones(5)]})
        Array(3., dtype=float32)
    """
    return l2_norm_of_leaves([jnp.asarray(x) for x in flatten(tree)])


def clip_grads(grad_tree: Any, max_norm: Scalar) -> Any:
    """`grad_tree` rescaled so that its global L2 norm is at most `max_norm`.

    trax's `base.clip_grads`: with `n = l2_norm(grad_tree)`, each gradient is kept when
    `n < max_norm` and multiplied by `max_norm / n` otherwise. The result has the structure of
    `grad_tree` (lists, tuples and dicts kept).

    Args:
        grad_tree: a trax tree of gradients.
        max_norm: the largest global L2 norm.
    """
    leaves = [jnp.asarray(g) for g in flatten(grad_tree)]
    return unflatten(clip_leaves(leaves, max_norm, l2_norm_of_leaves(leaves)), grad_tree)
