"""MoMo: momentum (and Adam) with a Polyak-type step size from the loss `value`."""

from __future__ import annotations

from typing import Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp

from .. import fields
from .._core.base import AbstractTransform, require_params
from .._core.extra_args import ExtraArg, extra_arg
from .._core.fields import FINITE, NONNEGATIVE, PROBABILITY_EXCLUSIVE, hyperparameter, static
from .._util.numerics import safe_increment
from .._util.trees import sum_of_squares, vdot
from ..schedules._base import ScalarOrSchedule, value_at
from ..transforms._polyak import _TINY, READS_VALUE
from ..transforms._real_only import reject_complex
from ._mechanic import _lowest_dtype
from .._core.fields import Scalar
from .._state.moments import in_update_dtype, init_state, scalar_dtype, store, widen
from jax.typing import DTypeLike


class MomoState(NamedTuple):
    """The state of `momo`.

    exp_avg: the EMA of the gradients (the momentum), like the params (in `mu_dtype` if set).
    barf: the EMA of the loss values.
    gamma: the EMA of `<g, params>`.
    lb: the lower bound of the loss in use (adapted with `adapt_lower_bound`).
    count: updates made so far (int32 scalar).
    """

    exp_avg: Any
    barf: jax.Array
    gamma: jax.Array
    lb: jax.Array
    count: jax.Array


class MomoAdamState(NamedTuple):
    """The state of `momo_adam`.

    exp_avg: the EMA of the gradients (Adam's first moment), like the params (in `mu_dtype` if set).
    exp_avg_sq: the EMA of the squared gradients (Adam's second moment), like the params (in
        `nu_dtype` if set).
    barf: the EMA of the loss values.
    gamma: the EMA of `<g, params>`.
    lb: the lower bound of the loss in use (adapted with `adapt_lower_bound`).
    count: updates made so far (int32 scalar).
    """

    exp_avg: Any
    exp_avg_sq: Any
    barf: jax.Array
    gamma: jax.Array
    lb: jax.Array
    count: jax.Array


def _value(extra_args: dict, owner: Any, dtype: Any) -> jax.Array:
    """The loss `value` passed to `update`, in `dtype`; a clear error where it is missing."""
    value = extra_arg(extra_args, "value", owner)
    if value is None:
        raise ValueError(
            f"{type(owner).__name__}.update needs the loss at the current parameters as `value`, got None: "
            "compute it with `jax.value_and_grad` (or `eqx.filter_value_and_grad`) and pass `value=loss`."
        )
    return jnp.asarray(value, dtype)


def _scalars_init(params: Any, lower_bound: Any, owner: Any, *dtypes: Any) -> tuple[jax.Array, jax.Array, jax.Array]:
    """`barf`, `gamma` and `lb` at the start, in the parameters' lowest dtype (widened to the
    state dtypes `dtypes` that are set, `scalar_dtype`)."""
    reject_complex(params, owner)
    dtype = scalar_dtype(_lowest_dtype(jax.tree_util.tree_leaves(params)), *dtypes)
    return jnp.zeros([], dtype), jnp.zeros([], dtype), jnp.asarray(lower_bound, dtype)


def _polyak_step(alpha, weight_decay, barf, lb, gamma, iprod, norm, cap) -> jax.Array:
    """`min(cap, max((1 + alpha wd)(barf - lb - gamma) + iprod, 0) / norm)`, and 0 where `norm`
    vanishes (no direction to step along). `lb` is the (bias-corrected) lower bound in use."""
    decay = 1 + alpha * weight_decay
    t1 = jnp.maximum(decay * (barf - lb - gamma) + iprod, 0.0) / norm
    return jnp.minimum(cap, jnp.where(norm <= _TINY, 0.0, t1))


