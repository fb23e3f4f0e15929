"""Fenchel-Young losses: the loss of any "max" function, and the sparsemax losses."""

from __future__ import annotations

from typing import Any, Callable

import equinox as eqx
import jax
import jax.numpy as jnp

from ..projections import projection_simplex
from . import _inputs
from jax.typing import ArrayLike


class FenchelYoungLoss(eqx.Module):
    r"""The Fenchel-Young loss of a max function, over the last axis of the scores.

    For a convex "max" function $\Omega^*$ (e.g. `logsumexp`, whose gradient is the softmax):

    $$\ell(\theta, y) = \Omega^*(\theta) - \langle y, \theta \rangle$$

    (the term $\Omega(y)$ of the full definition does not depend on $\theta$ and is left out,
    so the loss is not 0 at its minimum). Its gradient in $\theta$ is
    $\nabla \Omega^*(\theta) - y$. Leading axes are batch axes: unlike jaxopt, the scores are
    not flattened into one vector. Build it with `make_fenchel_young_loss`.

    Args:
        max_fun: the max function, `max_fun(scores_1d, *args, **kwargs) -> scalar`; a static
            field (code, not a hyperparameter).

    Example:
        >>> loss = modopt.losses.make_fenchel_young_loss(jax.nn.logsumexp)
        >>> loss(jnp.array([0.0, 0.0]), jnp.array([1.0, 0.0]))  # log 2, the cross entropy
        Array(0.6931472, dtype=float32)

    Reference: Blondel, Martins & Niculae, 2020, "Learning with Fenchel-Young Losses",
    https://arxiv.org/abs/1901.02324
    """

    max_fun: Callable[..., Any] = eqx.field(static=True)

    def __check_init__(self):
        if not callable(self.max_fun):
            raise TypeError(
                f"make_fenchel_young_loss: max_fun must be a function of the scores, got a "
                f"{type(self.max_fun).__name__}."
            )

    def __call__(self, scores: ArrayLike, targets: ArrayLike, *args: Any, **kwargs: Any) -> jax.Array:
        """The loss of `scores` against `targets`, reduced over their last axis.

        Args:
            scores: floating-point scores $\\theta$ of shape `[..., n]`.
            targets: the targets $y$ (e.g. one-hot rows or distributions), broadcastable
                with `scores`.
            *args: passed to `max_fun` after each row of scores (not vectorized).
            **kwargs: passed to `max_fun` (not vectorized).

        Returns:
            The losses, with the broadcast shape of the inputs without the last axis.
        """
        loss = "fenchel_young_loss"
        scores = _inputs.floating(loss, "scores", scores)
        targets = _inputs.real(loss, "targets", targets)
        _inputs.broadcast(loss, "scores", scores, "targets", targets)
        if scores.ndim == 0:
            raise ValueError(f"{loss}: scores must have at least one axis, laid out [..., n], got a scalar.")
        max_value = jnp.vectorize(lambda row: self.max_fun(row, *args, **kwargs), signature="(n)->()")(scores)
        return max_value - jnp.einsum("...i,...i->...", jnp.conj(targets), scores)


def make_fenchel_young_loss(max_fun: Any) -> FenchelYoungLoss:
    r"""The Fenchel-Young loss built on a max function, for scores of shape `[..., n]`.

    $$\ell(\theta, y) = \Omega^*(\theta) - \langle y, \theta \rangle$$

    with $\Omega^*$ = `max_fun` applied to each row of the last axis (see `FenchelYoungLoss`).
    With `jax.nn.logsumexp` this is the softmax cross entropy; with the max itself, the
    multiclass perceptron loss.

    Args:
        max_fun: the max function, `max_fun(scores_1d, *args, **kwargs) -> scalar`.

    Returns:
        The loss, a `FenchelYoungLoss` called as `loss(scores, targets, *args, **kwargs)`.

    Example:
        >>> loss = modopt.losses.make_fenchel_young_loss(jax.nn.logsumexp)
        >>> loss(jnp.array([[0.0, 0.0], [2.0, 0.0]]), jnp.array([[1.0, 0.0], [0.0, 1.0]])).round(4)
        Array([0.6931, 2.1269], dtype=float32)

    Reference: Blondel, Martins & Niculae, 2020, "Learning with Fenchel-Young Losses",
    https://arxiv.org/abs/1901.02324
    """
    return FenchelYoungLoss(max_fun)


