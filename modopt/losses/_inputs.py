"""Trace-time checks of loss inputs, with errors that name the loss, the argument and the fix.

Every check looks only at shapes, dtypes and Python values, so it runs once when a jitted
loss is traced and costs nothing per step. Values behind tracers (label ranges, padding
patterns) cannot be checked and are documented by each loss instead.
"""

from __future__ import annotations

import operator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .._core.fields import is_concrete
from jax.typing import ArrayLike


def as_array(loss: str, name: str, value: Any) -> jax.Array:
    """`value` as a JAX array, or a `TypeError` naming the argument."""
    if value is None:
        raise TypeError(f"{loss}: {name} is None; pass an array.")
    try:
        return jnp.asarray(value)
    except (TypeError, ValueError) as error:
        raise TypeError(
            f"{loss}: {name} must be an array or a number, got a {type(value).__name__} ({error})."
        ) from None


def _kind(dtype: Any) -> str:
    if jnp.issubdtype(dtype, jnp.bool_):
        return "boolean"
    if jnp.issubdtype(dtype, jnp.integer):
        return "integer"
    if jnp.issubdtype(dtype, jnp.complexfloating):
        return "complex"
    if jnp.issubdtype(dtype, jnp.floating):
        return "floating-point"
    return "non-numeric"


def floating(loss: str, name: str, value: Any, hint: str = "") -> jax.Array:
    """`value` as an array of a real floating dtype (float16/bfloat16/float32/float64)."""
    x = as_array(loss, name, value)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        fix = hint or (
            f"cast it with `{name}.astype(jnp.float32)`"
            if _kind(x.dtype) in ("integer", "boolean")
            else "losses are defined for real floating-point inputs only"
        )
        raise TypeError(
            f"{loss}: {name} must be a floating-point array, got the {_kind(x.dtype)} dtype {x.dtype}; {fix}."
        )
    return x


def real(loss: str, name: str, value: Any, *, allow_bool: bool = True, hint: str = "") -> jax.Array:
    """`value` as an array of real numbers: floating or integer (and boolean if `allow_bool`)."""
    x = as_array(loss, name, value)
    ok = jnp.issubdtype(x.dtype, jnp.floating) or jnp.issubdtype(x.dtype, jnp.integer)
    ok = ok or (allow_bool and jnp.issubdtype(x.dtype, jnp.bool_))
    if not ok:
        allowed = "floating-point, integer or boolean" if allow_bool else "floating-point or integer"
        raise TypeError(
            f"{loss}: {name} must be a real {allowed} array, got the {_kind(x.dtype)} dtype {x.dtype}"
            + (f"; {hint}." if hint else ".")
        )
    return x


def scores_and_signs(loss: str, predictor_outputs: Any, targets: ArrayLike) -> tuple[jax.Array, jax.Array]:
    """Checked floating `predictor_outputs` and real `targets` in {-1, +1} (booleans refused),
    for the binary margin losses (their shapes are checked by the caller)."""
    scores = floating(loss, "predictor_outputs", predictor_outputs)
    targets = real(
        loss,
        "targets",
        targets,
        allow_bool=False,
        hint="targets must be -1 or +1; map {0, 1} labels with `2 * labels - 1`",
    )
    return scores, targets


def integer(loss: str, name: str, value: Any, hint: str = "") -> jax.Array:
    """`value` as an array of an integer dtype (class indices)."""
    x = as_array(loss, name, value)
    if not jnp.issubdtype(x.dtype, jnp.integer):
        raise TypeError(
            f"{loss}: {name} must be an integer array of class indices, got the {_kind(x.dtype)} dtype "
            f"{x.dtype}" + (f"; {hint}." if hint else ".")
        )
    return x


def broadcast(loss: str, a_name: str, a: jax.Array, b_name: str, b: jax.Array) -> tuple[int, ...]:
    """The broadcast shape of `a` and `b`, or a `ValueError` naming both shapes."""
    try:
        return tuple(np.broadcast_shapes(a.shape, b.shape))
    except ValueError:
        raise ValueError(
            f"{loss}: {a_name} of shape {a.shape} and {b_name} of shape {b.shape} do not broadcast "
            "(aligned from the right, each pair of sizes must be equal or contain a 1)."
        ) from None


def same_shape(loss: str, a_name: str, a: jax.Array, b_name: str, b: jax.Array) -> None:
    """`a` and `b` have exactly the same shape (no broadcasting)."""
    if a.shape != b.shape:
        raise ValueError(
            f"{loss}: {a_name} of shape {a.shape} and {b_name} of shape {b.shape} must have the same shape "
            f"({loss} does not broadcast its inputs; use `jnp.broadcast_to` first if that is what you mean)."
        )