class Momo(AbstractTransform):
    r"""MoMo: SGD with momentum and a Polyak-type step size, from the loss `value`.

    Each step, with `beta_t = 0` at the first step (the averages start at the first values)
    and `beta` after, `f` the loss `value`, `g` the gradient, `x` the parameters and
    `alpha` the learning rate (schedule):

        d     = beta_t d + (1 - beta_t) g                 (the momentum)
        barf  = beta_t barf + (1 - beta_t) f
        gamma = beta_t gamma + (1 - beta_t) <g, x>
        tau   = min(alpha, max((1 + alpha wd)(barf - lb - gamma) + <d, x>, 0) / ||d||^2)
        update = -alpha wd / (1 + alpha wd) x - tau d

    (`tau = 0` where `||d||^2` is below the float64 machine epsilon). `lb` is `lower_bound`;
    with `adapt_lower_bound` it is estimated on the fly (never below `lower_bound`). The
    learning rate is a cap, so it can be large.

    Pass the loss: `optimizer.step(model, grads, value=loss)` or
    `update(grads, state, params, value=loss)`. `update` needs `params`. Real parameters only.

    Args:
        learning_rate: the largest step (a cap on the adaptive one), a number >= 0 or a schedule.
        beta: the momentum coefficient of the averages, in [0, 1).
        lower_bound: a lower bound of the loss, finite (0 suits most losses).
        weight_decay: the strength of the weight decay, >= 0.
        adapt_lower_bound: estimate the lower bound on the fly, starting from `lower_bound`
            (static).
        mu_dtype: the dtype of the momentum `d` (modopt's, keyword-only); `None` keeps the
            parameters' dtype (see `fields.dtype`: state dtypes are accumulated in float32 and
            stored in this dtype). The averages `barf`, `gamma` and `lb` take the parameters'
            lowest dtype, or `mu_dtype` where it is wider.

    Example:
        >>> loss, grads = eqx.filter_value_and_grad(loss_fn)(model, x, y)
        >>> model, optimizer = optimizer.step(model, grads, value=loss)

    Reference: Schaipp et al., 2023, "MoMo: Momentum Models for Adaptive Learning Rates",
    https://arxiv.org/abs/2305.07583
    """

    extra_args_spec: ClassVar[tuple[ExtraArg, ...]] = READS_VALUE

    learning_rate: ScalarOrSchedule = fields.learning_rate(1.0)
    beta: Scalar = hyperparameter(0.9, check=PROBABILITY_EXCLUSIVE)
    lower_bound: Scalar = hyperparameter(0.0, check=FINITE)
    weight_decay: Scalar = hyperparameter(0.0, check=NONNEGATIVE)
    adapt_lower_bound: bool = static(default=False)
    mu_dtype: DTypeLike | None = fields.dtype(kw_only=True)

    def init(self, params):
        barf, gamma, lb = _scalars_init(params, self.lower_bound, self, self.mu_dtype)
        return MomoState(init_state(params, self.mu_dtype), barf, gamma, lb, jnp.zeros([], jnp.int32))

    def update(self, updates, state, params=None, **extra_args):
        require_params(params, self)
        value = _value(extra_args, self, state.barf.dtype)
        count = state.count
        bt = jnp.where(count == 0, 0.0, self.beta)  # the averages start at the first values
        barf = bt * state.barf + (1 - bt) * value
        exp_avg = jax.tree_util.tree_map(
            lambda m, g: bt * m + (1 - bt) * g, widen(state.exp_avg, self.mu_dtype), widen(updates, self.mu_dtype)
        )
        gamma = bt * state.gamma + (1 - bt) * vdot(updates, params)
        norm = sum_of_squares(exp_avg)
        iprod = vdot(exp_avg, params)
        alpha, wd = value_at(self.learning_rate, count), self.weight_decay
        decay = 1 + alpha * wd
        lb = state.lb
        if self.adapt_lower_bound:
            cap = decay * (barf - gamma) + iprod
            lb = jnp.where(cap < decay * lb, jnp.maximum(cap / (2 * decay), self.lower_bound), lb)
        tau = _polyak_step(alpha, wd, barf, lb, gamma, iprod, norm, alpha)
        new_updates = jax.tree_util.tree_map(lambda m, p: -(alpha * wd) / decay * p - tau * m, exp_avg, params)
        new_updates = in_update_dtype(new_updates, updates, self.mu_dtype)
        if self.adapt_lower_bound:
            lb = jnp.maximum((barf + iprod - gamma) - (1 / 2) * tau * norm, self.lower_bound)
        else:
            lb = state.lb
        exp_avg = store(exp_avg, self.mu_dtype, state.exp_avg)
        return new_updates, MomoState(exp_avg, barf, gamma, lb, safe_increment(count))

    def learning_rates(self, state):
        return {"learning_rate": value_at(self.learning_rate, state.count)}


