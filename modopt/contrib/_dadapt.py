"""Learning-rate-free AdamW: D-Adaptation (`dadapt_adamw`) and Prodigy (`prodigy`).

Both estimate `d`, the distance from the initial point to a solution, from the gradients
seen so far, and step as AdamW would with learning rate `d * learning_rate`: give them a
learning rate of 1 (or a schedule whose peak is 1).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .. import fields
from .._core.base import AbstractTransform, require_params
from .._core.fields import FINITE, NONNEGATIVE, POSITIVE, UNIT, Rate, hyperparameter, static
from .._util.numerics import safe_increment
from .._util.trees import vdot
from ..schedules._base import ScalarOrSchedule, value_at
from ..transforms._real_only import reject_complex
from ._mechanic import _lowest_dtype
from .._core.fields import Scalar
from .._state.moments import copy_state, in_update_dtype, init_state, scalar_dtype, store, widen
from jax.typing import DTypeLike


class DAdaptAdamWState(NamedTuple):
    """The state of `dadapt_adamw`.

    exp_avg: the EMA of `dlr * g` (the first moment, learning rate included), like the params
        (in `mu_dtype` if set).
    exp_avg_sq: the EMA of `g**2`, like the params (in `nu_dtype` if set).
    grad_sum: the EMA (decay `sqrt(b2)`) of `dlr * g`, like the params (in `mu_dtype` if set).
    estim_lr: the current estimate `d` of the distance to a solution (a scalar, see `_scalars_dtype`).
    numerator_weighted: the EMA (decay `sqrt(b2)`) of `dlr * <g, grad_sum / (sqrt(exp_avg_sq) + eps)>`.
    count: updates made so far (int32 scalar).
    """

    exp_avg: Any
    exp_avg_sq: Any
    grad_sum: Any
    estim_lr: jax.Array
    numerator_weighted: jax.Array
    count: jax.Array


class ProdigyState(NamedTuple):
    """The state of `prodigy`.

    exp_avg: the EMA of `d * g`, like the params (in `mu_dtype` if set).
    exp_avg_sq: the EMA of `(d * g)**2`, like the params (in `nu_dtype` if set).
    grad_sum: the weighted sum (decay `beta3`) of the gradients, like the params (in `mu_dtype`
        if set).
    params0: the initial parameters, from which the distance `d` is estimated (in
        `param_dtype` if set).
    estim_lr: the current estimate `d` of the distance to a solution (a scalar).
    numerator_weighted: the weighted sum (decay `beta3`) of `d * dlr * <g, params0 - params>`.
    count: updates made so far (int32 scalar).
    """

    exp_avg: Any
    exp_avg_sq: Any
    grad_sum: Any
    params0: Any
    estim_lr: jax.Array
    numerator_weighted: jax.Array
    count: jax.Array


def betas_field():
    """AdamW's `(beta1, beta2)` as one hyperparameter: a vector of two rates in [0, 1)."""
    return fields.decay_rate((0.9, 0.999), ndim=1)


def check_betas(betas: Any, owner: str) -> None:
    shape = np.shape(betas.value if isinstance(betas, Rate) else betas)
    if shape != (2,):
        raise ValueError(f"Invalid betas: shape {shape} (must be a pair (beta1, beta2)) in {owner}.")


def split_betas(betas: Rate) -> tuple[Rate, Rate]:
    """The two rates of a `betas` pair, each with its exact complement."""
    return Rate(betas.value[0], betas.complement[0]), Rate(betas.value[1], betas.complement[1])


def square_root(rate: Rate) -> Rate:
    """`sqrt(b)` as a rate: its complement `1 - sqrt(b) = (1 - b) / (1 + sqrt(b))` keeps the
    precision of `1 - b` (computing `1 - sqrt(b)` in float32 would lose four digits at 0.999)."""
    complement = rate.complement / (1 + jnp.sqrt(rate.value))
    return Rate(1 - complement, complement)


def like(x: Any, leaf: Any) -> jax.Array:
    """A scalar in the dtype of `leaf`, as a Python number would act on it (bf16 stays bf16)."""
    return jnp.asarray(x).astype(jnp.result_type(leaf))


def adam_bias_correction(beta1: Rate, beta2: Rate, count: jax.Array) -> jax.Array:
    """`sqrt(1 - beta2**t) / (1 - beta1**t)`: Adam's bias corrections folded into the step size."""
    return (1 - beta2.value**count) ** 0.5 / (1 - beta1.value**count)


