"""Numerically safe building blocks: norms with correct gradients at zero, safe counters."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from .trees import abs_sq as abs_sq
from .trees import global_norm as global_norm


def safe_norm(
    x: ArrayLike,
    min_norm: ArrayLike,
    ord: int | float | str | None = None,  # noqa: A002
    axis: int | tuple[int, ...] | None = None,
    keepdims: bool = False,
) -> jax.Array:
    """`max(norm(x), min_norm)` whose gradient is 0 (not NaN) where the norm is below `min_norm`.

    `jnp.maximum(jnp.linalg.norm(x), min_norm)` has a NaN gradient at `x = 0`: the gradient
    of `sqrt` at 0 is infinite and meets a zero from the `maximum`. Here, where the norm is at
    most `min_norm`, the norm is computed on ones instead of `x`, so the discarded branch of
    the `where` never differentiates `sqrt` at zero.

    Args:
        x: an array.
        min_norm: the lower bound of the result (a number or an array broadcasting with it).
        ord: the order of the norm, as in `jnp.linalg.norm` (None, a non-zero int, `inf`,
            `-inf`, `'fro'`, `'nuc'`).
        axis: None, an axis, or a pair of axes (matrix norms), as in `jnp.linalg.norm`.
        keepdims: keep the reduced axes with size one.

    Returns:
        `max(norm(x), min_norm)`, with the shape `jnp.linalg.norm` gives.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> import modopt
        >>> jax.grad(lambda v: modopt.safe_norm(v, 0.0))(jnp.zeros(2))
        Array([0., 0.], dtype=float32)
    """
    norm = jnp.linalg.norm(x, ord=ord, axis=axis, keepdims=True)
    small = norm <= min_norm
    masked = jnp.linalg.norm(jnp.where(small, jnp.ones_like(x), x), ord=ord, axis=axis, keepdims=keepdims)
    if not keepdims:
        small = jnp.squeeze(small, axis=axis)
    return jnp.where(small, min_norm, masked)


def safe_root_mean_squares(x: ArrayLike, min_rms: ArrayLike) -> jax.Array:
    """`max(sqrt(mean(|x|**2)), min_rms)` with a zero (not NaN) gradient below `min_rms`.

    As in `safe_norm`, the root mean square is computed on ones where it is at most `min_rms`,
    so the gradient there is exactly 0 instead of NaN at `x = 0`.

    Args:
        x: an array (real or complex).
        min_rms: the lower bound of the result.

    Returns:
        A real scalar: `max(sqrt(mean(|x|**2)), min_rms)`.

    Example:
        >>> import jax.numpy as jnp
        >>> import modopt
        >>> float(modopt.safe_root_mean_squares(jnp.array([3.0, 4.0]), 0.1))  # sqrt(12.5)
        3.535533905029297
    """
    rms = jnp.sqrt(jnp.mean(abs_sq(x)))
    small = rms <= min_rms
    masked = jnp.sqrt(jnp.mean(abs_sq(jnp.where(small, jnp.ones_like(x), x))))
    return jnp.where(small, min_rms, masked)


def overflow_scale(x: ArrayLike, batch_dims: int = 0, bound: int | None = None) -> jax.Array:
    """A power of two `2**-k` (`k >= 0` an integer) that brings the entries of `x` within
    `2**(maxexp / 4)` of its dtype (`2**32` for float32), so that their squares and sums of
    them stay finite: `x * overflow_scale(x)` can be squared and summed safely, and the result
    scaled back by the inverse (or the ratio of two such results taken as it is).

    It is exactly 1 for arrays already within that bound (every ordinary gradient): multiplying
    by it changes no bit. Scaling by a power of two is exact too (barring underflow of entries
    far below the largest), so a scaled computation rounds as the unscaled one would where that
    one does not overflow. Non-finite entries give 1 (they stay non-finite).

    Args:
        x: a floating-point or complex array (the scale has the real dtype).
        batch_dims: the number of leading axes along which the scales are separate (the result
            has those axes, and size 1 along the others).
        bound: the entries are brought within `2**bound`; `None` is `maxexp // 4` of the dtype
            (32 for float32). Products of products (the Frobenius norm of a Gram matrix, an
            eigendecomposition of one) need `maxexp // 8`.
    """
    x = jnp.asarray(x)
    k = overflow_exponent(x, batch_dims, bound)
    real = jnp.finfo(x.dtype).dtype  # a complex array's real dtype
    return power_of_two(-k, real).reshape(k.shape + (1,) * (x.ndim - batch_dims))


def overflow_exponent(x: ArrayLike, batch_dims: int = 0, bound: int | None = None) -> jax.Array:
    """The `k` of `overflow_scale(x, batch_dims, bound) == 2**-k`: an int32 array of the leading
    `batch_dims` axes of `x`, 0 wherever its entries are within `2**bound` (or not finite)."""
    x = jnp.asarray(x)
    bound = jnp.finfo(x.dtype).maxexp // 4 if bound is None else bound
    top = jnp.max(jnp.abs(x), axis=tuple(range(batch_dims, x.ndim)), initial=0)
    k = jnp.maximum(_exponent(top) - bound, 0)
    return jnp.where(jnp.isfinite(top), k, 0).astype(jnp.int32)


# The IEEE binary formats, whose exponent field is read and written directly below (a few
# integer operations, where `jnp.frexp` and `jnp.ldexp` handle every case in dozens, each
# compiled: a matrix optimizer takes scales of many blocks in one step).
_BITS = {jnp.dtype(jnp.float16): jnp.int16, jnp.dtype(jnp.bfloat16): jnp.int16,
         jnp.dtype(jnp.float32): jnp.int32, jnp.dtype(jnp.float64): jnp.int64}  # fmt: skip


def _exponent(top: jax.Array) -> jax.Array:
    """`jnp.frexp(top)[1]` (`top = m * 2**e`, `0.5 <= m < 1`) for normal `top >= 0`, and `minexp`
    for zero and subnormals: enough for `overflow_exponent`'s comparison with its bound.
    Non-finite `top`: any value."""
    dtype = jnp.dtype(top.dtype)
    if dtype not in _BITS:
        return jnp.frexp(top)[1]
    info = jnp.finfo(dtype)
    field = (jax.lax.bitcast_convert_type(top, _BITS[dtype]) >> info.nmant) & ((1 << info.nexp) - 1)
    return field.astype(jnp.int32) - (info.maxexp - 2)  # the biased field is e + maxexp - 2


def power_of_two(k: ArrayLike, dtype: jnp.dtype = jnp.float32) -> jax.Array:
    """`2.0**k` in `dtype` for integer `k` (an array, traced or not): `jnp.ldexp(1, k)`, written
    as the product of two powers of two built from their exponent fields, each a normal number
    (exact; 0 or infinity beyond the dtype's range, as XLA flushes subnormals)."""
    k = jnp.asarray(k, jnp.int32)
    dtype = jnp.dtype(dtype)
    if dtype not in _BITS:
        return jnp.ldexp(jnp.ones(k.shape, dtype), k)
    info = jnp.finfo(dtype)
    bits = _BITS[dtype]

    def normal(e):  # 2**e for minexp <= e <= maxexp - 1
        return jax.lax.bitcast_convert_type((e + (info.maxexp - 1)).astype(bits) << info.nmant, dtype)

    # Beyond twice the range the product is 0 or infinity all the same; within it, both halves
    # are normal exponents.
    k = jnp.clip(k, 2 * info.minexp, 2 * (info.maxexp - 1))
    half = k >> 1  # floor(k / 2)
    return normal(half) * normal(k - half)


def scaled_norm(x: ArrayLike) -> jax.Array:
    """`jnp.linalg.norm(x)` (Frobenius) without overflow for huge entries: computed on `x`
    scaled by `overflow_scale(x)` and scaled back (the same bits where it does not overflow)."""
    scale = overflow_scale(x)
    return jnp.linalg.norm(x * scale) / scale.reshape(())


def safe_increment(count: jax.Array) -> jax.Array:
    """`count + 1`, saturating at the dtype's maximum instead of overflowing.

    Args:
        count: the counter, an integer array (signed or unsigned).
    """
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
    """`count + 1` for an int32 counter, saturating at `2**31 - 1` instead of wrapping around.

    A plain `count + 1` at `2**31 - 1` overflows to `-2**31`, which would restart bias
    corrections and schedules; this one stays at the maximum.

    Args:
        count: an int32 array (usually a scalar step count).

    Returns:
        `min(count + 1, 2**31 - 1)`, int32.

    Example:
        >>> import jax.numpy as jnp
        >>> import modopt
        >>> modopt.safe_int32_increment(jnp.asarray(2**31 - 1, jnp.int32))
        Array(2147483647, dtype=int32)
    """
    count = jnp.asarray(count)
    if count.dtype != jnp.int32:
        raise ValueError(
            f"Invalid count: dtype {count.dtype} (expected an int32 counter) in safe_int32_increment. "
            "Use `safe_increment` for counters of other dtypes."
        )
    return safe_increment(count)


def is_concrete_zero(value: object) -> bool:
    """Whether `value` is known to be 0 where the step is traced: a number, or a concrete scalar
    array (a hyperparameter compiled in as a `Constant`), equal to 0.

    A term it multiplies (`weight_decay * params`) can then be left out, as optax leaves out a
    weight decay given as `0.0`: the step does no work for it, and a NaN or infinite parameter
    does not turn the update into NaN through `0 * p`.
    """
    if isinstance(value, (bool, np.bool_)) or isinstance(value, jax.core.Tracer):
        return False
    if isinstance(value, (int, float)):
        return value == 0
    if isinstance(value, (jax.Array, np.ndarray, np.generic)) and np.ndim(value) == 0:
        return np.issubdtype(value.dtype, np.number) and bool(np.asarray(value) == 0)
    return False
