"""Connectionist temporal classification (CTC): the loss of unaligned label sequences."""

from __future__ import annotations

import functools
import operator

import jax
import jax.numpy as jnp
import numpy as np

from . import _inputs
from .._core.fields import Scalar
from jax.typing import ArrayLike


def _check_ctc(loss, logits, logit_paddings, labels, label_paddings, blank_id, log_epsilon):
    """The four arrays, checked for rank, shape and dtype, and `blank_id` as an int."""
    logits = _inputs.floating(loss, "logits", logits)
    _inputs.rank(loss, "logits", logits, 3, "(B, T, K): batch, time frames, classes including the blank")
    batch, frames, classes = logits.shape
    if frames == 0:
        raise ValueError(f"{loss}: logits of shape {logits.shape} has no time frames (T = 0).")
    logit_paddings = _inputs.real(loss, "logit_paddings", logit_paddings)
    if logit_paddings.shape != (batch, frames):
        raise ValueError(
            f"{loss}: logit_paddings of shape {logit_paddings.shape} must have the shape (B, T) = "
            f"{(batch, frames)} of logits {logits.shape} without the class axis."
        )
    labels = _inputs.integer(
        loss,
        "labels",
        labels,
        hint="labels are class ids of shape (B, N): cast them with `labels.astype(jnp.int32)`",
    )
    _inputs.rank(loss, "labels", labels, 2, "(B, N): batch, label positions")
    if labels.shape[0] != batch:
        raise ValueError(
            f"{loss}: labels of shape {labels.shape} must have the batch size B = {batch} "
            f"of logits {logits.shape}."
        )
    label_paddings = _inputs.real(loss, "label_paddings", label_paddings)
    if label_paddings.shape != labels.shape:
        raise ValueError(
            f"{loss}: label_paddings of shape {label_paddings.shape} must have the shape of labels, "
            f"{labels.shape}."
        )
    try:
        blank_id = operator.index(blank_id)
    except TypeError:
        raise TypeError(
            f"{loss}: blank_id must be a Python int (it selects a class at trace time), got {blank_id!r}."
        ) from None
    if not 0 <= blank_id < classes:
        raise ValueError(
            f"Invalid blank_id: {blank_id} (must be in [0, {classes}), a class of logits {logits.shape}) "
            f"in {loss}."
        )
    _inputs.number_in(
        loss,
        "log_epsilon",
        log_epsilon,
        "a finite negative number, e.g. -1e5",
        lambda v: bool(np.all(np.isfinite(v) & (v < 0))),
    )
    return logits, logit_paddings, labels, label_paddings, blank_id


def _into_blanks(blank: jax.Array, extra: jax.Array) -> jax.Array:
    """Adds (in log space) `extra[:, n]` to the blank state `n + 1`, for every `n`."""
    return jnp.concatenate([blank[:, :1], jnp.logaddexp(blank[:, 1:], extra)], axis=1)


def _forward(loss_name, logits, logit_paddings, labels, label_paddings, blank_id, log_epsilon):
    """Checks the inputs, then runs the compiled recursion; see `ctc_loss_with_forward_probs`."""
    logits, logit_paddings, labels, label_paddings, blank_id = _check_ctc(
        loss_name, logits, logit_paddings, labels, label_paddings, blank_id, log_epsilon
    )
    return _recursion(logits, logit_paddings, labels, label_paddings, log_epsilon, blank_id=blank_id)


