"""Self-supervised (metric learning) losses on embeddings: NT-Xent and the triplet margin loss."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from . import _inputs
from ._divergence import cosine_similarity
from .._core.fields import Scalar
from jax.typing import ArrayLike


def ntxent(embeddings: ArrayLike, labels: ArrayLike, temperature: Any = 0.07) -> jax.Array:
    r"""Normalized temperature-scaled cross entropy (NT-Xent), the contrastive loss of SimCLR.

    With $s_{ij} = \cos(e_i, e_j) / \tau$, each positive pair `(i, j)` (same label, `i != j`)
    is a classification of `j` against the negatives of `i` (different labels):

    $$\ell = -\frac{1}{|P|} \sum_{(i, j) \in P}
    \log \frac{e^{s_{ij}}}{e^{s_{ij}} + \sum_{k:\, y_k \ne y_i} e^{s_{ik}}}$$

    averaged over all ordered positive pairs `P`. The cosines floor the squared norms at the
    machine epsilon of the dtype, so a zero embedding gives finite values.

    Args:
        embeddings: floating-point embeddings of shape `[batch, features]`.
        labels: the group of each embedding, of shape `[batch]` (integer, boolean or
            floating): embeddings with the same label are positive pairs, e.g. `[0, 0, 1, 1]`
            for two views of two images. Without any positive pair the loss is NaN (0 / 0).
        temperature: the temperature $\tau > 0$ dividing the cosines.

    Returns:
        The loss, a scalar.

    Example:
        >>> embeddings = jnp.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [0.0, 1.0]])
        >>> modopt.losses.ntxent(embeddings, jnp.array([0, 0, 1, 1]), temperature=1.0).round(4)
        Array(0.5514, dtype=float32)

    Reference: Chen et al., 2020, "A Simple Framework for Contrastive Learning of Visual
    Representations", https://arxiv.org/abs/2002.05709
    """
    loss = "ntxent"
    embeddings = _inputs.floating(loss, "embeddings", embeddings)
    labels = _inputs.real(loss, "labels", labels)
    _inputs.rank(loss, "embeddings", embeddings, 2, "(batch, features)")
    if labels.shape != embeddings.shape[:1]:
        raise ValueError(
            f"{loss}: labels of shape {labels.shape} must have one label per embedding, that is shape "
            f"{embeddings.shape[:1]} for embeddings of shape {embeddings.shape}."
        )
    _inputs.number_in(loss, "temperature", temperature, "> 0", lambda t: bool(np.all(t > 0)))

    eps = jnp.finfo(embeddings.dtype).eps
    similarity = cosine_similarity(embeddings[None, :, :], embeddings[:, None, :], epsilon=eps) / temperature
    same = labels[:, None] == labels[None, :]
    positive = same & ~jnp.eye(labels.shape[0], dtype=bool)
    negative = ~same
    positive_similarity = jnp.where(positive, similarity, -jnp.inf)
    negative_similarity = jnp.where(negative, similarity, -jnp.inf)
    # Shifted by each row's largest similarity to another embedding, for stability.
    largest = jnp.max(jnp.where(positive | negative, similarity, -jnp.inf), axis=1, keepdims=True)
    largest = jax.lax.stop_gradient(largest)
    positive_shifted = positive_similarity - largest
    negatives = jnp.sum(jnp.exp(negative_similarity - largest), axis=1, keepdims=True)
    log_probs = positive_shifted - jnp.log(negatives + jnp.exp(positive_shifted))
    return -jnp.sum(jnp.where(positive, log_probs, 0.0)) / jnp.sum(positive)


def triplet_margin_loss(
    anchors: ArrayLike,
    positives: ArrayLike,
    negatives: ArrayLike,
    axis: int = -1,
    norm_degree: Scalar = 2,
    margin: Scalar = 1.0,
    eps: Scalar = 1e-6,
) -> jax.Array:
    r"""Triplet margin loss: the positive should be closer to the anchor than the negative by `margin`.

    With the smoothed p-norm distance $d(x, y) = (\sum_k |x_k - y_k|^p + \epsilon)^{1/p}$
    along `axis`:

    $$\ell(a, p, n) = \max\big(0,\ d(a, p) - d(a, n) + \text{margin}\big)$$

    0 once $d(a, n) \ge d(a, p) + \text{margin}$. For even `norm_degree` (the default 2) this
    is optax's formula; optax leaves out the absolute value, which for odd degrees gives a
    signed sum that is not a distance (NaN for degree 3), so modopt departs from it there.

    Args:
        anchors: floating-point anchor embeddings, of shape `[batch, features]` (any shape
            with the features along `axis`).
        positives: floating-point embeddings similar to the anchors, broadcastable with them.
        negatives: floating-point embeddings dissimilar to the anchors, broadcastable with them.
        axis: the feature axis along which distances are taken (default -1).
        norm_degree: the degree `p > 0` of the norm (default 2, Euclidean).
        margin: the margin by which the negative distance should exceed the positive one.
        eps: `epsilon >= 0` added under the root, which keeps the gradient finite where two
            embeddings coincide.

    Returns:
        The losses, with the broadcast shape of the inputs without `axis`.

    Example:
        >>> anchors = jnp.array([[0.0, 0.0], [0.0, 0.0]])
        >>> positives = jnp.array([[0.0, 1.0], [0.0, 1.0]])
        >>> negatives = jnp.array([[3.0, 0.0], [1.0, 0.0]])
        >>> modopt.losses.triplet_margin_loss(anchors, positives, negatives, eps=0.0)
        Array([0., 1.], dtype=float32)

    Reference: Balntas et al., 2016, "Learning local feature descriptors with triplets and
    shallow convolutional neural networks", https://bmva-archive.org.uk/bmvc/2016/papers/paper119/
    """
    loss = "triplet_margin_loss"
    anchors = _inputs.floating(loss, "anchors", anchors)
    positives = _inputs.floating(loss, "positives", positives)
    negatives = _inputs.floating(loss, "negatives", negatives)
    _inputs.broadcast(loss, "anchors", anchors, "positives", positives)
    _inputs.broadcast(loss, "anchors", anchors, "negatives", negatives)
    shape = np.broadcast_shapes(anchors.shape, positives.shape, negatives.shape)
    if len(shape) == 0:
        raise ValueError(f"{loss}: the embeddings must have a feature axis, got scalars.")
    _inputs.axes(loss, axis, len(shape), "the embeddings", allow_none=False)
    _inputs.number_in(loss, "norm_degree", norm_degree, "> 0", lambda p: bool(np.all(p > 0)))
    _inputs.number_in(loss, "eps", eps, ">= 0", lambda e: bool(np.all(e >= 0)))

    def distance(x: jax.Array, y: jax.Array) -> jax.Array:
        return jnp.power(jnp.sum(jnp.power(jnp.abs(x - y), norm_degree), axis=axis) + eps, 1 / norm_degree)

    return jnp.maximum(distance(anchors, positives) - distance(anchors, negatives) + margin, 0)
