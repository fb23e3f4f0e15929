"""Moment estimates shared by the adaptive transforms (Adam and its family), and the state
dtypes of every transform that keeps moments.

Each works leaf by leaf on pytrees; `None` leaves of `updates` are carried through.

State dtypes (`mu_dtype`, `nu_dtype`, `accumulator_dtype`; see `fields.dtype`) go through three
helpers, so every transform treats them alike: `init_state` makes the zeros in the state dtype,
`widen` reads the stored state and the gradients in the accumulation dtype (float32, or wider),
and `store` rounds the new state to the state dtype. With the dtype `None` the three do what
optax does: nothing beyond the dtypes the arithmetic gives. `widened_update_moment` and its
siblings are the moment updates with the widening done first.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp

from jax.typing import DTypeLike

from .._core.fields import Scalar
from .._core.types import Updates
from .._util.trees import abs_sq, cast_like, map_updates


def state_dtype_for(dtype: Any, leaf_dtype: Any) -> Any:
    """The dtype a leaf of state is stored in: `dtype`, complex of its precision for a complex
    leaf (a real state dtype never drops an imaginary part), or the leaf's own for `None`."""
    if dtype is None:
        return leaf_dtype
    if jnp.issubdtype(leaf_dtype, jnp.complexfloating):
        return jnp.promote_types(dtype, jnp.complex64)
    return jnp.dtype(dtype)


def init_state(tree: Any, dtype: Any = None, fill_value: Any = 0) -> Any:
    """`fill_value` (zeros by default) shaped like each leaf of `tree` (the params), stored in
    the state dtype `dtype`.

    Args:
        tree: a pytree of arrays (the params).
        dtype: the state dtype; `None` for each leaf's own (optax's default).
        fill_value: the initial value of every element.
    """
    if dtype is None:
        return jax.tree_util.tree_map(lambda x: jnp.full_like(x, fill_value), tree)
    return jax.tree_util.tree_map(lambda x: jnp.full_like(x, fill_value, state_dtype_for(dtype, jnp.result_type(x))), tree)


def copy_state(tree: Any, dtype: Any = None) -> Any:
    """A copy of `tree` (the params: a starting point or reference point kept in the state),
    stored in the state dtype `dtype` (`None`: each leaf's own). A copy, not the same arrays:
    the state is donated to jitted steps alongside the parameters.

    Args:
        tree: a pytree of arrays (the params).
        dtype: the state dtype; `None` for each leaf's own (optax's default).
    """
    if dtype is None:
        return jax.tree_util.tree_map(jnp.copy, tree)
    return jax.tree_util.tree_map(lambda x: jnp.array(x, state_dtype_for(dtype, jnp.result_type(x)), copy=True), tree)


def scalar_dtype(dtype: Any, *dtypes: Any) -> Any:
    """The dtype of a transform's running scalars (a step-size estimate, a loss average) kept
    in `dtype` (the parameters' lowest, as optax keeps them): widened to the state dtypes that
    are set (`None` entries are ignored) where one is wider, so float32 state dtypes on
    bfloat16 parameters leave no bfloat16 scalar, and bfloat16 ones leave float32 scalars as
    they are. Unchanged when no state dtype is set.

    Args:
        dtype: the scalars' dtype without state dtypes.
        *dtypes: the transform's state dtypes (`None` for those not set).
    """
    return jnp.result_type(dtype, *(d for d in dtypes if d is not None))


def widen(tree: Any, dtype: Any) -> Any:
    """`tree` (stored state, or the gradients that update it) read for the arithmetic of a
    state of dtype `dtype`: each leaf widened to float32 at least (float64 and complex leaves
    keep their precision). With `dtype` `None` the tree is returned as it is: the arithmetic
    promotes as optax's does. `None` leaves are carried through.

    Args:
        tree: a pytree of arrays.
        dtype: the state dtype, or `None`.
    """
    if dtype is None:
        return tree
    return map_updates(lambda x: x.astype(jnp.promote_types(x.dtype, jnp.float32)), tree)


def store(tree: Any, dtype: Any, like: Any = None) -> Any:
    """The new state `tree` rounded for storage: to the state dtype `dtype`; with `dtype` `None`,
    to the dtypes of `like` (the previous state) where given, else as the arithmetic gave it.

    Args:
        tree: the new state, computed at the accumulation precision.
        dtype: the state dtype, or `None`.
        like: the previous state, whose dtypes are kept when `dtype` is `None` (or `None`).
    """
    if dtype is None:
        return tree if like is None else cast_like(tree, like)
    return jax.tree_util.tree_map(lambda x: x.astype(state_dtype_for(dtype, x.dtype)), tree)


