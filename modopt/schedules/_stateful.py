"""Stateful schedules: a value computed from a state of its own, updated at every step."""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol, runtime_checkable

import equinox as eqx
import jax
import jax.numpy as jnp

from .._core.fields import static
from .._core.module import Module
from .._util.numerics import safe_increment
from ._base import AbstractSchedule, as_schedule


@runtime_checkable
class StatefulSchedule(Protocol):
    """A schedule with a state of its own (optax's protocol): `init() -> state`,
    `update(state, **extra_args) -> state` and `schedule(state, **extra_args) -> value`.

    The extra arguments are those the optimizer's `update` receives (a loss, say), so the
    value can follow the training. `inject_hyperparams` and `inject_stateful_hyperparams`
    keep each one's state in `InjectStatefulHyperparamsState.hyperparams_states`. Any object
    with the three methods is one (`isinstance` checks them).
    """

    def init(self) -> Any: ...

    def update(self, state: Any, **extra_args: Any) -> Any: ...

    def __call__(self, state: Any, **extra_args: Any) -> Any: ...


class WrappedScheduleState(NamedTuple):
    """The state of a `WrappedSchedule`: the step count."""

    count: jax.Array  # int32 scalar


class WrappedSchedule(Module):
    """A schedule of the step count as a `StatefulSchedule` whose state is the count.

    `init()` is a count of 0, `update` adds 1 (saturating), and the value is
    `schedule_fn(state.count)`; extra arguments are ignored.

    Args:
        schedule_fn: the schedule: a modopt schedule or any function of the step count.

    Example:
        >>> wrapped = modopt.WrappedSchedule(modopt.linear_schedule(0.0, 1.0, 10))
        >>> state = wrapped.update(wrapped.init())
        >>> float(wrapped(state))
        0.1
    """

    schedule_fn: AbstractSchedule = eqx.field(converter=as_schedule)

    def init(self) -> WrappedScheduleState:
        return WrappedScheduleState(count=jnp.zeros([], jnp.int32))

    def update(self, state: WrappedScheduleState, **extra_args: Any) -> WrappedScheduleState:
        del extra_args
        return WrappedScheduleState(count=safe_increment(state.count))

    def __call__(self, state: WrappedScheduleState, **extra_args: Any) -> Any:
        del extra_args
        return self.schedule_fn(state.count)


class StatefulFunction(Module):
    """A `StatefulSchedule` that is not an Equinox module, held as code (static): its numbers,
    if any, are not leaves, and a different one retraces. Made by `as_stateful_module`.

    Args:
        schedule: the stateful schedule (static: code).
    """

    schedule: Any = static()

    def init(self) -> Any:
        return self.schedule.init()

    def update(self, state: Any, **extra_args: Any) -> Any:
        return self.schedule.update(state, **extra_args)

    def __call__(self, state: Any, **extra_args: Any) -> Any:
        return self.schedule(state, **extra_args)


def as_stateful_module(value: Any) -> Any:
    """A stateful schedule as a module: Equinox modules as they are, other objects as
    `StatefulFunction`s (static), as a schedule function becomes a `FunctionSchedule`."""
    return value if isinstance(value, eqx.Module) else StatefulFunction(value)


def is_stateful_schedule(value: Any) -> bool:
    """Whether `value` is a `StatefulSchedule` (its value needs a state), not a schedule of the count."""
    return not isinstance(value, AbstractSchedule) and isinstance(value, StatefulSchedule)
