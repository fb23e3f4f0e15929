"""Adam's rescaling of updates by bias-corrected moment estimates, and its direct variants
(Adamax, AMSGrad). The helpers here are shared with the other Adam-like transforms."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from .. import fields
from .._core.base import AbstractTransform
from .._core.fields import static
from .._state.moments import (
    bias_correction,
    in_update_dtype,
    init_state,
    store,
    widen,
    widened_update_infinity_moment,
    widened_update_moment,
    widened_update_moment_per_elem_norm,
)
from .._util.numerics import safe_increment
from .._util.trees import is_none
from .._core.fields import Scalar
from jax.typing import DTypeLike


def debiased_mu(mu: Any, updates: Any, b1: Any, count: Any, nesterov: bool) -> Any:
    """The bias-corrected first moment `mu / (1 - b1^t)` at step `count` (from 1).

    With `nesterov=True`, Nesterov's look-ahead instead (Dozat, 2016):
    `b1 mu / (1 - b1^(t+1)) + (1 - b1) g / (1 - b1^t)`.
    """
    if not nesterov:
        return bias_correction(mu, b1, count)
    return jax.tree_util.tree_map(
        lambda m, g: b1 * m + (1 - b1) * g,
        bias_correction(mu, b1, safe_increment(count)),
        bias_correction(updates, b1, count),
    )


def moment_ratio(mu_hat: Any, nu_hat: Any, eps: Any, eps_root: Any = 0.0) -> Any:
    """Adam's step direction, `mu_hat / (sqrt(nu_hat + eps_root) + eps)`, leaf by leaf."""
    return jax.tree_util.tree_map(
        lambda m, v: None if m is None else m / (jnp.sqrt(v + eps_root) + eps), mu_hat, nu_hat, is_leaf=is_none
    )


class ScaleByAdamState(NamedTuple):
    """Adam's step count and moment estimates."""

    count: jax.Array  # int32 scalar
    mu: Any  # first moment, like the params (in `mu_dtype` if set)
    nu: Any  # second moment, like the params (in `nu_dtype` if set)


class ScaleByAdam(AbstractTransform):
    r"""Rescales updates by Adam's bias-corrected moment estimates.

    With `t` the step (from 1): `m = b1 m + (1 - b1) g`, `v = b2 v + (1 - b2) |g|^2`,
    `update = m_hat / (sqrt(v_hat + eps_root) + eps)` where `m_hat = m / (1 - b1^t)` and
    `v_hat = v / (1 - b2^t)`. With `nesterov=True`, `m_hat` is replaced by Nesterov's
    look-ahead `b1 m / (1 - b1^(t+1)) + (1 - b1) g / (1 - b1^t)` (Dozat, 2016).

    Args:
        b1: the decay rate of the first moment (the EMA of gradients), in [0, 1).
        b2: the decay rate of the second moment (the EMA of squared gradients), in [0, 1).
        eps: added to the denominator's square root for numerical stability, >= 0.
        eps_root: added to the second moment inside the square root, >= 0 (for instance to keep
            gradients through the square root finite when differentiating through the optimizer).
        mu_dtype: the dtype of the first moment (for instance `jnp.bfloat16` to save memory); `None`
            keeps the parameters' dtype.
        nu_dtype: the dtype of the second moment; `None` keeps the parameters' dtype (see
            `fields.dtype`: state dtypes are accumulated in float32 and stored in this dtype).
        nesterov: use Nesterov's look-ahead first moment (NAdam) instead of the bias-corrected one
            (static).

    Reference: Kingma & Ba, 2014, https://arxiv.org/abs/1412.6980
    """

    elementwise_updates = True

    b1: Scalar = fields.decay_rate(0.9)
    b2: Scalar = fields.decay_rate(0.999)
    eps: Scalar = fields.eps(1e-8)
    eps_root: Scalar = fields.eps(0.0)
    mu_dtype: DTypeLike | None = fields.dtype()
    nu_dtype: DTypeLike | None = fields.dtype(kw_only=True)
    nesterov: bool = static(default=False, kw_only=True)

    def init(self, params):
        return ScaleByAdamState(
            count=jnp.zeros([], jnp.int32),
            mu=init_state(params, self.mu_dtype),
            nu=init_state(params, self.nu_dtype),
        )

    def update(self, updates, state, params=None, **extra_args):
        mu = widened_update_moment(updates, state.mu, self.b1, 1, self.mu_dtype)
        nu = widened_update_moment_per_elem_norm(updates, state.nu, self.b2, 2, self.nu_dtype)
        count = safe_increment(state.count)
        mu_hat = debiased_mu(mu, widen(updates, self.mu_dtype), self.b1, count, self.nesterov)
        nu_hat = bias_correction(nu, self.b2, count)
        new_updates = in_update_dtype(moment_ratio(mu_hat, nu_hat, self.eps, self.eps_root), updates, self.mu_dtype, self.nu_dtype)
        return new_updates, ScaleByAdamState(count, store(mu, self.mu_dtype), store(nu, self.nu_dtype, state.nu))


