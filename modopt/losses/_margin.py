"""Margin losses on scores: the perceptron loss and the multiclass hinge and perceptron losses."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from . import _inputs
from jax.typing import ArrayLike


def perceptron_loss(predictor_outputs: Any, targets: ArrayLike) -> jax.Array:
    r"""Perceptron loss for binary classification with targets in {-1, +1}.

    $$\ell(s, y) = \max(0,\ -s\, y)$$

    zero for every correctly classified example, whatever its margin (the hinge loss without
    the margin of 1).

    Args:
        predictor_outputs: floating-point scores `s` of the decision function, any shape.
        targets: the classes `y`, each -1 or +1 (integer or floating), of the same shape as
            `predictor_outputs` (no broadcasting, as in optax). Boolean targets are refused:
            map {0, 1} labels with `2 * labels - 1`.

    Returns:
        The losses, with the shape of the inputs.

    Example:
        >>> modopt.losses.perceptron_loss(jnp.array([2.0, -0.5]), jnp.array([1, 1]))
        Array([0. , 0.5], dtype=float32)

    Reference: Rosenblatt, 1958, "The perceptron: a probabilistic model for information
    storage and organization in the brain", https://doi.org/10.1037/h0042519
    """
    loss = "perceptron_loss"
    scores, targets = _inputs.scores_and_signs(loss, predictor_outputs, targets)
    _inputs.same_shape(loss, "predictor_outputs", scores, "targets", targets)
    return jnp.maximum(0, -scores * targets)


def _scores_and_one_hot(loss: str, scores: ArrayLike, labels: ArrayLike) -> tuple[jax.Array, jax.Array]:
    """Checked `scores` `[..., num_classes]` and the one-hot rows of the integer `labels` `[...]`.

    A label outside `[0, num_classes)` gives a row of zeros (its score counts as 0).
    """
    scores = _inputs.floating(loss, "scores", scores)
    labels = _inputs.class_indices(loss, labels, "scores", scores)
    return scores, jax.nn.one_hot(labels, scores.shape[-1], dtype=scores.dtype)


def multiclass_hinge_loss(scores: ArrayLike, labels: ArrayLike) -> jax.Array:
    r"""Multiclass hinge loss (Crammer-Singer): the margin violation of the best wrong class.

    With `c` the true class and a margin of 1 between it and every other class:

    $$\ell(s, c) = \max_j \big(s_j + [j \ne c]\big) - s_c$$

    which is 0 once $s_c \ge s_j + 1$ for every $j \ne c$.

    Args:
        scores: floating-point scores of shape `[..., num_classes]`.
        labels: integer class indices of shape `[...]` (broadcastable to the shape of
            `scores` without its last axis), in `[0, num_classes)`.

    Returns:
        The losses, of shape `[...]`, in the dtype of `scores`.

    Example:
        >>> scores = jnp.array([[3.0, 1.0, 0.0], [1.0, 1.5, 0.0]])
        >>> modopt.losses.multiclass_hinge_loss(scores, jnp.array([0, 0]))
        Array([0. , 1.5], dtype=float32)

    Reference: Crammer & Singer, 2001, "On the Algorithmic Implementation of Multiclass
    Kernel-based Vector Machines", https://www.jmlr.org/papers/v2/crammer01a.html
    """
    scores, one_hot = _scores_and_one_hot("multiclass_hinge_loss", scores, labels)
    return jnp.max(scores + 1.0 - one_hot, axis=-1) - jnp.sum(scores * one_hot, axis=-1)


def multiclass_perceptron_loss(scores: ArrayLike, labels: ArrayLike) -> jax.Array:
    r"""Multiclass perceptron loss: how far the true class's score is below the best score.

    $$\ell(s, c) = \max_j s_j - s_c$$

    Args:
        scores: floating-point scores of shape `[..., num_classes]`.
        labels: integer class indices of shape `[...]` (broadcastable to the shape of
            `scores` without its last axis), in `[0, num_classes)`.

    Returns:
        The losses, of shape `[...]`, in the dtype of `scores`.

    Example:
        >>> scores = jnp.array([[3.0, 1.0, 0.0], [1.0, 1.5, 0.0]])
        >>> modopt.losses.multiclass_perceptron_loss(scores, jnp.array([0, 0]))
        Array([0. , 0.5], dtype=float32)

    Reference: Collins, 2002, "Discriminative Training Methods for Hidden Markov Models:
    Theory and Experiments with Perceptron Algorithms", https://aclanthology.org/W02-1001/
    """
    scores, one_hot = _scores_and_one_hot("multiclass_perceptron_loss", scores, labels)
    return jnp.max(scores, axis=-1) - jnp.sum(scores * one_hot, axis=-1)
