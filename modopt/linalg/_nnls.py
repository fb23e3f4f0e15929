"""Non-negative least squares by an accelerated projected gradient method."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ._checks import number


def _spectral_bound(gram: jax.Array) -> jax.Array:
    """An upper bound on the spectral radius of `gram`: the least of its Frobenius and 1-norms."""
    frobenius = jnp.sqrt(jnp.sum(jnp.square(gram)))
    if gram.size == 0:
        return frobenius
    return jnp.minimum(frobenius, jnp.max(jnp.sum(jnp.abs(gram), axis=0)))


def nnls(
    A: Any,  # noqa: N803 (optax's name)
    b: Any,
    iters: int,
    unroll: int | bool = 1,
    L: Any = None,  # noqa: N803 (optax's name)
) -> jax.Array:
    r"""Solves the non-negative least squares problem $\min_{x \ge 0} \|A x - b\|_2$.

    Runs `iters` steps of the fast projected gradient method (Polyak 2015), Nesterov-style
    momentum on the projected gradient step for $\tfrac12 x^\top Q x - q^\top x$ with
    $Q = A^\top A$, $q = A^\top b$, starting from $x_0 = p_0 = 0$, $c_0 = 0$:
    $$x_{k+1} = \max\!\big(p_k - (Q p_k - q) / L,\ 0\big),\qquad
    c_{k+1} = \tfrac{1 + \sqrt{1 + 4 c_k^2}}{2},\qquad
    p_{k+1} = x_{k+1} + \tfrac{c_k - 1}{c_{k+1}}\,(x_{k+1} - x_k),$$
    where $L \ge \lambda_{\max}(Q)$ (by default the least of $Q$'s Frobenius norm and its
    1-norm). The error in the objective falls as $O(1/k^2)$.

    Args:
        A: the matrix, of shape `(M, N)`.
        b: the target, a vector of shape `(M,)` or a matrix of shape `(M, K)` (K problems at
            once).
        iters: the number of iterations.
        unroll: passed to `jax.lax.scan` (how many iterations one loop body holds).
        L: an upper bound on the largest eigenvalue of `A.T @ A`; computed when `None`.

    Returns:
        The solution, of shape `(N,)` or `(N, K)`, non-negative.

    Example:
        >>> import jax.numpy as jnp
        >>> import modopt
        >>> A = jnp.array([[1.0, 2.0], [3.0, 4.0]])
        >>> b = jnp.array([5.0, 6.0])
        >>> x = modopt.nnls(A, b, 1000)
        >>> print(f"{x[0]:.2f} {x[1]:.2f}")
        0.00 1.70

    References:
        Polyak, [Projected gradient method for non-negative least
        square](http://www.ams.org/books/conm/636/), 2015.
    """
    where = "nnls"
    A, b = jnp.asarray(A), jnp.asarray(b)  # noqa: N806
    if A.ndim != 2:
        raise ValueError(
            f"Invalid A: an array of shape {A.shape} (expected a matrix of shape (M, N)) in {where}."
        )
    if b.ndim not in (1, 2) or b.shape[0] != A.shape[0]:
        raise ValueError(
            f"Invalid b: an array of shape {b.shape} (expected ({A.shape[0]},) or ({A.shape[0]}, K) to match "
            f"A of shape {A.shape}) in {where}."
        )
    number("iters", iters, where, least=0, integer=True)
    if not isinstance(iters, (int, np.integer)):
        raise TypeError(
            f"Invalid iters: {iters!r} (expected a Python int; it sets the loop length) in {where}."
        )
    dtype = jnp.result_type(A, b)
    if not jnp.issubdtype(dtype, jnp.inexact):
        dtype = jnp.result_type(float)
    A, b = A.astype(dtype), b.astype(dtype)  # noqa: N806

    gram = A.T @ A
    target = A.T @ b
    bound = _spectral_bound(gram) if L is None else jnp.asarray(L)
    bound = jnp.where(bound == 0, 1, bound).astype(dtype)  # A = 0: any step works, the solution is 0

    def iteration(carry, _):
        x, p, c = carry
        c_next = (1 + jnp.sqrt(1 + 4 * c**2)) / 2
        x_next = jnp.maximum(p - (gram @ p - target) / bound, 0)
        p_next = x_next + (c - 1) / c_next * (x_next - x)
        return (x_next, p_next, c_next), None

    x0 = jnp.zeros(A.shape[1:] + b.shape[1:], dtype)
    (x, _, _), _ = lax.scan(iteration, (x0, x0, 0.0), length=int(iters), unroll=unroll)
    return x