def _moments_init(params: Any, owner: Any) -> tuple[Any, Any, Any, Any]:
    """Zeros for the two moments and the gradient sum (in `mu_dtype`, `nu_dtype`, `mu_dtype`),
    and the scalars' dtype: the parameters' lowest, widened to the state dtypes that are set
    (`scalar_dtype`)."""
    reject_complex(params, owner)
    dtypes = state_dtypes(owner)
    dtype = scalar_dtype(_lowest_dtype(jax.tree_util.tree_leaves(params)), *dtypes)
    return init_state(params, owner.mu_dtype), init_state(params, owner.nu_dtype), init_state(params, owner.mu_dtype), dtype


def state_dtypes(owner: Any) -> tuple[Any, ...]:
    """The state dtypes of `owner` (`DAdaptAdamW` or `Prodigy`), `None` for those not set."""
    return owner.mu_dtype, owner.nu_dtype, getattr(owner, "param_dtype", None)


class DAdaptAdamW(AbstractTransform):
    r"""D-Adaptation AdamW: AdamW whose learning rate is scaled by an estimate of the distance
    to a solution, learned from the gradients.

    With `lr` the learning rate (schedule) at the step, `d` the current estimate, `r = sqrt(b2)`,
    `s` the gradient sum, `n` the numerator of the estimate and `m`, `v` AdamW's moments:

        dlr = d * lr * sqrt(1 - b2^t) / (1 - b1^t)
        n   = r * n + (1 - r) * dlr * <g, s / (sqrt(v) + eps)>        (s and v before the step)
        m   = b1 * m + (1 - b1) * dlr * g
        v   = b2 * v + (1 - b2) * g^2
        s   = r * s + (1 - r) * dlr * g
        d   = max(d, n / ((1 - r) * ||s||_1))
        update = -weight_decay * dlr * params - m / (sqrt(v) + eps)

    `d` starts at `estim_lr0` and never decreases. Give it `learning_rate=1` (or a schedule
    whose peak is 1, such as a warmup then linear decay to 0). `update` needs `params`. Real
    parameters only.

    Args:
        learning_rate: the factor on the estimated step size, a number >= 0 or a schedule of the
            step count (1 by default).
        betas: the decay rates `(b1, b2)` of AdamW's first and second moments, each in [0, 1).
        eps: added to the square root of the second moment, >= 0.
        estim_lr0: the initial (under-)estimate `d` of the distance to a solution, > 0.
        weight_decay: the strength of AdamW's decoupled weight decay, multiplied by `dlr`.
        mu_dtype: the dtype of the first moment `m` and of the gradient sum `s` (modopt's,
            keyword-only); `None` keeps the parameters' dtype (see `fields.dtype`: state dtypes
            are accumulated in float32 and stored in this dtype).
        nu_dtype: the dtype of the second moment `v` (keyword-only); `None` keeps the
            parameters' dtype.

    The scalars `d` and `n` take the parameters' lowest dtype, or a wider state dtype that
    is set.

    Example:
        >>> optimizer = modopt.Optimizer(modopt.contrib.dadapt_adamw(), model)
        >>> model, optimizer = optimizer.step(model, grads)

    Reference: Defazio and Mishchenko, 2023, "Learning-Rate-Free Learning by D-Adaptation",
    https://arxiv.org/abs/2301.07733
    """

    learning_rate: ScalarOrSchedule = fields.learning_rate(1.0)
    betas: Any = betas_field()
    eps: Scalar = fields.eps(1e-8)
    estim_lr0: Scalar = hyperparameter(1e-6, check=POSITIVE)
    weight_decay: Scalar = hyperparameter(0.0, check=FINITE)
    mu_dtype: DTypeLike | None = fields.dtype(kw_only=True)
    nu_dtype: DTypeLike | None = fields.dtype(kw_only=True)

    def __check_init__(self):
        check_betas(self.betas, "DAdaptAdamW")

    def init(self, params):
        exp_avg, exp_avg_sq, grad_sum, dtype = _moments_init(params, self)
        return DAdaptAdamWState(
            exp_avg=exp_avg,
            exp_avg_sq=exp_avg_sq,
            grad_sum=grad_sum,
            estim_lr=jnp.asarray(self.estim_lr0, dtype),
            numerator_weighted=jnp.zeros([], dtype),
            count=jnp.zeros([], jnp.int32),
        )

    def update(self, updates, state, params=None, **extra_args):
        require_params(params, self)
        beta1, beta2 = split_betas(self.betas)
        root = square_root(beta2)
        count = safe_increment(state.count)
        sched = value_at(self.learning_rate, state.count)
        nw = state.numerator_weighted
        dlr = (state.estim_lr * sched * like(adam_bias_correction(beta1, beta2, count), state.estim_lr)).astype(nw.dtype)
        eps = self.eps

        mu_dtype, nu_dtype = self.mu_dtype, self.nu_dtype
        # With state dtypes, the stored state and the gradients are read in float32 (`widen`).
        old_sum, old_sq = widen(state.grad_sum, mu_dtype), widen(state.exp_avg_sq, nu_dtype)
        weighted_sum = jax.tree_util.tree_map(lambda s, v: s / (jnp.sqrt(v) + eps), old_sum, old_sq)
        numerator_acum = vdot(updates, weighted_sum)
        g_mu, g_nu = widen(updates, mu_dtype), widen(updates, nu_dtype)
        exp_avg = jax.tree_util.tree_map(
            lambda m, g: like(beta1.value, m) * m + like(beta1.complement, m) * dlr * g, widen(state.exp_avg, mu_dtype), g_mu
        )
        exp_avg_sq = jax.tree_util.tree_map(
            lambda v, g: like(beta2.value, v) * v + like(beta2.complement, v) * g * g, old_sq, g_nu
        )
        grad_sum = jax.tree_util.tree_map(
            lambda s, g: like(root.value, s) * s + like(root.complement, s) * dlr * g, old_sum, g_mu
        )
        grad_sum_l1 = _l1(grad_sum)
        nw = like(root.value, nw) * nw + like(root.complement, nw) * dlr * numerator_acum
        estim_lr = jnp.maximum(state.estim_lr, nw / (like(root.complement, nw) * grad_sum_l1))
        wd = self.weight_decay
        new_updates = jax.tree_util.tree_map(
            lambda m, v, p: -wd * dlr * p - m / (jnp.sqrt(v) + eps), exp_avg, exp_avg_sq, params
        )
        new_updates = in_update_dtype(new_updates, updates, mu_dtype, nu_dtype)
        return new_updates, DAdaptAdamWState(
            store(exp_avg, mu_dtype, state.exp_avg),
            store(exp_avg_sq, nu_dtype, state.exp_avg_sq),
            store(grad_sum, mu_dtype, state.grad_sum),
            estim_lr,
            nw,
            count,
        )

    def learning_rates(self, state):
        return {"learning_rate": value_at(self.learning_rate, state.count)}


