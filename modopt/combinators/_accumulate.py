"""Accumulating gradients over several steps: `apply_every` and `MultiSteps`.

`apply_every(k)` sums `k` consecutive updates and emits the sum on every `k`-th step (zeros in
between); the transforms before it in a chain still step every time. `MultiSteps(opt, k)`
wraps a whole optimizer: it averages (or sums) `k` mini-step gradients and runs `opt` once on
the result, so `opt`'s state advances once per `k` mini-steps, as if the batch were `k` times
larger. `skip_not_finite` and `skip_large_updates` are ready-made `should_skip_update_fn`s.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

import jax
import jax.numpy as jnp

from .. import fields
from .._core.base import AbstractTransform, AbstractWrapper, Params, Updates, inner_transform
from .._core.fields import POSITIVE_INTEGER, hyperparameter, static
from .._util.numerics import safe_increment
from .._util.trees import cast_like, map_updates, zeros_like
from ..schedules._base import ScalarOrSchedule, scalar_or_schedule, value_at
from .._core.fields import Scalar
from .._state.moments import in_update_dtype, init_state, store, widen
from jax.typing import DTypeLike

# Counts of steps given as hyperparameters: whole numbers (as Python ints or integer arrays).


def zeros_like_output(fn: Callable[..., tuple[Any, Any]], *args: Any) -> Any:
    """Zeros shaped and typed like the updates `fn(*args)` would return, computing nothing.

    The branch of a `lax.cond` that skips an inner update returns these, so both branches
    agree even when the inner transform changes the updates' dtype.
    """
    updates, _ = jax.eval_shape(fn, *args)
    return jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), updates)


def same_types(new_state: Any, old_state: Any) -> Any:
    """`new_state` with each array leaf in the dtype of the matching leaf of `old_state`.

    The state of a wrapper that selects between a stepped and an unstepped inner state keeps
    one structure and one set of dtypes at every step (no retrace, stable checkpoints).
    """

    def like(new, old):
        if jnp.issubdtype(jnp.result_type(old), jax.dtypes.prng_key):
            return new
        return jnp.asarray(new).astype(jnp.result_type(old))

    return jax.tree_util.tree_map(like, new_state, old_state)


# --- apply_every ------------------------------------------------------------------------------


class ApplyEvery(NamedTuple):
    """The state of `apply_every`: the position in the current window, and the running sum."""

    count: jax.Array  # int32 scalar, in [0, k)
    grad_acc: Any  # the sum of this window's updates so far, shaped and typed like the params


class ApplyEveryK(AbstractTransform):
    """Sums `k` consecutive updates and emits the sum every `k`-th step, zeros in between.

    At step `t` (counting from 0) the window sum is `s = g` when `t % k == 0`, else
    `s = s_prev + g`; the update is `s` when `t % k == k - 1` and zero otherwise.

    Only this transform skips steps: the transforms before it in a chain still update their
    state at every step, so `apply_every(2)` on half batches is not the same as full batches.
    To accumulate in front of a whole optimizer, use `MultiSteps`.

    Args:
        k: the window length, an integer >= 1 (a hyperparameter: changing it does not retrace).
        accumulator_dtype: the dtype of the window sum (modopt's, keyword-only); `None` keeps
            the parameters' dtype (optax's). Set, the sum is taken in float32 at least and
            stored in this dtype (see `fields.dtype`).

    Example:
        >>> tx = modopt.chain(modopt.apply_every(4), modopt.sgd(0.1))
    """

    elementwise_updates = True

    k: Scalar = hyperparameter(1, check=POSITIVE_INTEGER)
    accumulator_dtype: DTypeLike | None = fields.dtype(kw_only=True)

    def init(self, params):
        return ApplyEvery(count=jnp.zeros([], jnp.int32), grad_acc=init_state(params, self.accumulator_dtype))

    def update(self, updates, state, params=None, **extra_args):
        position = state.count % self.k
        emit = position == self.k - 1
        # Restart the sum at the first step of a window (`where`: a NaN of the last window
        # does not leak into this one).
        dtype = self.accumulator_dtype
        sums = map_updates(
            lambda g, acc: jnp.where(position != 0, acc, jnp.zeros_like(acc)) + g,
            widen(updates, dtype),
            widen(state.grad_acc, dtype),
        )
        new_updates = map_updates(lambda s: jnp.where(emit, s, jnp.zeros_like(s)), sums)
        new_updates = in_update_dtype(new_updates, updates, dtype)
        if dtype is None:
            grad_acc = map_updates(lambda s, acc: s.astype(acc.dtype), sums, state.grad_acc)
        else:
            grad_acc = store(sums, dtype)
        count = (safe_increment(state.count) % self.k).astype(state.count.dtype)
        return new_updates, ApplyEvery(count=count, grad_acc=grad_acc)


apply_every = ApplyEveryK


# --- MultiSteps -------------------------------------------------------------------------------


class ShouldSkipUpdateFunction(Protocol):
    """Decides whether `MultiSteps` drops a mini-step's gradients.

    Called as `fn(updates, gradient_step, params)`; returns a boolean scalar array (True:
    skip this mini-step as if it never happened) and a pytree of arrays kept in
    `MultiStepsState.skip_state` for monitoring.
    """

    def __call__(self, updates: Any, gradient_step: jax.Array, params: Any) -> tuple[jax.Array, Any]: ...


def skip_not_finite(updates: Updates, gradient_step: Any, params: Params) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Skips a mini-step whose `updates` hold any `inf` or `NaN`.

    Args:
        updates: the mini-step's updates (gradients), a pytree.
        gradient_step: the number of gradient steps taken so far (unused; part of the
            `should_skip_update_fn` signature).
        params: the parameters (unused; part of the signature).

    Returns `(should_skip, {"should_skip": should_skip, "num_not_finite": count})`, where
    `count` is the number of non-finite elements over all leaves.
    """
    del gradient_step, params
    counts = [jnp.sum(~jnp.isfinite(u)) for u in jax.tree_util.tree_leaves(updates)]
    num_not_finite = jnp.sum(jnp.array(counts)) if counts else jnp.zeros([], jnp.int32)
    should_skip = num_not_finite > 0
    return should_skip, {"should_skip": should_skip, "num_not_finite": num_not_finite}


