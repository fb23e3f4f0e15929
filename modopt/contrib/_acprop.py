"""ACProp: AdaBelief's centered second moment, applied asynchronously (one step late)."""

from __future__ import annotations

import jax.numpy as jnp

from .. import fields
from .._core.base import AbstractComposite, AbstractTransform
from .._state.moments import (
    bias_correction,
    in_update_dtype,
    init_state,
    store,
    widen,
    widened_update_moment,
    widened_update_moment_per_elem_norm,
)
from .._util.numerics import safe_increment
from .._util.trees import map_updates
from ..combinators import Chain
from ..schedules._base import ScalarOrSchedule
from ..transforms import AddDecayedWeights, ScaleByBeliefState, ScaleByLearningRate
from ..transforms._adam import moment_ratio
from .._core.fields import Scalar
from jax.typing import DTypeLike
from .._core.masks import MaskOrFn


class ScaleByAcprop(AbstractTransform):
    r"""Rescales updates by ACProp: the gradient over the root of the previous step's centered
    second moment.

    With `t` the step (from 1), the update uses the state before this step:
    `update = g / (sqrt(s_hat) + eps)` with `s_hat = s / (1 - b2^(t-1))`, and `s_hat = 1` at the
    first step (no second moment yet). Then the state moves on: `m = b1 m + (1 - b1) g` and
    `s = b2 s + (1 - b2) |g - m_old|^2 + eps_root`, where `m_old` is the momentum before this
    step. The numerator is the raw gradient and the denominator does not depend on it
    (asynchronous), unlike AdaBelief. The state is AdaBelief's (`ScaleByBeliefState`).

    Args:
        b1: the decay rate of the EMA of gradients `m`, in [0, 1).
        b2: the decay rate of `s`, the EMA of the squared prediction error `|g - m|^2`, in [0, 1).
        eps: added to `sqrt(s_hat)` in the denominator, >= 0.
        eps_root: added to `s` at every step, >= 0 (keep it positive to differentiate through the
            optimizer).
        mu_dtype: the dtype of the EMA of gradients `m`; `None` keeps the parameters' dtype.
        nu_dtype: the dtype of `s`; `None` keeps the parameters' dtype.

    Example:
        >>> tx = modopt.chain(modopt.contrib.scale_by_acprop(), modopt.scale(-1e-3))

    Reference: Zhuang et al., 2021, "Momentum Centering and Asynchronous Update for Adaptive
    Gradient Methods", https://arxiv.org/abs/2110.05454
    """

    elementwise_updates = True

    b1: Scalar = fields.decay_rate(0.9)
    b2: Scalar = fields.decay_rate(0.999)
    eps: Scalar = fields.eps(1e-16)
    eps_root: Scalar = fields.eps(1e-16)
    mu_dtype: DTypeLike | None = fields.dtype(kw_only=True)
    nu_dtype: DTypeLike | None = fields.dtype(kw_only=True)

    def init(self, params):
        return ScaleByBeliefState(
            count=jnp.zeros([], jnp.int32), mu=init_state(params, self.mu_dtype), nu=init_state(params, self.nu_dtype)
        )

    def update(self, updates, state, params=None, **extra_args):
        mu = widened_update_moment(updates, state.mu, self.b1, 1, self.mu_dtype)
        old_nu = widen(state.nu, self.nu_dtype)
        prediction_error = map_updates(jnp.subtract, widen(updates, self.nu_dtype), widen(state.mu, self.mu_dtype))
        eps_root = self.eps_root
        nu = widened_update_moment_per_elem_norm(prediction_error, old_nu, self.b2, 2, self.nu_dtype)
        nu = map_updates(lambda v: v + eps_root, nu)
        count = safe_increment(state.count)
        # The denominator is the previous step's; at the first step there is none, and it is 1.
        first = state.count == 0
        previous = bias_correction(old_nu, self.b2, jnp.where(first, count, state.count))
        previous = map_updates(lambda v: jnp.where(first, 1, v), previous)
        new_updates = in_update_dtype(moment_ratio(updates, previous, self.eps), updates, self.mu_dtype, self.nu_dtype)
        return new_updates, ScaleByBeliefState(count=count, mu=store(mu, self.mu_dtype), nu=store(nu, self.nu_dtype, state.nu))


class Acprop(AbstractComposite):
    r"""ACProp: descends along the gradient over the root of the previous step's centered second
    moment, with weight decay.

    `params -= learning_rate * (g / (sqrt(s_hat) + eps) + weight_decay * params)`, where `s_hat`
    is the bias-corrected EMA of `|g - m|^2` up to the previous step (see `scale_by_acprop`).
    The weight decay is multiplied by the learning rate, as in PyTorch.

    Args:
        learning_rate: the step size: a number >= 0 or a schedule of the step count.
        b1: the decay rate of the EMA of gradients `m`, in [0, 1).
        b2: the decay rate of `s`, the EMA of the squared prediction error `|g - m|^2`, in [0, 1).
        eps: added to `sqrt(s_hat)` in the denominator, >= 0.
        eps_root: added to `s` at every step, >= 0.
        weight_decay: the coefficient of the weight decay added to the update before the learning
            rate scales it (a number or a schedule).
        mask: which parameters the weight decay applies to: `None` for all, a pytree of bools with
            the params' structure, or a function of the params returning one.
        mu_dtype: the dtype of the EMA of gradients `m`; `None` keeps the parameters' dtype.
        nu_dtype: the dtype of `s`; `None` keeps the parameters' dtype.

    Example:
        >>> optimizer = modopt.Optimizer(modopt.contrib.acprop(1e-3), model)

    Reference: Zhuang et al., 2021, "Momentum Centering and Asynchronous Update for Adaptive
    Gradient Methods", https://arxiv.org/abs/2110.05454
    """

    learning_rate: ScalarOrSchedule = fields.learning_rate()
    b1: Scalar = fields.decay_rate(0.9)
    b2: Scalar = fields.decay_rate(0.999)
    eps: Scalar = fields.eps(1e-16)
    eps_root: Scalar = fields.eps(1e-16)
    weight_decay: ScalarOrSchedule = fields.weight_decay(0.0)
    mask: MaskOrFn = fields.mask()
    mu_dtype: DTypeLike | None = fields.dtype(kw_only=True)
    nu_dtype: DTypeLike | None = fields.dtype(kw_only=True)

    def build(self):
        return Chain(
            ScaleByAcprop(self.b1, self.b2, self.eps, self.eps_root, mu_dtype=self.mu_dtype, nu_dtype=self.nu_dtype),
            AddDecayedWeights(self.weight_decay, self.mask),
            ScaleByLearningRate(self.learning_rate),
        )


scale_by_acprop = ScaleByAcprop
acprop = Acprop
