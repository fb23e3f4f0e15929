"""Divergences between distributions and (dis)similarities between vectors."""

from __future__ import annotations

import warnings
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from . import _inputs
from .._core.fields import Scalar
from jax.typing import ArrayLike


def _distributions(loss: str, log_predictions: ArrayLike, targets: ArrayLike, axis: Any, where: ArrayLike):
    """Checked `(log_predictions, targets, where)` for a divergence reduced over `axis`."""
    log_predictions = _inputs.floating(loss, "log_predictions", log_predictions)
    targets = _inputs.floating(
        loss,
        "targets",
        targets,
        hint=f"targets are probabilities: cast with `targets.astype({log_predictions.dtype.name})`",
    )
    shape = _inputs.broadcast(loss, "log_predictions", log_predictions, "targets", targets)
    _inputs.axes(loss, axis, len(shape), "the inputs")
    return log_predictions, targets, _inputs.mask(loss, where, shape, "the inputs")


def _kl_terms(log_predictions: jax.Array, targets: jax.Array) -> jax.Array:
    """`q * (log q - log p)` element-wise, 0 wherever `q == 0` (even where `log p = -inf`)."""
    zero = targets == 0
    # Where the target is 0 the unused branch of the `where` sees log q = 0 and log p = 0, so
    # it stays finite and no NaN (0 * inf) reaches the gradients, even where log p = -inf.
    log_targets = jnp.log(jnp.where(zero, jnp.ones_like(targets), targets))
    log_predictions = jnp.where(zero, jnp.zeros_like(log_predictions), log_predictions)
    return jnp.where(zero, jnp.zeros_like(targets), targets * (log_targets - log_predictions))


def kl_divergence(log_predictions: ArrayLike, targets: ArrayLike, axis: Any = -1, where: ArrayLike | None = None) -> jax.Array:
    r"""Kullback-Leibler divergence `KL(targets || predictions)`, predictions given as logs.

    With `q` the target distribution and `log p` the predicted log-probabilities:

    $$\mathrm{KL}(q \,\|\, p) = \sum_j q_j (\log q_j - \log p_j)$$

    the information lost when `p` is used to approximate `q`. Terms with `q_j = 0` are 0, even
    where `log p_j = -inf` (the convention `0 log 0 = 0`), and have a zero gradient.

    Args:
        log_predictions: floating-point log-probabilities `log p` of shape `[..., dim]`
            (logs, e.g. from `jax.nn.log_softmax`, so that tiny probabilities do not underflow).
        targets: floating-point probabilities `q` (non-negative), broadcastable with
            `log_predictions`.
        axis: the axis or axes of the distribution (default -1), or `None` for all.
        where: optional boolean mask of the entries to include, broadcastable to the shape
            of the inputs (aligned from the right, as in NumPy).

    Returns:
        The divergences, with the broadcast shape of the inputs without `axis`.

    Example:
        >>> log_p = jnp.log(jnp.array([0.5, 0.5]))
        >>> modopt.losses.kl_divergence(log_p, jnp.array([1.0, 0.0]))
        Array(0.6931472, dtype=float32)

    Reference: Kullback & Leibler, 1951, "On Information and Sufficiency",
    https://doi.org/10.1214/aoms/1177729694
    """
    log_p, q, where = _distributions("kl_divergence", log_predictions, targets, axis, where)
    return jnp.sum(_kl_terms(log_p, q), axis=axis, where=where)


def generalized_kl_divergence(
    log_predictions: ArrayLike, targets: ArrayLike, axis: Any = -1, where: ArrayLike | None = None
) -> jax.Array:
    r"""Generalized Kullback-Leibler divergence, for unnormalized non-negative measures.

    $$D(q \,\|\, p) = \sum_j q_j (\log q_j - \log p_j) + \sum_j (p_j - q_j)$$

    The second sum is 0 for normalized distributions, so this is `kl_divergence` there; it
    stays a divergence (non-negative, 0 only at `p = q`) for unnormalized non-negative
    measures, jointly convex in `(q, p)`. It is the Bregman divergence of `x log x - x`.
    Terms with `q_j = 0` contribute `p_j` (the convention `0 log 0 = 0`).

    Args:
        log_predictions: floating-point log-probabilities `log p` of shape `[..., dim]`.
        targets: floating-point non-negative `q`, broadcastable with `log_predictions`.
        axis: the axis or axes of the distribution (default -1), or `None` for all.
        where: optional boolean mask of the entries to include, as in `kl_divergence`.

    Returns:
        The divergences, with the broadcast shape of the inputs without `axis`.

    Example:
        >>> log_p = jnp.log(jnp.array([1.0, 1.0]))
        >>> modopt.losses.generalized_kl_divergence(log_p, jnp.array([0.5, 0.5]))
        Array(0.30685282, dtype=float32)

    Reference: Boyd & Vandenberghe, 2004, "Convex Optimization", p. 90,
    https://stanford.edu/~boyd/cvxbook/; Bregman, 1967,
    https://doi.org/10.1016/0041-5553(67)90040-7
    """
    return _generalized_kl("generalized_kl_divergence", log_predictions, targets, axis, where)