class ScaleByAdamax(AbstractTransform):
    r"""Rescales updates by Adamax's infinity-norm estimate (Adam with `p = infinity`).

    With `t` the step (from 1): `m = b1 m + (1 - b1) g`, `u = max(|g| + eps, b2 u)` and
    `update = m / ((1 - b1^t) u)`. The running maximum `u` needs no bias correction. The
    state is Adam's, with `nu` holding `u`.

    Args:
        b1: the decay rate of the first moment (the EMA of gradients), in [0, 1).
        b2: the decay rate of the infinity norm `u = max(|g| + eps, b2 u)`, in [0, 1).
        eps: added to `|g|` in the running maximum, >= 0, so that `u` is never zero.
        mu_dtype: the dtype of the first moment; `None` keeps the parameters' dtype.
        nu_dtype: the dtype of the infinity norm `u`; `None` keeps the parameters' dtype.

    Reference: Kingma & Ba, 2014 (Section 7.1), https://arxiv.org/abs/1412.6980
    """

    elementwise_updates = True

    b1: Scalar = fields.decay_rate(0.9)
    b2: Scalar = fields.decay_rate(0.999)
    eps: Scalar = fields.eps(1e-8)

    mu_dtype: DTypeLike | None = fields.dtype(kw_only=True)
    nu_dtype: DTypeLike | None = fields.dtype(kw_only=True)

    def init(self, params):
        return ScaleByAdamState(
            count=jnp.zeros([], jnp.int32), mu=init_state(params, self.mu_dtype), nu=init_state(params, self.nu_dtype)
        )

    def update(self, updates, state, params=None, **extra_args):
        count = safe_increment(state.count)
        mu = widened_update_moment(updates, state.mu, self.b1, 1, self.mu_dtype)
        nu = widened_update_infinity_moment(updates, state.nu, self.b2, self.eps, self.nu_dtype)
        new_updates = jax.tree_util.tree_map(lambda m, v: m / v, bias_correction(mu, self.b1, count), nu)
        new_updates = in_update_dtype(new_updates, updates, self.mu_dtype, self.nu_dtype)
        return new_updates, ScaleByAdamState(count=count, mu=store(mu, self.mu_dtype), nu=store(nu, self.nu_dtype))


class ScaleByAmsgradState(NamedTuple):
    """AMSGrad's step count, moment estimates and running maximum of the second moment."""

    count: jax.Array  # int32 scalar
    mu: Any  # first moment, like the params (in `mu_dtype` if set)
    nu: Any  # second moment, like the params (in `nu_dtype` if set)
    nu_max: Any  # running maximum of the (bias-corrected, by default) second moment (in `nu_dtype` if set)


class ScaleByAmsgrad(AbstractTransform):
    r"""Rescales updates like Adam, dividing by the largest second moment seen so far.

    With `t` the step (from 1): `m`, `v` as in Adam, `v_max = max(v_max, v_hat)` and
    `update = m_hat / (sqrt(v_max + eps_root) + eps)`. The step size per coordinate never
    grows, which repairs Adam's convergence. `bias_correction_mu=False` and
    `bias_correction_nu=False` use `m` and `v` uncorrected, as in the paper.

    Args:
        b1: the decay rate of the first moment (the EMA of gradients), in [0, 1).
        b2: the decay rate of the second moment (the EMA of squared gradients), in [0, 1).
        eps: added to the denominator's square root for numerical stability, >= 0.
        eps_root: added to the second moment inside the square root, >= 0 (for instance to keep
            gradients through the square root finite when differentiating through the optimizer).
        mu_dtype: the dtype of the first moment (for instance `jnp.bfloat16` to save memory); `None`
            keeps the parameters' dtype.
        nu_dtype: the dtype of the second moment and of its running maximum; `None` keeps the
            parameters' dtype.
        bias_correction_mu: bias-correct the first moment as Adam does (static); `False` uses `m` as
            in the paper.
        bias_correction_nu: bias-correct the second moment before its running maximum (static);
            `False` uses `v` as in the paper.

    Reference: Reddi et al., 2018, https://openreview.net/forum?id=ryQu7f-RZ
    """

    elementwise_updates = True

    b1: Scalar = fields.decay_rate(0.9)
    b2: Scalar = fields.decay_rate(0.999)
    eps: Scalar = fields.eps(1e-8)
    eps_root: Scalar = fields.eps(0.0)
    mu_dtype: DTypeLike | None = fields.dtype()
    bias_correction_mu: bool = static(default=True)
    bias_correction_nu: bool = static(default=True)
    nu_dtype: DTypeLike | None = fields.dtype(kw_only=True)

    def init(self, params):
        return ScaleByAmsgradState(
            count=jnp.zeros([], jnp.int32),
            mu=init_state(params, self.mu_dtype),
            nu=init_state(params, self.nu_dtype),
            nu_max=init_state(params, self.nu_dtype),
        )

    def update(self, updates, state, params=None, **extra_args):
        mu = widened_update_moment(updates, state.mu, self.b1, 1, self.mu_dtype)
        nu = widened_update_moment_per_elem_norm(updates, state.nu, self.b2, 2, self.nu_dtype)
        count = safe_increment(state.count)
        mu_hat = bias_correction(mu, self.b1, count) if self.bias_correction_mu else mu
        nu_hat = bias_correction(nu, self.b2, count) if self.bias_correction_nu else nu
        nu_max = jax.tree_util.tree_map(jnp.maximum, widen(state.nu_max, self.nu_dtype), nu_hat)
        new_updates = in_update_dtype(moment_ratio(mu_hat, nu_max, self.eps, self.eps_root), updates, self.mu_dtype, self.nu_dtype)
        return new_updates, ScaleByAmsgradState(
            count=count,
            mu=store(mu, self.mu_dtype),
            nu=store(nu, self.nu_dtype),
            nu_max=store(nu_max, self.nu_dtype),
        )


scale_by_adam = ScaleByAdam
scale_by_adamax = ScaleByAdamax
scale_by_amsgrad = ScaleByAmsgrad
