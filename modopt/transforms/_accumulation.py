"""Accumulating past updates: momentum traces and exponential moving averages."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from .. import fields
from .._base import AbstractTransform
from .._fields import UNIT, static
from .._moments import bias_correction, update_moment
from .._numerics import safe_increment
from .._trees import cast, map_updates, zeros_like
from .._fields import Scalar
from jax.typing import DTypeLike


class TraceState(NamedTuple):
    """The momentum buffer."""

    trace: Any


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
        return TraceState(trace=zeros_like(params, self.accumulator_dtype))

    def update(self, updates, state, params=None, **extra_args):
        step = lambda g, t: g + self.decay * t  # noqa: E731
        new_trace = map_updates(step, updates, state.trace)
        updates = map_updates(step, updates, new_trace) if self.nesterov else new_trace
        return updates, TraceState(trace=cast(new_trace, self.accumulator_dtype))


class EmaState(NamedTuple):
    """Step count and exponential moving average of past updates."""

    count: jax.Array  # int32 scalar
    ema: Any


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
        return EmaState(count=jnp.zeros([], jnp.int32), ema=zeros_like(params, self.accumulator_dtype))

    def update(self, updates, state, params=None, **extra_args):
        new_ema = update_moment(updates, state.ema, self.decay, 1)
        count = safe_increment(state.count)
        updates = bias_correction(new_ema, self.decay, count) if self.debias else new_ema
        return updates, EmaState(count=count, ema=cast(new_ema, self.accumulator_dtype))


trace = Trace
ema = Ema
