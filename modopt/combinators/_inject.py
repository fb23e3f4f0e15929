"""Hyperparameters kept in the optimizer state: `inject_hyperparams`.

modopt's transforms already hold their hyperparameters as array leaves, so a change never
retraces; `inject_hyperparams` is for code written for optax, which reads and writes them in
the state (`opt_state.hyperparams["learning_rate"] = 1e-4`), and for optax transforms, whose
hyperparameters live in closures.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .. import fields
from .._core.base import AbstractTransform, Part, as_transform, parts_act_elementwise
from .._core.fields import StaticTree, _is_key, as_hyperparameter
from .._util.numerics import safe_increment
from .._core.specs import follow_params
from ..schedules._base import AbstractSchedule, as_schedule, is_schedule
from ..schedules._stateful import WrappedScheduleState, as_stateful_module, is_stateful_schedule
from jax.typing import DTypeLike


class InjectHyperparamsState(NamedTuple):
    """The step count, the hyperparameters the last step used, and the inner state."""

    count: jax.Array  # int32 scalar
    hyperparams: dict[str, Any]  # by name; a number set here is used from the next step on
    inner_state: Any


class InjectStatefulHyperparamsState(NamedTuple):
    """optax's layout: the step count, the hyperparameters the last step used, the state of each
    schedule, and the inner state."""

    count: jax.Array  # int32 scalar
    hyperparams: dict[str, Any]  # by name; a number set here is used from the next step on
    hyperparams_states: dict[str, Any]  # by name: a `WrappedScheduleState` per schedule of the count,
    # the state of each `StatefulSchedule`
    inner_state: Any


def _as_injected(values: dict[str, Any]) -> dict[str, Any]:
    """The injected hyperparameters as leaves: numbers as arrays, callables as schedules."""
    return {name: as_schedule(as_hyperparameter(value)) for name, value in values.items()}


class InjectHyperparams(AbstractTransform):
    """`inner_factory(**others, **hyperparams)`, with the hyperparameters in the state.

    At every step the inner transform is built from the state's `hyperparams`: numbers as
    the state holds them (so `state.hyperparams[name] = value` takes effect at the next
    step) and schedules evaluated at the step count. Floats are cast to `hyperparam_dtype`
    (default: the highest float dtype of the params). Made by `inject_hyperparams`.

    Args:
        inner_factory: the transform's factory, such as `modopt.adam` or `optax.sgd` (static: code).
        hyperparams: the injected hyperparameters by name: numbers, and schedules of the step count.
        others: the factory's other arguments (flags, dtypes, masks and `static_args`), passed as
            they are (static).
        hyperparam_dtype: the dtype of the injected floats; `None` for the widest float dtype of the
            params.
    """

    inner_factory: Callable[..., Any] = fields.static()
    hyperparams: dict[str, Any] = fields.hyperparameter(kind="dict", converter=_as_injected)
    others: StaticTree = fields.static()  # flags, dtypes, masks and `static_args`
    hyperparam_dtype: DTypeLike | None = fields.dtype(of="hyperparameters")

    def inner(self, values: dict[str, Any]) -> AbstractTransform:
        """The inner transform with the hyperparameters `values`."""
        try:
            inner = self.inner_factory(**self.others.tree, **values)
        except ValueError as error:
            dtypes = sorted({str(jnp.result_type(v)) for v in values.values()})
            raise ValueError(
                f"inject_hyperparams: {_name(self.inner_factory)} rejects its hyperparameters as held in the "
                f"state (dtypes {', '.join(dtypes)}; they follow the params' dtype unless `hyperparam_dtype` "
                f"is given, e.g. jnp.float32): {error}"
            ) from None
        return as_transform(inner, "inject_hyperparams")

    def _values_at(self, count: Any, stored: dict[str, Any], params: Any) -> dict[str, Any]:
        """The hyperparameters a step at `count` uses: scheduled ones evaluated, others as stored."""
        dtype = self.hyperparam_dtype or _highest_float(params)
        values = {}
        for name, value in self.hyperparams.items():
            values[name] = _as_dtype(value(count) if is_schedule(value) else stored[name], dtype)
        return values

    def init(self, params):
        count = jnp.zeros([], jnp.int32)
        values = self._values_at(count, self.hyperparams, params)
        return InjectHyperparamsState(count, values, self.inner(values).init(params))

    def update(self, updates, state, params=None, **extra_args):
        values = self._values_at(state.count, state.hyperparams, updates)
        updates, inner_state = self.inner(values).update(updates, state.inner_state, params, **extra_args)
        return updates, InjectHyperparamsState(safe_increment(state.count), values, inner_state)

    def parts(self):
        return (Part("", self.inner(self._values_at(0, self.hyperparams, None)), _inner_state),)

    def acts_elementwise(self) -> bool:
        # Its own work is on scalars (a count, hyperparameters): as elementwise as what it builds.
        return parts_act_elementwise(self)

    def learning_rates(self, state):
        values = {
            name: value(state.count) if is_schedule(value) else state.hyperparams[name]
            for name, value in self.hyperparams.items()
        }
        return self.inner(values).learning_rates(state.inner_state)

    def hyperparameters_in_state(self):
        # The numbers; a scheduled value is recomputed at every step, so it lives in its schedule.
        return {
            name: functools.partial(_stored, name=name)
            for name, value in self.hyperparams.items()
            if not is_schedule(value)
        }


class InjectStatefulHyperparams(AbstractTransform):
    """`inject_hyperparams` with optax 0.2.8's state, and stateful schedules.

    The state is `InjectStatefulHyperparamsState(count, hyperparams, hyperparams_states,
    inner_state)`: besides the hyperparameters, it holds the state of each schedule. A
    schedule of the step count has a `WrappedScheduleState` there (its own count, which
    follows the state's `count`); a `StatefulSchedule` has its own state, updated at every
    step, and its value is computed from that state and the extra arguments `update`
    receives. Numbers, schedules of the count, dtypes and the factory's other arguments are
    handled as by `InjectHyperparams`, which this transform holds. Made by
    `inject_stateful_hyperparams`, and by `inject_hyperparams` when it is given a
    `StatefulSchedule`.

    Args:
        injected: the `InjectHyperparams` holding the factory, the numbers and schedules of the
            count, the other arguments and the dtype of the injected floats.
        stateful: the `StatefulSchedule`s by name.
    """

    injected: InjectHyperparams
    stateful: dict[str, Any] = eqx.field(converter=lambda d: {k: as_stateful_module(v) for k, v in d.items()})

    def _values(
        self, count: Any, stored: dict[str, Any], states: dict[str, Any], params: Any, extra_args: Any
    ) -> dict[str, Any]:
        """The hyperparameters a step uses: `InjectHyperparams`' values, and each stateful
        schedule's value at its state."""
        dtype = self.injected.hyperparam_dtype or _highest_float(params)
        values = self.injected._values_at(count, stored, params)
        for name, schedule in self.stateful.items():
            values[name] = _as_dtype(schedule(states[name], **extra_args), dtype)
        return values

    def _initial_states(self, count: jax.Array) -> dict[str, Any]:
        states = {
            name: WrappedScheduleState(count)
            for name, value in self.injected.hyperparams.items()
            if is_schedule(value)
        }
        states.update({name: schedule.init() for name, schedule in self.stateful.items()})
        return states

    def init(self, params):
        count = jnp.zeros([], jnp.int32)
        states = self._initial_states(count)
        values = self._values(count, self.injected.hyperparams, states, params, {})
        return InjectStatefulHyperparamsState(count, values, states, self.injected.inner(values).init(params))

    def update(self, updates, state, params=None, **extra_args):
        states = state.hyperparams_states
        values = self._values(state.count, state.hyperparams, states, updates, extra_args)
        new_states = {}
        for name, schedule_state in states.items():
            if name in self.stateful:
                new_states[name] = self.stateful[name].update(schedule_state, **extra_args)
            else:
                new_states[name] = WrappedScheduleState(safe_increment(schedule_state.count))
        updates, inner_state = self.injected.inner(values).update(
            updates, state.inner_state, params, **extra_args
        )
        return updates, InjectStatefulHyperparamsState(
            safe_increment(state.count), values, new_states, inner_state
        )

    def _first_inner(self) -> AbstractTransform:
        count = jnp.zeros([], jnp.int32)
        return self.injected.inner(
            self._values(count, self.injected.hyperparams, self._initial_states(count), None, {})
        )

    def parts(self):
        return (Part("", self._first_inner(), _inner_state),)

    def acts_elementwise(self) -> bool:
        return parts_act_elementwise(self)

    def state_specs(self, params, param_specs):
        own = follow_params(jax.eval_shape(self.init, params), params, param_specs, type(self).__name__)
        return own._replace(inner_state=self._first_inner().state_specs(params, param_specs))

    def learning_rates(self, state):
        values = self._values(state.count, state.hyperparams, state.hyperparams_states, None, {})
        return self.injected.inner(values).learning_rates(state.inner_state)

    def hyperparameters_in_state(self):
        return self.injected.hyperparameters_in_state()


def _name(factory: Any) -> str:
    return getattr(factory, "__name__", type(factory).__name__)


def _inner_state(state: InjectHyperparamsState) -> Any:
    return state.inner_state


def _stored(state: InjectHyperparamsState, name: str) -> Any:
    return state.hyperparams[name]


def _highest_float(params: Any) -> Any:
    """The widest floating dtype among the leaves of `params` (float32 if there are none)."""
    dtypes = [
        jnp.result_type(x)
        for x in jax.tree_util.tree_leaves(params)
        if jnp.issubdtype(jnp.result_type(x), jnp.floating)
    ]
    return functools.reduce(jnp.promote_types, dtypes) if dtypes else jnp.dtype(jnp.float32)


def _as_dtype(value: Any, dtype: Any) -> Any:
    """Python and weakly typed floats as `dtype`; strongly typed arrays and integers unchanged."""
    value = jnp.asarray(value)
    if jnp.issubdtype(value.dtype, jnp.floating) and value.weak_type:
        return value.astype(dtype)
    return value


def inject_hyperparams(
    inner_factory: Callable[..., Any],
    static_args: str | Iterable[str] = (),
    hyperparam_dtype: DTypeLike | None = None,
) -> Callable[..., InjectHyperparams | InjectStatefulHyperparams]:
    """Wraps a transform factory so that its numeric hyperparameters live in the state.

    `inject_hyperparams(modopt.adam)(learning_rate=schedule, b1=0.9)` returns a transform
    whose state is `InjectHyperparamsState(count, hyperparams, inner_state)`. Every number
    and callable argument is injected (callables as schedules of the step count), except
    booleans, dtypes and the names in `static_args` (callables that are not schedules, sizes
    that shape the computation), which are passed through as they are. Given a
    `StatefulSchedule`, it returns an `InjectStatefulHyperparams`, whose state (optax 0.2.8's
    layout, see `inject_stateful_hyperparams`) keeps the schedule's state.

    Reading and setting: `state.hyperparams["b1"] = 0.95` changes the next steps;
    `modopt.Optimizer(...).set(b1=0.95)` writes there too, since that is where the value lives.

    Works with modopt factories and optax ones (`inject_hyperparams(optax.sgd)`).

    Args:
        inner_factory: the factory whose arguments are injected: a modopt constructor
            (`modopt.adam`) or an optax function (`optax.sgd`).
        static_args: the name, or names, of arguments passed through as they are rather than
            injected.
        hyperparam_dtype: the dtype of the injected floats; `None` for the widest float dtype of the
            params.
    """
    return _injector(inner_factory, static_args, hyperparam_dtype, always_stateful=False)


def _injector(
    inner_factory: Callable[..., Any],
    static_args: str | Iterable[str],
    hyperparam_dtype: Any,
    always_stateful: bool,
) -> Callable[..., Any]:
    """The factory of injected transforms (stateful ones always when `always_stateful`)."""
    static_names = {static_args} if isinstance(static_args, str) else set(static_args)
    signature = inspect.signature(inner_factory)
    unknown = static_names - set(signature.parameters)
    if unknown:
        raise ValueError(
            f"inject_hyperparams: static_args {sorted(unknown)} are not parameters of "
            f"{getattr(inner_factory, '__name__', inner_factory)}; its parameters are {list(signature.parameters)}."
        )

    @functools.wraps(inner_factory)
    def make(*args: Any, **kwargs: Any) -> InjectHyperparams | InjectStatefulHyperparams:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        injected, stateful, others = {}, {}, {}
        for name, value in bound.arguments.items():
            if name in static_names or isinstance(value, (bool, np.bool_)) or _is_dtype(value):
                others[name] = value
            elif is_stateful_schedule(value):
                stateful[name] = value
            elif callable(value) or isinstance(value, AbstractSchedule) or _is_number(value) or _is_key(value):
                injected[name] = value  # a PRNG key too, as optax injects any array
            else:
                others[name] = value
        transform = InjectHyperparams(inner_factory, injected, StaticTree(others), hyperparam_dtype)
        if stateful or always_stateful:
            return InjectStatefulHyperparams(transform, stateful)
        return transform

    return make


def inject_stateful_hyperparams(
    inner_factory: Callable[..., Any],
    static_args: str | Iterable[str] = (),
    hyperparam_dtype: DTypeLike | None = None,
) -> Callable[..., InjectStatefulHyperparams]:
    """`inject_hyperparams` with optax 0.2.8's state: each schedule's state is kept too.

    The transforms it makes have the state `InjectStatefulHyperparamsState(count, hyperparams,
    hyperparams_states, inner_state)`, as optax's `inject_hyperparams` and
    `inject_stateful_hyperparams` give: `hyperparams_states` holds a `WrappedScheduleState` for
    each schedule of the step count and the state of each `StatefulSchedule`, whose value
    follows its state and the extra arguments of `update`. Arguments are sorted as by
    `inject_hyperparams`. optax 0.2.8 deprecates this name for `inject_hyperparams` (the same
    function there); modopt keeps it as the way to optax's layout, without a warning.

    Args:
        inner_factory: the factory whose arguments are injected: a modopt constructor
            (`modopt.adam`) or an optax function (`optax.sgd`).
        static_args: the name, or names, of arguments passed through as they are rather than
            injected.
        hyperparam_dtype: the dtype of the injected floats; `None` for the widest float dtype of the
            params.

    Example:
        >>> tx = modopt.inject_stateful_hyperparams(modopt.sgd)(learning_rate=modopt.linear_schedule(0.1, 0.0, 100))
        >>> sorted(tx.init({"w": jnp.zeros(2)}).hyperparams_states)
        ['learning_rate']
    """
    return _injector(inner_factory, static_args, hyperparam_dtype, always_stateful=True)


def _is_dtype(value: Any) -> bool:
    """A dtype or scalar type (`jnp.float32`, `np.dtype("bfloat16")`): passed through, not
    injected (optax would call a scalar type as a schedule of the count)."""
    if isinstance(value, np.dtype):
        return True
    return isinstance(value, type) and (
        issubclass(value, np.generic) or isinstance(getattr(value, "dtype", None), np.dtype)
    )


def _is_number(value: Any) -> bool:
    if isinstance(value, (int, float, complex)):  # complex: injected, to be refused as a hyperparameter
        return True
    return isinstance(value, (jax.Array, np.ndarray)) and jnp.issubdtype(value.dtype, jnp.number)