class MomoAdam(AbstractTransform):
    r"""MoMo-Adam: Adam(W) with a Polyak-type step size, from the loss `value`.

    Each step, with `f` the loss `value`, `g` the gradient, `x` the parameters, `alpha` the
    learning rate (schedule) and `t` the step number:

        m     = b1 m + (1 - b1) g,   v = b2 v + (1 - b2) g^2
        D     = eps + sqrt(v / (1 - b2^t))               (Adam's preconditioner)
        barf  = b1 barf + (1 - b1) f
        gamma = b1 gamma + (1 - b1) <g, x>
        c     = 1 - b1^t
        tau   = min(alpha / c, max((1 + alpha wd)(barf - c lb - gamma) + <m, x>, 0) / <m, m / D>)
        update = -alpha wd / (1 + alpha wd) x - tau m / D

    (`tau = 0` where `<m, m / D>` is below the float64 machine epsilon). `lb` is
    `lower_bound`; with `adapt_lower_bound` it is estimated on the fly (never below
    `lower_bound`). The weight decay is decoupled, as in AdamW.

    Pass the loss: `optimizer.step(model, grads, value=loss)` or
    `update(grads, state, params, value=loss)`. `update` needs `params`. Real parameters only.

    Args:
        learning_rate: the largest step (a cap on the adaptive one), a number >= 0 or a schedule.
        b1: the decay rate of the first moment and of the loss averages, in [0, 1).
        b2: the decay rate of the second moment, in [0, 1).
        eps: added to the square root of the second moment, >= 0.
        lower_bound: a lower bound of the loss, finite (0 suits most losses).
        weight_decay: the strength of the decoupled weight decay, >= 0.
        adapt_lower_bound: estimate the lower bound on the fly, starting from `lower_bound`
            (static).
        mu_dtype: the dtype of the first moment `m` (modopt's, keyword-only); `None` keeps the
            parameters' dtype (see `fields.dtype`: state dtypes are accumulated in float32 and
            stored in this dtype).
        nu_dtype: the dtype of the second moment `v` (keyword-only); `None` keeps the
            parameters' dtype. The averages `barf`, `gamma` and `lb` take the parameters'
            lowest dtype, or a wider state dtype that is set.

    Example:
        >>> loss, grads = eqx.filter_value_and_grad(loss_fn)(model, x, y)
        >>> model, optimizer = optimizer.step(model, grads, value=loss)

    Reference: Schaipp et al., 2023, "MoMo: Momentum Models for Adaptive Learning Rates",
    https://arxiv.org/abs/2305.07583
    """

    extra_args_spec: ClassVar[tuple[ExtraArg, ...]] = READS_VALUE

    learning_rate: ScalarOrSchedule = fields.learning_rate(1e-2)
    b1: Scalar = fields.decay_rate(0.9)
    b2: Scalar = fields.decay_rate(0.999)
    eps: Scalar = fields.eps(1e-8)
    lower_bound: Scalar = hyperparameter(0.0, check=FINITE)
    weight_decay: Scalar = hyperparameter(0.0, check=NONNEGATIVE)
    adapt_lower_bound: bool = static(default=False)
    mu_dtype: DTypeLike | None = fields.dtype(kw_only=True)
    nu_dtype: DTypeLike | None = fields.dtype(kw_only=True)

    def init(self, params):
        barf, gamma, lb = _scalars_init(params, self.lower_bound, self, self.mu_dtype, self.nu_dtype)
        exp_avg, exp_avg_sq = init_state(params, self.mu_dtype), init_state(params, self.nu_dtype)
        return MomoAdamState(exp_avg, exp_avg_sq, barf, gamma, lb, jnp.zeros([], jnp.int32))

    def update(self, updates, state, params=None, **extra_args):
        require_params(params, self)
        value = _value(extra_args, self, state.barf.dtype)
        b1, b2, eps = self.b1, self.b2, self.eps
        count = safe_increment(state.count)
        barf = b1 * state.barf + (1 - b1) * value
        mu_dtype, nu_dtype = self.mu_dtype, self.nu_dtype
        exp_avg = jax.tree_util.tree_map(
            lambda m, g: b1 * m + (1 - b1) * g, widen(state.exp_avg, mu_dtype), widen(updates, mu_dtype)
        )
        exp_avg_sq = jax.tree_util.tree_map(
            lambda v, g: b2 * v + (1 - b2) * g * g, widen(state.exp_avg_sq, nu_dtype), widen(updates, nu_dtype)
        )
        bc2 = jnp.asarray(1 - b2**count, barf.dtype)
        precond = jax.tree_util.tree_map(lambda v: eps + jnp.sqrt(v / bc2), exp_avg_sq)
        norm = vdot(exp_avg, jax.tree_util.tree_map(lambda m, d: m / d, exp_avg, precond))
        gamma = b1 * state.gamma + (1 - b1) * vdot(updates, params)
        iprod = vdot(exp_avg, params)
        alpha, wd = value_at(self.learning_rate, state.count), self.weight_decay
        bc1 = jnp.asarray(1 - b1**count, barf.dtype)
        decay = 1 + alpha * wd
        lb = state.lb
        if self.adapt_lower_bound:
            cap = decay * (barf - gamma) + iprod
            lb = jnp.where(cap < decay * bc1 * lb, jnp.maximum(cap / (2 * bc1 * decay), self.lower_bound), lb)
        tau = _polyak_step(alpha, wd, barf, bc1 * lb, gamma, iprod, norm, alpha / bc1)
        new_updates = jax.tree_util.tree_map(
            lambda m, d, p: -(alpha * wd) / decay * p - tau * m / d, exp_avg, precond, params
        )
        new_updates = in_update_dtype(new_updates, updates, mu_dtype, nu_dtype)
        if self.adapt_lower_bound:
            lb = jnp.maximum(((barf + iprod - gamma) - (1 / 2) * tau * norm) / bc1, self.lower_bound)
        else:
            lb = state.lb
        exp_avg, exp_avg_sq = store(exp_avg, mu_dtype, state.exp_avg), store(exp_avg_sq, nu_dtype, state.exp_avg_sq)
        return new_updates, MomoAdamState(exp_avg, exp_avg_sq, barf, gamma, lb, count)

    def learning_rates(self, state):
        return {"learning_rate": value_at(self.learning_rate, state.count)}


momo = Momo
momo_adam = MomoAdam
