"""Accumulating past updates: momentum traces and exponential moving averages."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from .. import fields
from .._core.base import AbstractTransform
from .._core.fields import UNIT, static
from .._state.moments import (
    bias_correction,
    in_update_dtype,
    init_state,
    store,
    widen,
    widened_update_moment,
)
from .._util.numerics import safe_increment
from .._util.trees import map_updates
from .._core.fields import Scalar
from jax.typing import DTypeLike


class TraceState(NamedTuple):
    """The momentum buffer."""

    trace: Any  # like the params (in `accumulator_dtype` if set)


class Trace(AbstractTransform):
    """Momentum: `t = g + decay * t`; the update is `t` (or `g + decay * t` with Nesterov).

    Args:
        decay: the momentum coefficient, in [0, 1].
        nesterov: return `g + decay * t` (Nesterov's momentum) instead of `t` (static).
        accumulator_dtype: the dtype of the trace; `None` keeps the updates' dtype.

    Reference: Sutskever et al., 2013, http://proceedings.mlr.press/v28/sutskever13.pdf
    """

    elementwise_updates = True

    decay: Scalar = fields.momentum()
    nesterov: bool = static(default=False)
    accumulator_dtype: DTypeLike | None = fields.dtype()

    def init(self, params):
        return TraceState(trace=init_state(params, self.accumulator_dtype))

    def update(self, updates, state, params=None, **extra_args):
        step = lambda g, t: g + self.decay * t  # noqa: E731
        grads = widen(updates, self.accumulator_dtype)
        new_trace = map_updates(step, grads, widen(state.trace, self.accumulator_dtype))
        new_updates = map_updates(step, grads, new_trace) if self.nesterov else new_trace
        new_updates = in_update_dtype(new_updates, updates, self.accumulator_dtype)
        return new_updates, TraceState(trace=store(new_trace, self.accumulator_dtype))


class EmaState(NamedTuple):
    """Step count and exponential moving average of past updates."""

    count: jax.Array  # int32 scalar
    ema: Any  # like the params (in `accumulator_dtype` if set)


class Ema(AbstractTransform):
    """Exponential moving average of updates, `e = decay * e + (1 - decay) * g`.

    With `debias=True` the output is divided by `1 - decay**t`.

    Args:
        decay: the decay rate of the average, in [0, 1].
        debias: divide by `1 - decay^t` so that early averages are not biased towards zero (static).
        accumulator_dtype: the dtype of the average; `None` keeps the updates' dtype.
    """

    elementwise_updates = True

    decay: Scalar = fields.decay_rate(check=UNIT)
    debias: bool = static(default=True)
    accumulator_dtype: DTypeLike | None = fields.dtype()

    def init(self, params):
        return EmaState(count=jnp.zeros([], jnp.int32), ema=init_state(params, self.accumulator_dtype))

    def update(self, updates, state, params=None, **extra_args):
        new_ema = widened_update_moment(updates, state.ema, self.decay, 1, self.accumulator_dtype)
        count = safe_increment(state.count)
        new_updates = bias_correction(new_ema, self.decay, count) if self.debias else new_ema
        new_updates = in_update_dtype(new_updates, updates, self.accumulator_dtype)
        return new_updates, EmaState(count=count, ema=store(new_ema, self.accumulator_dtype))


trace = Trace
ema = Ema
