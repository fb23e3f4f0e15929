"""Power iteration: the dominant eigenpair of a matrix, or of a linear operator on a pytree."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from .._util.trees import global_norm, vdot
from ._checks import number, square_matrix


def _unit(tree: Any, fallback: Any) -> Any:
    """`tree / ||tree||`, or `fallback` (already of unit norm) where `tree` is all zeros."""
    norm = global_norm(tree)
    nonzero = norm > 0
    inverse = jnp.where(nonzero, 1.0 / jnp.where(nonzero, norm, 1.0), 0.0)
    return jax.tree_util.tree_map(
        lambda x, f: jnp.where(nonzero, (x * inverse).astype(x.dtype), f), tree, fallback
    )


def _check_v0(v0: Any, matrix: Any) -> None:
    where = "power_iteration"
    leaves = jax.tree_util.tree_leaves(v0)
    if not leaves:
        raise ValueError(f"Invalid v0: {v0!r} has no arrays (expected the start vector) in {where}.")
    for path, leaf in jax.tree_util.tree_flatten_with_path(v0)[0]:
        if not jnp.issubdtype(jnp.result_type(leaf), jnp.inexact):
            raise TypeError(
                f"Invalid v0: the leaf at {jax.tree_util.keystr(path) or 'the root'} has dtype "
                f"{jnp.result_type(leaf)} (expected a floating dtype) in {where}."
            )
    if not callable(matrix) and (jnp.ndim(v0) != 1 or jnp.shape(v0)[0] != matrix.shape[0]):
        raise ValueError(
            f"Invalid v0: shape {jnp.shape(v0)} (expected ({matrix.shape[0]},) to match a matrix of shape "
            f"{tuple(matrix.shape)}) in {where}."
        )


def power_iteration(
    matrix: jax.Array | Callable[[Any], Any],
    num_iters: int | jax.Array = 100,
    error_tolerance: float | jax.Array = 1e-6,
    precision: jax.lax.Precision = jax.lax.Precision.HIGHEST,
    *,
    v0: Any = None,
    key: jax.Array | None = None,
) -> tuple[Any, jax.Array]:
    r"""The dominant eigenvector and eigenvalue of a matrix, by power iteration.

    Starting from a unit vector `v`, each iteration multiplies by the matrix and renormalizes:

        z = A v,    lambda = <v, z>,    v <- z / ||z||

    until the relative residual `||A v - lambda v|| / |lambda|` is at most `error_tolerance`
    or `num_iters` products have been taken. It converges to the eigenpair whose eigenvalue
    is largest in absolute value, at the rate `|lambda_2 / lambda_1|` per iteration, when that
    eigenvalue is unique (a symmetric positive semi-definite `A` is the intended use, e.g. to
    find a Hessian's or a preconditioner statistic's largest eigenvalue).

    `matrix` may also be a function computing `A v` for `v` a pytree (a Hessian-vector product,
    say); then `v0` gives the start vector and the vector's structure.

    Args:
        matrix: a square 2-D real floating array `(n, n)`, or a callable `v -> A v`.
        num_iters: the most matrix-vector products taken in the loop, an integer >= 0.
        error_tolerance: stop once the relative residual is at most this (>= 0).
        precision: the XLA precision of the matrix-vector products (`jax.lax.Precision`):
            `DEFAULT` is fastest on accelerators, `HIGHEST` is exact float32.
        v0: the start vector (keyword-only). By default, uniform in `[-1, 1]^n` drawn with
            `key`; required when `matrix` is a callable.
        key: the PRNG key that draws the default `v0` (keyword-only); `jax.random.PRNGKey(0)`
            by default, so the result is deterministic.

    Returns:
        `(eigenvector, eigenvalue)`: the eigenvector with unit L2 norm (shaped like `v0`), and
        the eigenvalue, a scalar. For the zero matrix: a unit vector and 0.

    Example:
        >>> import jax.numpy as jnp
        >>> from modopt.linalg import power_iteration
        >>> vector, value = power_iteration(jnp.array([[2.0, 0.0], [0.0, 1.0]]))
        >>> round(float(value), 4), [round(abs(float(x)), 4) for x in vector]
        (2.0, [1.0, 0.0])

    Reference: von Mises & Pollaczek-Geiringer, 1929, Praktische Verfahren der
    Gleichungsauflösung, https://doi.org/10.1002/zamm.19290090206; Golub & Van Loan, Matrix
    Computations, 4th ed., section 8.2.1,
    https://www.cs.cornell.edu/cv/GolubVanLoan4/golubandvanloan.htm
    """
    where = "power_iteration"
    number("num_iters", num_iters, where, least=0, integer=True)
    number("error_tolerance", error_tolerance, where, least=0)
    if callable(matrix) and not hasattr(matrix, "shape"):
        if v0 is None:
            raise ValueError(
                "Invalid v0: None in power_iteration. When `matrix` is a function `v -> A v`, pass the "
                "start vector `v0=` (a pytree shaped like the function's input)."
            )
        _check_v0(v0, matrix)
        return _iterate(matrix, v0, num_iters, error_tolerance)
    matrix = square_matrix("matrix", matrix, where)
    if v0 is None:
        key = jax.random.PRNGKey(0) if key is None else key
        v0 = jax.random.uniform(key, matrix.shape[-1:], matrix.dtype, minval=-1.0, maxval=1.0)
    _check_v0(v0, matrix)
    return _dense(matrix, jnp.asarray(v0), num_iters, error_tolerance, precision=precision)


@functools.partial(jax.jit, static_argnames=("precision",))
def _dense(matrix, v0, num_iters, error_tolerance, *, precision):
    """Power iteration on an array, compiled once per shape, dtype and precision."""

    def matvec(v):
        return jnp.matmul(matrix, v, precision=precision)

    return _iterate(matvec, v0, num_iters, error_tolerance)


def _iterate(
    matvec: Callable[[Any], Any], v0: Any, num_iters: Any, error_tolerance: Any
) -> tuple[Any, jax.Array]:
    """The power-iteration loop for an operator `matvec` from the start vector `v0`."""
    ones = jax.tree_util.tree_map(jnp.ones_like, v0)
    first = _unit(v0, _unit(ones, ones))  # a zero v0 falls back to the all-ones direction
    product = matvec(first)
    value = vdot(first, product)

    def residual_small(vector, product, value):
        residual = global_norm(jax.tree_util.tree_map(lambda z, v: z - value * v, product, vector))
        return residual <= error_tolerance * jnp.abs(value)

    def keep_going(carry):
        vector, product, value, count = carry
        return (count < num_iters) & ~residual_small(vector, product, value)

    def iterate(carry):
        vector, product, _, count = carry
        vector = _unit(product, vector)
        product = matvec(vector)
        return vector, product, vdot(vector, product), count + 1

    start = (first, product, value, jnp.asarray(0))
    vector, product, value, _ = jax.lax.while_loop(keep_going, iterate, start)
    return _unit(product, vector), value
