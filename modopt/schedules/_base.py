"""The schedule base class: a module mapping a step count to a value."""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable
from typing import Any, Union

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._core.module import Module
from .._core.fields import (
    Check,
    as_hyperparameter,
    hyperparameter,
    is_concrete,
    pretty,
    static,
    tree_hash,
    validate_hyperparameters,
)

# The two aliases are built as optax 0.2.8 builds its own, of the same members, so that they
# compare equal to optax's (`typing.Union` compares its members): code that checks an
# annotation against `optax.ScalarOrSchedule` finds modopt's learning rates annotated alike.
Schedule = Callable[[jax.typing.ArrayLike], jax.typing.ArrayLike]
"""A function of the step count, `schedule(count) -> value`: an `AbstractSchedule` or any callable."""
ScalarOrSchedule = Union[float, jax.Array, Schedule]
"""A hyperparameter given as a number (a Python or NumPy scalar, a 0-d array) or a `Schedule`."""


class AbstractSchedule(Module):
    """A function of the step count whose numeric parameters are array leaves.

    Being a module, a schedule can be changed inside `jit` without a retrace and is saved
    with the optimizer that holds it. It hashes by its values, so `jax.jit(schedule)` works.
    """

    __hash__ = tree_hash
    __eq__ = eqx.Module.__eq__

    @abc.abstractmethod
    def __call__(self, count: jax.Array) -> jax.Array:
        """The value at step `count`."""

    def probe_counts(self) -> tuple[Any, ...]:
        """The steps where the schedule's extreme values lie: where its pieces start and end.

        A schedule in a checked field (a learning rate must stay >= 0 and finite) is checked at
        these steps when it is built or set. Each piece of modopt's schedules is monotone, so its
        values lie between those at its ends; a plain function is probed at step 0 only.
        """
        return (0,)

    def __check_init__(self):
        validate_hyperparameters(self)

    def __repr__(self):
        return pretty(self)


class FunctionSchedule(AbstractSchedule):
    """A plain Python function used as a schedule.

    The function is code, so it is static: a different function (even an equal lambda)
    retraces. Use modopt's schedules to change values without retracing.

    Args:
        fn: a function of the step count returning the value (static: code).
    """

    fn: Callable[[jax.Array], Any] = static()

    def __call__(self, count):
        return self.fn(count)


class MappedSchedule(AbstractSchedule):
    """`fn(schedule(count))`: a function of a scheduled value, itself a schedule.

    `fn` is code, so it is static: use a module-level function (or `operator.neg`), not a
    new lambda per call, or every rebuilt transform retraces.

    Args:
        schedule: the schedule whose value is mapped.
        fn: the function applied to the value (static: code).
    """

    schedule: AbstractSchedule
    fn: Callable[[Any], Any] = static()

    def __call__(self, count):
        return self.fn(self.schedule(count))

    def probe_counts(self):
        return self.schedule.probe_counts()


def as_schedule(value: Any) -> Any:
    """Converter for `learning_rate`-like fields: callables become schedules, numbers stay.

    Args:
        value: a number, a modopt schedule, or any callable of the step count (which becomes a
            `FunctionSchedule`).
    """
    if isinstance(value, AbstractSchedule) or not callable(value):
        return value
    return FunctionSchedule(value)


def as_vector(values: Any, dtype: Any) -> jax.Array:
    """A 1-D array of `values` (a sequence of numbers, or an array) of the given dtype kind."""
    if isinstance(values, jax.Array):
        return values
    values = tuple(values)
    if not values:
        return jnp.zeros((0,), dtype)
    if any(isinstance(v, jax.core.Tracer) for v in values):
        return jnp.stack([jnp.asarray(v) for v in values]).astype(dtype)
    return jnp.asarray(np.asarray(values), dtype)


def as_boundaries(values: Any) -> jax.Array:
    """Step boundaries as a 1-D array: integers where they fit JAX's default integer type,
    else floats; traced boundaries keep their own dtype."""
    if isinstance(values, jax.Array):
        return values
    values = tuple(values)
    if not all(is_concrete(v) for v in values):
        return jnp.stack([jnp.asarray(v) for v in values])
    limits = np.iinfo(jax.dtypes.canonicalize_dtype(int))
    integral = all(np.issubdtype(np.asarray(v).dtype, np.integer) and limits.min <= int(v) <= limits.max for v in values)
    return as_vector(values, int if integral or not values else float)


def is_schedule(value: Any) -> bool:
    return isinstance(value, AbstractSchedule)


def scalar_or_schedule(
    default: Any = dataclasses.MISSING, *, check: Check | None = None, kind: str = "number_or_schedule", **kwargs: Any
):
    """A hyperparameter field that also accepts a schedule (or any callable of the count).

    With `kind="schedule"` it accepts only a schedule. A callable becomes a `FunctionSchedule`.

    Args:
        default: the field's default value; leave it out for a required field.
        check: a `Check` a number must pass at construction, or `None` for none.
        kind: `"number_or_schedule"` (the default) or `"schedule"` to accept only schedules and
            callables.
        **kwargs: passed to `equinox.field` (`kw_only=True`, `metadata`...).
    """
    return hyperparameter(default, check=check, kind=kind, converter=_scalar_or_schedule, **kwargs)


def _scalar_or_schedule(value: ScalarOrSchedule) -> Any:
    return as_schedule(as_hyperparameter(value))


# Equinox gives each field's `__init__` parameter its converter's annotation: the alias itself,
# not the string `from __future__ import annotations` would leave (see `ScalarOrSchedule`).
_scalar_or_schedule.__annotations__["value"] = ScalarOrSchedule


def schedule_annotations(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` with its string annotations `"ScalarOrSchedule"` and `"Schedule"` (as `from __future__
    import annotations` leaves them) replaced by the aliases, for `inspect.signature` readers.

    Args:
        fn: a function whose parameters are annotated with the aliases.
    """
    aliases = {"ScalarOrSchedule": ScalarOrSchedule, "Schedule": Schedule}
    for name, annotation in fn.__annotations__.items():
        if isinstance(annotation, str) and annotation in aliases:
            fn.__annotations__[name] = aliases[annotation]
    return fn


def value_at(value: Any, count: jax.Array) -> Any:
    """A scalar-or-schedule hyperparameter's value at step `count`."""
    return value(count) if is_schedule(value) else value