def convex_kl_divergence(log_predictions: ArrayLike, targets: ArrayLike, axis: Any = -1, where: ArrayLike | None = None) -> jax.Array:
    r"""`generalized_kl_divergence` under its older name (deprecated in optax 0.2.8).

    $$D(q \,\|\, p) = \sum_j q_j (\log q_j - \log p_j) + \sum_j (p_j - q_j)$$

    The same function as `generalized_kl_divergence`; errors name `convex_kl_divergence`.
    As in optax 0.2.8, calling it warns (`DeprecationWarning`) that the new name is preferred.

    Args:
        log_predictions: floating-point log-probabilities `log p` of shape `[..., dim]`.
        targets: floating-point non-negative `q`, broadcastable with `log_predictions`.
        axis: the axis or axes of the distribution (default -1), or `None` for all.
        where: optional boolean mask of the entries to include, as in `kl_divergence`.

    Returns:
        The divergences, with the broadcast shape of the inputs without `axis`.

    Example:
        >>> log_p = jnp.log(jnp.array([1.0, 1.0]))
        >>> modopt.losses.convex_kl_divergence(log_p, jnp.array([0.5, 0.5]))
        Array(0.30685282, dtype=float32)

    Reference: Kullback & Leibler, 1951, https://doi.org/10.1214/aoms/1177729694; Boyd &
    Vandenberghe, 2004, "Convex Optimization", p. 90, https://stanford.edu/~boyd/cvxbook/
    """
    warnings.warn(
        "convex_kl_divergence is deprecated: use generalized_kl_divergence (the same function).",
        DeprecationWarning,
        stacklevel=2,
    )
    return _generalized_kl("convex_kl_divergence", log_predictions, targets, axis, where)


def _generalized_kl(loss: str, log_predictions: ArrayLike, targets: ArrayLike, axis: Any, where: ArrayLike) -> jax.Array:
    log_p, q, where = _distributions(loss, log_predictions, targets, axis, where)
    kl = jnp.sum(_kl_terms(log_p, q), axis=axis, where=where)
    return kl + jnp.sum(jnp.exp(log_p) - q, axis=axis, where=where)


def kl_divergence_with_log_targets(
    log_predictions: ArrayLike, log_targets: ArrayLike, axis: Any = -1, where: ArrayLike | None = None
) -> jax.Array:
    r"""Kullback-Leibler divergence `KL(targets || predictions)`, both given as logs.

    $$\mathrm{KL}(q \,\|\, p) = \sum_j e^{\log q_j} (\log q_j - \log p_j)$$

    `kl_divergence` with the targets in log space, for targets too small to store as
    probabilities. Terms with `log q_j = -inf` are 0 with a zero gradient (optax gives NaN
    there).

    Args:
        log_predictions: floating-point log-probabilities `log p` of shape `[..., dim]`.
        log_targets: floating-point log-probabilities `log q`, broadcastable with
            `log_predictions`.
        axis: the axis or axes of the distribution (default -1), or `None` for all.
        where: optional boolean mask of the entries to include, broadcastable to the shape
            of the inputs.

    Returns:
        The divergences, with the broadcast shape of the inputs without `axis`.

    Example:
        >>> log_p = jnp.log(jnp.array([0.5, 0.5]))
        >>> modopt.losses.kl_divergence_with_log_targets(log_p, jnp.array([0.0, -jnp.inf]))
        Array(0.6931472, dtype=float32)

    Reference: Kullback & Leibler, 1951, "On Information and Sufficiency",
    https://doi.org/10.1214/aoms/1177729694
    """
    loss = "kl_divergence_with_log_targets"
    log_p = _inputs.floating(loss, "log_predictions", log_predictions)
    log_q = _inputs.floating(loss, "log_targets", log_targets)
    shape = _inputs.broadcast(loss, "log_predictions", log_p, "log_targets", log_q)
    _inputs.axes(loss, axis, len(shape), "the inputs")
    where = _inputs.mask(loss, where, shape, "the inputs")
    # Where q = 0 the unused branch sees log q = log p = 0, so no inf - inf reaches the gradients.
    zero = jnp.isneginf(log_q)
    log_q = jnp.where(zero, jnp.zeros_like(log_q), log_q)
    log_p = jnp.where(zero, jnp.zeros_like(log_p), log_p)
    terms = jnp.where(zero, 0.0, jnp.exp(log_q) * (log_q - log_p))
    return jnp.sum(terms, axis=axis, where=where)


