"""Applying a transform only at some steps: `conditionally_transform`, `conditionally_mask`,
and `maybe_update` (the older name of `conditionally_transform`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

import jax
import jax.numpy as jnp

from .._core.base import AbstractTransform, AbstractWrapper, inner_transform
from .._core.fields import static
from .._util.numerics import safe_increment
from ._accumulate import same_types, zeros_like_output


class ConditionFn(Protocol):
    """`fn(step, **extra_args) -> bool scalar`: whether the inner transform runs at this step.

    `step` is the number of earlier calls to `update` (an int32 scalar). The extra arguments
    of `update` are passed only with `forward_extra_args=True`.
    """

    def __call__(self, step: jax.Array, **extra_args: Any) -> jax.Array: ...


class ConditionallyTransformState(NamedTuple):
    """The inner transform's state and the number of calls to `update` so far."""

    inner_state: Any
    step: jax.Array  # int32 scalar


class ConditionallyMaskState(NamedTuple):
    """The number of calls to `update` so far and the inner transform's state."""

    step: jax.Array  # int32 scalar
    inner_state: Any


def _conditional_update(wrapper: Any, updates, inner_state, step, params, extra_args, otherwise):
    """`inner.update(...)` where `should_transform_fn(step)` holds, else `otherwise(...)`.

    Returns `(updates, inner_state)`; the inner state is unchanged where the inner transform
    does not run.
    """

    def inner_update(updates, inner_state):
        return wrapper.inner.update(updates, inner_state, params, **extra_args)

    def run():
        new_updates, new_inner = inner_update(updates, inner_state)
        return new_updates, same_types(new_inner, inner_state)

    def skip():
        return otherwise(inner_update), inner_state

    condition_args = extra_args if wrapper.forward_extra_args else {}
    should_transform = jnp.asarray(wrapper.should_transform_fn(step, **condition_args))
    if should_transform.shape != ():
        raise ValueError(
            f"{type(wrapper).__name__}: should_transform_fn must return a scalar (a boolean), got an "
            f"array of shape {should_transform.shape}."
        )
    return jax.lax.cond(should_transform.astype(bool), run, skip)


class ConditionallyTransform(AbstractWrapper):
    """Runs `inner` only at the steps where `should_transform_fn(step)` is True; at the
    others the updates pass through unchanged and the inner state stays as it is.

    `step` counts the calls to `update` (from 0), whether `inner` ran or not. The function is
    code: a static field (a new function, even an equal lambda, retraces).

    Args:
        inner: the wrapped transform (a modopt or optax one).
        should_transform_fn: `fn(step) -> bool scalar` (see `ConditionFn`).
        forward_extra_args: also pass `update`'s extra arguments to `should_transform_fn`.

    Example:
        >>> # weight decay on every other step only
        >>> tx = modopt.conditionally_transform(modopt.add_decayed_weights(1e-4), lambda step: step % 2 == 0)

    To return zero updates at the steps where `inner` does not run, see `conditionally_mask`.
    """

    inner: AbstractTransform = inner_transform()
    should_transform_fn: Callable[..., Any] = static()
    forward_extra_args: bool = static(default=False)

    def init(self, params):
        return ConditionallyTransformState(inner_state=self.inner.init(params), step=jnp.zeros([], jnp.int32))

    def update(self, updates, state, params=None, **extra_args):
        new_updates, inner_state = _conditional_update(
            self, updates, state.inner_state, state.step, params, extra_args, otherwise=lambda _: updates
        )
        return new_updates, ConditionallyTransformState(
            inner_state=inner_state, step=safe_increment(state.step)
        )


class ConditionallyMask(AbstractWrapper):
    """Runs `inner` only at the steps where `should_transform_fn(step)` is True; at the
    others the updates are zero and the inner state stays as it is.

    `step` counts the calls to `update` (from 0), whether `inner` ran or not. The function is
    code: a static field (a new function, even an equal lambda, retraces).

    Args:
        inner: the wrapped transform (a modopt or optax one).
        should_transform_fn: `fn(step) -> bool scalar` (see `ConditionFn`).
        forward_extra_args: also pass `update`'s extra arguments to `should_transform_fn`.

    Example:
        >>> # no parameter change during the first 100 steps (e.g. while a schedule warms up statistics)
        >>> tx = modopt.conditionally_mask(modopt.sgd(0.1), lambda step: step >= 100)

    To pass the updates through unchanged instead, see `conditionally_transform`.
    """

    inner: AbstractTransform = inner_transform()
    should_transform_fn: Callable[..., Any] = static()
    forward_extra_args: bool = static(default=False)

    def init(self, params):
        return ConditionallyMaskState(step=jnp.zeros([], jnp.int32), inner_state=self.inner.init(params))

    def update(self, updates, state, params=None, **extra_args):
        new_updates, inner_state = _conditional_update(
            self,
            updates,
            state.inner_state,
            state.step,
            params,
            extra_args,
            otherwise=lambda inner_update: zeros_like_output(inner_update, updates, state.inner_state),
        )
        return new_updates, ConditionallyMaskState(step=safe_increment(state.step), inner_state=inner_state)


conditionally_transform = ConditionallyTransform
conditionally_mask = ConditionallyMask


def maybe_update(inner: Any, should_update_fn: Callable[[jax.Array], Any]) -> ConditionallyTransform:
    """Runs `inner` only at the steps where `should_update_fn(step)` is True.

    The older name of `conditionally_transform(inner, should_update_fn)`, which it returns:
    at the other steps the updates and the inner state pass through unchanged; the step
    counter advances at every call. Its state is a `ConditionallyTransformState`.

    Args:
        inner: the transform run at the chosen steps (a modopt or optax transform).
        should_update_fn: a function of the step count (from 0) returning a bool, jittable (static:
            code).
    """
    return ConditionallyTransform(inner, should_update_fn)
