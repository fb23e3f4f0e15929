"""Transforms that aggregate per-element gradients: optax 0.2.8's `experimental.aggregating`.

An aggregator takes one gradient per element of a batch, every leaf with the batch on an axis
(`jax.vmap(jax.grad(loss), in_axes=(None, 0))(params, batch)`), and returns an update shaped
like the parameters, so that it can measure what a mean hides (the gradients' variance).
`process(preprocessor, aggregator, postprocessor)` runs a transform on the per-element
gradients, the aggregator, then an ordinary optimizer on the aggregate:

    opt = aggregating.add_mean_variance_to_opt(modopt.adam(1e-3), ema_decay=0.9)
    grads = jax.vmap(jax.grad(loss), in_axes=(None, 0))(params, batch)
    updates, state = opt.update(grads, state)
    mean, variance = aggregating.get_unbiased_mean_and_variance_ema(state)

Aggregators can also accumulate over several micro-batches: the optimizer after them steps
once their state says `ready`, and passes zero updates before.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, Protocol

import jax
import jax.numpy as jnp

from .. import fields
from .._core.base import AbstractTransform, EmptyState, Part, as_transform, init_empty_state, inner_transform
from .._core.extra_args import ExtraArg, extra_arg
from .._core.fields import UNIT, static
from .._util.numerics import safe_int32_increment
from .._util.trees import select, zeros_like
from ..combinators._chain import Chain
from ..transforms._stateless import Identity
from ..tree._state import get
from .._core.fields import Scalar
from .._state.moments import in_update_dtype, init_state, store, widen
from jax.typing import DTypeLike

PerElementUpdates = Any
"""Updates with one entry per element of a batch: every leaf has the batch on an axis."""
AggregatedUpdates = Any
"""Updates shaped like the parameters, aggregated over a batch."""
MaybeAxis = int | Sequence[int] | None
"""An axis, several axes, or `None`."""


class AggregatorUpdateFn(Protocol):
    """`update(per_elt_updates, state, params=None, **extra_args) -> (aggregated, state)`."""

    def __call__(
        self, per_elt_updates: PerElementUpdates, state: Any, params: Any = None, **extra_args: Any
    ) -> tuple[AggregatedUpdates, Any]: ...


class Aggregator(AbstractTransform):
    """A transform whose `update` takes per-element updates and aggregates them.

    Built as optax's is, from a pair of functions: `Aggregator(init=..., update=...)` with
    `update(per_elt_updates, state, params=None) -> (aggregated, state)`; or around a modopt
    transform that aggregates: `Aggregator(inner=transform)`. Either way its state is that of
    what it holds. `Optimizer.step` takes per-element gradients for it (a leading batch axis on
    every leaf), as for `differentially_private_aggregate`.

    Args:
        init: `init(params) -> state`, with `update`, to build it from functions.
        update: `update(per_elt_updates, state, params=None, **extra_args) -> (updates, state)`.
        inner: the modopt (or optax) transform that aggregates, instead of `init` and `update`.

    Example:
        >>> average = aggregating.Aggregator(
        ...     init=modopt.init_empty_state,
        ...     update=lambda updates, state, params=None: (jax.tree.map(lambda u: u.mean(0), updates), state),
        ... )
    """

    per_example_updates = True

    inner: AbstractTransform

    def __init__(
        self,
        init: Callable[[Any], Any] | None = None,
        update: AggregatorUpdateFn | None = None,
        *,
        inner: Any = None,
    ):
        if (inner is None) == (init is None or update is None):
            raise TypeError(
                "Aggregator takes either `init` and `update` (functions), or `inner` (a transform)."
            )
        self.inner = as_transform(_Functions(init, update) if inner is None else inner, "Aggregator")

    def init(self, params):
        return self.inner.init(params)

    def update(self, updates, state, params=None, **extra_args):
        return self.inner.update(updates, state, params, **extra_args)

    def state_specs(self, params, param_specs):
        return self.inner.state_specs(params, param_specs)

    def parts(self):
        return (Part("", self.inner, _same),)


class _Functions(NamedTuple):
    init: Callable[[Any], Any]
    update: Callable[..., Any]


def _same(state: Any) -> Any:
    return state


class Process(AbstractTransform):
    """`preprocessor` on per-element updates, `aggregator`, then `postprocessor`; made by `process`.

    The state is `(preprocessor's, aggregator's, postprocessor's)`. Where the aggregator's
    state has a `ready` flag (it accumulates micro-batches), the postprocessor steps only when
    it is true and the updates are zeros otherwise. With `aggregator_has_aux`, the aggregator
    returns `(updates, aux)` and the dict `aux` is passed to the postprocessor as extra
    arguments.

    Args:
        preprocessor: the transform applied to the per-element updates.
        aggregator: the transform reducing them to updates shaped like the parameters.
        postprocessor: the transform applied to the aggregated updates (an optimizer).
        aggregator_has_aux: whether the aggregator returns `(updates, aux)` (static).
    """

    preprocessor: AbstractTransform = inner_transform()
    aggregator: AbstractTransform = inner_transform()
    postprocessor: AbstractTransform = inner_transform()
    aggregator_has_aux: bool = static(default=False)

    def init(self, params):
        return (self.preprocessor.init(params), self.aggregator.init(params), self.postprocessor.init(params))

    def update(self, updates, state, params=None, **extra_args):
        pre_state, aggregator_state, post_state = state
        updates, pre_state = self.preprocessor.update(updates, pre_state, params, **extra_args)
        aggregated, aggregator_state = self.aggregator.update(updates, aggregator_state, params, **extra_args)
        if self.aggregator_has_aux:
            aggregated, aux = aggregated
            extra_args = {**extra_args, **aux}
        ready = get(aggregator_state, "ready", True)
        updates, post_state = jax.lax.cond(
            ready,
            lambda g, s, p, kw: self.postprocessor.update(g, s, p, **kw),
            lambda g, s, p, kw: (zeros_like(g), s),
            aggregated,
            post_state,
            params,
            extra_args,
        )
        return updates, (pre_state, aggregator_state, post_state)

    def takes_per_example_updates(self) -> bool:
        return self.preprocessor.takes_per_example_updates() or self.aggregator.takes_per_example_updates()

    def state_specs(self, params, param_specs):
        return tuple(part.transform.state_specs(params, param_specs) for part in self.parts())

    def parts(self):
        return tuple(
            Part(f"[{i}]", transform, _item(i))
            for i, transform in enumerate((self.preprocessor, self.aggregator, self.postprocessor))
        )


def _item(i: int) -> Callable[[Any], Any]:
    return lambda state: state[i]


def process(
    preprocessor: Any, aggregator: Any, postprocessor: Any, aggregator_has_aux: bool = False
) -> Process | Aggregator:
    """Processes per-element updates: `preprocessor`, then `aggregator`, then `postprocessor`.

    See `Process`. Where `aggregator` is an `Aggregator` the result is one too (it takes
    per-element updates).

    Args:
        preprocessor: the transform applied to the per-element updates (`modopt.identity()`, or a
            per-element clipping).
        aggregator: the transform reducing them to updates shaped like the parameters.
        postprocessor: the transform applied to the aggregated updates (an optimizer).
        aggregator_has_aux: whether the aggregator returns `(updates, aux)`, `aux` a dict of extra
            arguments for the postprocessor.

    Example:
        >>> opt = aggregating.process(
        ...     modopt.identity(), aggregating.average_per_element_updates(), modopt.adam(1e-1)
        ... )
    """
    processed = Process(preprocessor, aggregator, postprocessor, aggregator_has_aux)
    return Aggregator(inner=processed) if isinstance(aggregator, Aggregator) else processed


class AveragePerElementUpdates(AbstractTransform):
    """The mean of the per-element updates over `per_elt_axis`; stateless.

    Args:
        per_elt_axis: the axis, or axes, of the elements (static).
    """

    per_example_updates = True

    per_elt_axis: int | tuple[int, ...] = static(
        default=0, converter=lambda a: tuple(a) if isinstance(a, list) else a
    )

    def init(self, params):
        return init_empty_state(params)

    def update(self, updates, state, params=None, **extra_args):
        return jax.tree_util.tree_map(lambda x: jnp.mean(x, axis=self.per_elt_axis), updates), state


def average_per_element_updates(per_elt_axis: int | Sequence[int] = 0) -> Aggregator:
    """An aggregator taking the mean of the per-element updates.

    Args:
        per_elt_axis: the axis, or axes, of the elements.
    """
    return Aggregator(inner=AveragePerElementUpdates(per_elt_axis))


class AccumulateAvgUpdatesState(NamedTuple):
    """The micro-batch count, whether the average is complete, and the running average."""

    micro_step: jax.Array  # int
    ready: jax.Array  # bool
    avg_grad: Any  # like the params (in `accumulator_dtype` if set)


class AccumulateAvgUpdates(AbstractTransform):
    """Averages the updates of `accumulation_steps` micro-batches; zeros until it has them.

    At every `accumulation_steps`-th update it returns the average of the last
    `accumulation_steps` updates and says `ready` in its state (then starts over); it returns
    zeros before.

    Args:
        accumulation_steps: the number of micro-batches averaged, an integer >= 2 (static).
        accumulator_dtype: the dtype of the running average (modopt's, keyword-only); `None`
            keeps the parameters' dtype. Set, the average is taken in float32 at least and
            rounded when stored (see `fields.dtype`).
    """

    elementwise_updates = True

    accumulation_steps: int = static()
    accumulator_dtype: DTypeLike | None = fields.dtype(kw_only=True)

    def __check_init__(self):
        _check_steps(self.accumulation_steps, "AccumulateAvgUpdates", least=2)

    def init(self, params):
        return AccumulateAvgUpdatesState(jnp.asarray(0), jnp.asarray(False), init_state(params, self.accumulator_dtype))

    def update(self, updates, state, params=None, **extra_args):
        dtype = self.accumulator_dtype
        micro_step = state.micro_step + 1
        average = jax.tree_util.tree_map(
            lambda u, a: a + (u - a) / micro_step, widen(updates, dtype), widen(state.avg_grad, dtype)
        )
        out, stored = in_update_dtype(average, updates, dtype), store(average, dtype)
        ready = AccumulateAvgUpdatesState(jnp.asarray(0), jnp.asarray(True), zeros_like(stored))
        waiting = AccumulateAvgUpdatesState(micro_step, jnp.asarray(False), stored)
        return select(micro_step == self.accumulation_steps, (out, ready), (zeros_like(out), waiting))


def _check_steps(steps: Any, where: str, least: int = 1) -> None:
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < least:
        raise ValueError(f"Invalid accumulation_steps: {steps!r} (must be an integer >= {least}) in {where}.")


def accumulate_avg_updates(
    accumulation_steps: int, *, accumulator_dtype: DTypeLike | None = None
) -> AccumulateAvgUpdates | Identity:
    """Averages the updates of `accumulation_steps` micro-batches (see `AccumulateAvgUpdates`).

    With one micro-batch there is nothing to accumulate: it is `modopt.identity()`.

    Args:
        accumulation_steps: the number of micro-batches averaged, an integer >= 1.
        accumulator_dtype: the dtype of the running average (modopt's, keyword-only).
    """
    _check_steps(accumulation_steps, "accumulate_avg_updates")
    if accumulation_steps == 1:
        return Identity()
    return AccumulateAvgUpdates(accumulation_steps, accumulator_dtype=accumulator_dtype)


def average_incrementally_updates(
    per_elt_axis: MaybeAxis, accumulation_steps: int, *, accumulator_dtype: DTypeLike | None = None
) -> Aggregator | AbstractTransform:
    """Averages per-element updates over their axis and over micro-batches.

    With `per_elt_axis=None` the updates are already averaged over their batch: this is
    `accumulate_avg_updates(accumulation_steps)`. Otherwise an `Aggregator` averaging over the
    axis, then over `accumulation_steps` micro-batches.

    Args:
        per_elt_axis: the axis, or axes, of the elements, or `None` for updates already averaged.
        accumulation_steps: the number of micro-batches averaged, an integer >= 1.
        accumulator_dtype: the dtype of the running average over micro-batches (modopt's,
            keyword-only).
    """
    accumulate = accumulate_avg_updates(accumulation_steps, accumulator_dtype=accumulator_dtype)
    if per_elt_axis is None:
        return accumulate
    return Aggregator(inner=Chain(AveragePerElementUpdates(per_elt_axis), accumulate))


def get_batch_size_from_per_elt_updates(
    per_elt_updates: PerElementUpdates, per_elt_axis: int | Sequence[int]
) -> int:
    """The number of elements in per-element updates: the size of `per_elt_axis` (the product
    of the sizes for several axes), which must be the same in every leaf.

    Args:
        per_elt_updates: the per-element updates.
        per_elt_axis: the axis, or axes, of the elements.
    """
    axes = (per_elt_axis,) if isinstance(per_elt_axis, int) else tuple(per_elt_axis)
    flat = jax.tree_util.tree_flatten_with_path(per_elt_updates)[0]
    sizes = {jax.tree_util.keystr(path): math.prod(jnp.shape(u)[a] for a in axes) for path, u in flat}
    if len(set(sizes.values())) > 1:
        raise ValueError(
            f"Per-element updates must have the same batch size in every leaf (axis {per_elt_axis}); got {sizes}."
        )
    return next(iter(sizes.values()))


class PerElementMeanAndSumSqDiffGradsState(NamedTuple):
    """The micro-batch count, whether the statistics are complete, and the running statistics."""

    micro_step: jax.Array  # int32
    ready: jax.Array  # bool
    mean_grads: Any  # like the params (in `mu_dtype` if set)
    sum_sq_diff_grads: Any  # like the params (in `nu_dtype` if set)


class PerElementMeanAndSumSqDiffGrads(AbstractTransform):
    """The mean of per-element updates, with the sum of their squared deviations from it.

    Returns `(mean, {"sum_sq_diff_grads": sum of (g_i - mean)^2, "sample_size": n})`, the
    auxiliary dict being extra arguments for what follows (see `process`). Over several
    micro-batches the statistics are combined exactly (Chan et al.'s parallel algorithm) and
    returned every `accumulation_steps`-th update, zeros before; the state then says `ready`.

    Args:
        per_elt_axis: the axis, or axes, of the elements (static).
        accumulation_steps: the number of micro-batches combined, an integer >= 1 (static).
        mu_dtype: the dtype of the running mean over micro-batches (modopt's, keyword-only);
            `None` keeps the parameters' dtype. Set, the statistics are combined in float32 at
            least and rounded when stored (see `fields.dtype`).
        nu_dtype: the dtype of the running sum of squared deviations (keyword-only).

    Reference: Chan, Golub & LeVeque, 1979, "Updating formulae and a pairwise algorithm for
    computing sample variances", https://doi.org/10.1007/978-3-642-51461-6_3
    """

    per_example_updates = True

    per_elt_axis: int | tuple[int, ...] = static(
        default=0, converter=lambda a: tuple(a) if isinstance(a, list) else a
    )
    accumulation_steps: int = static(default=1)
    mu_dtype: DTypeLike | None = fields.dtype(kw_only=True)
    nu_dtype: DTypeLike | None = fields.dtype(kw_only=True)

    def __check_init__(self):
        _check_steps(self.accumulation_steps, "get_per_element_mean_and_sum_sq_diff_grads")

    def init(self, params):
        if self.accumulation_steps == 1:
            return EmptyState()
        return PerElementMeanAndSumSqDiffGradsState(
            jnp.asarray(0, jnp.int32),
            jnp.asarray(False),
            init_state(params, self.mu_dtype),
            init_state(params, self.nu_dtype),
        )

    def _batch_statistics(self, updates: Any) -> tuple[Any, Any, int]:
        axis = self.per_elt_axis
        size = get_batch_size_from_per_elt_updates(updates, axis)
        means = jax.tree_util.tree_map(lambda x: jnp.mean(x, axis=axis, keepdims=True), updates)
        sums = jax.tree_util.tree_map(lambda x, m: jnp.sum(jnp.square(x - m), axis=axis), updates, means)
        return jax.tree_util.tree_map(lambda m: jnp.squeeze(m, axis=axis), means), sums, size

    def update(self, updates, state, params=None, **extra_args):
        means, sums, size = self._batch_statistics(updates)
        if self.accumulation_steps == 1:
            return (means, {"sum_sq_diff_grads": sums, "sample_size": size}), state
        mu_dtype, nu_dtype = self.mu_dtype, self.nu_dtype
        micro_step = state.micro_step + 1
        old_means = widen(state.mean_grads, mu_dtype)
        delta = jax.tree_util.tree_map(jnp.subtract, widen(means, mu_dtype), old_means)
        new_means = jax.tree_util.tree_map(lambda a, d: a + d / micro_step, old_means, delta)
        weight = state.micro_step * size / micro_step
        new_sums = jax.tree_util.tree_map(
            lambda a, s, d: a + s + d**2 * weight, widen(state.sum_sq_diff_grads, nu_dtype), widen(sums, nu_dtype), widen(delta, nu_dtype)
        )
        mean_out, sums_out = in_update_dtype(new_means, means, mu_dtype, nu_dtype), in_update_dtype(new_sums, sums, mu_dtype, nu_dtype)
        outputs = (mean_out, {"sum_sq_diff_grads": sums_out, "sample_size": size * micro_step})
        stored_means, stored_sums = store(new_means, mu_dtype), store(new_sums, nu_dtype)
        ready = PerElementMeanAndSumSqDiffGradsState(
            jnp.asarray(0, jnp.int32), jnp.asarray(True), zeros_like(stored_means), zeros_like(stored_sums)
        )
        waiting = PerElementMeanAndSumSqDiffGradsState(micro_step, jnp.asarray(False), stored_means, stored_sums)
        return select(micro_step == self.accumulation_steps, (outputs, ready), (zeros_like(outputs), waiting))


def get_per_element_mean_and_sum_sq_diff_grads(
    per_elt_axis: int | Sequence[int] = 0,
    accumulation_steps: int = 1,
    *,
    mu_dtype: DTypeLike | None = None,
    nu_dtype: DTypeLike | None = None,
) -> Aggregator:
    """An aggregator returning the mean of per-element updates and, as auxiliary extra
    arguments, the sum of their squared deviations and the sample size (see
    `PerElementMeanAndSumSqDiffGrads`); use it in `process(..., aggregator_has_aux=True)`.

    Args:
        per_elt_axis: the axis, or axes, of the elements.
        accumulation_steps: the number of micro-batches combined, an integer >= 1.
        mu_dtype: the dtype of the running mean over micro-batches (modopt's, keyword-only).
        nu_dtype: the dtype of the running sum of squared deviations (keyword-only).
    """
    statistics = PerElementMeanAndSumSqDiffGrads(per_elt_axis, accumulation_steps, mu_dtype=mu_dtype, nu_dtype=nu_dtype)
    return Aggregator(inner=statistics)


class PerElementMeanAndVarianceEMAState(NamedTuple):
    """The step count, the decay, and the moving averages of the mean and variance."""

    count: jax.Array  # int32
    ema_decay: jax.Array  # float
    mean_grads_ema: Any  # like the params (in `mu_dtype` if set)
    variance_grads_ema: Any  # like the params (in `nu_dtype` if set)


class TrackPerElementMeanAndVarianceWithEma(AbstractTransform):
    """Moving averages of the updates' mean and of the per-element variance; updates unchanged.

    `update` reads the extra arguments `sum_sq_diff_grads` and `sample_size` that
    `get_per_element_mean_and_sum_sq_diff_grads` produces (through `process`): the variance
    is `sum_sq_diff_grads / (sample_size - 1)`. Each average is `(1 - d) x + d * average`,
    not debiased here: `get_unbiased_mean_and_variance_ema` divides by `1 - d^count`.

    Args:
        ema_decay: the decay `d` of the moving averages, in [0, 1].
        mu_dtype: the dtype of the average of the mean (modopt's, keyword-only); `None` keeps
            the parameters' dtype. Set, the averages are computed in float32 at least and
            rounded when stored (see `fields.dtype`).
        nu_dtype: the dtype of the average of the variance (keyword-only).
    """

    # Not required of `Optimizer.step`: inside `process` the aggregator passes them.
    extra_args_spec = (
        ExtraArg(
            "sum_sq_diff_grads",
            "the sum of squared deviations of the per-element gradients",
            False,
            like_params=True,
        ),
        ExtraArg("sample_size", "the number of per-element gradients", False),
    )

    ema_decay: Scalar = fields.decay_rate(0.9, check=UNIT)
    mu_dtype: DTypeLike | None = fields.dtype(kw_only=True)
    nu_dtype: DTypeLike | None = fields.dtype(kw_only=True)

    def init(self, params):
        return PerElementMeanAndVarianceEMAState(
            jnp.zeros([], jnp.int32),
            jnp.asarray(self.ema_decay),
            init_state(params, self.mu_dtype),
            init_state(params, self.nu_dtype),
        )

    def update(self, updates, state, params=None, **extra_args):
        sums = extra_arg(extra_args, "sum_sq_diff_grads", self)
        size = extra_arg(extra_args, "sample_size", self)
        decay = self.ema_decay

        def average(x, y):  # kept in the average's dtype
            return ((1 - decay) * x + decay * y).astype(y.dtype)

        mu_dtype, nu_dtype = self.mu_dtype, self.nu_dtype
        # With state dtypes, the averages and what they average are read in float32 (`widen`).
        mean = jax.tree_util.tree_map(average, widen(updates, mu_dtype), widen(state.mean_grads_ema, mu_dtype))
        # The factor in each leaf's dtype, as a Python number would be (optax's, with one
        # micro-batch; over several, optax's traced factor turns bfloat16 averages to float32,
        # which its `process` then rejects).
        variance = jax.tree_util.tree_map(
            lambda s, y: average(jnp.asarray(1 / (size - 1), s.dtype) * s, y),
            widen(sums, nu_dtype),
            widen(state.variance_grads_ema, nu_dtype),
        )
        new_state = state._replace(
            count=safe_int32_increment(state.count),
            mean_grads_ema=store(mean, mu_dtype),
            variance_grads_ema=store(variance, nu_dtype),
        )
        return updates, new_state


def track_per_element_mean_and_variance_with_ema(
    ema_decay: Scalar = 0.9, *, mu_dtype: DTypeLike | None = None, nu_dtype: DTypeLike | None = None
) -> TrackPerElementMeanAndVarianceWithEma:
    """Tracks moving averages of the gradients' mean and variance (see
    `TrackPerElementMeanAndVarianceWithEma`); `add_mean_variance_to_opt` puts it in place.

    Args:
        ema_decay: the decay of the moving averages, in [0, 1].
        mu_dtype: the dtype of the average of the mean (modopt's, keyword-only).
        nu_dtype: the dtype of the average of the variance (keyword-only).
    """
    return TrackPerElementMeanAndVarianceWithEma(ema_decay, mu_dtype=mu_dtype, nu_dtype=nu_dtype)


def get_unbiased_mean_and_variance_ema(state: Any) -> tuple[Any, Any]:
    """The debiased moving averages of the gradients' mean and variance, from an optimizer state.

    Finds the `PerElementMeanAndVarianceEMAState` in `state` (of `add_mean_variance_to_opt`)
    and divides each average by `1 - ema_decay^count`.

    Args:
        state: the state of an optimizer holding `track_per_element_mean_and_variance_with_ema`.

    Raises:
        ValueError: when `state` holds no `PerElementMeanAndVarianceEMAState`.
    """
    tracked = get(state, "PerElementMeanAndVarianceEMAState", None)
    if tracked is None:
        raise ValueError(
            "State must have PerElementMeanAndVarianceEMAState to compute unbiased mean and variance EMA "
            "(an optimizer made by add_mean_variance_to_opt has one)."
        )
    correction = 1 - tracked.ema_decay**tracked.count
    unbiased = lambda tree: jax.tree_util.tree_map(lambda x: x / correction, tree)  # noqa: E731
    return unbiased(tracked.mean_grads_ema), unbiased(tracked.variance_grads_ema)


def add_mean_variance_to_opt(
    opt: Any,
    ema_decay: Scalar = 0.9,
    per_elt_axis: int | Sequence[int] = 0,
    accumulation_steps: int = 1,
    *,
    mu_dtype: DTypeLike | None = None,
    nu_dtype: DTypeLike | None = None,
) -> Aggregator:
    """`opt` on the mean of per-element gradients, tracking their mean and variance.

    `process(identity(), get_per_element_mean_and_sum_sq_diff_grads(per_elt_axis,
    accumulation_steps), chain(track_per_element_mean_and_variance_with_ema(ema_decay), opt),
    aggregator_has_aux=True)`: it takes per-element gradients and steps as `opt` would on their
    mean; `get_unbiased_mean_and_variance_ema(state)` reads the averages.

    Args:
        opt: the optimizer (a modopt or optax transform).
        ema_decay: the decay of the moving averages of the mean and variance, in [0, 1].
        per_elt_axis: the axis, or axes, of the elements.
        accumulation_steps: the number of micro-batches combined per step, an integer >= 1.
        mu_dtype: the dtype of the tracked means and of the running mean over micro-batches
            (modopt's, keyword-only); `opt` keeps its own state dtypes.
        nu_dtype: the dtype of the tracked variances and of the running sum of squared
            deviations (keyword-only).

    Example:
        >>> opt = aggregating.add_mean_variance_to_opt(modopt.sgd(0.1), ema_decay=0.9)
    """
    dtypes = {"mu_dtype": mu_dtype, "nu_dtype": nu_dtype}
    return process(
        Identity(),
        get_per_element_mean_and_sum_sq_diff_grads(per_elt_axis, accumulation_steps, **dtypes),
        Chain(
            track_per_element_mean_and_variance_with_ema(ema_decay, **dtypes),
            as_transform(opt, "add_mean_variance_to_opt"),
        ),
        aggregator_has_aux=True,
    )
