"""Piecewise schedules: a value scaled at given boundaries, held or interpolated in between.

optax's piecewise schedules take `boundaries_and_scales`, a dict `{boundary: scale}`. Here
the boundaries and the scales are two 1-D array leaves (sorted by boundary): new numbers
reuse the compiled step, while the number of boundaries (their shape) is structure.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .._core.fields import FINITE, FINITE_NONNEGATIVE, _shown, choice, hyperparameter, is_concrete
from ._base import AbstractSchedule, as_boundaries, as_vector
from ._exact import divide, is_traced
from ._schedules import as_count
from .._core.fields import Scalar


def _as_scales(values: Any) -> jax.Array:
    return as_vector(values, float)


def _check_pieces(module: Any) -> None:
    boundaries, scales = module.boundaries, module.scales
    where = f"in {type(module).__name__}"
    if jnp.ndim(boundaries) != 1 or jnp.shape(scales) != jnp.shape(boundaries):
        raise ValueError(
            f"Invalid boundaries and scales: shapes {jnp.shape(boundaries)} and {jnp.shape(scales)} (must be "
            f"two 1-D arrays of the same length, one scale per boundary) {where}."
        )


def _sorted_pieces(boundaries_and_scales: Mapping[Any, Any] | None, where: str) -> tuple[tuple, tuple]:
    """The `{boundary: scale}` dict as (boundaries, scales), sorted by boundary and checked."""
    if not boundaries_and_scales:
        return (), ()
    pieces = sorted(dict(boundaries_and_scales).items())
    for boundary, scale in pieces:
        if is_concrete(scale) and not FINITE_NONNEGATIVE.predicate(np.asarray(scale)):
            raise ValueError(
                f"Invalid boundaries_and_scales: scale {_shown(scale)} at boundary {boundary} "
                f"(must be {FINITE_NONNEGATIVE.description}) in {where}."
            )
    boundaries, scales = zip(*pieces)
    return boundaries, scales


class PiecewiseConstantSchedule(AbstractSchedule):
    r"""`init_value` times the product of the scales of every boundary reached.

    `value(count) = init_value * prod(scales[i] for i where count >= boundaries[i])`: the
    value jumps by a factor `scales[i]` at step `boundaries[i]` and is flat in between.

    Args:
        init_value: the value before the first boundary.
        boundaries: the steps at which the value is scaled (a 1-D array or sequence).
        scales: one factor >= 0 per boundary.

    Build it from optax's `{boundary: scale}` dict with `piecewise_constant_schedule`.
    """

    init_value: Scalar = hyperparameter(check=FINITE)
    boundaries: Any = hyperparameter(default=(), converter=as_boundaries, ndim=1)
    scales: Any = hyperparameter(default=(), check=FINITE_NONNEGATIVE, converter=_as_scales, ndim=1)

    def probe_counts(self):
        return (0, *np.asarray(self.boundaries).tolist())

    def __check_init__(self):
        _check_pieces(self)

    def __call__(self, count):
        count = as_count(count)
        value = self.init_value
        for i in range(self.boundaries.shape[0]):  # in order of the boundaries, as optax multiplies
            value = value * jnp.where(count >= self.boundaries[i], self.scales[i], 1)
        return value


def piecewise_constant_schedule(
    init_value: Scalar, boundaries_and_scales: Mapping[int, Any] | None = None
) -> PiecewiseConstantSchedule:
    """A piecewise constant schedule: `init_value` scaled at each boundary reached.

    From step `b` on, the value is multiplied by `boundaries_and_scales[b]` (a factor >= 0),
    so at step `count` it is `init_value` times the product of the scales of every boundary
    `b <= count`.

    Args:
        init_value: the value before the first boundary.
        boundaries_and_scales: a mapping from boundary steps (ints >= 0) to scale factors >= 0;
            `None` or empty for a constant schedule.

    Example:
        >>> schedule = modopt.piecewise_constant_schedule(1.0, {100: 0.1, 200: 0.5})
        >>> [float(schedule(c)) for c in (99, 100, 250)]
        [1.0, 0.1, 0.05]
    """
    boundaries, scales = _sorted_pieces(boundaries_and_scales, "piecewise_constant_schedule")
    return PiecewiseConstantSchedule(init_value, boundaries, scales)


def _interpolate_linear(start, end, fraction):
    return start + (end - start) * fraction


def _interpolate_cosine(start, end, fraction):
    return end + (start - end) * 0.5 * (1 + jnp.cos(jnp.pi * fraction))


_INTERPOLATE = {"linear": _interpolate_linear, "cosine": _interpolate_cosine}


class PiecewiseInterpolateSchedule(AbstractSchedule):
    r"""Interpolation (linear or cosine) between values scaled at boundaries.

    The points are `(0, v_0)` and `(boundaries[i], v_{i+1})` with `v_0 = init_value` and
    `v_{i+1} = v_i * scales[i]`. On `[b_i, b_{i+1})` (with `b_0 = 0`), for
    `f = (count - b_i) / max(b_{i+1} - b_i, 1)`:

        linear: v_i + (v_{i+1} - v_i) * f
        cosine: v_{i+1} + (v_i - v_{i+1}) * (1 + cos(pi * f)) / 2

    and from the last boundary on, the value is the last `v`. So the value at step
    `boundaries[i]` is `init_value * prod(scales[:i+1])`. An empty interval (two equal
    boundaries, or a boundary at 0) is skipped: the later value holds from that step.

    Args:
        interpolate_type: `"linear"` or `"cosine"` (structure: static).
        init_value: the value at step 0.
        boundaries: the steps of the points after the first, in increasing order.
        scales: one factor >= 0 per boundary, multiplied into the value of the previous point.

    Build it from optax's `{boundary: scale}` dict with `piecewise_interpolate_schedule`.
    """

    interpolate_type: str = choice(dataclasses.MISSING, tuple(_INTERPOLATE))
    init_value: Scalar = hyperparameter(check=FINITE)
    boundaries: Any = hyperparameter(default=(), converter=as_boundaries, ndim=1)
    scales: Any = hyperparameter(default=(), check=FINITE_NONNEGATIVE, converter=_as_scales, ndim=1)

    def probe_counts(self):
        return (0, *np.asarray(self.boundaries).tolist())

    def __check_init__(self):
        _check_pieces(self)
        if is_concrete(self.boundaries) and np.any(np.diff(np.asarray(self.boundaries)) < 0):
            raise ValueError(
                f"Invalid boundaries: {_shown(self.boundaries)} (must be in increasing order) in "
                f"{type(self).__name__}."
            )

    def __call__(self, count):
        count = as_count(count)
        ends = self.boundaries
        starts = jnp.concatenate([jnp.zeros((1,), ends.dtype), ends])  # b_0 = 0, b_1, ..., b_n
        values = jnp.cumprod(jnp.concatenate([jnp.reshape(self.init_value, (1,)), self.scales]))
        lengths = jnp.maximum(ends - starts[:-1], 1)
        if self.interpolate_type == "linear" and is_traced(lengths, values):
            # XLA folds optax's constants: `(count - start) * ((end - start) * (1 / length))`
            pieces = values[:-1] + (count - starts[:-1]) * ((values[1:] - values[:-1]) * (1 / lengths))
        else:
            fraction = divide(count - starts[:-1], lengths)
            pieces = _INTERPOLATE[self.interpolate_type](values[:-1], values[1:], fraction)
        inside = (starts[:-1] <= count) & (count < ends)
        return jnp.sum(jnp.where(inside, pieces, 0)) + jnp.where(starts[-1] <= count, values[-1], 0)


def piecewise_interpolate_schedule(
    interpolate_type: str, init_value: Scalar, boundaries_and_scales: Mapping[int, Any] | None = None
) -> PiecewiseInterpolateSchedule:
    """A schedule interpolating (`"linear"` or `"cosine"`) between values scaled at boundaries.

    At step `b` (a key of `boundaries_and_scales`) the value is `init_value` times the
    product of the scales of every boundary `<= b`; in between, it is interpolated from one
    such value to the next, and after the last boundary it stays at the last value. See
    `PiecewiseInterpolateSchedule` for the formulas.

    Args:
        interpolate_type: `"linear"` or `"cosine"`: how values are interpolated between boundaries.
        init_value: the value at step 0.
        boundaries_and_scales: a mapping from boundary steps (ints >= 0) to scale factors >= 0;
            `None` or empty for a constant schedule.

    Example:
        >>> schedule = modopt.piecewise_interpolate_schedule("linear", 1.0, {4: 0.5, 8: 0.5})
        >>> [float(schedule(c)) for c in (0, 2, 4, 6, 8, 20)]
        [1.0, 0.75, 0.5, 0.375, 0.25, 0.25]
    """
    boundaries, scales = _sorted_pieces(boundaries_and_scales, "piecewise_interpolate_schedule")
    return PiecewiseInterpolateSchedule(interpolate_type, init_value, boundaries, scales)


def piecewise_linear_schedule(
    init_value: Scalar, boundaries_and_scales: Mapping[int, Any] | None = None
) -> PiecewiseInterpolateSchedule:
    """Linear interpolation through the points `(0, init_value)` and `(b, value at b)`.

    The boundaries and scales are given as to optax's piecewise schedules: with the
    boundaries `b_1 < ... < b_n` (keys of `boundaries_and_scales`, each >= 0) and their
    scales `s_i`, the points are `(0, v_0)` and `(b_i, v_i)` with `v_0 = init_value` and
    `v_i = v_{i-1} * s_i`. Between two points the value is on the line through them,
    `v_{i-1} + (v_i - v_{i-1}) * (count - b_{i-1}) / (b_i - b_{i-1})`; after `b_n` it is
    `v_n`. Where two points share a step (a boundary at 0), the later one holds from it.

    This is `piecewise_interpolate_schedule("linear", init_value, boundaries_and_scales)`
    with non-negative boundaries (optax 0.2 names it in `inject_hyperparams`' example
    without providing it).

    Args:
        init_value: `v_0`, the value at step 0.
        boundaries_and_scales: a mapping from boundary steps (ints >= 0) to scale factors >= 0;
            `None` or empty for a constant schedule.

    Example:
        >>> schedule = modopt.piecewise_linear_schedule(0.9, {100: 0.999 / 0.9})
        >>> round(float(schedule(50)), 4)
        0.9495
    """
    boundaries, scales = _sorted_pieces(boundaries_and_scales, "piecewise_linear_schedule")
    for boundary in boundaries:
        if is_concrete(boundary) and boundary < 0:
            raise ValueError(
                f"Invalid boundaries_and_scales: boundary {boundary} (must be >= 0, the points start at "
                f"step 0) in piecewise_linear_schedule."
            )
    return PiecewiseInterpolateSchedule("linear", init_value, boundaries, scales)
