"""Numerically safe building blocks: norms with correct gradients at zero, safe counters."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ._trees import abs_sq as abs_sq
from ._trees import global_norm as global_norm


def safe_norm(x, min_norm, ord=None, axis=None, keepdims: bool = False) -> jax.Array:  # noqa: A002
    """`max(norm(x), min_norm)` whose gradient is 0 (not NaN) where the norm is below `min_norm`.

    Below the threshold the norm is computed on ones instead of `x`, so the discarded branch
    of the `where` never differentiates `sqrt` at zero.
    """
    norm = jnp.linalg.norm(x, ord=ord, axis=axis, keepdims=True)
    small = norm <= min_norm
    masked = jnp.linalg.norm(jnp.where(small, jnp.ones_like(x), x), ord=ord, axis=axis, keepdims=keepdims)
    if not keepdims:
        small = jnp.squeeze(small, axis=axis)
    return jnp.where(small, min_norm, masked)


def safe_root_mean_squares(x, min_rms) -> jax.Array:
    """`max(sqrt(mean(|x|**2)), min_rms)` with a zero (not NaN) gradient below `min_rms`."""
    rms = jnp.sqrt(jnp.mean(abs_sq(x)))
    small = rms <= min_rms
    masked = jnp.sqrt(jnp.mean(abs_sq(jnp.where(small, jnp.ones_like(x), x))))
    return jnp.where(small, min_rms, masked)


def safe_increment(count: jax.Array) -> jax.Array:
    """`count + 1`, saturating at the dtype's maximum instead of overflowing."""
    count = jnp.asarray(count)
    if jnp.issubdtype(count.dtype, jnp.integer):
        top = jnp.iinfo(count.dtype).max
    elif jnp.issubdtype(count.dtype, jnp.floating):
        top = jnp.finfo(count.dtype).max
    else:
        raise ValueError(f"Cannot increment a counter of dtype {count.dtype}: use an integer dtype.")
    top = jnp.asarray(top, count.dtype)  # a Python int beyond int32 would not trace
    return jnp.where(count < top, count + jnp.ones([], count.dtype), count)


def safe_int32_increment(count: jax.Array) -> jax.Array:
    """`count + 1` for an int32 counter, saturating at 2**31 - 1."""
    count = jnp.asarray(count)
    if count.dtype != jnp.int32:
        raise ValueError(f"safe_int32_increment expects an int32 counter, got {count.dtype}.")
    return safe_increment(count)