def skip_large_updates(
    updates: Updates, gradient_step: Any, params: Params, max_squared_norm: Any
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Skips a mini-step whose squared global norm is not below `max_squared_norm` (or is NaN).

    Args:
        updates: the mini-step's updates (gradients), a pytree.
        gradient_step: the number of gradient steps taken so far (unused; part of the
            `should_skip_update_fn` signature).
        params: the parameters (unused; part of the signature).
        max_squared_norm: the threshold of the squared global norm: a mini-step at or above it is
            skipped.

    Returns `(should_skip, {"should_skip": should_skip, "norm_squared": squared_norm})`. Bind
    the threshold once, at module level, so rebuilding the optimizer does not retrace:
    `skip_big = functools.partial(modopt.skip_large_updates, max_squared_norm=42.0)`.
    """
    del gradient_step, params
    squared = [jnp.sum(u**2) for u in jax.tree_util.tree_leaves(updates)]
    norm_squared = jnp.sum(jnp.array(squared)) if squared else jnp.zeros([], jnp.float32)
    should_skip = jnp.logical_not(norm_squared < max_squared_norm)
    return should_skip, {"should_skip": should_skip, "norm_squared": norm_squared}


class MultiStepsState(NamedTuple):
    """The state of `MultiSteps`.

    mini_step: the mini-steps accumulated in the current window, in `[0, k)`.
    gradient_step: the inner optimizer's steps so far (windows completed).
    inner_opt_state: the wrapped optimizer's state; it changes once per window.
    acc_grads: the window's mean (or sum) of gradients so far, in `accumulator_dtype`.
    skip_state: what `should_skip_update_fn` returned for monitoring at the last mini-step
        (`()` without one).
    """

    mini_step: jax.Array
    gradient_step: jax.Array
    inner_opt_state: Any
    acc_grads: Any
    skip_state: Any = ()


class MultiSteps(AbstractWrapper):
    """Accumulates gradients over `k` mini-steps, then takes one step of the wrapped optimizer.

    Mini-step `i` of a window (from 0) folds its gradient `g` into the accumulator: the
    running mean `a = a + (g - a) / (i + 1)` (or the sum `a = a + g` with
    `use_grad_mean=False`). Mini-steps before the last return zero updates and leave the
    inner state alone; the last one (`i == k - 1`) returns `opt.update(a, ...)`, keeps the
    inner state it gives, and starts a new window. So `MultiSteps(opt, k)` with batches of
    size `B` steps like `opt` with batches of size `k * B` (up to the order of additions).

    `k` comes from `every_k_schedule`: a number, or a schedule of the gradient step count
    (to grow the batch during training). It is a hyperparameter: changing it does not
    retrace. Schedules returning non-integers are truncated to integers.

    `should_skip_update_fn(updates, gradient_step, params) -> (skip, info)` rejects a
    mini-step entirely: zero updates, and only `skip_state = info` changes (see
    `skip_not_finite`, `skip_large_updates`). It is code: a static field.

    Extra arguments reach `opt.update` (at the mini-steps that call it). The learning rate
    `Optimizer.learning_rate` reports is the inner optimizer's at its own step count.

    Args:
        opt: the wrapped optimizer (a modopt or optax transform).
        every_k_schedule: mini-steps per gradient step, an integer >= 1 or a schedule.
        use_grad_mean: average the gradients (True, the default) or sum them.
        should_skip_update_fn: optional, see above.
        accumulator_dtype: the accumulator's dtype (float32 by default; `None`: the params').

    Example:
        >>> tx = modopt.MultiSteps(modopt.adam(1e-3), every_k_schedule=4)
        >>> updates, state = tx.update(grads, tx.init(params), params)
        >>> tx.has_updated(state)  # False until the 4th mini-step
    """

    inner: AbstractTransform = inner_transform()
    every_k_schedule: ScalarOrSchedule = scalar_or_schedule(check=POSITIVE_INTEGER)
    use_grad_mean: bool = static(default=True)
    should_skip_update_fn: Callable[..., tuple[Any, Any]] | None = static(default=None)
    accumulator_dtype: DTypeLike | None = fields.dtype(jnp.float32)
    inner_state_field = "inner_opt_state"

    def __init__(
        self,
        opt: Any,
        every_k_schedule: Any,
        use_grad_mean: bool = True,
        should_skip_update_fn: ShouldSkipUpdateFunction | None = None,
        accumulator_dtype: DTypeLike | None = jnp.float32,
    ):
        self.inner = opt
        self.every_k_schedule = every_k_schedule
        self.use_grad_mean = use_grad_mean
        self.should_skip_update_fn = should_skip_update_fn
        self.accumulator_dtype = accumulator_dtype

    @property
    def inner_opt(self) -> AbstractTransform:
        """The wrapped optimizer (optax's name)."""
        return self.inner

    def gradient_transformation(self) -> MultiSteps:
        """The transform itself: it already is one (optax returns an `(init, update)` pair)."""
        return self

    def acts_elementwise(self) -> bool:
        # Sums, means and counts: elementwise, unless a skip function looks at the whole update.
        return self.should_skip_update_fn is None and self.inner.acts_elementwise()

    def has_updated(self, state: MultiStepsState) -> jax.Array:
        """True right after a mini-step that stepped the inner optimizer (a window just closed)."""
        return jnp.logical_and(state.mini_step == 0, state.gradient_step > 0)

    def skipped_last_step(self, state: MultiStepsState) -> jax.Array:
        """True unless the last mini-step stepped the inner optimizer (and it did not skip).

        A mini-step that accumulated, or that `should_skip_update_fn` rejected (read from
        `skip_state["should_skip"]`, which `skip_not_finite` and `skip_large_updates` write),
        counts as skipped.
        """
        skipped = jnp.logical_or(
            ~self.has_updated(state), self.inner.skipped_last_step(state.inner_opt_state)
        )
        if isinstance(state.skip_state, dict) and "should_skip" in state.skip_state:
            skipped = jnp.logical_or(skipped, jnp.asarray(state.skip_state["should_skip"], bool))
        return skipped

    def init(self, params):
        gradient_step = jnp.zeros([], jnp.int32)
        skip_state = ()
        if self.should_skip_update_fn is not None:
            _, skip_state = self.should_skip_update_fn(zeros_like(params), gradient_step, params)
        return MultiStepsState(
            mini_step=jnp.zeros([], jnp.int32),
            gradient_step=gradient_step,
            inner_opt_state=self.inner.init(params),
            acc_grads=zeros_like(params, self.accumulator_dtype),
            skip_state=skip_state,
        )

    def update(self, updates, state, params=None, **extra_args):
        k = jnp.asarray(value_at(self.every_k_schedule, state.gradient_step)).astype(state.mini_step.dtype)
        should_skip, skip_state = self._should_skip(updates, state.gradient_step, params)

        def inner_update(acc_grads, inner_state):
            return self.inner.update(cast_like(acc_grads, updates), inner_state, params, **extra_args)

        no_updates = zeros_like_output(inner_update, state.acc_grads, state.inner_opt_state)

        def accept():
            if self.use_grad_mean:  # Welford's running mean: no sum that grows with k
                fold = lambda g, acc: acc + (g - acc) / (state.mini_step + 1)
            else:
                fold = lambda g, acc: g + acc
            dtype = self.accumulator_dtype  # the sum is taken in float32 at least (see `fields.dtype`)
            acc_grads = map_updates(fold, widen(updates, dtype), widen(state.acc_grads, dtype))
            emit = state.mini_step == k - 1

            def step():
                new_updates, new_inner = inner_update(acc_grads, state.inner_opt_state)
                return new_updates, same_types(new_inner, state.inner_opt_state)

            new_updates, inner_state = jax.lax.cond(emit, step, lambda: (no_updates, state.inner_opt_state))
            restart = map_updates(lambda acc: jnp.where(emit, jnp.zeros_like(acc), acc), acc_grads)
            return new_updates, MultiStepsState(
                mini_step=safe_increment(state.mini_step) % k,
                gradient_step=jnp.where(emit, safe_increment(state.gradient_step), state.gradient_step),
                inner_opt_state=inner_state,
                acc_grads=cast_like(restart, state.acc_grads),  # in the accumulator's dtype
                skip_state=skip_state,
            )

        if should_skip is None:
            return accept()
        return jax.lax.cond(should_skip, lambda: (no_updates, state._replace(skip_state=skip_state)), accept)

    def _should_skip(self, updates, gradient_step, params):
        """`(should_skip, skip_state)`, or `(None, ())` without a `should_skip_update_fn`."""
        if self.should_skip_update_fn is None:
            return None, ()
        should_skip, skip_state = self.should_skip_update_fn(updates, gradient_step, params)
        should_skip = jnp.asarray(should_skip)
        if should_skip.dtype != jnp.bool_ or should_skip.shape != ():
            raise ValueError(
                "MultiSteps: should_skip_update_fn must return a boolean scalar array first, got "
                f"dtype {should_skip.dtype} and shape {should_skip.shape}."
            )
        return should_skip, skip_state
