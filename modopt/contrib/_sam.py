"""Sharpness-aware minimization (`sam`): adversarial steps by one optimizer, then a step of
another from the gradient found there; and `normalize`, the adversary's usual first step."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp

from .._core.base import AbstractTransform, EmptyState, Part, init_empty_state, inner_transform
from .._core.extra_args import ExtraArg
from .._core.fields import static
from .._core.specs import REPLICATED
from .._util.trees import global_norm, is_none, select
from .._state.updates import apply_updates

NormalizeState = EmptyState
"""The state of `normalize` (empty)."""


class Normalize(AbstractTransform):
    r"""Divides the updates by their global L2 norm: `g / ||g||` over all leaves together.

    The adversarial optimizer of SAM starts with it: `chain(normalize(), sgd(rho))` steps a
    distance `rho` up the gradient. A zero gradient gives NaN, as in optax.

    Example:
        >>> adversary = modopt.chain(modopt.contrib.normalize(), modopt.sgd(0.05))
    """

    def init(self, params):
        return init_empty_state(params)

    def update(self, updates, state, params=None, **extra_args):
        norm = global_norm(updates)
        return jax.tree_util.tree_map(lambda g: g / norm, updates), state


class SAMState(NamedTuple):
    """The state of `sam`.

    steps_since_sync: adversarial steps since the last outer step (int32 scalar).
    opt_state: the outer optimizer's state.
    adv_state: the adversarial optimizer's state.
    cache: the parameters of the last outer step (`None` in opaque mode).
    """

    steps_since_sync: jax.Array
    opt_state: Any
    adv_state: Any
    cache: Any


GradFn = Callable[[Any, int], Any]

READS_GRAD_FN = (
    ExtraArg(
        "grad_fn",
        "the gradient at given parameters, `grad_fn(params, i) -> grads` (i: the adversarial step); "
        "needed with opaque_mode=True",
        required=False,
        of_params=True,
    ),
)


class Sam(AbstractTransform):
    r"""SAM (sharpness-aware minimization): an outer step from the gradient at an adversarial
    point found by `sync_period - 1` steps of another optimizer.

    Transparent mode (the default): one call of `update` is one step of either optimizer.
    With the true parameters `x` cached at the first call of a cycle, calls `1 .. k-1`
    (`k = sync_period`) return the adversary's steps, which *ascend*:
    `-adv_optimizer(g)`, with `g` the gradient at the current (perturbed) parameters; the
    `k`-th call returns the step that puts the parameters at `x + optimizer(g)`, the outer
    optimizer's update from the gradient at the adversarial point, applied at `x`. So the
    parameters the caller holds between calls are adversarial ones; evaluate at the end of a
    cycle. The outer state advances only at the `k`-th calls; the adversary's state is reset
    then when `reset_state` holds.

    Opaque mode (`opaque_mode=True`): each call does a whole cycle inside: `k - 1` adversarial
    steps, each followed by `grad_fn(adversarial_params, i)`, then the outer step from the last
    gradient, applied at the true parameters. Pass `grad_fn` at every call:
    `update(grads, state, params, grad_fn=lambda p, i: jax.grad(loss)(p, batch))`, or
    `optimizer.step(model, grads, grad_fn=...)` with a function of the model (the gradients it
    returns may be shaped like the model). Use it when each call of `update` has side effects
    (batch-norm statistics) that adversarial parameters would corrupt.

    Extra arguments other than `grad_fn` reach both optimizers as given (optax passes none).
    The unselected branch of each step is discarded with `where`, so a NaN in the step that is
    not taken does not leak into the result (optax mixes the two branches arithmetically).

    Args:
        optimizer: the outer optimizer (a modopt or optax transform).
        adv_optimizer: the adversarial optimizer; its updates are negated (it ascends). SAM's is
            `chain(normalize(), sgd(rho))`.
        sync_period: the length `k` of a cycle, an integer >= 1 (static): `k - 1` adversarial
            steps, then an outer one. The default 2 is the SAM of the paper.
        reset_state: reset the adversarial optimizer's state at each outer step (static).
        opaque_mode: run whole cycles inside each call, with `grad_fn` (static).
        batch_axis_name: in opaque mode under `pmap`, the axis to average the adversarial
            gradients over (`jax.lax.pmean`); `None` for none (static).

    Example:
        >>> adversary = modopt.chain(modopt.contrib.normalize(), modopt.sgd(0.05))
        >>> tx = modopt.contrib.sam(modopt.sgd(0.1), adversary, sync_period=2)

    Reference: Foret et al., 2021, "Sharpness-Aware Minimization for Efficiently Improving
    Generalization", https://arxiv.org/abs/2010.01412
    """

    extra_args_spec: ClassVar[tuple[ExtraArg, ...]] = READS_GRAD_FN

    optimizer: AbstractTransform = inner_transform()
    adv_optimizer: AbstractTransform = inner_transform()
    sync_period: int = static(default=2)
    reset_state: bool = static(default=True)
    opaque_mode: bool = static(default=False)
    batch_axis_name: str | None = static(default=None)

    def __check_init__(self):
        period = self.sync_period
        if isinstance(period, bool) or not isinstance(period, int) or period < 1:
            raise ValueError(f"Invalid sync_period: {period!r} (must be an integer >= 1) in Sam.")

    def init(self, params):
        return SAMState(
            steps_since_sync=jnp.zeros([], jnp.int32),
            opt_state=self.optimizer.init(params),
            adv_state=self.adv_optimizer.init(params),
            # A copy: the state is donated to jitted steps alongside the parameters.
            cache=None if self.opaque_mode else jax.tree_util.tree_map(jnp.copy, params),
        )

    def update(self, updates, state, params=None, **extra_args):
        grad_fn = extra_args.pop("grad_fn", None)
        if self.opaque_mode:
            return self._opaque_update(updates, state, params, grad_fn, extra_args)
        return self._transparent_update(updates, state, params, extra_args)

    def _transparent_update(self, updates, state, params, extra_args):
        first_step = state.steps_since_sync == 0
        last_step = state.steps_since_sync == self.sync_period - 1
        adv_updates, adv_state = self.adv_optimizer.update(updates, state.adv_state, params, **extra_args)
        adv_updates = jax.tree_util.tree_map(jnp.negative, adv_updates)
        opt_updates, opt_state = self.optimizer.update(updates, state.opt_state, state.cache, **extra_args)
        # From the adversarial parameters back to the cached ones, then the outer step.
        opt_updates = jax.tree_util.tree_map(lambda c, p, u: c - p + u, state.cache, params, opt_updates)
        kept_adv_state = self.adv_optimizer.init(params) if self.reset_state else state.adv_state
        return select(last_step, opt_updates, adv_updates), SAMState(
            steps_since_sync=(state.steps_since_sync + 1) % self.sync_period,
            opt_state=select(last_step, opt_state, state.opt_state),
            adv_state=select(last_step, kept_adv_state, adv_state),
            cache=select(first_step, params, state.cache),
        )

    def _opaque_update(self, updates, state, params, grad_fn, extra_args):
        if grad_fn is None:
            raise TypeError(
                "Sam.update needs the extra argument `grad_fn` with opaque_mode=True: pass "
                "`grad_fn=lambda params, i: jax.grad(loss)(params, batch)` (called once per adversarial step)."
            )
        adv_params, adv_updates, adv_state = params, updates, state.adv_state
        for i in range(self.sync_period - 1):
            adv_updates, adv_state = self.adv_optimizer.update(
                adv_updates, adv_state, adv_params, **extra_args
            )
            adv_updates = jax.tree_util.tree_map(jnp.negative, adv_updates)
            adv_params = apply_updates(adv_params, adv_updates)
            adv_updates = _like_params(grad_fn(adv_params, i), params)
            if self.batch_axis_name is not None:
                adv_updates = jax.lax.pmean(adv_updates, axis_name=self.batch_axis_name)
        if self.reset_state:
            adv_state = self.adv_optimizer.init(params)
        new_updates, opt_state = self.optimizer.update(adv_updates, state.opt_state, params, **extra_args)
        return new_updates, SAMState(
            steps_since_sync=jnp.zeros([], jnp.int32), opt_state=opt_state, adv_state=adv_state, cache=None
        )

    def state_specs(self, params, param_specs):
        # Each optimizer places its state by its own rule; the cache is laid out as the params.
        return SAMState(
            steps_since_sync=REPLICATED,
            opt_state=self.optimizer.state_specs(params, param_specs),
            adv_state=self.adv_optimizer.state_specs(params, param_specs),
            cache=None if self.opaque_mode else param_specs,
        )

    def parts(self):
        return (
            Part("optimizer", self.optimizer, lambda state: state.opt_state),
            Part("adv_optimizer", self.adv_optimizer, lambda state: state.adv_state),
        )


def _like_params(grads: Any, params: Any) -> Any:
    """`grads` cut to the structure of `params`: a gradient shaped like a whole model (what
    `grad_fn` returns through `Optimizer.step`) keeps the leaves of the trained parameters."""
    return jax.tree_util.tree_map(lambda p, g: None if p is None else g, params, grads, is_leaf=is_none)


normalize = Normalize
sam = Sam
