"""Inverse p-th roots of symmetric positive semi-definite matrices by coupled Newton iteration."""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .._core.fields import is_concrete
from ._checks import number, square_matrix
from ._power_iteration import power_iteration

_GROWTH = 1.2  # a step may raise the error by this factor and still count as progress


def _static_power(base: jax.Array, p: int, precision: Any) -> jax.Array:
    """`base ** p` (matrix power) by repeated squaring, unrolled for a Python integer `p >= 1`."""
    result = None
    while True:
        if p & 1:
            result = base if result is None else jnp.matmul(result, base, precision=precision)
        p >>= 1
        if not p:
            return result
        base = jnp.matmul(base, base, precision=precision)


def _traced_power(base: jax.Array, p: jax.Array, precision: Any) -> jax.Array:
    """`base ** p` (matrix power) by repeated squaring in a loop, for a traced integer `p >= 1`."""

    def body(carry):
        result, square, exponent = carry
        result = jnp.where(exponent % 2 == 1, jnp.matmul(result, square, precision=precision), result)
        return result, jnp.matmul(square, square, precision=precision), exponent // 2

    identity = jnp.eye(base.shape[0], dtype=base.dtype)
    return jax.lax.while_loop(lambda carry: carry[2] > 0, body, (identity, base, p))[0]


def _frobenius(a: jax.Array) -> jax.Array:
    """`||a||_F`, rescaled where squaring the entries underflows to 0 or overflows to inf."""
    plain = jnp.linalg.norm(a)
    scale = jnp.max(jnp.abs(a))
    safe_scale = jnp.where(scale > 0, scale, 1.0)
    rescaled = safe_scale * jnp.linalg.norm(a / safe_scale)
    return jnp.where((plain > 0) & jnp.isfinite(plain), plain, rescaled)


