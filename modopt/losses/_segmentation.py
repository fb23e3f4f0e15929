"""Segmentation losses: soft Dice (and Tversky), binary Dice and the generalized Dice loss."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .._core.fields import is_concrete
from . import _inputs
from .._core.fields import Scalar
from jax.typing import ArrayLike

_REDUCTIONS = ("mean", "sum", "none")


def dice_loss(
    predictions: ArrayLike,
    targets: ArrayLike,
    *,
    class_weights: Any = None,
    smooth: Scalar = 1.0,
    alpha: Scalar = 0.5,
    beta: Scalar = 0.5,
    apply_softmax: bool = True,
    reduction: str = "mean",
    ignore_background: bool = False,
    axis: Any = None,
) -> jax.Array:
    r"""Soft Dice loss per class (Tversky loss with `alpha != beta`), for segmentation.

    With `p` the predicted probabilities and `t` the targets of class `c`, summed over the
    spatial axes, $I_c = \sum_i p_{ic} t_{ic}$, $P_c = \sum_i p_{ic}$, $T_c = \sum_i t_{ic}$:

    $$\ell_c = 1 - \frac{I_c + s}{I_c + \alpha (P_c - I_c) + \beta (T_c - I_c) + s}$$

    `alpha` weighs the false positives and `beta` the false negatives; `alpha = beta = 1/2`
    is the Dice loss $1 - (2 I_c + 2 s) / (P_c + T_c + 2 s)$ (with smoothing `2 s`), and
    `alpha = beta = 1` the Jaccard (IoU) loss. The per-class losses are weighted by
    `class_weights`, then averaged or summed over the classes (`reduction`).

    Args:
        predictions: floating-point logits of shape `[..., num_classes]`, or `[..., 1]` or
            `[...]` for binary segmentation (then one logit for the foreground, through a
            sigmoid); probabilities with `apply_softmax=False`.
        targets: one-hot targets of shape `[..., num_classes]`, or binary targets of shape
            `[..., 1]` or `[...]`. After adding the missing class axis of size 1 to one of
            them, the shapes must be equal.
        class_weights: optional weights of the classes, of shape `[num_classes]` (or `[1]`).
        smooth: smoothing `s >= 0` added to the numerator and the denominator: it keeps the
            loss defined for empty classes (an empty class predicted empty has loss 0).
        alpha: weight of the false positives, `>= 0`.
        beta: weight of the false negatives, `>= 0`.
        apply_softmax: whether `predictions` are logits (softmax over the classes, or a
            sigmoid for a single class). With `False` they are probabilities; with several
            classes, concrete (not traced) predictions are checked to sum to 1 over the class
            axis.
        reduction: over the classes: `"mean"`, `"sum"`, or `"none"` for the per-class losses.
        ignore_background: leave out the first class (index 0), when there are several.
        axis: the axis or axes summed over; default all but the first (batch) and the last
            (class) axes, e.g. H and W for inputs of shape `(batch, H, W, C)`.

    Returns:
        The losses, of the shape of the inputs without `axis` and, unless `reduction` is
        `"none"`, without the class axis: `[batch]` by default.

    Example:
        >>> logits = jnp.array([[[9.0, -9.0], [-9.0, 9.0]]])  # (batch, pixels, classes)
        >>> targets = jnp.array([[[1.0, 0.0], [0.0, 1.0]]])
        >>> modopt.losses.dice_loss(logits, targets).round(4)  # nearly perfect
        Array([0.], dtype=float32)

    Reference: Milletari, Navab & Ahmadi, 2016, "V-Net: Fully Convolutional Neural Networks
    for Volumetric Medical Image Segmentation", https://arxiv.org/abs/1606.04797; Salehi,
    Erdogmus & Gholipour, 2017, "Tversky loss function for image segmentation using 3D fully
    convolutional deep networks", https://arxiv.org/abs/1706.05721
    """
    loss = "dice_loss"
    predictions, targets = _inputs_with_class_axis(loss, predictions, targets)
    return _dice(
        loss,
        predictions,
        targets,
        class_weights,
        smooth,
        alpha,
        beta,
        apply_softmax,
        reduction,
        ignore_background,
        axis,
    )


def binary_dice_loss(
    predictions: ArrayLike, targets: ArrayLike, *, smooth: Scalar = 1.0, apply_sigmoid: bool = True
) -> jax.Array:
    r"""Dice loss of a binary (foreground/background) segmentation.

    `dice_loss` of one class, the foreground, with `p = sigmoid(predictions)`:

    $$\ell = 1 - \frac{2 \sum_i p_i t_i + 2 s}{\sum_i p_i + \sum_i t_i + 2 s}$$

    summed over all axes but the first (batch) one.

    Args:
        predictions: floating-point logits of shape `[...]` or `[..., 1]`; probabilities
            with `apply_sigmoid=False`.
        targets: binary targets (0 or 1, any real dtype) of the same shape, or with or
            without the trailing axis of size 1.
        smooth: smoothing `s >= 0`, as in `dice_loss`.
        apply_sigmoid: whether `predictions` are logits. With `False` they are probabilities
            of the foreground (optax 0.2.8 refuses these unless every one is 1, mistaking
            them for distributions over classes; modopt takes them).

    Returns:
        The losses, of shape `[batch]` (the first axis).

    Example:
        >>> probabilities = jnp.array([[1.0, 1.0, 0.0, 0.0]])
        >>> modopt.losses.binary_dice_loss(probabilities, jnp.array([[1, 1, 0, 0]]), apply_sigmoid=False)
        Array([0.], dtype=float32)

    Reference: Milletari, Navab & Ahmadi, 2016, "V-Net: Fully Convolutional Neural Networks
    for Volumetric Medical Image Segmentation", https://arxiv.org/abs/1606.04797
    """
    loss = "binary_dice_loss"
    predictions = _inputs.floating(loss, "predictions", predictions)
    targets = _inputs.real(loss, "targets", targets)
    if predictions.ndim == targets.ndim and (predictions.ndim == 0 or predictions.shape[-1] != 1):
        predictions, targets = predictions[..., None], targets[..., None]
    predictions, targets = _inputs_with_class_axis(loss, predictions, targets)
    return _dice(loss, predictions, targets, None, smooth, 0.5, 0.5, apply_sigmoid, "mean", False, None)


def multiclass_generalized_dice_loss(
    predictions: ArrayLike,
    targets: ArrayLike,
    *,
    smooth: Scalar = 1.0,
    apply_softmax: bool = True,
    ignore_background: bool = False,
) -> jax.Array:
    r"""Generalized Dice loss: per-class Dice losses weighted by inverse squared class sizes.

    With $T_c$ the number of target pixels of class `c` in the whole batch, the weights are

    $$w_c = C \frac{1 / (T_c^2 + 10^{-7})}{\sum_k 1 / (T_k^2 + 10^{-7})}$$

    and the loss is the mean over the batch and the classes of $w_c$ times the per-class Dice
    loss of `dice_loss` (summed over the spatial axes): rare classes count as much as large
    ones.

    Args:
        predictions: floating-point logits of shape `[batch, ..., num_classes]`;
            probabilities with `apply_softmax=False`.
        targets: one-hot targets of the same shape.
        smooth: smoothing `s >= 0`, as in `dice_loss`.
        apply_softmax: whether `predictions` are logits, as in `dice_loss`.
        ignore_background: leave out the first class (index 0) from the mean (its weight
            still counts in the normalization of the weights).

    Returns:
        The loss, a scalar.

    Example:
        >>> probabilities = jnp.array([[[0.9, 0.1], [0.2, 0.8]]])
        >>> targets = jnp.array([[[1.0, 0.0], [0.0, 1.0]]])
        >>> modopt.losses.multiclass_generalized_dice_loss(probabilities, targets, apply_softmax=False)
        Array(0.07504693, dtype=float32)

    Reference: Sudre et al., 2017, "Generalised Dice overlap as a deep learning loss function
    for highly unbalanced segmentations", https://arxiv.org/abs/1707.03237
    """
    loss = "multiclass_generalized_dice_loss"
    predictions = _inputs.floating(loss, "predictions", predictions)
    targets = _inputs.real(loss, "targets", targets)
    _inputs.same_shape(loss, "predictions", predictions, "targets", targets)
    if predictions.ndim == 0:
        raise ValueError(
            f"{loss}: predictions must have a class axis, laid out [..., num_classes], got a scalar."
        )
    class_sizes = jnp.sum(targets, axis=tuple(range(targets.ndim - 1)))
    inverse = 1.0 / (class_sizes**2 + 1e-7)
    class_weights = inverse / jnp.sum(inverse) * inverse.shape[0]
    per_class = _dice(
        loss,
        predictions,
        targets,
        class_weights,
        smooth,
        0.5,
        0.5,
        apply_softmax,
        "none",
        ignore_background,
        None,
    )
    return jnp.mean(per_class)


def _inputs_with_class_axis(loss: str, predictions: ArrayLike, targets: ArrayLike) -> tuple[jax.Array, jax.Array]:
    """Checked predictions and targets, a missing class axis of size 1 added to one of them."""
    predictions = _inputs.floating(loss, "predictions", predictions)
    targets = _inputs.real(loss, "targets", targets)
    if predictions.ndim == targets.ndim - 1:
        predictions = predictions[..., None]
    elif targets.ndim == predictions.ndim - 1:
        targets = targets[..., None]
    _inputs.same_shape(loss, "predictions", predictions, "targets", targets)
    if predictions.ndim == 0:
        raise ValueError(
            f"{loss}: predictions must have a class axis, laid out [..., num_classes], got a scalar."
        )
    return predictions, targets


def _dice(
    loss: str,
    predictions: jax.Array,
    targets: jax.Array,
    class_weights: Any,
    smooth: Any,
    alpha: Any,
    beta: Any,
    apply_softmax: bool,
    reduction: str,
    ignore_background: bool,
    axis: Any,
) -> jax.Array:
    """The Dice losses of inputs of the same shape `[..., num_classes]`, checked."""
    if reduction not in _REDUCTIONS:
        raise ValueError(f"Invalid reduction: {reduction!r} (must be 'mean', 'sum' or 'none') in {loss}.")
    for name, value in (("smooth", smooth), ("alpha", alpha), ("beta", beta)):
        _inputs.number_in(loss, name, value, ">= 0", lambda v: bool(np.all(v >= 0)))
    num_classes = predictions.shape[-1]
    if class_weights is not None:
        class_weights = _inputs.real(loss, "class_weights", class_weights, allow_bool=False)
        if class_weights.ndim != 1 or class_weights.shape[0] not in (1, num_classes):
            raise ValueError(
                f"{loss}: class_weights must have shape ({num_classes},), one weight per class, "
                f"got shape {class_weights.shape}."
            )
    if apply_softmax:
        probabilities = (
            jax.nn.sigmoid(predictions) if num_classes == 1 else jax.nn.softmax(predictions, axis=-1)
        )
    else:
        probabilities = predictions
        if num_classes > 1 and is_concrete(predictions):
            sums = np.asarray(jnp.sum(predictions, axis=-1), np.float64)
            if not np.allclose(sums, 1.0, rtol=1e-5):
                raise ValueError(
                    f"{loss}: with apply_softmax=False, predictions must be valid probability distributions (summing to 1 "
                    f"over the class axis, the last); their sums range over [{sums.min():.6f}, {sums.max():.6f}]. "
                    "Pass logits with apply_softmax=True instead."
                )
    if axis is None:
        axes = tuple(range(1, probabilities.ndim - 1))
    else:
        axes = _inputs.axes(loss, axis, probabilities.ndim, "predictions", allow_none=False)
    intersection = jnp.sum(probabilities * targets, axis=axes)
    predicted = jnp.sum(probabilities, axis=axes)
    target = jnp.sum(targets, axis=axes)
    numerator = intersection + smooth
    denominator = intersection + alpha * (predicted - intersection) + beta * (target - intersection) + smooth
    losses = 1.0 - numerator / denominator
    if class_weights is not None:
        losses = losses * class_weights
    if ignore_background and num_classes > 1:
        losses = losses[..., 1:]
    if reduction == "mean":
        return jnp.mean(losses, axis=-1)
    if reduction == "sum":
        return jnp.sum(losses, axis=-1)
    return losses
