"""Lookahead: fast weights explore for `sync_period` steps, then slow weights move toward them."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from .._core.base import AbstractTransform, AbstractWrapper, inner_transform, require_params
from .._core.declared import adapt_to_params, declared_extra_args
from .._core.fields import POSITIVE_INTEGER, UNIT, hyperparameter, static
from .._core.fields import Scalar
from .._core.fields import _dtype_violation, canonical_dtype
from .._state.moments import copy_state
from jax.typing import DTypeLike


class LookaheadParams(NamedTuple):
    """The two copies of the parameters lookahead trains.

    Compute gradients at `fast`; evaluate (and serve) `slow`, which generalizes better.
    `LookaheadParams.init_synced(params)` starts both at `params`; the slow copy may be kept in
    another dtype (`slow_dtype`).
    """

    fast: Any
    slow: Any

    @classmethod
    def init_synced(cls, params: Any, slow_dtype: DTypeLike | None = None) -> LookaheadParams:
        """`LookaheadParams(fast=params, slow=<a copy of params>)`.

        The slow parameters are a copy, not the same arrays, so a jitted step can donate both.

        Args:
            params: the parameters, a pytree of arrays.
            slow_dtype: the dtype of the slow copy (modopt's; `jnp.bfloat16` halves its memory
                for float32 parameters), a floating dtype, or `None` for the parameters' own.
                The synchronization is computed in the wider of the two dtypes and the slow
                parameters are rounded once, when `apply_updates` stores them; the fast ones
                restart from the unrounded value.
        """
        dtype = canonical_dtype(slow_dtype)
        if dtype is not None and (violation := _dtype_violation(dtype)):
            raise ValueError(
                f"Invalid slow_dtype: {violation} (must be a floating dtype such as jnp.float32 or jnp.bfloat16, "
                "or None for the parameters' own) in LookaheadParams.init_synced."
            )
        return cls(fast=params, slow=copy_state(params, dtype))


class LookaheadState(NamedTuple):
    """The fast optimizer's state and the fast steps taken since the last synchronization."""

    fast_state: Any
    steps_since_sync: jax.Array  # int32 scalar, in [0, sync_period)


class Lookahead(AbstractWrapper):
    """Lookahead: `sync_period` steps of a fast optimizer, then the slow weights move toward
    the fast ones and the fast weights restart from there.

    With parameters `LookaheadParams(fast, slow)` and `u` the fast optimizer's update of
    the gradient at `fast`, a step updates `fast <- fast + u` and leaves `slow`; every
    `sync_period`-th step also synchronizes:

        slow <- slow + slow_step_size * (fast + u - slow),    fast <- slow

    The result is returned as `LookaheadParams` updates, so `apply_updates(params, updates)`
    does both: do not change these updates before applying them. With `reset_state=True` the
    fast optimizer's state returns to its initial value at each synchronization.

    `update(grads, state, params)` needs `params` (a `LookaheadParams`). `grads` is the
    gradient at `params.fast`; a `LookaheadParams` of gradients (what `Optimizer.step` passes
    when the model is a `LookaheadParams`) is read by its `fast` part. `init` accepts the
    `LookaheadParams` or the fast parameters alone. Extra arguments reach the fast optimizer;
    those that are functions of the parameters (`value_fn`) take the `LookaheadParams`, as
    `update` does, and are called with the fast parameters in place.

    Args:
        fast_optimizer: the optimizer of the inner loop (a modopt or optax transform).
        sync_period: fast steps between synchronizations, an integer >= 1.
        slow_step_size: how far the slow weights move toward the fast ones, in [0, 1].
        reset_state: reset the fast optimizer's state at each synchronization.

    Both numbers are hyperparameters: changing them does not retrace.

    Example:
        >>> tx = modopt.lookahead(modopt.sgd(0.1), sync_period=5, slow_step_size=0.5)
        >>> params = modopt.LookaheadParams.init_synced(params)
        >>> state = tx.init(params)
        >>> updates, state = tx.update(jax.grad(loss)(params.fast), state, params)
        >>> params = modopt.apply_updates(params, updates)

    Reference: Zhang et al., 2019, "Lookahead Optimizer: k steps forward, 1 step back",
    https://arxiv.org/abs/1907.08610
    """

    inner: AbstractTransform = inner_transform()
    sync_period: Scalar = hyperparameter(check=POSITIVE_INTEGER)
    slow_step_size: Scalar = hyperparameter(check=UNIT)
    reset_state: bool = static(default=False)
    inner_state_field = "fast_state"

    def __init__(self, fast_optimizer: Any, sync_period: Scalar, slow_step_size: Scalar, reset_state: bool = False):
        self.inner = fast_optimizer
        self.sync_period = sync_period
        self.slow_step_size = slow_step_size
        self.reset_state = reset_state

    @property
    def fast_optimizer(self) -> AbstractTransform:
        """The optimizer of the inner loop."""
        return self.inner

    def inner_view(self, tree, params):
        return tree.fast if isinstance(params, LookaheadParams) else tree

    def init(self, params):
        return LookaheadState(
            fast_state=self.inner.init(self.inner_view(params, params)),
            steps_since_sync=jnp.zeros([], jnp.int32),
        )

    def update(self, updates, state, params=None, **extra_args):
        require_params(params, self)
        if not isinstance(params, LookaheadParams):
            raise TypeError(
                f"Lookahead.update needs the parameters as modopt.LookaheadParams(fast, slow), got a "
                f"{type(params).__name__}: start from `modopt.LookaheadParams.init_synced(params)`."
            )
        if isinstance(updates, LookaheadParams):
            updates = updates.fast
        fast_args = self._fast_extra_args(extra_args, params)
        updates, fast_state = self.inner.update(updates, state.fast_state, params.fast, **fast_args)
        sync = state.steps_since_sync == self.sync_period - 1
        # One step that is a fast step and, when `sync`, the synchronization after it:
        # with `d = fast + u - slow`, slow moves by `alpha * d` and fast by `u - (1 - alpha) * d`.
        difference = jax.tree_util.tree_map(lambda f, u, s: f + u - s, params.fast, updates, params.slow)
        alpha = self.slow_step_size
        slow_updates = jax.tree_util.tree_map(lambda d: alpha * sync * d, difference)
        fast_updates = jax.tree_util.tree_map(lambda u, d: u - sync * (1 - alpha) * d, updates, difference)
        if self.reset_state:
            initial = self.inner.init(params.fast)
            fast_state = jax.tree_util.tree_map(
                lambda now, start: jnp.where(sync, start, now), fast_state, initial
            )
        steps_since_sync = ((state.steps_since_sync + 1) % self.sync_period).astype(
            state.steps_since_sync.dtype
        )
        return LookaheadParams(fast=fast_updates, slow=slow_updates), LookaheadState(
            fast_state, steps_since_sync
        )

    def _fast_extra_args(self, extra_args, params):
        """The extra arguments as the fast optimizer needs them for `params.fast`.

        They are written for the parameters `update` gets, the `LookaheadParams`: a function of
        the parameters (`value_fn`) is called on them with `fast` replaced, and a tree like
        the parameters (`grad`) given as `LookaheadParams` is cut to its `fast` part.
        """
        return adapt_to_params(
            declared_extra_args(self.inner),
            extra_args,
            lambda fast: params._replace(fast=fast),
            lambda tree: tree.fast if isinstance(tree, LookaheadParams) else tree,
        )


lookahead = Lookahead
