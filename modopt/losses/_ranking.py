"""Ranking losses: the cost of the ranking that item scores induce, against relevance labels.

Each list of items is the last axis of the inputs; the leading axes are batch axes.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp

from . import _inputs
from jax.typing import ArrayLike


def ranking_softmax_loss(
    logits: ArrayLike,
    labels: ArrayLike,
    *,
    where: ArrayLike | None = None,
    weights: ArrayLike | None = None,
    reduce_fn: Callable[..., Any] | None = jnp.mean,
) -> jax.Array:
    r"""Listwise softmax loss: cross entropy between the relevance labels and the softmax of the scores.

    For each list, over the valid items:

    $$\ell(s, y) = -\sum_i y_i \log \frac{e^{s_i}}{\sum_j e^{s_j}}$$

    with `y` the (weighted) relevance labels, not normalized. Adding a constant to the scores
    of a list leaves its loss unchanged. Items outside `where` take no part: neither their
    label nor their score counts; a list without valid items has loss 0 and is left out of
    the reduction.

    Args:
        logits: floating-point scores of the items, of shape `[..., list_size]`.
        labels: the relevance labels (non-negative; integer, boolean or floating, cast to the
            dtype of `logits`), broadcastable with `logits`.
        where: optional boolean mask of the valid items, broadcastable to the shape of the
            inputs.
        weights: optional weights of the items, multiplying their labels, broadcastable to
            the shape of the inputs.
        reduce_fn: the reduction of the per-list losses over the valid lists, called as
            `reduce_fn(losses, where=valid_lists)`: `jnp.mean` (default; 0 when no list is
            valid) or `jnp.sum`; `None` returns the per-list losses, 0 for the lists without
            valid items.

    Returns:
        The reduced loss, a scalar; with `reduce_fn=None` the losses of shape `[...]`.

    Example:
        >>> scores = jnp.array([[2.0, 1.0, 0.0], [1.0, 0.5, 1.5]])
        >>> labels = jnp.array([[1.0, 0.0, 0.0], [0.0, 0.0, 1.0]])
        >>> where = jnp.array([[True, True, False], [True, True, True]])
        >>> modopt.losses.ranking_softmax_loss(scores, labels, where=where, reduce_fn=None)
        Array([0.31326163, 0.68026966], dtype=float32)

    Reference: Cao et al., 2007, "Learning to Rank: From Pairwise Approach to Listwise
    Approach", https://doi.org/10.1145/1273496.1273513; Bruch et al., 2019, "An Analysis of
    the Softmax Cross Entropy Loss for Learning-to-Rank with Binary Relevance",
    https://doi.org/10.1145/3341981.3344221
    """
    loss = "ranking_softmax_loss"
    logits = _inputs.floating(loss, "logits", logits)
    labels = _inputs.real(loss, "labels", labels)
    shape = _inputs.broadcast(loss, "logits", logits, "labels", labels)
    if len(shape) == 0:
        raise ValueError(f"{loss}: logits must have a list axis, laid out [..., list_size], got a scalar.")
    labels = jnp.broadcast_to(labels.astype(logits.dtype), shape)
    logits = jnp.broadcast_to(logits, shape)
    if weights is not None:
        weights = _inputs.real(loss, "weights", weights, allow_bool=False)
        _inputs.broadcast(loss, "logits", logits, "weights", weights)
        if not _broadcasts_to(weights.shape, shape):
            raise ValueError(
                f"{loss}: weights of shape {weights.shape} do not broadcast to the inputs' shape {shape}."
            )
    if reduce_fn is not None and not callable(reduce_fn):
        raise TypeError(
            f"{loss}: reduce_fn must be a function such as jnp.mean or jnp.sum, or None, got {reduce_fn!r}."
        )
    where = _inputs.mask(loss, where, shape, "the inputs")

    if where is None:
        log_probs = jax.nn.log_softmax(logits, axis=-1)
    else:
        where = jnp.broadcast_to(where, shape)
        labels = jnp.where(where, labels, 0)
        log_probs = _masked_log_softmax(logits, where)
    if weights is not None:
        labels = labels * weights
    per_list = -jnp.sum(labels * log_probs, axis=-1)

    valid_lists = None if where is None else jnp.any(where, axis=-1)
    if reduce_fn is None:
        return per_list
    reduced = reduce_fn(per_list, where=valid_lists)
    if reduce_fn is jnp.mean and valid_lists is not None:
        reduced = jnp.where(jnp.any(valid_lists), reduced, 0.0)
    return reduced


def _masked_log_softmax(logits: jax.Array, where: jax.Array) -> jax.Array:
    """`log_softmax` over the valid entries of the last axis, 0 elsewhere, finite gradients.

    Invalid entries never meet `-inf` or an empty sum, so no NaN reaches the gradients, even
    for lists with no valid entry (all 0).
    """
    anywhere = jnp.any(where, axis=-1, keepdims=True)
    largest = jnp.max(jnp.where(where, logits, -jnp.inf), axis=-1, keepdims=True)
    largest = jax.lax.stop_gradient(jnp.where(anywhere, largest, 0.0))
    shifted = jnp.where(where, logits - largest, 0.0)
    total = jnp.sum(jnp.where(where, jnp.exp(shifted), 0.0), axis=-1, keepdims=True)
    log_total = jnp.log(jnp.where(anywhere, total, 1.0))
    return jnp.where(where, shifted - log_total, 0.0)


def _broadcasts_to(shape: tuple[int, ...], target: tuple[int, ...]) -> bool:
    try:
        return tuple(jnp.broadcast_shapes(shape, target)) == tuple(target)
    except ValueError:
        return False
