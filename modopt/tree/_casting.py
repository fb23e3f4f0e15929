"""Dtypes of pytrees: optax's `tree.cast`, `tree.cast_like` and `tree.dtype`."""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp

from .._util.trees import cast as cast
from .._util.trees import cast_like as cast_like

_HANDLERS = (None, "promote", "highest", "lowest")


def dtype(tree: Any, mixed_dtype_handler: str | None = None) -> Any:
    """The dtype of the leaves of `tree` (JAX's default dtype of an empty array for an empty tree).

    Leaves of several dtypes are an error unless `mixed_dtype_handler` says how to combine them:
    `"promote"` gives the dtype they all promote to (`jnp.promote_types`); `"highest"` and
    `"lowest"` give the one every other promotes to, or that promotes to every other, in the
    partial order `a <= b` when `promote_types(a, b) == b` (an error where two leaves' dtypes are
    not ordered, such as int32 and uint32).

    Args:
        tree: a pytree of arrays (or numbers).
        mixed_dtype_handler: `None` (one dtype required), `"promote"`, `"highest"` or `"lowest"`.

    Example:
        >>> import jax.numpy as jnp
        >>> import modopt
        >>> tree = {"a": jnp.ones(2, jnp.float16), "b": jnp.ones(2, jnp.float32)}
        >>> modopt.tree.dtype(tree, "lowest"), modopt.tree.dtype(tree, "highest")
        (dtype('float16'), dtype('float32'))
    """
    if mixed_dtype_handler not in _HANDLERS:
        raise ValueError(
            f"Invalid mixed_dtype_handler: {mixed_dtype_handler!r} (must be one of {list(_HANDLERS)}) in tree.dtype."
        )
    leaves = jax.tree_util.tree_leaves(tree)
    if not leaves:
        return jnp.asarray(leaves).dtype
    dtypes = [jnp.asarray(x).dtype for x in leaves]
    if mixed_dtype_handler is None:
        mismatched = [
            f"Expected dtype={dtypes[0]} for {jax.tree_util.keystr(path)} but got {d}."
            for (path, _), d in zip(jax.tree_util.tree_leaves_with_path(tree), dtypes)
            if d != dtypes[0]
        ]
        if mismatched:
            raise ValueError(
                "\n".join(mismatched) + "\n(tree.dtype: the leaves have several dtypes; pass mixed_dtype_handler="
                "'promote', 'highest' or 'lowest' to combine them.)"
            )
        return dtypes[0]
    if mixed_dtype_handler == "promote":
        return functools.reduce(jnp.promote_types, dtypes)
    pick = _higher if mixed_dtype_handler == "highest" else _lower
    return functools.reduce(pick, dtypes)


def _lower(a: Any, b: Any) -> Any:
    """Of two dtypes, the one that promotes to the other; an error if neither does."""
    promoted = jnp.promote_types(a, b)
    if promoted == a:
        return b
    if promoted == b:
        return a
    raise ValueError(f"Cannot order the dtypes {a} and {b}: neither promotes to the other (tree.dtype).")


def _higher(a: Any, b: Any) -> Any:
    """Of two dtypes, the one the other promotes to; an error if neither does."""
    return b if _lower(a, b) == a else a