class Prodigy(AbstractTransform):
    r"""Prodigy: learning-rate-free AdamW, a D-Adaptation that adapts faster.

    Like `dadapt_adamw`, AdamW's step is scaled by an estimate `d` of the distance to a
    solution, here estimated from the distance travelled, `params0 - params`, weighting recent
    gradients more. Per step, with `lr` the learning rate (schedule) at the step:

        dlr = d * lr * sqrt(1 - b2^t) / (1 - b1^t)
        m   = b1 * m + (1 - b1) * d * g
        v   = b2 * v + (1 - b2) * (d * g)^2
        s   = beta3 * s + (d / d0) * dlr * g          (d * g * d / d0 with safeguard_warmup)
        n   = beta3 * n + (d / d0) * dlr * <g, params0 - params>
        d   = max(d, estim_lr_coef * n / ||s||_1)
        update = -weight_decay * dlr * params - dlr * m / (sqrt(v) + d * eps)

    with `d0 = estim_lr0` and `d` the estimate before the step except in the update. `d`
    never decreases. Give it `learning_rate=1` (or a schedule whose peak is 1, such as a
    warmup then linear decay to 0). `update` needs `params`. Real parameters only.

    Args:
        learning_rate: the factor on the estimated step size, a number >= 0 or a schedule of the
            step count (1 by default).
        betas: the decay rates `(b1, b2)` of AdamW's first and second moments, each in [0, 1).
        beta3: the decay of the weighted sums `s` and `n`, in [0, 1]; `None` uses `sqrt(b2)`.
        eps: added to the square root of the second moment (times `d`), >= 0.
        estim_lr0: the initial (under-)estimate `d0` of the distance to a solution, > 0.
        estim_lr_coef: a factor on each estimate of `d`, >= 0.
        weight_decay: the strength of AdamW's decoupled weight decay, multiplied by `dlr`.
        safeguard_warmup: leave the learning rate out of the gradient sum `s` (the denominator of
            the estimate), which keeps `d` from growing too fast during a warmup (static).
        mu_dtype: the dtype of the first moment `m` and of the gradient sum `s` (modopt's,
            keyword-only); `None` keeps the parameters' dtype (see `fields.dtype`: state dtypes
            are accumulated in float32 and stored in this dtype).
        nu_dtype: the dtype of the second moment `v` (keyword-only); `None` keeps the
            parameters' dtype.
        param_dtype: the dtype of the copy of the initial parameters `params0` (keyword-only);
            `None` keeps the parameters' dtype. The distance `params0 - params` is taken in
            float32 at least.

    The scalars `d` and `n` take the parameters' lowest dtype, or a wider state dtype that
    is set.

    Example:
        >>> optimizer = modopt.Optimizer(modopt.contrib.prodigy(), model)
        >>> model, optimizer = optimizer.step(model, grads)

    Reference: Mishchenko and Defazio, 2023, "Prodigy: An Expeditiously Adaptive
    Parameter-Free Learner", https://arxiv.org/abs/2306.06101
    """

    learning_rate: ScalarOrSchedule = fields.learning_rate(1.0)
    betas: Any = betas_field()
    beta3: Scalar | None = hyperparameter(None, check=UNIT)
    eps: Scalar = fields.eps(1e-8)
    estim_lr0: Scalar = hyperparameter(1e-6, check=POSITIVE)
    estim_lr_coef: Scalar = hyperparameter(1.0, check=NONNEGATIVE)
    weight_decay: Scalar = hyperparameter(0.0, check=FINITE)
    safeguard_warmup: bool = static(default=False)
    mu_dtype: DTypeLike | None = fields.dtype(kw_only=True)
    nu_dtype: DTypeLike | None = fields.dtype(kw_only=True)
    param_dtype: DTypeLike | None = fields.dtype(kw_only=True)

    def __check_init__(self):
        check_betas(self.betas, "Prodigy")

    def init(self, params):
        exp_avg, exp_avg_sq, grad_sum, dtype = _moments_init(params, self)
        return ProdigyState(
            exp_avg=exp_avg,
            exp_avg_sq=exp_avg_sq,
            grad_sum=grad_sum,
            params0=copy_state(params, self.param_dtype),
            estim_lr=jnp.asarray(self.estim_lr0, dtype),
            numerator_weighted=jnp.zeros([], dtype),
            count=jnp.zeros([], jnp.int32),
        )

    def update(self, updates, state, params=None, **extra_args):
        require_params(params, self)
        beta1, beta2 = split_betas(self.betas)
        beta3 = square_root(beta2).value if self.beta3 is None else self.beta3
        count = safe_increment(state.count)
        sched = value_at(self.learning_rate, state.count)
        d, d0, eps = state.estim_lr, self.estim_lr0, self.eps
        dlr = jnp.asarray(d * sched * like(adam_bias_correction(beta1, beta2, count), d), d.dtype)

        mu_dtype, nu_dtype, param_dtype = self.mu_dtype, self.nu_dtype, self.param_dtype
        # With state dtypes, the stored state and the gradients are read in float32 (`widen`).
        params0 = widen(state.params0, param_dtype)
        numerator_acum = vdot(updates, jax.tree_util.tree_map(lambda p0, p: p0 - p, params0, params))
        dg_mu = jax.tree_util.tree_map(lambda g: d * g, widen(updates, mu_dtype))
        dg_nu = jax.tree_util.tree_map(lambda g: d * g, widen(updates, nu_dtype))
        exp_avg = jax.tree_util.tree_map(
            lambda m, x: like(beta1.value, m) * m + like(beta1.complement, m) * x, widen(state.exp_avg, mu_dtype), dg_mu
        )
        exp_avg_sq = jax.tree_util.tree_map(
            lambda v, x: like(beta2.value, v) * v + like(beta2.complement, v) * x * x, widen(state.exp_avg_sq, nu_dtype), dg_nu
        )
        step = d if self.safeguard_warmup else dlr
        grad_sum = jax.tree_util.tree_map(
            lambda s, x: like(beta3, s) * s + step * x / d0, widen(state.grad_sum, mu_dtype), dg_mu
        )
        nw = state.numerator_weighted
        nw = like(beta3, nw) * nw + (d / d0) * dlr * numerator_acum
        estim_lr = jnp.maximum(d, self.estim_lr_coef * nw / _l1(grad_sum))
        wd = self.weight_decay
        new_updates = jax.tree_util.tree_map(
            lambda m, v, p: -wd * dlr * p - dlr * m / (jnp.sqrt(v) + estim_lr * eps), exp_avg, exp_avg_sq, params
        )
        new_updates = in_update_dtype(new_updates, updates, mu_dtype, nu_dtype, param_dtype)
        new_state = ProdigyState(
            store(exp_avg, mu_dtype, state.exp_avg),
            store(exp_avg_sq, nu_dtype, state.exp_avg_sq),
            store(grad_sum, mu_dtype, state.grad_sum),
            state.params0,
            estim_lr,
            nw,
            count,
        )
        return new_updates, new_state

    def learning_rates(self, state):
        return {"learning_rate": value_at(self.learning_rate, state.count)}


def _l1(tree: Any) -> jax.Array:
    """`sum |x|` over every element of every leaf."""
    sums = [jnp.sum(jnp.abs(x)) for x in jax.tree_util.tree_leaves(tree)]
    return sum(sums) if sums else jnp.zeros([], jnp.float32)


dadapt_adamw = DAdaptAdamW
prodigy = Prodigy