# Compiled once per shape (and blank id): called eagerly, the scan and its gathers would
# otherwise dispatch op by op and retrace the loop on every call. Inside a user's `jit` it
# is inlined. `log_epsilon` is an argument, so changing it does not recompile.
@functools.partial(jax.jit, static_argnames="blank_id")
def _recursion(logits, logit_paddings, labels, label_paddings, log_epsilon, *, blank_id):
    batch, _, classes = logits.shape
    num_labels = labels.shape[1]
    # Low-precision logits run the recursion in float32.
    dtype = jnp.promote_types(logits.dtype, jnp.float32)
    log_probs = jax.nn.log_softmax(logits.astype(dtype), axis=-1)

    # Per frame: the log-probability of the blank, and of each label position's class.
    # Ids outside [0, K) (often used as label padding) score 0, as a zero one-hot row would.
    blank_scores = log_probs[:, :, blank_id]  # (B, T)
    in_range = (labels >= 0) & (labels < classes)
    ids = jnp.where(in_range, labels, 0)
    label_scores = jnp.take_along_axis(log_probs, ids[:, None, :], axis=2)  # (B, T, N)
    label_scores = jnp.where(in_range[:, None, :], label_scores, jnp.zeros_like(label_scores))

    # repeated[b, n]: label n + 1 repeats label n, so it cannot follow it without a blank.
    repeated = jnp.zeros((batch, num_labels), dtype)
    if num_labels > 1:
        repeated = repeated.at[:, :-1].set((labels[:, 1:] == labels[:, :-1]).astype(dtype))
    allow_skip = log_epsilon * repeated  # 0 where a label may follow the previous one directly
    allow_blank_after = log_epsilon * (1.0 - repeated)  # 0 where it needs the blank between

    blank0 = jnp.full((batch, num_labels + 1), log_epsilon, dtype).at[:, 0].set(0.0)
    label0 = jnp.full((batch, num_labels), log_epsilon, dtype)

    def frame(carry, inputs):
        blank, label = carry
        label_score, blank_score, padded = inputs
        # Mass ready to emit label n: from blank state n, or straight from label n - 1.
        ready = _into_blanks(blank, label + allow_skip)
        new_label = jnp.logaddexp(ready[:, :-1] + label_score, label + label_score)
        new_blank = _into_blanks(
            ready + blank_score[:, None], label + blank_score[:, None] + allow_blank_after
        )
        keep = padded[:, None]
        new_blank = jnp.where(keep, blank, new_blank)
        new_label = jnp.where(keep, label, new_label)
        return (new_blank, new_label), (new_blank, new_label)

    time_major = (
        jnp.transpose(label_scores, (1, 0, 2)),
        jnp.transpose(blank_scores, (1, 0)),
        jnp.transpose(logit_paddings != 0, (1, 0)),
    )
    (last_blank, last_label), (log_alpha_blank, log_alpha_label) = jax.lax.scan(
        frame, (blank0, label0), time_major
    )
    # After the last frame a path may also end on its last label.
    final = _into_blanks(last_blank, last_label)
    log_alpha_blank = log_alpha_blank.at[-1].set(final)

    lengths = num_labels - jnp.sum(label_paddings, axis=1).astype(jnp.int32)
    loss = -jnp.take_along_axis(final, lengths[:, None], axis=1, mode="clip")[:, 0]
    return loss, log_alpha_blank, log_alpha_label


