"""Random pytrees: optax's `tree.split_key_like`, `tree.random_like`, `tree.unwrap_random_key_data`."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import jax
from jax.typing import DTypeLike


def split_key_like(rng_key: jax.Array, target_tree: Any) -> Any:
    """One new key per leaf of `target_tree`, split from `rng_key`, in a tree of its structure.

    Args:
        rng_key: the key to split: a typed key (`jax.random.key`) or a raw `uint32` one
            (`jax.random.PRNGKey`); the keys returned are of the same kind.
        target_tree: the pytree whose structure the keys take.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> import modopt
        >>> keys = modopt.tree.split_key_like(jax.random.key(0), {"a": jnp.ones(2), "b": jnp.ones(3)})
        >>> sorted(keys)
        ['a', 'b']
    """
    treedef = jax.tree_util.tree_structure(target_tree)
    keys = jax.random.split(rng_key, treedef.num_leaves)
    return jax.tree_util.tree_unflatten(treedef, list(keys))


def random_like(
    rng_key: jax.Array,
    target_tree: Any,
    sampler: Callable[..., Any] = jax.random.normal,
    dtype: DTypeLike | None = None,
) -> Any:
    """A tree of random arrays shaped like the leaves of `target_tree`, one split key per leaf.

    Each leaf is `sampler(key, leaf.shape, dtype or leaf.dtype)`, placed like the leaf where the
    sampler takes `out_sharding`.

    Args:
        rng_key: the key the leaves' keys are split from (see `split_key_like`).
        target_tree: the pytree of arrays whose shapes (and dtypes) the result takes.
        sampler: `sampler(key, shape, dtype)`, such as `jax.random.normal` (the default) or
            `jax.random.rademacher` (integer dtypes only); one that also takes `out_sharding`
            gets each leaf's sharding.
        dtype: the dtype of every leaf; `None` for each target leaf's own.
    """
    keys = split_key_like(rng_key, target_tree)
    takes_sharding = "out_sharding" in inspect.signature(sampler).parameters

    def draw(leaf, key):
        leaf_dtype = dtype or leaf.dtype
        if takes_sharding:
            return sampler(key, leaf.shape, leaf_dtype, out_sharding=jax.typeof(leaf).sharding)
        return sampler(key, leaf.shape, leaf_dtype)

    return jax.tree_util.tree_map(draw, target_tree, keys)


def unwrap_random_key_data(input_tree: Any) -> Any:
    """`input_tree` with every typed PRNG key replaced by its raw key data (to compare numbers).

    Args:
        input_tree: a pytree of arrays and typed keys (`jax.random.key`); other leaves are
            returned as they are.
    """

    def unwrap(x):
        if isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            return jax.random.key_data(x)
        return x

    return jax.tree_util.tree_map(unwrap, input_tree)
