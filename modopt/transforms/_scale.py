"""Scaling by constants, schedules and the learning rate."""

from __future__ import annotations

import operator
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from .. import fields
from .._core.base import AbstractComposite, AbstractTransform, EmptyState, init_empty_state, require_params
from .._core.fields import NONNEGATIVE, hyperparameter, static
from .._util.numerics import safe_increment, safe_norm, safe_root_mean_squares
from .._util.trees import map_updates
from ..schedules._base import AbstractSchedule, MappedSchedule, ScalarOrSchedule, is_schedule, scalar_or_schedule, value_at
from ._stateless import Identity
from .._core.fields import Scalar


class Scale(AbstractTransform):
    """Multiplies updates by a fixed `step_size` (any sign).

    Args:
        step_size: the factor, a number of any sign.
    """

    elementwise_updates = True

    step_size: Scalar = hyperparameter()

    def init(self, params):
        return init_empty_state(params)

    def update(self, updates, state, params=None, **extra_args):
        return jax.tree_util.tree_map(lambda g: self.step_size * g, updates), state


class ScaleByScheduleState(NamedTuple):
    """The step count a schedule is evaluated at."""

    count: jax.Array  # int32 scalar


class ScaleBySchedule(AbstractTransform):
    """Multiplies updates by `step_size_fn(count)`, with `count` the number of past updates.

    Args:
        step_size_fn: a schedule, or any function of the step count, giving the factor (of any
            sign).
    """

    elementwise_updates = True

    step_size_fn: AbstractSchedule = scalar_or_schedule(kind="schedule")

    def init(self, params):
        return ScaleByScheduleState(count=jnp.zeros([], jnp.int32))

    def update(self, updates, state, params=None, **extra_args):
        step_size = self.step_size_fn(state.count)
        updates = jax.tree_util.tree_map(lambda g: jnp.asarray(step_size, g.dtype) * g, updates)
        return updates, ScaleByScheduleState(count=safe_increment(state.count))


class ScaleByLearningRate(AbstractComposite):
    """Multiplies updates by `-learning_rate` (or `+learning_rate` with `flip_sign=False`).

    `learning_rate` is a number or a schedule; `None` means no scaling.

    Args:
        learning_rate: a number >= 0 or a schedule of the step count; `None` leaves the updates
            unscaled (and unflipped).
        flip_sign: multiply by `-learning_rate`, for descent (static); `False` multiplies by
            `learning_rate`.
    """

    learning_rate: ScalarOrSchedule = fields.learning_rate(None)
    flip_sign: bool = static(default=True, kw_only=True)

    def learning_rates(self, state):
        if self.learning_rate is None:
            return {}
        return {"learning_rate": value_at(self.learning_rate, getattr(state, "count", None))}

    def build(self):
        if self.learning_rate is None:
            return Identity()
        if is_schedule(self.learning_rate):
            flipped = MappedSchedule(self.learning_rate, operator.neg) if self.flip_sign else self.learning_rate
            return ScaleBySchedule(flipped)
        return Scale(-self.learning_rate if self.flip_sign else self.learning_rate)


class ScaleByParamBlockNorm(AbstractTransform):
    """Multiplies each update leaf by the L2 norm of its parameter (at least `min_scale`).

    A block is one leaf of the params (a weight vector or matrix): `u <- u * max(||p||, min_scale)`.

    Args:
        min_scale: the floor of the parameter norm, >= 0, so that zero-initialized parameters can
            still move.
    """

    min_scale: Scalar = hyperparameter(default=1e-3, check=NONNEGATIVE)

    def init(self, params):
        return init_empty_state(params)

    def update(self, updates, state, params=None, **extra_args):
        statistic = lambda p: safe_norm(p, self.min_scale)  # noqa: E731
        return _scale_by_param_statistic(updates, params, self, statistic), state


class ScaleByParamBlockRms(AbstractTransform):
    """Multiplies each update leaf by the RMS of its parameter (at least `min_scale`).

    A block is one leaf of the params: `u <- u * max(sqrt(mean(|p|^2)), min_scale)`.

    Args:
        min_scale: the floor of the parameter RMS, >= 0, so that zero-initialized parameters can
            still move.

    Reference: Shazeer & Stern, 2018 (Adafactor), https://arxiv.org/abs/1804.04235
    """

    min_scale: Scalar = hyperparameter(default=1e-3, check=NONNEGATIVE)

    def init(self, params):
        return init_empty_state(params)

    def update(self, updates, state, params=None, **extra_args):
        statistic = lambda p: safe_root_mean_squares(p, self.min_scale)  # noqa: E731
        return _scale_by_param_statistic(updates, params, self, statistic), state


def _scale_by_param_statistic(updates: Any, params: Any, transform: Any, statistic: Any) -> Any:
    """`update * statistic(param)` leaf by leaf (`None` updates stay `None`)."""
    require_params(params, transform)
    return map_updates(lambda u, p: u * statistic(p), updates, params)


scale = Scale
scale_by_schedule = ScaleBySchedule
scale_by_learning_rate = ScaleByLearningRate
scale_by_param_block_norm = ScaleByParamBlockNorm
scale_by_param_block_rms = ScaleByParamBlockRms

ScaleState = EmptyState  # the state of `scale`, named as in optax