def ctc_loss_with_forward_probs(
    logits: ArrayLike,
    logit_paddings: ArrayLike,
    labels: ArrayLike,
    label_paddings: ArrayLike,
    blank_id: int = 0,
    log_epsilon: Scalar = -1e5,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    r"""CTC loss, with the forward (alpha) log-probabilities it was computed from.

    CTC scores a label sequence `y` of length `N` against `T >= N` frames of class scores
    without an alignment: it sums over every frame-level path `pi` (one class per frame,
    with an extra *blank* class `phi`) that reduces to `y` after merging repeated classes
    and dropping blanks (the map `B`):

    $$\mathcal{L} = -\log \sum_{\pi:\ \mathcal{B}(\pi) = y}\ \prod_{t=1}^{T} p_t(\pi_t)$$

    where `p_t = softmax(logits[:, t])`. The sum is computed by a forward recursion over
    frames, in log space. Its two state families, for `n = 0..N`, are

    $$\alpha_{\mathrm{BLANK}}(t, n) = \sum_{\pi_{1:t}:\ \mathcal{B}(\pi_{1:t}) = y_{1:n},\ \pi_t = \phi}
        \prod_{s \le t} p_s(\pi_s), \qquad
      \alpha_{\mathrm{LABEL}}(t, n) = \sum_{\pi_{1:t}:\ \mathcal{B}(\pi_{1:t}) = y_{1:n},\ \pi_t = y_n}
        \prod_{s \le t} p_s(\pi_s),$$

    the probability of having emitted the first `n` labels by frame `t` and sitting on a
    blank, or on label `n` itself. A label may follow the previous one directly, except a
    repeated label, which needs a blank in between. `log_epsilon` stands in for `log(0)`
    (impossible transitions) so that everything stays finite and differentiable.

    Args:
        logits: floating-point `(B, T, K)` array of class scores: batch, time frames,
            classes including the blank.
        logit_paddings: `(B, T)` array, 1 where a frame is padding and 0 where it is real
            (any non-zero value counts as padding). Padded frames leave the recursion as
            it is.
        labels: integer `(B, N)` array of label ids in `[0, K)`, other than `blank_id`.
        label_paddings: `(B, N)` array, 1 for padding and 0 for labels. Labels must be
            right-padded (each row is zeros, then ones): the label length is `N` minus the
            row's sum. Padded positions may hold any id.
        blank_id: the class of the blank, a Python int in `[0, K)` (default 0).
        log_epsilon: a finite negative stand-in for `log(0)` (default -1e5).

    Returns:
        `(loss, log_alpha_blank, log_alpha_label)`: the `(B,)` losses; the `(T, B, N + 1)`
        array of `log alpha_BLANK(t, n)` (its last frame also counts the paths that end on
        their last label, so the loss is `-log_alpha_blank[-1, b, length_b]`); the
        `(T, B, N)` array of `log alpha_LABEL(t, n + 1)` (label positions counted from 0).
        States beyond a sequence's length hold values of no meaning.

    Example:
        >>> logits = jnp.zeros((1, 2, 3))  # uniform over 3 classes, 2 frames
        >>> loss, _, _ = modopt.losses.ctc_loss_with_forward_probs(
        ...     logits, jnp.zeros((1, 2)), jnp.array([[1]]), jnp.zeros((1, 1)))
        >>> float(loss[0])  # paths "1 1", "1 blank", "blank 1": -log(3 / 9)
        1.0986...

    Reference: Graves, Fernández, Gomez & Schmidhuber, 2006, "Connectionist Temporal
    Classification: Labelling Unsegmented Sequence Data with Recurrent Neural Networks",
    ICML, https://doi.org/10.1145/1143844.1143891
    """
    return _forward(
        "ctc_loss_with_forward_probs", logits, logit_paddings, labels, label_paddings, blank_id, log_epsilon
    )


def ctc_loss(
    logits: ArrayLike,
    logit_paddings: ArrayLike,
    labels: ArrayLike,
    label_paddings: ArrayLike,
    blank_id: int = 0,
    log_epsilon: Scalar = -1e5,
) -> jax.Array:
    r"""CTC loss: the negative log-probability of each label sequence, over all alignments.

    $$\mathcal{L} = -\log \sum_{\pi:\ \mathcal{B}(\pi) = y}\ \prod_{t=1}^{T} p_t(\pi_t)$$

    summed over the frame-level paths `pi` that give the labels `y` once repeats are merged
    and blanks dropped. See `ctc_loss_with_forward_probs` for the recursion, which this
    function runs, returning only the loss.

    Args:
        logits: floating-point `(B, T, K)` class scores (batch, frames, classes with blank).
        logit_paddings: `(B, T)`: 1 for padded frames, 0 for real ones.
        labels: integer `(B, N)` label ids in `[0, K)`, other than `blank_id`.
        label_paddings: `(B, N)`: 1 for padding, 0 for labels; right-padded.
        blank_id: the class of the blank, a Python int in `[0, K)` (default 0).
        log_epsilon: a finite negative stand-in for `log(0)` (default -1e5).

    Returns:
        The `(B,)` losses. An impossible sequence (more labels and required blanks than
        frames) gets a loss of the order of `-log_epsilon`.

    Example:
        >>> logits = jnp.zeros((1, 2, 3))
        >>> loss = modopt.losses.ctc_loss(logits, jnp.zeros((1, 2)), jnp.array([[1]]), jnp.zeros((1, 1)))
        >>> round(float(loss[0]), 4)  # -log(3 / 9)
        1.0986

    Reference: Graves, Fernández, Gomez & Schmidhuber, 2006, "Connectionist Temporal
    Classification", ICML, https://doi.org/10.1145/1143844.1143891
    """
    return _forward("ctc_loss", logits, logit_paddings, labels, label_paddings, blank_id, log_epsilon)[0]
