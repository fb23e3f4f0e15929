"""Recording measurements of the updates in the state: `snapshot`, `monitor`, `measure_with_ema`.

A measure is code (a static field): a function of the updates returning an array or a pytree
of arrays, e.g. their global norm. In a chain it sees the updates as transformed so far.
The measurements are read back from the state by their names (`state[i].measurement[name]`
in a chain).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from .. import fields
from .._core.base import (
    AbstractComposite,
    AbstractTransform,
    GradientTransformation,
    as_transform,
    init_empty_state,
)
from .._core.fields import UNIT, static
from .._core.specs import follow_params
from ..transforms._accumulation import Ema
from ._chain import Chain
from .._core.fields import Scalar
from jax.typing import DTypeLike

Measure = Callable[[Any], Any]  # updates -> an array or a pytree of arrays


def _zeros_of(shapes: Any) -> Any:
    return jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)


class SnapshotState(NamedTuple):
    """The latest measurement, under its name: `{measure_name: measure(updates)}`."""

    measurement: dict[str, Any]


class Snapshot(AbstractTransform):
    """Stores `measure(updates)` in the state under `measure_name`; updates pass unchanged.

    Useful to look at intermediate updates inside a chain (the norm before clipping, say).
    Before the first update the state holds `measure(params)`, so the state keeps one
    structure throughout (as a jitted or scanned step needs).

    Args:
        measure_name: the key of the measurement in the state's `measurement` dict (static).
        measure: a function of the updates returning the measurement (static: code).

    Example:
        >>> tx = modopt.chain(modopt.sgd(0.1, momentum=0.9),
        ...                   modopt.snapshot("norm_before_clip", modopt.global_norm),
        ...                   modopt.clip_by_global_norm(1.0))
        >>> # after a step: state[1].measurement["norm_before_clip"]
    """

    measure_name: str = static()
    measure: Measure = static()

    def init(self, params):
        return SnapshotState({self.measure_name: self.measure(params)})

    def update(self, updates, state, params=None, **extra_args):
        return updates, SnapshotState({self.measure_name: self.measure(updates)})


class Measurement(AbstractTransform):
    """A stateless measure as a transform: its "updates" are `measure(updates)`.

    How `monitor` and `measure_with_ema` run a plain function. With `as_float=True`, a
    measurement that is not floating (a bool such as "was it clipped") is converted to the
    default float dtype, so that a moving average of it keeps one dtype.
    """

    measure: Measure = static()
    as_float: bool = static(default=False, kw_only=True)

    def measured(self, updates: Any) -> Any:
        measurement = self.measure(updates)
        if not self.as_float:
            return measurement
        default = jax.dtypes.canonicalize_dtype(float)
        return jax.tree_util.tree_map(
            lambda m: m if jnp.issubdtype(jnp.result_type(m), jnp.inexact) else jnp.asarray(m, default),
            measurement,
        )

    def init(self, params):
        return init_empty_state(params)

    def update(self, updates, state, params=None, **extra_args):
        return self.measured(updates), state


class MeasureWithEma(AbstractComposite):
    """An exponential moving average of `measure(updates)`, as a measure for `monitor`.

    Its output ("updates") is the average `e_t = decay * e_{t-1} + (1 - decay) * m_t` of the
    measurements `m_t = measure(updates)`, divided by `1 - decay**t` with `debias=True`. The
    state is `chain(measurement, ema)`'s, `(EmptyState(), EmaState(count, ema))`, with the
    average shaped like the measurement (`measure(params)` gives its shape). A measurement that
    is not floating (a bool) is averaged in the default float dtype, or `accumulator_dtype`.

    Args:
        measure: the measurement, a function of the updates returning an array (a scalar, a flag...)
            (static: code).
        decay: the decay rate of the average, in [0, 1].
        debias: divide by `1 - decay^t`, so that early averages are not biased towards zero
            (static).
        accumulator_dtype: the dtype of the average; `None` for the measurement's floating dtype
            (the default float dtype for a bool).

    Example:
        >>> clipped = modopt.measure_with_ema(lambda u: modopt.global_norm(u) > 1.0, decay=0.9)
        >>> tx = modopt.chain(modopt.monitor({"clipped_ema": clipped}), modopt.clip_by_global_norm(1.0))
    """

    measure: Measure = static()
    decay: Scalar = fields.decay_rate(check=UNIT)
    debias: bool = static(default=True)
    accumulator_dtype: DTypeLike | None = fields.dtype()

    def build(self) -> AbstractTransform:
        return Chain(
            Measurement(self.measure, as_float=True), Ema(self.decay, self.debias, self.accumulator_dtype)
        )

    def init(self, params):
        # The average is shaped like the measurement, not like the parameters.
        chain = self.build()
        shapes = jax.eval_shape(chain.transforms[0].measured, params)
        return chain.init(_zeros_of(shapes))

    def state_specs(self, params, param_specs):
        # By shape, on the state this init really makes (a measurement shaped like the
        # parameters follows them; a scalar is replicated).
        return follow_params(jax.eval_shape(self.init, params), params, param_specs, type(self).__name__)


class MonitorState(NamedTuple):
    """The latest measurement of each measure by name, and each measure's own state (in order)."""

    measurements: dict[str, Any]
    measure_states: tuple[Any, ...]


