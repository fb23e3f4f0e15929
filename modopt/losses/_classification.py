"""Classification losses on logits (unnormalized log-probabilities) and label smoothing."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import jax.scipy.special
import numpy as np

from . import _inputs
from .._core.fields import Scalar
from jax.typing import ArrayLike


def hinge_loss(predictor_outputs: Any, targets: ArrayLike) -> jax.Array:
    r"""Hinge loss for binary classification with targets in {-1, +1}.

    $$\ell(s, y) = \max(0,\ 1 - s\, y)$$

    Args:
        predictor_outputs: floating-point scores `s` of the decision function, any shape.
        targets: the classes `y`, each -1 or +1 (integer or floating), broadcastable with
            `predictor_outputs`. Boolean targets are refused: {0, 1} labels would give
            every negative example the loss 1; map them with `2 * labels - 1`.

    Returns:
        The losses, with the broadcast shape of the inputs.

    Example:
        >>> modopt.losses.hinge_loss(jnp.array([2.0, 0.5, -1.0]), jnp.array([1, 1, 1]))
        Array([0. , 0.5, 2. ], dtype=float32)

    Reference: Cortes & Vapnik, 1995, "Support-vector networks",
    https://doi.org/10.1007/BF00994018
    """
    loss = "hinge_loss"
    scores, targets = _inputs.scores_and_signs(loss, predictor_outputs, targets)
    _inputs.broadcast(loss, "predictor_outputs", scores, "targets", targets)
    return jnp.maximum(0, 1 - scores * targets)


def sigmoid_binary_cross_entropy(logits: ArrayLike, labels: ArrayLike) -> jax.Array:
    r"""Element-wise binary cross entropy of independent sigmoid probabilities.

    With `p = sigmoid(x)` the predicted probability of the positive class:

    $$\ell(x, y) = -y \log \sigma(x) - (1 - y) \log \sigma(-x)$$

    computed with `log_sigmoid`, so large logits of either sign stay finite. Each element is
    its own binary problem: use it for binary classification (one logit per example, for
    class 1) or multi-label classification (one logit per class, labels not mutually
    exclusive). Mind the broadcasting of `logits` against `labels`.

    Args:
        logits: floating-point logits `x`, any shape.
        labels: the target probabilities `y` in [0, 1] (binary labels may be integer or
            boolean), broadcastable with `logits`; cast to the dtype of `logits`.

    Returns:
        The cross entropies, with the broadcast shape of the inputs.

    Example:
        >>> modopt.losses.sigmoid_binary_cross_entropy(jnp.array([0.0, 100.0]), jnp.array([1, 0]))
        Array([  0.6931472, 100.       ], dtype=float32)

    Reference: Goodfellow, Bengio & Courville, 2016, "Deep Learning", section 6.2.2.2,
    http://www.deeplearningbook.org/contents/mlp.html
    """
    return _sigmoid_cross_entropy("sigmoid_binary_cross_entropy", logits, labels)[0]


def _sigmoid_cross_entropy(loss: str, logits: ArrayLike, labels: ArrayLike):
    """Checked element-wise sigmoid cross entropy, with `log sigmoid(+-x)` and the cast labels.

    Returns `(cross_entropy, log_p, log_not_p, labels)`, for the losses built on it.
    """
    logits = _inputs.floating(loss, "logits", logits)
    labels = _inputs.real(loss, "labels", labels)
    _inputs.broadcast(loss, "logits", logits, "labels", labels)
    labels = labels.astype(logits.dtype)
    log_p, log_not_p = jax.nn.log_sigmoid(logits), jax.nn.log_sigmoid(-logits)
    return -labels * log_p - (1.0 - labels) * log_not_p, log_p, log_not_p, labels


def _probability_labels(loss: str, labels: ArrayLike, logits: jax.Array) -> jax.Array:
    """Labels that are probabilities over the classes (floating), with a fix for index labels."""
    labels = _inputs.as_array(loss, "labels", labels)
    if jnp.issubdtype(labels.dtype, jnp.integer) and labels.ndim < logits.ndim:
        hint = (
            f"{loss} takes one-hot or probability labels with the class axis; for integer class indices "
            "use softmax_cross_entropy_with_integer_labels, or one-hot encode them with "
            "`jax.nn.one_hot(labels, num_classes)`"
        )
    else:
        hint = f"cast one-hot labels with `labels.astype({logits.dtype.name})`"
    return _inputs.floating(loss, "labels", labels, hint=hint)


def softmax_cross_entropy(logits: ArrayLike, labels: ArrayLike, axis: Any = -1, where: ArrayLike | None = None) -> jax.Array:
    r"""Cross entropy between the softmax of `logits` and the distributions `labels`.

    For mutually exclusive classes (each example in exactly one class). Over the class axis:

    $$\ell(x, y) = -\sum_j y_j \log \frac{e^{x_j}}{\sum_k e^{x_k}}$$

    Classes whose logit is `-inf` and whose label is 0 contribute 0 (the convention
    `0 log 0 = 0`), so masking classes out with `-inf` logits is safe.

    Args:
        logits: floating-point logits of shape `[..., num_classes]`.
        labels: floating-point probability distributions over the classes (non-negative,
            summing to 1), e.g. one-hot rows, broadcastable with `logits`.
        axis: the class axis or axes (default -1), or `None` for all axes.
        where: optional boolean mask of the classes to include, broadcastable to the shape
            of `logits`; or of the rank of `logits` without the class axes (it then masks
            whole examples).

    Returns:
        The cross entropies, with the shape of `logits` without the class axes.

    Example:
        >>> logits = jnp.array([[2.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
        >>> labels = jnp.array([[1.0, 0.0, 0.0], [0.0, 0.5, 0.5]])
        >>> modopt.losses.softmax_cross_entropy(logits, labels).round(4)  # -log(e^2 / (e^2 + 2)), log(3)
        Array([0.2395, 1.0986], dtype=float32)

    Reference: Goodfellow, Bengio & Courville, 2016, "Deep Learning", section 6.2.2.3,
    http://www.deeplearningbook.org/contents/mlp.html
    """
    return _cross_entropy("softmax_cross_entropy", logits, labels, axis, where)[0]


def _cross_entropy(loss: str, logits: ArrayLike, labels: ArrayLike, axis: Any, where: ArrayLike):
    """Checked softmax cross entropy, with the labels, softmax and mask it used.

    Returns `(cross_entropy, labels, log_probs, where)`, for the losses built on it.
    """
    logits = _inputs.floating(loss, "logits", logits)
    labels = _probability_labels(loss, labels, logits)
    _inputs.broadcast(loss, "logits", logits, "labels", labels)
    axes = _inputs.axes(loss, axis, logits.ndim, "logits")
    where = _inputs.mask(loss, where, logits.shape, "logits", expand=axes)
    log_probs = jax.nn.log_softmax(logits, axis=axis, where=where)
    # 0 * log(0) is 0 here, not NaN; where the label is non-zero, `-inf` stays `-inf`.
    safe_log_probs = jnp.where((labels == 0) & jnp.isneginf(log_probs), jnp.zeros_like(log_probs), log_probs)
    cross_entropy = -jnp.sum(labels * safe_log_probs, axis=axis, where=where)
    return cross_entropy, labels, log_probs, where


def softmax_cross_entropy_with_integer_labels(
    logits: ArrayLike, labels: ArrayLike, axis: Any = -1, where: ArrayLike | None = None
) -> jax.Array:
    r"""Cross entropy between the softmax of `logits` and integer class labels.

    The same loss as `softmax_cross_entropy` with one-hot labels, without building them:

    $$\ell(x, c) = \log \sum_k e^{x_k} - x_c$$

    Args:
        logits: floating-point logits of shape `[..., num_classes]`.
        labels: integer class indices of shape `[...]` (the shape of `logits` without the
            class axes, or broadcastable to it with the same rank), in `[0, num_classes)`.
            Labels are values, which tracing cannot see: an index beyond the classes gives
            NaN, a negative one counts from the end as in NumPy indexing.
        axis: the class axis (default -1), or a tuple of axes: their slice is then
            flattened in row-major order, and a label is a flat index into it (see
            `jnp.ravel_multi_index`).
        where: optional boolean mask of the classes to include, as in
            `softmax_cross_entropy`. Examples with no class included get 0.

    Returns:
        The cross entropies, with the shape of `logits` without the class axes.

    Example:
        >>> logits = jnp.array([[2.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
        >>> modopt.losses.softmax_cross_entropy_with_integer_labels(logits, jnp.array([0, 2])).round(4)
        Array([0.2395, 1.0986], dtype=float32)

    Reference: Goodfellow, Bengio & Courville, 2016, "Deep Learning", section 6.2.2.3,
    http://www.deeplearningbook.org/contents/mlp.html
    """
    loss = "softmax_cross_entropy_with_integer_labels"
    logits = _inputs.floating(loss, "logits", logits)
    labels = _inputs.as_array(loss, "labels", labels)
    if jnp.issubdtype(labels.dtype, jnp.floating) and labels.ndim == logits.ndim:
        hint = (
            "these look like one-hot or probability labels: use softmax_cross_entropy, or take "
            "`labels.argmax(axis)` for class indices"
        )
    else:
        hint = "cast class indices with `labels.astype(jnp.int32)`"
    labels = _inputs.integer(loss, "labels", labels, hint=hint)
    axes = _inputs.axes(loss, axis, logits.ndim, "logits", allow_none=False)
    batch_axes = tuple(a for a in range(logits.ndim) if a not in axes)
    batch_shape = tuple(logits.shape[a] for a in batch_axes)
    shown_axis = axis if isinstance(axis, int) else tuple(axis)
    if labels.ndim != len(batch_shape) or not _broadcasts(labels.shape, batch_shape):
        raise ValueError(
            f"{loss}: labels of shape {labels.shape} must have the shape of logits {logits.shape} "
            f"without its class axis {shown_axis}, that is {batch_shape}."
        )
    where = _inputs.mask(loss, where, logits.shape, "logits", expand=axes)

    # Class axes last, flattened into one: labels index that flat axis.
    def classes_last(x: jax.Array) -> jax.Array:
        x = jnp.transpose(x, batch_axes + axes)
        return jnp.reshape(x, x.shape[: len(batch_axes)] + (-1,))

    flat_logits = classes_last(logits)
    picked = jnp.take_along_axis(flat_logits, labels[..., None], axis=-1)[..., 0]
    if where is None:
        return jax.nn.logsumexp(flat_logits, axis=-1) - picked
    flat_where = classes_last(jnp.broadcast_to(where, logits.shape))
    out = jax.nn.logsumexp(flat_logits, axis=-1, where=flat_where) - picked
    return jnp.where(jnp.any(flat_where, axis=-1), out, 0.0)


def _broadcasts(shape: tuple[int, ...], target: tuple[int, ...]) -> bool:
    try:
        return tuple(np.broadcast_shapes(shape, target)) == tuple(target)
    except ValueError:
        return False


def smooth_labels(labels: ArrayLike, alpha: Scalar, *, axis: Any = -1, where: ArrayLike | None = None) -> jax.Array:
    r"""Label smoothing: mixes one-hot labels with the uniform distribution.

    With `K` classes along `axis`:

    $$\tilde y = (1 - \alpha)\, y + \alpha / K$$

    Smoothed targets keep a cross-entropy-trained model from pushing its logit gaps to
    infinity, which tends to improve calibration.

    Args:
        labels: floating-point one-hot (or probability) labels, classes along `axis`.
        alpha: the smoothing factor, in [0, 1].
        axis: the class axis or axes (default -1), or `None` for all axes.
        where: optional boolean mask of the classes that count, broadcastable to the shape
            of `labels` (e.g. one row of classes for the whole batch): `K` is then the number
            of classes included (the formula is applied to every entry; masked ones are for
            the consumer to ignore).

    Returns:
        The smoothed labels, with the shape of `labels`.

    Example:
        >>> modopt.losses.smooth_labels(jnp.array([1.0, 0.0, 0.0, 0.0]), 0.2)
        Array([0.85, 0.05, 0.05, 0.05], dtype=float32)

    Reference: Müller, Kornblith & Hinton, 2019, "When Does Label Smoothing Help?",
    https://arxiv.org/abs/1906.02629
    """
    loss = "smooth_labels"
    labels = _inputs.floating(loss, "labels", labels)
    _inputs.number_in(loss, "alpha", alpha, "in [0, 1]", lambda a: bool(np.all((a >= 0) & (a <= 1))))
    axes = _inputs.axes(loss, axis, labels.ndim, "labels")
    where = _inputs.mask(loss, where, labels.shape, "labels")
    if where is None:
        num_classes = int(
            np.prod([labels.shape[a] for a in (axes if axes is not None else range(labels.ndim))])
        )
    else:
        num_classes = jnp.sum(jnp.broadcast_to(where, labels.shape), axis=axes, keepdims=True)
    return (1.0 - alpha) * labels + alpha / num_classes


def safe_softmax_cross_entropy(logits: ArrayLike, labels: ArrayLike) -> jax.Array:
    r"""Softmax cross entropy over the last axis, with `0 log 0 = 0` for `-inf` logits.

    $$\ell(x, y) = -\sum_j y_j \log \frac{e^{x_j}}{\sum_k e^{x_k}}$$

    where a class with label 0 contributes 0 even where its logit is `-inf`. modopt's
    `softmax_cross_entropy` follows the same convention, so this is that loss over the last
    axis; optax keeps both names because its `softmax_cross_entropy` gives NaN there.

    Args:
        logits: floating-point logits of shape `[..., num_classes]`; `-inf` masks a class out.
        labels: floating-point probability distributions over the classes (non-negative,
            summing to 1), broadcastable with `logits`.

    Returns:
        The cross entropies, of shape `[...]`.

    Example:
        >>> logits = jnp.array([0.0, 0.0, -jnp.inf])
        >>> modopt.losses.safe_softmax_cross_entropy(logits, jnp.array([0.5, 0.5, 0.0]))  # log 2
        Array(0.6931472, dtype=float32)

    Reference: Goodfellow, Bengio & Courville, 2016, "Deep Learning", section 6.2.2.3,
    http://www.deeplearningbook.org/contents/mlp.html
    """
    return _cross_entropy("safe_softmax_cross_entropy", logits, labels, -1, None)[0]


def poly_loss_cross_entropy(
    logits: ArrayLike, labels: ArrayLike, *, epsilon: Scalar = 2.0, axis: Any = -1, where: ArrayLike | None = None
) -> jax.Array:
    r"""Poly-1 loss: softmax cross entropy plus `epsilon` times the first polynomial term.

    Cross entropy is the series $-\log p_t = \sum_{j \ge 1} (1 - p_t)^j / j$; PolyLoss-1
    raises the weight of its first term by `epsilon`. With `p = softmax(x)` over the class axis:

    $$\ell(x, y) = -\sum_j y_j \log p_j + \epsilon \sum_j y_j (1 - p_j)$$

    which is $-\log p_t + \epsilon (1 - p_t)$ for one-hot labels.

    Args:
        logits: floating-point logits of shape `[..., num_classes]`.
        labels: floating-point probability distributions over the classes, broadcastable
            with `logits`.
        epsilon: weight of the term `1 - p_t`; the paper suggests 2 for ImageNet
            classification and -1 for detection and segmentation (tune it per task).
        axis: the class axis or axes (default -1), or `None` for all axes.
        where: optional boolean mask of the classes to include, broadcastable to the shape of
            `logits`, or of the rank of `logits` without the class axes (masking whole examples).

    Returns:
        The losses, with the shape of `logits` without the class axes.

    Example:
        >>> logits = jnp.array([0.0, 0.0])  # p_t = 1/2
        >>> modopt.losses.poly_loss_cross_entropy(logits, jnp.array([1.0, 0.0]), epsilon=2.0)  # log 2 + 1
        Array(1.6931472, dtype=float32)

    Reference: Leng et al., 2022, "PolyLoss: A Polynomial Expansion Perspective of
    Classification Loss Functions", https://arxiv.org/abs/2204.12511
    """
    loss = "poly_loss_cross_entropy"
    cross_entropy, labels, log_probs, where = _cross_entropy(loss, logits, labels, axis, where)
    one_minus_pt = jnp.sum(labels * (1 - jnp.exp(log_probs)), axis=axis, where=where)
    return cross_entropy + epsilon * one_minus_pt


def sigmoid_focal_loss(logits: ArrayLike, labels: ArrayLike, *, alpha: Scalar | None = None, gamma: Scalar = 2.0) -> jax.Array:
    r"""Focal loss: sigmoid cross entropy scaled down on well-classified examples.

    With `p = sigmoid(x)` and $p_t = y p + (1 - y)(1 - p)$ the probability given to the label:

    $$\ell(x, y) = \alpha_t\, (1 - p_t)^\gamma\, \mathrm{BCE}(x, y), \qquad
    \alpha_t = \alpha y + (1 - \alpha)(1 - y)$$

    ($\alpha_t = 1$ without `alpha`). The factor $(1 - p_t)^\gamma$ is computed in log
    space, $\exp(\gamma \log((1 - y) p + y (1 - p)))$, so it stays accurate for large logits
    and for `gamma < 1`; `gamma = 0` gives `sigmoid_binary_cross_entropy` exactly. Soft labels
    in [0, 1] are allowed.

    Args:
        logits: floating-point logits `x`, any shape.
        labels: the targets `y` in [0, 1] (binary labels may be integer or boolean),
            broadcastable with `logits`; cast to the dtype of `logits`.
        alpha: optional weight of the positive class in (0, 1), the negative one getting
            `1 - alpha`; `None` (default) weighs both alike.
        gamma: the focusing exponent, `>= 0` (default 2); larger values focus the loss more
            on the hard examples.

    Returns:
        The losses, with the broadcast shape of the inputs.

    Example:
        >>> # p_t = 1/2: (1/2)^2 log 2
        >>> modopt.losses.sigmoid_focal_loss(jnp.array([0.0]), jnp.array([1.0]))
        Array([0.1732868], dtype=float32)

    Reference: Lin et al., 2017, "Focal Loss for Dense Object Detection",
    https://arxiv.org/abs/1708.02002
    """
    loss = "sigmoid_focal_loss"
    _inputs.number_in(loss, "gamma", gamma, ">= 0", lambda g: bool(np.all(g >= 0)))
    if alpha is not None:
        _inputs.number_in(loss, "alpha", alpha, "in [0, 1]", lambda a: bool(np.all((a >= 0) & (a <= 1))))
    cross_entropy, log_p, log_not_p, labels = _sigmoid_cross_entropy(loss, logits, labels)
    # log(1 - p_t) = log((1 - y) p + y (1 - p)), stable for logits of either sign.
    log_p, log_not_p, labels = jnp.broadcast_arrays(log_p, log_not_p, labels)
    log_one_minus_pt = jax.scipy.special.logsumexp(
        jnp.stack([log_p, log_not_p], axis=-1), axis=-1, b=jnp.stack([1 - labels, labels], axis=-1)
    )
    focal = cross_entropy * jnp.exp(gamma * log_one_minus_pt)
    if alpha is None:
        return focal
    return (alpha * labels + (1.0 - alpha) * (1.0 - labels)) * focal
