"""The standard schedules: constant, polynomial, cosine decay, warmup + cosine, joins.

Step counts (`transition_steps`, `decay_steps`, boundaries) are array leaves too, so a
schedule's length can change without a retrace.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from .._core.fields import (
    FINITE,
    FINITE_NONNEGATIVE,
    NONNEGATIVE,
    POSITIVE,
    Rate,
    as_rate,
    hyperparameter,
    is_concrete,
    rate,
)
from .._core.fields import Scalar
from ._base import AbstractSchedule, as_boundaries, as_schedule, value_at
from ._exact import Derived, derive, divide, is_traced, power, strongly_typed


def as_count(count: Any) -> Any:
    """A step count as JAX takes it: an integer beyond JAX's default integer type becomes a float.

    Without x64, `10**10` does not fit int32 and JAX refuses it; as a float32 it is exact up
    to 2**24 and within a relative 6e-8 beyond. Every other count (arrays included) is
    returned unchanged, so int32 counts keep integer arithmetic.
    """
    if isinstance(count, (int, np.integer)) and not isinstance(count, (bool, np.bool_)):
        limits = np.iinfo(jax.dtypes.canonicalize_dtype(int))
        if not limits.min <= count <= limits.max:
            return float(count)
    return count


class ConstantSchedule(AbstractSchedule):
    """The same `value` at every step.

    Args:
        value: the value, a number.
    """

    value: Scalar = hyperparameter(check=FINITE)

    def __call__(self, count):
        return self.value


class PolynomialSchedule(AbstractSchedule):
    r"""Polynomial interpolation from `init_value` to `end_value`.

    With `t = clip(count - transition_begin, 0, transition_steps)`:
    `(init_value - end_value) * (1 - t / transition_steps) ** power + end_value`.
    A non-positive `transition_steps` gives the constant `init_value`; a negative
    `transition_begin` counts as 0. `init_value - end_value` is computed as optax computes it,
    from the numbers as given (Python floats: in double precision, rounded once), so the values
    are optax's to the bit; from the end of the transition on, the value is `end_value`
    exactly, where optax's jitted schedule can be a rounding off it (below 0 for a decay to 0,
    NaN for a fractional `power`).

    Args:
        init_value: the value up to `transition_begin`.
        end_value: the value from `transition_begin + transition_steps` on.
        power: the exponent of the interpolation (1 is linear).
        transition_steps: the number of steps of the transition; a non-positive one gives the
            constant `init_value`.
        transition_begin: the step at which the transition starts; a negative one counts as 0.
    """

    init_value: Scalar = hyperparameter(check=FINITE)
    end_value: Scalar = hyperparameter(check=FINITE)
    power: Scalar = hyperparameter(check=FINITE_NONNEGATIVE)
    transition_steps: Scalar = hyperparameter(check=FINITE)
    transition_begin: Scalar = hyperparameter(default=0, check=FINITE)
    span: Derived = eqx.field(repr=False)  # `init_value - end_value` as optax computes it

    def __init__(
        self,
        init_value: ArrayLike,
        end_value: ArrayLike,
        power: ArrayLike,
        transition_steps: ArrayLike,
        transition_begin: ArrayLike = 0,
    ):
        self.init_value, self.end_value, self.power = init_value, end_value, power
        self.transition_steps, self.transition_begin = transition_steps, transition_begin
        self.span = derive(operator.sub, init_value, end_value)

    def probe_counts(self):
        begin = max(np.asarray(self.transition_begin).item(), 0)
        return (0, begin, begin + max(np.asarray(self.transition_steps).item(), 1))

    def __call__(self, count):
        count = as_count(count)
        begin = jnp.maximum(self.transition_begin, 0)
        steps = jnp.where(self.transition_steps <= 0, 1, self.transition_steps)
        t = jnp.clip(count - begin, 0, steps)
        span = self.span.get(operator.sub, self.init_value, self.end_value)
        # From the end of the transition on the value is `end_value` exactly. optax's jitted
        # schedule computes `1 - t * (1 / steps)` there, which rounds to +-1e-7: a value a
        # rounding off `end_value` (below 0 for a decay to 0, NaN for a fractional power).
        remaining = jnp.where(t >= steps, 0, 1 - divide(t, steps))
        decayed = span * power(remaining, self.power) + self.end_value
        return strongly_typed(jnp.where(self.transition_steps <= 0, self.init_value, decayed))


def linear_schedule(
    init_value: ArrayLike, end_value: ArrayLike, transition_steps: ArrayLike, transition_begin: ArrayLike = 0
) -> PolynomialSchedule:
    """Linear interpolation from `init_value` to `end_value` (a polynomial of power 1).

    Args:
        init_value: the value up to `transition_begin`.
        end_value: the value from `transition_begin + transition_steps` on.
        transition_steps: the number of steps of the transition; a non-positive one gives the
            constant `init_value`.
        transition_begin: the step at which the transition starts; a negative one counts as 0.
    """
    return PolynomialSchedule(init_value, end_value, 1, transition_steps, transition_begin)


def warmup_constant_schedule(
    init_value: ArrayLike, peak_value: ArrayLike, warmup_steps: ArrayLike
) -> PolynomialSchedule:
    """Linear warmup from `init_value` to `peak_value` over `warmup_steps`, then `peak_value`.

    It is `linear_schedule(init_value, peak_value, warmup_steps)`.

    Args:
        init_value: the value at step 0.
        peak_value: the value from the end of the warmup on.
        warmup_steps: the length of the warmup; a non-positive one gives the constant `init_value`
            (as `linear_schedule` does).

    Example:
        >>> schedule = modopt.warmup_constant_schedule(0.0, 1e-3, 100)
        >>> [round(float(schedule(c)), 6) for c in (0, 50, 100, 1000)]
        [0.0, 0.0005, 0.001, 0.001]
    """
    return linear_schedule(init_value, peak_value, warmup_steps)


class CosineDecaySchedule(AbstractSchedule):
    r"""Cosine decay from `init_value` to `alpha * init_value` over `decay_steps`.

    `init_value * ((1 - alpha) * (0.5 * (1 + cos(pi * t / decay_steps))) ** exponent + alpha)`
    with `t = min(count, decay_steps)`. `alpha` is a rate: `1 - alpha` is exact, as optax's
    Python arithmetic gives it.

    Args:
        init_value: the value at step 0.
        decay_steps: the number of steps of the decay, > 0; the value stays at `alpha * init_value`
            after them.
        alpha: the final value as a fraction of `init_value`.
        exponent: the power applied to the cosine factor, > 0 (1 for the plain cosine).

    Reference: Loshchilov & Hutter, 2016, https://arxiv.org/abs/1608.03983
    """

    init_value: Scalar = hyperparameter(check=FINITE)
    decay_steps: Scalar = hyperparameter(check=POSITIVE)
    alpha: Scalar = rate(default=0.0, check=FINITE)
    exponent: Scalar = hyperparameter(default=1.0, check=FINITE_NONNEGATIVE)

    def probe_counts(self):
        return (0, np.asarray(self.decay_steps).item())

    def __call__(self, count):
        steps = jnp.asarray(self.decay_steps, jnp.float32)
        t = jnp.minimum(jnp.asarray(count, jnp.float32), steps)
        if is_traced(steps):  # XLA folds optax's constants: `t * (pi * (1 / steps))`
            angle = t * (jnp.pi * (1 / steps))
        else:
            angle = jnp.pi * t / steps
        cosine = 0.5 * (1 + jnp.cos(angle))
        return self.init_value * ((1 - self.alpha) * power(cosine, self.exponent) + self.alpha)


class JoinSchedules(AbstractSchedule):
    """`schedules[i]` from `boundaries[i - 1]` on, each restarted at its boundary.

    Step `count` uses the last schedule whose boundary is <= count, called with
    `count - boundary`. The boundaries are a 1-D array hyperparameter (`set(boundaries=...)`
    moves them without a retrace); their number is structure.

    Args:
        schedules: the schedules, in order (modopt schedules or functions of the count).
        boundaries: the steps at which each schedule after the first starts, increasing, one fewer
            than `schedules`.
    """

    schedules: tuple[AbstractSchedule, ...]
    boundaries: Any = hyperparameter(converter=as_boundaries, ndim=1)

    def __init__(self, schedules: Sequence[Any], boundaries: Any):
        self.schedules = tuple(as_schedule(s) for s in schedules)
        self.boundaries = as_boundaries(boundaries)

    def __check_init__(self):
        if jnp.shape(self.boundaries) != (len(self.schedules) - 1,):
            raise ValueError(
                f"join_schedules needs one more schedule than boundaries: got {len(self.schedules)} "
                f"schedules and boundaries of shape {jnp.shape(self.boundaries)}."
            )

    def __call__(self, count):
        count = as_count(count)
        value = value_at(self.schedules[0], count)
        for i, schedule in enumerate(self.schedules[1:]):
            boundary = self.boundaries[i]
            value = jnp.where(count < boundary, value, value_at(schedule, count - boundary))
        return value

    def probe_counts(self):
        # Each schedule runs from its boundary to the step before the next one: its own probes
        # there, and both ends of that window.
        starts = (0, *np.asarray(self.boundaries).tolist())
        counts = {
            start + count
            for start, schedule in zip(starts, self.schedules)
            for count in schedule.probe_counts()
        }
        return tuple(sorted(counts | set(starts) | {start - 1 for start in starts[1:] if start > 0}))


class WarmupCosineDecaySchedule(AbstractSchedule):
    """Linear warmup from `init_value` to `peak_value`, then cosine decay to `end_value`.

    The cosine part lasts `decay_steps - warmup_steps` steps (`decay_steps` counts the warmup).
    It is `join_schedules` of `linear_schedule(init_value, peak_value, warmup_steps)` and
    `cosine_decay_schedule(peak_value, decay_steps - warmup_steps, alpha, exponent)` with
    `alpha = end_value / peak_value` (0 where `peak_value` is 0), see `as_join`; `alpha` and
    `init_value - peak_value` are computed as optax computes them, from the numbers as given.

    Args:
        init_value: the value at step 0.
        peak_value: the value at the end of the warmup, where the decay starts.
        warmup_steps: the length of the linear warmup, >= 0 (0: no warmup).
        decay_steps: the total length of warmup and decay; the value stays at `end_value` after it.
        end_value: the value at the end of the decay.
        exponent: the power applied to the cosine factor, > 0 (1 for the plain cosine).
    """

    init_value: Scalar = hyperparameter(check=FINITE)
    peak_value: Scalar = hyperparameter(check=FINITE)
    warmup_steps: Scalar = hyperparameter(check=NONNEGATIVE)
    decay_steps: Scalar = hyperparameter(check=POSITIVE)
    end_value: Scalar = hyperparameter(default=0.0, check=FINITE)
    exponent: Scalar = hyperparameter(default=1.0, check=FINITE_NONNEGATIVE)
    warmup_span: Derived = eqx.field(repr=False)  # `init_value - peak_value`, as optax computes it
    alpha: Derived = eqx.field(repr=False)  # `end_value / peak_value` (a rate), as optax computes it

    def __init__(
        self,
        init_value: ArrayLike,
        peak_value: ArrayLike,
        warmup_steps: ArrayLike,
        decay_steps: ArrayLike,
        end_value: ArrayLike = 0.0,
        exponent: ArrayLike = 1.0,
    ):
        self.init_value, self.peak_value, self.end_value, self.exponent = (
            init_value,
            peak_value,
            end_value,
            exponent,
        )
        self.warmup_steps, self.decay_steps = warmup_steps, decay_steps
        self.warmup_span = derive(operator.sub, init_value, peak_value)
        self.alpha = derive(end_fraction, end_value, peak_value, convert=as_rate)

    def __check_init__(self):
        if is_concrete(self.decay_steps) and is_concrete(self.warmup_steps):
            if not self.decay_steps > self.warmup_steps:
                raise ValueError(
                    f"Invalid decay_steps: {self.decay_steps} (must be > warmup_steps = "
                    f"{self.warmup_steps}, as it counts the warmup) in WarmupCosineDecaySchedule."
                )

    def as_join(self) -> JoinSchedules:
        """The same schedule written as a join of its two phases."""
        warmup = with_span(
            linear_schedule(self.init_value, self.peak_value, self.warmup_steps), self.warmup_span
        )
        alpha = self.alpha.get(_end_rate, self.end_value, self.peak_value)
        decay = CosineDecaySchedule(
            self.peak_value, self.decay_steps - self.warmup_steps, alpha, self.exponent
        )
        return JoinSchedules((warmup, decay), (self.warmup_steps,))

    def __call__(self, count):
        return self.as_join()(count)

    def probe_counts(self):
        return (0, np.asarray(self.warmup_steps).item(), np.asarray(self.decay_steps).item())


def end_fraction(end_value: Any, peak_value: Any) -> Any:
    """`end_value / peak_value`, or 0 where `peak_value` is 0 (the `alpha` of a warmup cosine)."""
    if isinstance(end_value, (int, float)) and isinstance(peak_value, (int, float)):
        return 0.0 if peak_value == 0.0 else end_value / peak_value  # in Python, as optax
    zero = jnp.asarray(peak_value) == 0
    return jnp.where(zero, 0.0, end_value / jnp.where(zero, 1.0, peak_value))


def _end_rate(end_value: Any, peak_value: Any) -> Rate:
    fraction = end_fraction(end_value, peak_value)
    return Rate(fraction, 1 - fraction)


def with_span(schedule: PolynomialSchedule, span: Derived) -> PolynomialSchedule:
    """`schedule` with `init_value - end_value` taken from `span` (derived where the numbers
    were given: a schedule built of others passes its own on)."""
    return eqx.tree_at(lambda s: s.span, schedule, span)


constant_schedule = ConstantSchedule
polynomial_schedule = PolynomialSchedule
cosine_decay_schedule = CosineDecaySchedule
warmup_cosine_decay_schedule = WarmupCosineDecaySchedule


def join_schedules(schedules: Sequence[Any], boundaries: Sequence[Any]) -> JoinSchedules:
    """Sequences `schedules`, switching at each of `boundaries` (see `JoinSchedules`).

    Args:
        schedules: the schedules, in order (modopt schedules or functions of the count).
        boundaries: the steps at which each schedule after the first starts, increasing, one fewer
            than `schedules`.
    """
    return JoinSchedules(schedules, boundaries)