def rank(loss: str, name: str, x: jax.Array, expected: int, layout: str) -> None:
    """`x` has rank `expected`; `layout` names its axes, e.g. "(B, T, K)"."""
    if x.ndim != expected:
        raise ValueError(
            f"{loss}: {name} must have rank {expected}, laid out {layout}, "
            f"got shape {x.shape} (rank {x.ndim})."
        )


def axes(loss: str, axis: Any, ndim: int, of: str, *, allow_none: bool = True) -> tuple[int, ...] | None:
    """`axis` (an int, a tuple of ints or `None` for all) normalized for an array of rank `ndim`."""
    if axis is None:
        if allow_none:
            return None
        raise TypeError(f"{loss}: axis must be an int or a tuple of ints, got None.")
    many = isinstance(axis, (tuple, list))
    entries = tuple(axis) if many else (axis,)
    normalized = []
    for a in entries:
        try:
            a = operator.index(a)
        except TypeError:
            raise TypeError(f"{loss}: axis must be an int, a tuple of ints or None, got {axis!r}.") from None
        if not -ndim <= a < ndim:
            raise ValueError(f"{loss}: axis {a} is out of range for {of} of rank {ndim}.")
        normalized.append(a % ndim)
    if len(set(normalized)) != len(normalized):
        raise ValueError(f"{loss}: axis {axis!r} repeats an axis.")
    return tuple(normalized)


def mask(
    loss: str, where: ArrayLike, shape: tuple[int, ...], of: str, expand: tuple[int, ...] | None = None
) -> jax.Array | None:
    """The boolean `where` mask for an array of `shape`, which it must broadcast to.

    With `expand` (the reduced axes of a cross entropy), a mask of the rank of the reduced
    shape gets those axes inserted with size 1, so a mask of the batch shape selects whole
    examples.
    """
    if where is None:
        return None
    where = as_array(loss, "where", where)
    if not jnp.issubdtype(where.dtype, jnp.bool_):
        raise TypeError(
            f"{loss}: where must be a boolean mask, got the {_kind(where.dtype)} dtype {where.dtype}; "
            "use e.g. `where=mask > 0`."
        )
    given = where.shape
    if expand is not None and expand and where.ndim == len(shape) - len(expand):
        where = jnp.expand_dims(where, expand)
    try:
        fits = tuple(np.broadcast_shapes(where.shape, shape)) == tuple(shape)
    except ValueError:
        fits = False
    if not fits:
        without = "" if not expand else f", or to that shape without the reduced axis {_shown_axis(expand)}"
        raise ValueError(
            f"{loss}: where of shape {given} does not broadcast to {of} of shape {shape}{without}."
        )
    return where


def _shown_axis(axis: tuple[int, ...]) -> Any:
    return axis[0] if len(axis) == 1 else axis


def number_in(loss: str, name: str, value: Any, description: str, ok: Any) -> None:
    """A concrete hyperparameter (`delta`, `alpha`, `epsilon`) satisfies `ok`; traced values pass."""
    if is_concrete(value) and not ok(np.asarray(value)):
        shown = np.asarray(value)
        raise ValueError(
            f"Invalid {name}: {shown[()] if shown.ndim == 0 else shown} (must be {description}) in {loss}."
        )


def class_indices(loss: str, labels: ArrayLike, scores_name: str, scores: jax.Array) -> jax.Array:
    """Integer class `labels` for `scores` of shape `[..., num_classes]`: labels of shape `[...]`.

    The labels' shape must broadcast to the shape of `scores` without its last (class) axis.
    """
    labels = as_array(loss, "labels", labels)
    if jnp.issubdtype(labels.dtype, jnp.floating) and labels.ndim == scores.ndim:
        hint = "these look like one-hot labels: take `labels.argmax(-1)` for class indices"
    else:
        hint = "cast class indices with `labels.astype(jnp.int32)`"
    labels = integer(loss, "labels", labels, hint=hint)
    if scores.ndim == 0:
        raise ValueError(
            f"{loss}: {scores_name} must have a class axis, laid out [..., num_classes], got a scalar."
        )
    batch = scores.shape[:-1]
    try:
        fits = labels.ndim <= len(batch) and tuple(np.broadcast_shapes(labels.shape, batch)) == batch
    except ValueError:
        fits = False
    if not fits:
        raise ValueError(
            f"{loss}: labels of shape {labels.shape} must have the shape of {scores_name} {scores.shape} "
            f"without its last (class) axis, that is {batch}."
        )
    return labels