def matrix_inverse_pth_root(
    matrix: jax.Array,
    p: int | jax.Array,
    num_iters: int | jax.Array = 100,
    ridge_epsilon: float | jax.Array = 1e-6,
    error_tolerance: float | jax.Array = 1e-6,
    precision: jax.lax.Precision = jax.lax.Precision.HIGHEST,
    *,
    padding_start: int | jax.Array | None = None,
    relative_epsilon: bool = True,
    max_retries: int = 0,
    retry_error_threshold: float | jax.Array = 0.05,
    p_values: tuple[int, ...] | None = None,
) -> tuple[jax.Array, jax.Array]:
    r"""The inverse p-th root `matrix^(-1/p)` of a symmetric positive semi-definite matrix.

    The matrix is first damped to be positive definite, `A = matrix + eps * lambda_max * I`
    with `eps = ridge_epsilon` and `lambda_max` its largest eigenvalue (by `power_iteration`).
    The coupled Newton iteration (Higham, eq. 7.18, with `alpha = -1/p`) then keeps a pair
    `(H, M)` with the invariant `H^(-p) M = A`, starting from

        z = (1 + p) / (2 ||A||_F),    M_0 = z A,    H_0 = z^(1/p) I,

    and iterating

        T = (1 - alpha) I + alpha M,    M <- T^p M,    H <- H T,

    so that `M -> I` and `H -> A^(-1/p)`. The error is `max |M - I|` (entrywise). It stops
    once the error is at most `error_tolerance`, after `num_iters` steps, or as soon as a step
    raises the error more than 1.2-fold, in which case the previous `H` is returned.

    This is the preconditioner computation of Shampoo (`p = 4` for a matrix's two sides).

    Three keyword-only options serve blocked Shampoo (as in the distributed Shampoo reference,
    `precondition.distributed_shampoo.matrix_inverse_pth_root`); their defaults leave the
    computation above unchanged:

    - `padding_start = k` treats rows and columns `k, k+1, ...` as padding: they are zeroed,
      take no damping, and the root is zero there, so the leading `k x k` block gets the root
      of the leading block alone. It may be traced (a batch of blocks of different true sizes
      padded to one shape, under `jax.vmap`); `k = 0` gives the zero matrix.
    - `relative_epsilon=False` damps by `eps` itself instead of `eps * lambda_max`.
    - `max_retries = r`: while the error exceeds `retry_error_threshold`, start again with a
      ten times larger damping (`eps * 10^i` at the `i`-th retry), at most `r` times; the last
      attempt is returned (the reference makes up to 5 retries at threshold 0.05).

    With `p_values`, a traced `p` (one per matrix of a `jax.vmap`ped batch, say) is known to
    be one of these integers: each step computes the unrolled power of every one of them
    (sharing their squarings) and keeps `p`'s, so a matrix gets the numbers of its own static
    `p` (a traced `p` without them takes its power in a loop, whose products differ in
    rounding), and matrices of several roots share one program.

    Args:
        matrix: a symmetric positive semi-definite real floating array of shape `(n, n)`.
            bfloat16 and float16 matrices are computed in float32 and the root cast back.
        p: the root, an integer >= 1 (any integer, traced or not).
        num_iters: the most Newton steps, an integer >= 0.
        ridge_epsilon: the damping relative to the largest eigenvalue (>= 0).
        error_tolerance: stop once `max |M - I|` is at most this (>= 0).
        precision: the XLA precision of the matrix products (`jax.lax.Precision`).
        padding_start: the index where padding rows and columns begin (keyword-only), an integer
            in `[0, n]`, possibly traced; `None` (the default): no padding.
        relative_epsilon: damp by `ridge_epsilon * lambda_max` (the default) or, if `False`, by
            `ridge_epsilon` alone (keyword-only).
        max_retries: the most restarts with a ten times larger damping when the error stays above
            `retry_error_threshold` (keyword-only), a Python integer >= 0; 0 (the default): none.
        retry_error_threshold: the error above which an attempt is retried (keyword-only), >= 0.
        p_values: the integers a traced `p` can be (keyword-only, static); `None` (the
            default): any. Ignored for a concrete `p`.

    Returns:
        `(root, error)`: `root` approximates `(matrix + eps * lambda_max * I)^(-1/p)`, with the
        matrix's shape and dtype; `error` is `max |root^p A - I|` for that root (0 for n = 1),
        with `A` the damped matrix of the attempt returned.

    Example:
        >>> import jax.numpy as jnp
        >>> from modopt.linalg import matrix_inverse_pth_root
        >>> root, error = matrix_inverse_pth_root(jnp.diag(jnp.array([4.0, 16.0])), 2)
        >>> [round(float(x), 3) for x in jnp.diag(root)]
        [0.5, 0.25]

    Reference: Higham, 2008, Functions of Matrices: Theory and Computation, p. 184, eq. 7.18,
    https://doi.org/10.1137/1.9780898717778; Guo & Higham, 2006, A Schur-Newton method for the
    matrix p-th root and its inverse, https://doi.org/10.1137/050643374; Gupta, Koren & Singer,
    2018, Shampoo: Preconditioned Stochastic Tensor Optimization, https://arxiv.org/abs/1802.09568
    """
    where = "matrix_inverse_pth_root"
    matrix = square_matrix("matrix", matrix, where)
    number("p", p, where, least=1, integer=True)
    number("num_iters", num_iters, where, least=0, integer=True)
    number("ridge_epsilon", ridge_epsilon, where, least=0)
    number("error_tolerance", error_tolerance, where, least=0)

    if padding_start is not None:
        number("padding_start", padding_start, where, least=0, integer=True)
        if is_concrete(padding_start) and int(np.asarray(padding_start)) > matrix.shape[0]:
            raise ValueError(
                f"Invalid padding_start: {int(np.asarray(padding_start))} (must be at most the matrix size "
                f"{matrix.shape[0]}) in {where}."
            )
    if (
        isinstance(max_retries, (bool, np.bool_))
        or not isinstance(max_retries, (int, np.integer))
        or max_retries < 0
    ):
        raise ValueError(f"Invalid max_retries: {max_retries!r} (must be a Python integer >= 0) in {where}.")
    number("retry_error_threshold", retry_error_threshold, where, least=0)

    static_p = int(np.asarray(p)) if is_concrete(p) else None
    if p_values is not None:
        p_values = tuple(int(v) for v in p_values)
        if not p_values or any(v < 1 for v in p_values):
            raise ValueError(f"Invalid p_values: {p_values!r} (must be integers >= 1) in {where}.")
    return _inverse_pth_root(
        matrix,
        p,
        num_iters,
        ridge_epsilon,
        error_tolerance,
        padding_start,
        retry_error_threshold,
        static_p=static_p,
        p_values=None if static_p is not None else p_values,
        precision=precision,
        relative_epsilon=bool(relative_epsilon),
        max_retries=int(max_retries),
    )