def sparsemax_loss(logits: ArrayLike, labels: ArrayLike) -> jax.Array:
    r"""Binary sparsemax loss: the Fenchel-Young loss of the sparse sigmoid.

    $$\ell(x, y) = \mathrm{sparse\_plus}(x) \text{ if } y = 0, \qquad
    \mathrm{sparse\_plus}(-x) \text{ if } y = 1$$

    with sparse_plus 0 below -1, $(x + 1)^2 / 4$ on [-1, 1] and $x$ above 1. The loss is 0
    exactly where `jax.nn.sparse_sigmoid(logits) == labels`: a logit beyond 1 (or -1) on the
    right side costs nothing.

    Args:
        logits: floating-point scores `x`, any shape.
        labels: the binary labels `y` (0 or 1; integer, boolean or floating, any non-zero
            value counting as 1), broadcastable with `logits`.

    Returns:
        The losses, with the broadcast shape of the inputs.

    Example:
        >>> modopt.losses.sparsemax_loss(jnp.array([2.0, 0.0, -2.0]), jnp.array([1, 1, 1]))
        Array([0.  , 0.25, 2.  ], dtype=float32)

    Reference: Blondel, Martins & Niculae, 2020, "Learning with Fenchel-Young Losses",
    section 4.4, https://arxiv.org/abs/1901.02324
    """
    loss = "sparsemax_loss"
    logits = _inputs.floating(loss, "logits", logits)
    labels = _inputs.real(loss, "labels", labels)
    _inputs.broadcast(loss, "logits", logits, "labels", labels)
    return jax.nn.sparse_plus(jnp.where(labels, -logits, logits))


# sparsemax: each row (last axis) projected onto the probability simplex, with the
# projection's Jacobian (on the support, the move less its mean there).
_sparsemax = jnp.vectorize(projection_simplex, signature="(n)->(n)")


def multiclass_sparsemax_loss(scores: ArrayLike, labels: ArrayLike) -> jax.Array:
    r"""Multiclass sparsemax loss: the Fenchel-Young loss of sparsemax (Gini entropy).

    With `p = sparsemax(s)` the Euclidean projection of the scores onto the probability
    simplex and `c` the true class:

    $$\ell(s, c) = \langle p, s - s_c \rangle + \tfrac12 \big(1 - \|p\|^2\big)$$

    non-negative, 0 exactly when `p` is the one-hot vector of `c` (when $s_c$ exceeds every
    other score by at least 1), with gradient `p - onehot(c)`: unlike the softmax cross
    entropy it stops pushing once the margin is met.

    Args:
        scores: floating-point scores of shape `[..., num_classes]` (optax takes `[batch,
            num_classes]`; here any number of leading axes, or none).
        labels: integer class indices of shape `[...]`, in `[0, num_classes)`.

    Returns:
        The losses, of shape `[...]`.

    Example:
        >>> scores = jnp.array([[3.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
        >>> modopt.losses.multiclass_sparsemax_loss(scores, jnp.array([0, 0])).round(4)  # 0, 1/2 - 1/6
        Array([0.    , 0.3333], dtype=float32)

    Reference: Martins & Astudillo, 2016, "From Softmax to Sparsemax: A Sparse Model of
    Attention and Multi-Label Classification", https://arxiv.org/abs/1602.02068
    """
    loss = "multiclass_sparsemax_loss"
    scores = _inputs.floating(loss, "scores", scores)
    labels = _inputs.class_indices(loss, labels, "scores", scores)
    labels = jnp.broadcast_to(labels, scores.shape[:-1])[..., None]
    probabilities = _sparsemax(scores)
    # <p, s - s_c> over the support, with the true class's own term exactly 0.
    shifted = scores - jnp.take_along_axis(scores, labels, axis=-1)
    is_label = jnp.arange(scores.shape[-1]) == labels
    shifted = jnp.where(is_label | (probabilities == 0), 0.0, shifted)
    return jnp.sum(probabilities * shifted, axis=-1) + 0.5 * (
        1.0 - jnp.sum(probabilities * probabilities, axis=-1)
    )