def cosine_similarity(
    predictions: ArrayLike, targets: ArrayLike, epsilon: Scalar = 0.0, *, axis: Any = -1, where: ArrayLike | None = None
) -> jax.Array:
    r"""Cosine of the angle between `predictions` and `targets`, vector by vector.

    $$\cos(a, b) = \frac{a \cdot b}{\sqrt{\max(\|a\|^2, \epsilon)}\ \sqrt{\max(\|b\|^2, \epsilon)}}$$

    `epsilon` floors the squared norms (as optax 0.2.4+ does), so the norms are at least
    `sqrt(epsilon)`. With the default `epsilon=0`, a zero vector gives NaN; pass a small
    positive `epsilon` (e.g. 1e-12) to get 0 instead.

    Args:
        predictions: floating-point vectors of shape `[..., dim]`.
        targets: floating-point vectors, broadcastable with `predictions`.
        epsilon: floor of the squared norms, `>= 0`.
        axis: the axis or axes of the vectors (default -1), or `None` for all.
        where: optional boolean mask of the entries to include, broadcastable to the shape
            of the inputs (aligned from the right, as in NumPy).

    Returns:
        The similarities in [-1, 1], with the broadcast shape of the inputs without `axis`.

    Example:
        >>> modopt.losses.cosine_similarity(jnp.array([[1.0, 0.0], [1.0, 1.0]]), jnp.array([1.0, 0.0]))
        Array([1.        , 0.70710677], dtype=float32)

    Reference: https://en.wikipedia.org/wiki/Cosine_similarity
    """
    return _cosine("cosine_similarity", predictions, targets, epsilon, axis, where)


def cosine_distance(
    predictions: ArrayLike, targets: ArrayLike, epsilon: Scalar = 0.0, *, axis: Any = -1, where: ArrayLike | None = None
) -> jax.Array:
    r"""Cosine distance `1 - cosine_similarity(predictions, targets)`, vector by vector.

    $$d(a, b) = 1 - \cos(a, b)$$

    0 for vectors pointing the same way, 1 for orthogonal ones, 2 for opposite ones. See
    `cosine_similarity` for `epsilon`, `axis` and `where`.

    Args:
        predictions: floating-point vectors of shape `[..., dim]`.
        targets: floating-point vectors, broadcastable with `predictions`.
        epsilon: floor of the squared norms, `>= 0`.
        axis: the axis or axes of the vectors (default -1), or `None` for all.
        where: optional boolean mask of the entries to include.

    Returns:
        The distances in [0, 2], with the broadcast shape of the inputs without `axis`.

    Example:
        >>> modopt.losses.cosine_distance(jnp.array([0.0, 2.0]), jnp.array([1.0, 0.0]))
        Array(1., dtype=float32)

    Reference: https://en.wikipedia.org/wiki/Cosine_similarity#Cosine_distance
    """
    return 1.0 - _cosine("cosine_distance", predictions, targets, epsilon, axis, where)


def _cosine(loss: str, predictions: ArrayLike, targets: ArrayLike, epsilon: Any, axis: Any, where: ArrayLike) -> jax.Array:
    a = _inputs.floating(loss, "predictions", predictions)
    b = _inputs.floating(loss, "targets", targets)
    shape = _inputs.broadcast(loss, "predictions", a, "targets", b)
    _inputs.axes(loss, axis, len(shape), "the inputs")
    where = _inputs.mask(loss, where, shape, "the inputs")
    _inputs.number_in(loss, "epsilon", epsilon, ">= 0", lambda e: bool(np.all(e >= 0)))

    def unit(x: jax.Array) -> jax.Array:
        squared_norm = jnp.sum(x * x, axis=axis, where=where, keepdims=True)
        return x / jnp.sqrt(jnp.maximum(squared_norm, epsilon))

    return jnp.sum(unit(a) * unit(b), axis=axis, where=where)