@functools.partial(jax.jit, static_argnames=("static_p", "p_values", "precision", "relative_epsilon", "max_retries"))
def _inverse_pth_root(
    matrix,
    p,
    num_iters,
    ridge_epsilon,
    error_tolerance,
    padding_start,
    retry_error_threshold,
    *,
    static_p,
    p_values,
    precision,
    relative_epsilon,
    max_retries,
):
    """The coupled Newton iteration, compiled once per shape, dtype, precision, static `p` (or
    `p_values`) and options (a `padding_start` or none)."""
    dtype = jnp.promote_types(matrix.dtype, jnp.float32)
    a = matrix.astype(dtype)
    n = a.shape[0]
    identity = jnp.eye(n, dtype=dtype)
    if static_p is not None:
        p_int = static_p
        p_float = float(p_int)
    else:
        p_float = jnp.asarray(p, dtype)
        p_int = jnp.round(p_float).astype(jnp.int32)

    def per_p(f):
        """`f(p)` of a static `p`; with `p_values`, `f` of each (Python numbers or arrays)
        and `p`'s kept, as its static `p` would have it."""
        if p_values is None:
            return f(p_float)
        out = jnp.asarray(f(float(p_values[0])), dtype)
        for v in p_values[1:]:
            out = jnp.where(p_int == v, jnp.asarray(f(float(v)), dtype), out)
        return out

    def power(m):
        if isinstance(p_int, int):
            return _static_power(m, p_int, precision)
        if p_values is not None:
            return per_p(lambda v: _static_power(m, int(v), precision))
        return _traced_power(m, p_int, precision)

    alpha = per_p(lambda v: -1.0 / v)
    one_minus_alpha = per_p(lambda v: 1 - -1.0 / v)  # as `1 - alpha` of a static `p`

    if padding_start is not None:  # zero the padding; the identity and the damping skip it too
        valid = (jnp.arange(n) < padding_start).astype(dtype)
        a = a * valid[:, None] * valid[None, :]
        identity = identity * valid

    if not relative_epsilon:
        largest = jnp.ones([], dtype)
    elif n == 1:
        largest = a[0, 0]
    elif padding_start is None:
        _, largest = power_iteration(a, num_iters=100, error_tolerance=1e-6, precision=precision)
    else:  # power_iteration's own start vector, without its padding entries
        v0 = jax.random.uniform(jax.random.PRNGKey(0), (n,), dtype, minval=-1.0, maxval=1.0) * valid
        _, largest = power_iteration(a, num_iters=100, error_tolerance=1e-6, precision=precision, v0=v0)
    ridge = ridge_epsilon * jnp.maximum(largest, 1e-16) if relative_epsilon else ridge_epsilon * largest

    def newton(ridge):
        """The root of `a + ridge * identity` and its error."""
        damped = a + ridge * identity
        if n == 1:
            return damped**alpha, jnp.zeros([], dtype)

        z = per_p(lambda v: 1 + v) / (2 * _frobenius(damped))
        m0 = z * damped
        h0 = identity * z ** per_p(lambda v: 1.0 / v)
        error0 = jnp.max(jnp.abs(m0 - identity))

        def keep_going(carry):
            step, _, _, error, _, _, improving = carry
            return (step < num_iters) & (error > error_tolerance) & improving

        def newton_step(carry):
            step, m, h, error, _, _, _ = carry
            t = one_minus_alpha * identity + alpha * m
            new_m = jnp.matmul(power(t), m, precision=precision)
            new_h = jnp.matmul(h, t, precision=precision)
            new_error = jnp.max(jnp.abs(new_m - identity))
            return step + 1, new_m, new_h, new_error, h, error, new_error < _GROWTH * error

        start = (jnp.asarray(0), m0, h0, error0, h0, error0, jnp.asarray(True))
        _, _, h, error, previous_h, previous_error, improving = jax.lax.while_loop(
            keep_going, newton_step, start
        )
        return jnp.where(improving, h, previous_h), jnp.where(improving, error, previous_error)

    if max_retries and n > 1:
        # Attempt `i` damps by `ridge * 10**i` (`10**0` is exactly 1), again while the error stays
        # large: the first attempt is the loop's first turn, so the iteration is traced (and
        # compiled) once.

        def again(carry):
            tries, _, error = carry
            retry = (tries <= max_retries) & ~(error <= retry_error_threshold)  # NaN errors retry too
            return (tries == 0) | retry

        def attempt(carry):
            tries, _, _ = carry
            return (tries + 1, *newton(ridge * jnp.asarray(10.0, dtype) ** tries))

        start = (jnp.asarray(0), jnp.zeros((n, n), dtype), jnp.zeros([], dtype))
        _, root, error = jax.lax.while_loop(again, attempt, start)
    else:
        root, error = newton(ridge)
    if padding_start is not None:  # all padding: the zero matrix
        root = jnp.where(padding_start == 0, jnp.zeros_like(root), root)
        error = jnp.where(padding_start == 0, jnp.zeros_like(error), error)
    return root.astype(matrix.dtype), error
