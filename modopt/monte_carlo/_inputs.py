"""Checks of the arguments shared by the Monte Carlo estimators, with errors that name them."""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ._distributions import MultiNormalDiagFromLogScale

Function = Callable[[jax.Array], Any]  # f(x): one sample in, one float out


def check_count(name: str, value: Any) -> int:
    """A number of samples: a Python integer >= 1 (it sets the shape of the result)."""
    if isinstance(value, jax.core.Tracer):
        raise TypeError(
            f"{name} must be a Python int, not a traced value: it sets the shape of the jacobians. "
            f"Under jax.jit, mark it static (static_argnums or static_argnames)."
        )
    try:
        if isinstance(value, (bool, np.bool_)):
            raise TypeError
        count = operator.index(value)
    except TypeError:
        raise ValueError(f"Invalid {name}: {value!r} (must be an integer >= 1).") from None
    if count < 1:
        raise ValueError(f"Invalid {name}: {count} (must be an integer >= 1).")
    return count


def check_callable(name: str, value: Any, expected: str) -> None:
    if not callable(value):
        raise TypeError(f"Invalid {name}: {value!r} of type {type(value).__name__} (expected {expected}).")


def check_params(params: Any, dist_builder: Any) -> list[jax.Array]:
    """`params` as a list of floating arrays: the positional arguments of `dist_builder`."""
    if not isinstance(params, (list, tuple)):
        raise TypeError(
            f"Invalid params: a {type(params).__name__}. The estimators take a list of arrays, the "
            f"positional arguments of dist_builder (for multi_normal: [loc, log_scale])."
        )
    arrays = []
    for index, param in enumerate(params):
        try:
            array = jnp.asarray(param)
        except TypeError:
            raise TypeError(
                f"Invalid params[{index}]: {type(param).__name__} is not an array. params is a list "
                f"of arrays (for multi_normal: [loc, log_scale])."
            ) from None
        if not jnp.issubdtype(array.dtype, jnp.floating):
            raise TypeError(
                f"Invalid params[{index}]: dtype {array.dtype}. The jacobians are taken with respect "
                f"to params, which must be floating arrays (e.g. jnp.asarray(x, jnp.float32))."
            )
        arrays.append(array)
    if dist_builder is MultiNormalDiagFromLogScale:
        if len(arrays) != 2:
            raise ValueError(
                f"Invalid params: {len(arrays)} arrays, but multi_normal takes two, [loc, log_scale]."
            )
        loc, log_scale = arrays
        if loc.shape != log_scale.shape:
            raise ValueError(
                f"Invalid params: loc has shape {loc.shape} and log_scale has shape {log_scale.shape}. "
                f"multi_normal takes [loc, log_scale] of the same shape."
            )
    return arrays


def evaluate(function: Function, samples: jax.Array) -> jax.Array:
    """`function` applied to every sample (axis 0); an error unless it returns one number each."""
    values = jax.vmap(function)(samples)
    if not isinstance(values, jax.Array) or values.shape != samples.shape[:1]:
        shape = getattr(values, "shape", type(values).__name__)
        raise ValueError(
            f"Invalid function: it must return one number per sample, but on a sample of shape "
            f"{samples.shape[1:]} it returned {shape if isinstance(shape, str) else f'shape {tuple(shape[1:])}'}. "
            f"Reduce its output, e.g. with jnp.sum."
        )
    return values
