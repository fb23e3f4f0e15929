"""Pytree helpers every transform shares: one home for mapping, zeros, casts, selects and norms.

Updates may hold `None` leaves (a frozen parameter, a gradient that does not exist); the
helpers that map over updates carry them through unchanged.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax.typing import DTypeLike


def is_none(x: Any) -> bool:
    """`is_leaf` predicate that stops at `None` (a missing update or a frozen parameter)."""
    return x is None


def map_updates(f: Callable[..., Any], updates: Any, *rest: Any) -> Any:
    """`f(update, *others)` leaf by leaf; where an update is `None` the result is `None`.

    `rest` are trees with the structure of `updates` (states, params).
    """
    return jax.tree_util.tree_map(lambda u, *r: None if u is None else f(u, *r), updates, *rest, is_leaf=is_none)


def zeros_like(tree: Any, dtype: DTypeLike | None = None) -> Any:
    """Zeros shaped like each leaf of `tree` (optax's `tree.zeros_like`).

    Args:
        tree: a pytree of arrays.
        dtype: the dtype of the zeros; `None` for each leaf's own.
    """
    return jax.tree_util.tree_map(lambda x: jnp.zeros_like(x, dtype=dtype), tree)


def full_like(tree: Any, fill_value: Any, dtype: DTypeLike | None = None) -> Any:
    """`fill_value` broadcast to the shape of each leaf of `tree` (optax's `tree.full_like`).

    Args:
        tree: a pytree of arrays.
        fill_value: the value of every element.
        dtype: the dtype of the result; `None` for each leaf's own.
    """
    return jax.tree_util.tree_map(lambda x: jnp.full_like(x, fill_value, dtype=dtype), tree)


def cast(tree: Any, dtype: DTypeLike | None) -> Any:
    """Every leaf cast to `dtype`; the tree as it is when `dtype` is `None` (optax's `tree.cast`).

    Args:
        tree: a pytree of arrays.
        dtype: the dtype to cast to, or `None` to leave the tree unchanged.

    Example:
        >>> import jax.numpy as jnp
        >>> import modopt
        >>> modopt.tree.cast({"w": jnp.ones(2)}, jnp.bfloat16)["w"].dtype
        dtype(bfloat16)
    """
    if dtype is None:
        return tree
    return jax.tree_util.tree_map(lambda x: x.astype(dtype), tree)


def cast_like(tree: Any, other_tree: Any) -> Any:
    """Each leaf of `tree` cast to the dtype of the matching leaf of `other_tree` (optax's
    `tree.cast_like`); where that leaf has no dtype (a Python number), the leaf is left as it is.

    Args:
        tree: the pytree to cast.
        other_tree: a pytree with the structure of `tree` whose leaves give the dtypes.
    """
    return jax.tree_util.tree_map(lambda x, y: x.astype(y.dtype) if hasattr(y, "dtype") else x, tree, other_tree)


def select(condition: Any, tree_x: Any, tree_y: Any) -> Any:
    """`tree_x` where `condition` holds, else `tree_y`, leaf by leaf (optax's `tree.where`).

    Args:
        condition: a boolean (a scalar, or an array broadcasting with every leaf).
        tree_x: the pytree taken where `condition` is true.
        tree_y: the pytree taken where it is false, with the structure of `tree_x`.
    """
    return jax.tree_util.tree_map(lambda a, b: jnp.where(condition, a, b), tree_x, tree_y)


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


def _leaf_vdot(a: Any, b: Any) -> jax.Array:
    """`sum conj(a) * b` over two arrays of one shape, at the highest matmul precision, without
    raveling (a ravel would gather a sharded array; on a mesh of Explicit axes the result is
    replicated)."""
    a, b = jnp.asarray(a), jnp.asarray(b)
    if a.shape != b.shape:
        raise ValueError(f"vdot: the leaves differ in shape: {a.shape} and {b.shape}.")
    if jnp.iscomplexobj(a):
        a = jnp.conj(a)
    mesh = jax.typeof(a).sharding.mesh
    sharding = jax.sharding.NamedSharding(mesh, jax.P()) if mesh.are_all_axes_explicit else None
    return jnp.tensordot(a, b, a.ndim, precision=jax.lax.Precision.HIGHEST, out_sharding=sharding)


def vdot(tree_x: Any, tree_y: Any) -> Any:
    """The inner product `sum conj(x) * y` of two pytrees of one structure (optax's `tree.vdot`).

    Each leaf's product is taken at the highest matmul precision; the sum over leaves starts
    from 0 (an empty tree gives 0).

    Args:
        tree_x: the first pytree (conjugated where complex).
        tree_y: the second pytree, with the structure and shapes of `tree_x`.

    Example:
        >>> import jax.numpy as jnp
        >>> import modopt
        >>> modopt.tree.vdot({"a": jnp.array([1.0, 2.0])}, {"a": jnp.array([3.0, 4.0])})
        Array(11., dtype=float32)
    """
    products = jax.tree_util.tree_map(_leaf_vdot, tree_x, tree_y)
    return jax.tree_util.tree_reduce(operator.add, products, 0)


# ---- pickling tree structures -----------------------------------------------------------------
# A `PyTreeDef` of Equinox modules does not survive pickle: its node data holds Equinox's own
# `MISSING` marker, which pickle copies, and Equinox's unflatten compares it by identity (the
# copy then fails with "'_Missing' object is not subscriptable", and the treedef no longer
# equals the original). What is pickled instead is a tree of that structure with numbered leaves,
# flattened again on loading.


def structure_to_pickle(treedef: Any) -> Any:
    """A picklable stand-in for `treedef`: a tree of its structure, leaves numbered."""
    return treedef.unflatten(range(treedef.num_leaves))


def structure_from_pickle(example: Any) -> Any:
    """The treedef `structure_to_pickle` stood in for (a `PyTreeDef` pickled as such passes)."""
    return example if isinstance(example, jax.tree_util.PyTreeDef) else jax.tree_util.tree_structure(example)


class PicklableTreeDef:
    """A `PyTreeDef` that pickles (see above): `unflatten`, equality with treedefs, hashing."""

    __slots__ = ("treedef",)

    def __init__(self, treedef: Any):
        self.treedef = treedef

    def unflatten(self, leaves: Any) -> Any:
        return self.treedef.unflatten(leaves)

    def __eq__(self, other: Any) -> bool:
        return self.treedef == (other.treedef if isinstance(other, PicklableTreeDef) else other)

    def __hash__(self) -> int:
        return hash(self.treedef)

    def __reduce__(self):
        return _loaded_treedef, (structure_to_pickle(self.treedef),)


def _loaded_treedef(example: Any) -> PicklableTreeDef:
    return PicklableTreeDef(structure_from_pickle(example))