def in_update_dtype(new_updates: Updates, updates: Updates, *dtypes: Any) -> Updates:
    """A transform's output, computed at the accumulation precision, rounded to the dtype optax's
    arithmetic would give it: the gradients' dtype promoted with the state dtypes that are set
    (bfloat16 gradients and float32 state give float32 updates; bfloat16 state on bfloat16
    gradients gives bfloat16 updates, rounded once). Unchanged when no state dtype is set.

    Args:
        new_updates: the transform's output, with the structure of `updates`.
        updates: the gradients it was computed from.
        *dtypes: the transform's state dtypes (`None` for those not set).
    """
    if all(d is None for d in dtypes):
        return new_updates
    return map_updates(lambda u, g: u.astype(update_dtype(g.dtype, *dtypes)), new_updates, updates)


def update_dtype(grad_dtype: Any, *dtypes: Any) -> Any:
    """The dtype of a transform's output for gradients of `grad_dtype`: promoted with the state
    dtypes that are set (`None` entries are ignored; see `in_update_dtype`).

    Args:
        grad_dtype: the gradients' dtype.
        *dtypes: the transform's state dtypes (`None` for those not set).
    """
    return jnp.result_type(grad_dtype, *(d for d in dtypes if d is not None))


def update_moment(updates: Updates, moments: Updates, decay: Scalar, order: int) -> Updates:
    """EMA of the `order`-th power: `(1 - decay) * g**order + decay * m`.

    Args:
        updates: the new updates `g`, a pytree (`None` leaves are skipped).
        moments: the moments `m`, with the structure of `updates`.
        decay: the decay rate, in [0, 1].
        order: the power of `g`, an integer >= 1.
    """
    complement = 1 - decay  # once, not per leaf: the same value, a smaller program
    return map_updates(lambda g, m: complement * (g**order) + decay * m, updates, moments)


def update_moment_per_elem_norm(updates: Updates, moments: Updates, decay: Scalar, order: int) -> Updates:
    """EMA of `|g|**order`, element-wise; for complex `g` the modulus is used.

    Args:
        updates: the new updates `g`, a pytree (`None` leaves are skipped).
        moments: the moments `m`, with the structure of `updates`.
        decay: the decay rate, in [0, 1].
        order: the power of `|g|`, an integer >= 1.
    """

    def power_of_norm(g):
        if not jnp.iscomplexobj(g):
            return g**order
        half = order / 2
        return abs_sq(g) ** (int(half) if float(half).is_integer() else half)

    complement = 1 - decay
    return map_updates(lambda g, m: complement * power_of_norm(g) + decay * m, updates, moments)


def update_infinity_moment(updates: Updates, moments: Updates, decay: Scalar, eps: Scalar) -> Updates:
    """EMA of the infinity norm: `max(|g| + eps, decay * m)`.

    Args:
        updates: the new updates `g`, a pytree.
        moments: the running maximum `m`, with the structure of `updates`.
        decay: the decay rate, in [0, 1].
        eps: added to `|g|`, >= 0.
    """
    return map_updates(lambda g, m: jnp.maximum(jnp.abs(g) + eps, decay * m), updates, moments)


# The moment updates of a state with a state dtype: `g` and `m` widened (`widen`) first. The
# public ones above keep optax's signatures (`modopt.tree`).
def widened_update_moment(updates: Updates, moments: Updates, decay: Scalar, order: int, dtype: DTypeLike | None) -> Updates:
    """`update_moment` at the accumulation precision of the state dtype `dtype` (`widen`)."""
    return update_moment(widen(updates, dtype), widen(moments, dtype), decay, order)


def widened_update_moment_per_elem_norm(
    updates: Updates, moments: Updates, decay: Scalar, order: int, dtype: DTypeLike | None
) -> Updates:
    """`update_moment_per_elem_norm` at the accumulation precision of `dtype` (`widen`)."""
    return update_moment_per_elem_norm(widen(updates, dtype), widen(moments, dtype), decay, order)


def widened_update_infinity_moment(
    updates: Updates, moments: Updates, decay: Scalar, eps: Scalar, dtype: DTypeLike | None
) -> Updates:
    """`update_infinity_moment` at the accumulation precision of `dtype` (`widen`)."""
    return update_infinity_moment(widen(updates, dtype), widen(moments, dtype), decay, eps)


@functools.partial(jax.jit, inline=True)  # compiled `pow` rounds alike in eager and jitted code
def bias_correction(moment: Any, decay: Any, count: Any) -> Any:
    """Divides a moment by `1 - decay**count`, the bias of an EMA started at zero.

    The correction factor is computed in float32 (low precision would round it to 0) and
    applied in each leaf's own dtype, so bf16 moments stay bf16.
    """
    correction = 1 - jnp.asarray(decay) ** count
    return jax.tree_util.tree_map(lambda m: m / correction.astype(m.dtype), moment)
