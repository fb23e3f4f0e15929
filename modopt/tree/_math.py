"""Arithmetic, reductions and norms over pytrees: optax's `tree.add`, `tree.norm`, ...

Each maps an array operation over the leaves of one or more pytrees of the same structure
(`jax.tree.map`), or reduces every element of every leaf to one scalar. The helpers modopt's
transforms already share (zeros, fills, selects, inner products, moments) are the same
functions, re-exported here under optax's names.
"""

from __future__ import annotations

import builtins
import functools
import operator
from typing import Any

import jax
import jax.numpy as jnp

from .._state.moments import bias_correction as bias_correction
from .._state.moments import update_infinity_moment as update_infinity_moment
from .._state.moments import update_moment as update_moment
from .._state.moments import update_moment_per_elem_norm as update_moment_per_elem_norm
from .._util.trees import abs_sq, sum_of_squares
from .._util.trees import full_like as full_like
from .._util.trees import select as where
from .._util.trees import vdot as vdot
from .._util.trees import zeros_like as zeros_like
from jax.typing import DTypeLike

__all__ = [
    "add",
    "add_scale",
    "allclose",
    "batch_shape",
    "bias_correction",
    "clip",
    "conj",
    "div",
    "full_like",
    "max",
    "min",
    "mul",
    "norm",
    "ones_like",
    "real",
    "scale",
    "size",
    "sub",
    "sum",
    "update_infinity_moment",
    "update_moment",
    "update_moment_per_elem_norm",
    "vdot",
    "where",
    "zeros_like",
]


def add(tree_x: Any, tree_y: Any, *other_trees: Any) -> Any:
    """The leaf-by-leaf sum of two or more pytrees of one structure.

    Args:
        tree_x: the first pytree.
        tree_y: the second pytree.
        *other_trees: more pytrees to add.

    Example:
        >>> import jax.numpy as jnp
        >>> import modopt
        >>> modopt.tree.add({"a": jnp.ones(2)}, {"a": jnp.ones(2)}, {"a": jnp.ones(2)})
        {'a': Array([3., 3.], dtype=float32)}
    """
    return jax.tree_util.tree_map(lambda *leaves: builtins.sum(leaves), tree_x, tree_y, *other_trees)


def sub(tree_x: Any, tree_y: Any) -> Any:
    """`tree_x - tree_y`, leaf by leaf.

    Args:
        tree_x: the pytree subtracted from.
        tree_y: the pytree subtracted, with the structure of `tree_x`.
    """
    return jax.tree_util.tree_map(operator.sub, tree_x, tree_y)


def mul(tree_x: Any, tree_y: Any) -> Any:
    """`tree_x * tree_y`, leaf by leaf (element-wise).

    Args:
        tree_x: the first pytree.
        tree_y: the second pytree, with the structure of `tree_x`.
    """
    return jax.tree_util.tree_map(operator.mul, tree_x, tree_y)


def div(tree_x: Any, tree_y: Any) -> Any:
    """`tree_x / tree_y`, leaf by leaf (true division).

    Args:
        tree_x: the dividends.
        tree_y: the divisors, with the structure of `tree_x`.
    """
    return jax.tree_util.tree_map(operator.truediv, tree_x, tree_y)


def scale(scalar: Any, tree: Any) -> Any:
    """`scalar * tree`: every leaf multiplied by one scalar.

    Args:
        scalar: the factor (a number or a scalar array).
        tree: the pytree to scale.
    """
    return jax.tree_util.tree_map(lambda x: scalar * x, tree)


def add_scale(tree_x: Any, scalar: Any, tree_y: Any) -> Any:
    """`tree_x + scalar * tree_y`, leaf by leaf; where `tree_x` has `None`, the result has `None`.

    Args:
        tree_x: the pytree added to (`None` leaves stay `None`).
        scalar: the factor of `tree_y`.
        tree_y: the pytree scaled and added, with the structure of `tree_x`.
    """
    scalar = jnp.asarray(scalar)
    return jax.tree_util.tree_map(
        lambda x, y: None if x is None else x + scalar * y, tree_x, tree_y, is_leaf=lambda x: x is None
    )


def sum(tree: Any, associative_reduction: bool = False) -> Any:  # noqa: A001
    """The sum of every element of every leaf (0 for an empty tree).

    Args:
        tree: a pytree of arrays.
        associative_reduction: add the leaves' sums as a balanced tree (`jax.tree.reduce_associative`),
            which can compile faster for trees of many leaves; the order of the additions, and so
            the last bits of a float result, may then differ.
    """
    sums = jax.tree_util.tree_map(jnp.sum, tree)
    if associative_reduction:
        return jax.tree.reduce_associative(operator.add, sums, identity=0)
    return jax.tree_util.tree_reduce(operator.add, sums, 0)


