"""Exponential decay, alone or after a linear warmup.

The numbers (values, rate, step counts) are array leaves, so a new rate or length reuses
the compiled step; `staircase` and whether there is an `end_value` are structure.
"""

from __future__ import annotations

import operator

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from .._core.fields import FINITE, NONNEGATIVE, POSITIVE, hyperparameter, static
from ._base import AbstractSchedule
from ._exact import Derived, derive, divide, strongly_typed
from ._schedules import JoinSchedules, as_count, linear_schedule, with_span
from .._core.fields import Scalar


class ExponentialDecaySchedule(AbstractSchedule):
    r"""Exponential decay: `init_value` times `decay_rate` per `transition_steps` steps.

    With `s = count - max(transition_begin, 0)`:

        value = init_value                                          if s <= 0
        value = init_value * decay_rate ** (s / transition_steps)   otherwise

    With `staircase=True` the exponent is `floor(s / transition_steps)`: the value drops by a
    factor `decay_rate` at each multiple of `transition_steps` and is flat in between.

    With an `end_value`, the decay stops there: it is a floor when `decay_rate < 1` and a
    ceiling when `decay_rate >= 1` (`value = max(value, end_value)`, resp. `min`).

    Args:
        init_value: the value before (and at) `transition_begin`.
        transition_steps: the number of steps per factor of `decay_rate`; must be > 0.
        decay_rate: the factor per `transition_steps` steps; must be > 0 (below 1 decays,
            above 1 grows).
        transition_begin: the step at which the decay starts; a negative value counts as 0.
        staircase: decay in discrete jumps rather than continuously (structure: static).
        end_value: optional bound where the decay stops (see above).

    Example:
        >>> schedule = modopt.exponential_decay(1.0, transition_steps=10, decay_rate=0.5)
        >>> float(schedule(20))
        0.25
    """

    init_value: Scalar = hyperparameter(check=FINITE)
    transition_steps: Scalar = hyperparameter(check=POSITIVE)
    decay_rate: Scalar = hyperparameter(check=POSITIVE)
    transition_begin: Scalar = hyperparameter(default=0, check=FINITE)
    staircase: bool = static(default=False)
    end_value: Scalar | None = hyperparameter(default=None, check=FINITE)

    def probe_counts(self):
        # Monotone from the start of the decay on, toward `end_value` or 0, reached (or
        # underflowed to) by step 2**30 at any rate worth training with. A growth without an
        # `end_value` grows without bound, as asked: it is probed at its start only.
        return (0, max(np.asarray(self.transition_begin).item(), 0), *_far(self))

    def __call__(self, count):
        elapsed = as_count(count) - jnp.maximum(self.transition_begin, 0)
        exponent = divide(elapsed, self.transition_steps)
        if self.staircase:
            exponent = jnp.floor(exponent)
        value = jnp.where(
            elapsed <= 0, self.init_value, self.init_value * jnp.power(self.decay_rate, exponent)
        )
        if self.end_value is not None:
            floor, ceiling = jnp.maximum(value, self.end_value), jnp.minimum(value, self.end_value)
            value = jnp.where(self.decay_rate < 1, floor, ceiling)
        return strongly_typed(value)


class WarmupExponentialDecaySchedule(AbstractSchedule):
    r"""Linear warmup from `init_value` to `peak_value`, then exponential decay from `peak_value`.

    For `count < warmup_steps`:
    `init_value + (peak_value - init_value) * count / warmup_steps`; from `warmup_steps` on,
    `ExponentialDecaySchedule(peak_value, transition_steps, decay_rate, transition_begin,
    staircase, end_value)` at `count - warmup_steps` (so `transition_begin` counts from the
    end of the warmup). This is `join_schedules` of the two phases, see `as_join`.

    Args:
        init_value: the value at step 0.
        peak_value: the value at the end of the warmup, where the decay starts.
        warmup_steps: the length of the warmup, >= 0 (0: no warmup).
        transition_steps: the number of steps per factor of `decay_rate` in the decay phase,
            > 0, as in `exponential_decay`.
        decay_rate: the factor per `transition_steps` steps, > 0.
        transition_begin: the step after the warmup at which the decay starts.
        staircase: decay in discrete jumps rather than continuously (static).
        end_value: optional bound where the decay stops: a floor when `decay_rate < 1`, a
            ceiling when above.
    """

    init_value: Scalar = hyperparameter(check=FINITE)
    peak_value: Scalar = hyperparameter(check=FINITE)
    warmup_steps: Scalar = hyperparameter(check=NONNEGATIVE)
    transition_steps: Scalar = hyperparameter(check=POSITIVE)
    decay_rate: Scalar = hyperparameter(check=POSITIVE)
    transition_begin: Scalar = hyperparameter(default=0, check=FINITE)
    staircase: bool = static(default=False)
    end_value: Scalar | None = hyperparameter(default=None, check=FINITE)
    warmup_span: Derived = eqx.field(repr=False)  # `init_value - peak_value`, as optax computes it

    def __init__(
        self,
        init_value: ArrayLike,
        peak_value: ArrayLike,
        warmup_steps: ArrayLike,
        transition_steps: ArrayLike,
        decay_rate: ArrayLike,
        transition_begin: ArrayLike = 0,
        staircase: bool = False,
        end_value: ArrayLike | None = None,
    ):
        self.init_value, self.peak_value, self.warmup_steps = init_value, peak_value, warmup_steps
        self.transition_steps, self.decay_rate, self.transition_begin = (
            transition_steps,
            decay_rate,
            transition_begin,
        )
        self.staircase, self.end_value = staircase, end_value
        self.warmup_span = derive(operator.sub, init_value, peak_value)

    def as_join(self) -> JoinSchedules:
        """The same schedule written as a join of its two phases."""
        warmup = with_span(
            linear_schedule(self.init_value, self.peak_value, self.warmup_steps), self.warmup_span
        )
        decay = ExponentialDecaySchedule(
            self.peak_value,
            self.transition_steps,
            self.decay_rate,
            self.transition_begin,
            self.staircase,
            self.end_value,
        )
        return JoinSchedules((warmup, decay), (self.warmup_steps,))

    def __call__(self, count):
        return self.as_join()(count)

    def probe_counts(self):
        warmup = np.asarray(self.warmup_steps).item()
        begin = warmup + max(np.asarray(self.transition_begin).item(), 0)
        return (0, warmup, begin, *(warmup + far for far in _far(self)))


exponential_decay = ExponentialDecaySchedule
warmup_exponential_decay_schedule = WarmupExponentialDecaySchedule


def _far(schedule: ExponentialDecaySchedule | WarmupExponentialDecaySchedule) -> tuple[int, ...]:
    """A step by which an exponential decay has reached its end (see `probe_counts`)."""
    bounded = schedule.end_value is not None or np.asarray(schedule.decay_rate).item() < 1
    return (2**30,) if bounded else ()
