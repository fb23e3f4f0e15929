"""Regression losses, element-wise in the error `e = predictions - targets`."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from . import _inputs
from jax.typing import ArrayLike


def _errors(loss: str, predictions: ArrayLike, targets: ArrayLike, *, broadcast: bool) -> jax.Array:
    """`predictions - targets` (`predictions` alone when `targets` is None), after checks."""
    predictions = _inputs.floating(loss, "predictions", predictions)
    if targets is None:
        return predictions
    targets = _inputs.real(loss, "targets", targets)
    if broadcast:
        _inputs.broadcast(loss, "predictions", predictions, "targets", targets)
    else:
        _inputs.same_shape(loss, "predictions", predictions, "targets", targets)
    return predictions - targets


def squared_error(predictions: ArrayLike, targets: ArrayLike | None = None) -> jax.Array:
    r"""Element-wise squared error, `(predictions - targets) ** 2`.

    $$\ell(p, y) = (p - y)^2$$

    The mean squared error is `squared_error(predictions, targets).mean()`.

    Args:
        predictions: floating-point array of any shape `[...]`.
        targets: array of the same shape as `predictions` (no broadcasting, so that a
            `(n,)` against `(n, 1)` mix-up fails instead of producing an `(n, n)` loss).
            `None` (the default) means zeros.

    Returns:
        The squared errors, with the shape of `predictions`.

    Example:
        >>> modopt.losses.squared_error(jnp.array([1.0, 2.0]), jnp.array([0.0, 4.0]))
        Array([1., 4.], dtype=float32)

    Reference: Bishop, 2006, "Pattern Recognition and Machine Learning", section 1.1,
    https://www.microsoft.com/en-us/research/publication/pattern-recognition-machine-learning/
    """
    return _errors("squared_error", predictions, targets, broadcast=False) ** 2


def l2_loss(predictions: ArrayLike, targets: ArrayLike | None = None) -> jax.Array:
    r"""Half the element-wise squared error, `0.5 * (predictions - targets) ** 2`.

    $$\ell(p, y) = \tfrac{1}{2} (p - y)^2$$

    The factor 1/2 (Bishop's convention, not that of Hastie, Tibshirani & Friedman) makes
    the gradient the plain error `p - y`.

    Args:
        predictions: floating-point array of any shape `[...]`.
        targets: array of the same shape as `predictions` (no broadcasting, as in
            `squared_error`). `None` (the default) means zeros.

    Returns:
        The losses, with the shape of `predictions`.

    Example:
        >>> modopt.losses.l2_loss(jnp.array([1.0, 2.0]), jnp.array([0.0, 4.0]))
        Array([0.5, 2. ], dtype=float32)

    Reference: Bishop, 2006, "Pattern Recognition and Machine Learning", section 1.1,
    https://www.microsoft.com/en-us/research/publication/pattern-recognition-machine-learning/
    """
    return 0.5 * _errors("l2_loss", predictions, targets, broadcast=False) ** 2


def huber_loss(predictions: ArrayLike, targets: ArrayLike | None = None, delta: Any = 1.0) -> jax.Array:
    r"""Huber loss: quadratic for errors up to `delta`, linear beyond.

    With `e = predictions - targets`:

    $$\ell(e) = \begin{cases} \tfrac{1}{2} e^2 & |e| \le \delta \\
        \delta (|e| - \tfrac{1}{2}\delta) & |e| > \delta \end{cases}$$

    Its gradient is the error clipped to `[-delta, delta]`: gradient descent on the Huber
    loss is gradient descent on `l2_loss` with clipped gradients.

    Args:
        predictions: floating-point array of any shape `[...]`.
        targets: array broadcastable with `predictions`; `None` (the default) means zeros.
        delta: the error size where the loss turns linear, `>= 0` (default 1). May also be
            passed by keyword, as in optax.

    Returns:
        The losses, with the broadcast shape of `predictions` and `targets`.

    Example:
        >>> modopt.losses.huber_loss(jnp.array([0.5, -3.0]), delta=1.0)
        Array([0.125, 2.5  ], dtype=float32)

    Reference: Huber, 1964, "Robust Estimation of a Location Parameter",
    https://doi.org/10.1214/aoms/1177703732
    """
    _inputs.number_in("huber_loss", "delta", delta, ">= 0", lambda d: bool(np.all(d >= 0)))
    size = jnp.abs(_errors("huber_loss", predictions, targets, broadcast=True))
    inner = jnp.minimum(size, delta)  # the part of |e| on the quadratic piece
    # `size - inner` rather than `max(size - delta, 0)`: at |e| == delta only one piece has slope.
    return 0.5 * inner**2 + delta * (size - inner)


# From |e| = 1 on, `|e| + log1p(exp(-2|e|)) - log 2` loses nothing to cancellation (the
# result is at least 0.43) and never overflows; below it, `log1p(sinh(e)**2) / 2` keeps full
# relative precision down to the smallest errors, and `sinh(1)**2` fits every float dtype.
_LOG_COSH_SWITCH = 1.0
_LOG_2 = float(np.log(2.0))  # a Python float, weakly typed: keeps the dtype of the errors


def log_cosh(predictions: ArrayLike, targets: ArrayLike | None = None) -> jax.Array:
    r"""Log-cosh loss `log(cosh(predictions - targets))`, a smooth Huber-like loss.

    $$\ell(e) = \log\cosh e \approx \begin{cases} e^2 / 2 & |e| \ll 1 \\
        |e| - \log 2 & |e| \gg 1 \end{cases}$$

    It is twice differentiable everywhere, with gradient `tanh(e)`. Small errors use
    `log1p(sinh(e)**2) / 2`, which keeps full relative precision near zero (no cancellation
    against `log 2`); large ones use `|e| + log1p(exp(-2|e|)) - log 2`, which cannot overflow.

    Args:
        predictions: floating-point array of any shape `[...]`.
        targets: array broadcastable with `predictions`; `None` (the default) means zeros.

    Returns:
        The losses, with the broadcast shape of `predictions` and `targets`.

    Example:
        >>> modopt.losses.log_cosh(jnp.array([0.0, 100.0])).round(4)  # 0 and 100 - log(2)
        Array([ 0.    , 99.3069], dtype=float32)

    Reference: Chen et al., 2019, "Log Hyperbolic Cosine Loss Improves Variational
    Auto-Encoder", https://openreview.net/forum?id=rkglvsC9Ym
    """
    e = _errors("log_cosh", predictions, targets, broadcast=True)
    size = jnp.abs(e)
    small = size < _LOG_COSH_SWITCH
    # Each branch sees a harmless input where it is not selected, so neither overflows
    # and no NaN reaches the gradient.
    e_small = jnp.where(small, e, jnp.zeros_like(e))
    size_large = jnp.where(small, jnp.full_like(size, _LOG_COSH_SWITCH), size)
    near = 0.5 * jnp.log1p(jnp.sinh(e_small) ** 2)
    far = size_large + jnp.log1p(jnp.exp(-2.0 * size_large)) - _LOG_2
    return jnp.where(small, near, far)
