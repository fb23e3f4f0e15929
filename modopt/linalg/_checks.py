"""Argument checks shared by the linear-algebra routines (trace time, before any work)."""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np

from .._core.fields import _shown, is_concrete


def square_matrix(name: str, matrix: Any, where: str) -> Any:
    """`matrix` as a JAX array, or a clear error if it is not a real floating square 2-D array."""
    if callable(matrix) and not hasattr(matrix, "shape"):
        raise TypeError(
            f"Invalid {name}: a {type(matrix).__name__} (expected a square 2-D array) in {where}."
        )
    if not hasattr(matrix, "dtype"):
        matrix = np.asarray(matrix)
    if not jnp.issubdtype(matrix.dtype, jnp.floating):
        raise TypeError(
            f"Invalid {name}: an array of dtype {matrix.dtype} (expected a real floating dtype such as "
            f"float32) in {where}. Convert it first, e.g. `{name}.astype(jnp.float32)`."
        )
    if matrix.ndim != 2 or matrix.shape[0] != matrix.shape[1]:
        raise ValueError(
            f"Invalid {name}: an array of shape {tuple(matrix.shape)} (expected a square 2-D array of "
            f"shape (n, n)) in {where}. For a batch of matrices, use `jax.vmap`."
        )
    if matrix.shape[0] == 0:
        raise ValueError(f"Invalid {name}: an empty matrix of shape {tuple(matrix.shape)} in {where}.")
    return jnp.asarray(matrix)


def number(name: str, value: Any, where: str, *, least: float, integer: bool = False) -> None:
    """Rejects a concrete `value` below `least` (or not integral when `integer`); tracers pass."""
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"Invalid {name}: {value!r} (expected a number) in {where}.")
    if value is None or isinstance(value, str) or callable(value):
        raise TypeError(f"Invalid {name}: {value!r} (expected a number) in {where}.")
    if not is_concrete(value):
        return  # traced: checked by nobody, used as given
    concrete = np.asarray(value)
    if concrete.ndim != 0:
        raise ValueError(
            f"Invalid {name}: an array of shape {concrete.shape} (expected a scalar) in {where}."
        )
    what = "an integer" if integer else "a number"
    ok = np.isfinite(concrete) if not np.issubdtype(concrete.dtype, np.integer) else True
    ok = ok and concrete >= least and (not integer or concrete == np.round(concrete))
    if not ok:
        raise ValueError(f"Invalid {name}: {_shown(value)} (must be {what} >= {least:g}) in {where}.")