def _as_measure(name: str, measure: Any) -> AbstractTransform:
    if isinstance(measure, (AbstractTransform, GradientTransformation)):
        return as_transform(measure, f"monitor measure {name!r}")
    if callable(measure):
        return Measurement(measure)
    raise TypeError(
        f"monitor measure {name!r}: expected a function of the updates or a transform "
        f"(e.g. `measure_with_ema(...)`), got {type(measure).__name__}."
    )


class Monitor(AbstractTransform):
    """Records measurements of the updates, stateful ones included; updates pass unchanged.

    `measures` maps names to functions of the updates (as for `snapshot`) or to transforms
    whose output is the measurement and whose state carries over between steps (such as
    `measure_with_ema`). Transforms get the params and the extra arguments of `update`.
    Before the first update, each measurement holds zeros of the shape and dtype it will have,
    so the state keeps one structure throughout (optax starts from an empty dict, which a
    jitted or scanned step cannot carry).

    Args:
        measures: a mapping from names to functions of the updates (as for `snapshot`) or to
            transforms whose output is the measurement (such as `measure_with_ema`).

    Example:
        >>> tx = modopt.chain(
        ...     modopt.monitor({"norm": modopt.global_norm,
        ...                     "norm_ema": modopt.measure_with_ema(modopt.global_norm, decay=0.9)}),
        ...     modopt.clip_by_global_norm(1.0))
        >>> # after a step: state[0].measurements["norm_ema"]
    """

    names: tuple[str, ...] = static()
    measures: tuple[AbstractTransform, ...]

    def __init__(self, measures: Mapping[str, Any]):
        if not isinstance(measures, Mapping):
            raise TypeError(f"monitor expects a dict of measures by name, got {type(measures).__name__}.")
        self.names = tuple(measures)
        self.measures = tuple(_as_measure(name, m) for name, m in measures.items())

    def _measure_all(self, updates, states, params, extra_args):
        measurements, new_states = {}, []
        for name, measure, state in zip(self.names, self.measures, states):
            measurements[name], state = measure.update(updates, state, params, **extra_args)
            new_states.append(state)
        return measurements, tuple(new_states)

    def init(self, params):
        states = tuple(m.init(params) for m in self.measures)
        # What the first update will measure, as zeros: measured on the params as updates.
        shapes = jax.eval_shape(lambda p, s: self._measure_all(p, s, p, {})[0], params, states)
        return MonitorState(_zeros_of(shapes), states)

    def update(self, updates, state, params=None, **extra_args):
        if not isinstance(state, MonitorState) or len(state.measure_states) != len(self.measures):
            raise ValueError(
                f"monitor of {len(self.measures)} measures got a state of type {type(state).__name__}: "
                "was it made by this transform's init?"
            )
        measurements, states = self._measure_all(updates, state.measure_states, params, extra_args)
        return updates, MonitorState(measurements, states)

    # `parts()` stays empty: the measures observe the updates without changing them, so their
    # learning rates (if any), skipped steps or injected hyperparameters are not the optimizer's.

    def state_specs(self, params, param_specs):
        measurements = jax.eval_shape(self.init, params).measurements
        return MonitorState(
            follow_params(measurements, params, param_specs, type(self).__name__),
            tuple(m.state_specs(params, param_specs) for m in self.measures),
        )


snapshot = Snapshot
monitor = Monitor
measure_with_ema = MeasureWithEma