def _extremum(tree: Any, reduce_leaf: Any, combine: Any, start: float) -> Any:
    """`combine` over the reductions of the non-empty leaves, from `start`."""
    per_leaf = jax.tree_util.tree_map(lambda x: None if jnp.size(x) == 0 else reduce_leaf(x), tree)
    return jax.tree_util.tree_reduce(combine, per_leaf, start)


def max(tree: Any) -> Any:  # noqa: A001
    """The largest element of all the leaves (`-inf` for a tree without elements).

    Args:
        tree: a pytree of real arrays (leaves without elements are skipped).
    """
    return _extremum(tree, jnp.max, jnp.maximum, -float("inf"))


def min(tree: Any) -> Any:  # noqa: A001
    """The smallest element of all the leaves (`inf` for a tree without elements).

    Args:
        tree: a pytree of real arrays (leaves without elements are skipped).
    """
    return _extremum(tree, jnp.min, jnp.minimum, float("inf"))


def size(tree: Any) -> int:
    """The number of elements in all the leaves together (a Python int).

    Args:
        tree: a pytree of arrays.
    """
    return builtins.sum(jnp.size(leaf) for leaf in jax.tree_util.tree_leaves(tree))


def conj(tree: Any) -> Any:
    """The complex conjugate of every leaf (real leaves unchanged).

    Args:
        tree: a pytree of arrays.
    """
    return jax.tree_util.tree_map(jnp.conj, tree)


def real(tree: Any) -> Any:
    """The real part of every leaf.

    Args:
        tree: a pytree of arrays.
    """
    return jax.tree_util.tree_map(jnp.real, tree)


def norm(tree: Any, ord: int | str | float | None = None, squared: bool = False) -> jax.Array:  # noqa: A002
    """The vector norm of all the leaves' elements taken together.

    `ord=None` or `2`: `sqrt(sum |x|**2)` (complex leaves by modulus); `1`: `sum |x|`;
    `inf` (or `"inf"`, `"infinity"`): `max |x|`.

    Args:
        tree: a pytree of arrays.
        ord: the order of the norm: `None`, `1`, `2` or `inf`.
        squared: return the norm squared.

    Example:
        >>> import jax.numpy as jnp
        >>> import modopt
        >>> modopt.tree.norm({"a": jnp.array([3.0]), "b": jnp.array([4.0])})
        Array(5., dtype=float32)
    """
    if ord is None or ord == 2:
        total = sum_of_squares(tree)
        return jnp.array(total if squared else jnp.sqrt(total))
    if ord == 1:
        value = sum(jax.tree_util.tree_map(jnp.abs, tree))
    elif ord == jnp.inf or ord in ("inf", "infinity"):
        value = max(jax.tree_util.tree_map(jnp.abs, tree))
    else:
        raise ValueError(f"Invalid ord: {ord!r} (must be None, 1, 2 or inf) in tree.norm.")
    return jnp.array(abs_sq(value) if squared else value)


def batch_shape(tree: Any, shape: tuple[int, ...] = ()) -> Any:
    """Every leaf broadcast to leading batch dimensions `shape`: `(*shape, *leaf.shape)`.

    Args:
        tree: a pytree of arrays.
        shape: the leading dimensions to add.
    """
    return jax.tree_util.tree_map(lambda x: jnp.broadcast_to(x, (*shape, *jnp.shape(x))), tree)


def ones_like(tree: Any, dtype: DTypeLike | None = None) -> Any:
    """Ones shaped like each leaf of `tree`.

    Args:
        tree: a pytree of arrays.
        dtype: the dtype of the ones; `None` for each leaf's own.
    """
    return jax.tree_util.tree_map(lambda x: jnp.ones_like(x, dtype=dtype), tree)


def clip(tree: Any, min_value: Any = None, max_value: Any = None) -> Any:
    """Every leaf clipped to `[min_value, max_value]` (`None`: no bound on that side).

    Args:
        tree: a pytree of arrays.
        min_value: the lower bound, or `None`.
        max_value: the upper bound, or `None`.
    """
    return jax.tree_util.tree_map(lambda x: jnp.clip(x, min_value, max_value), tree)


def allclose(a: Any, b: Any, rtol: Any = 1e-05, atol: Any = 1e-08, equal_nan: bool = False) -> Any:
    """Whether every leaf of `a` is element-wise close to the matching leaf of `b`, as
    `jnp.allclose` decides (`|a - b| <= atol + rtol * |b|`); `True` for empty trees.

    Args:
        a: a pytree of arrays.
        b: a pytree with the structure of `a`.
        rtol: the relative tolerance.
        atol: the absolute tolerance.
        equal_nan: whether NaNs in the same places count as equal.
    """
    close = jax.tree_util.tree_map(lambda x, y: jnp.allclose(x, y, rtol=rtol, atol=atol, equal_nan=equal_nan), a, b)
    return functools.reduce(operator.and_, jax.tree_util.tree_leaves(close), True)
