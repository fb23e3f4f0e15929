"""MADGRAD: momentumized, adaptive, dual-averaged gradients (`madgrad`, `scale_by_madgrad`)."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from .. import fields
from .._core.base import AbstractComposite, AbstractTransform, require_params
from .._core.fields import UNIT
from .._util.numerics import safe_increment
from .._util.trees import map_updates
from ..combinators import Chain
from ..schedules._base import ScalarOrSchedule, value_at
from ..transforms import AddDecayedWeights
from .._core.fields import Scalar
from .._state.moments import copy_state, in_update_dtype, init_state, store, widen
from jax.typing import DTypeLike


class MadgradState(NamedTuple):
    """The state of `scale_by_madgrad`.

    count: updates made so far (int32 scalar).
    grad_sum_sq: the weighted sum of squared gradients `G`, like the params (in `nu_dtype` if set).
    s: the weighted sum of gradients, like the params (in `mu_dtype` if set).
    x0: the parameters at `init` (the dual-averaging origin), in `param_dtype` if set.
    """

    count: jax.Array
    grad_sum_sq: Any
    s: Any
    x0: Any


class ScaleByMadgrad(AbstractTransform):
    r"""Rescales updates by MADGRAD: a cube-root-adaptive dual average, with momentum.

    With `k` the number of past updates, `x` the parameters and `x0` those at `init`:

        lamb  = (learning_rate(k) + eps) * sqrt(k + 1)
        G     = G + lamb * g^2
        s     = s + lamb * g
        z     = x0 - s / (cbrt(G) + eps)
        x_new = (1 - momentum) * z + momentum * x
        update = x_new - x

    The learning rate is inside the transform (it weighs the sums), so the update is the
    step itself: no `scale_by_learning_rate` follows. As in the reference implementation, `eps`
    is added to the learning rate too. `update` needs `params`. Real parameters only.

    Args:
        learning_rate: the step size: a number >= 0 or a schedule of the step count.
        momentum: the weight of the current parameters in the new ones, in [0, 1] (0: plain
            dual averaging).
        eps: added to the learning rate and to the cube root of `G`, >= 0.
        mu_dtype: the dtype of the sum of gradients `s` (modopt's, keyword-only); `None` keeps
            the parameters' dtype (see `fields.dtype`: state dtypes are accumulated in float32
            and stored in this dtype).
        nu_dtype: the dtype of the sum of squared gradients `G` (keyword-only); `None` keeps
            the parameters' dtype.
        param_dtype: the dtype of the copy `x0` of the initial parameters (keyword-only);
            `None` keeps the parameters' dtype.

    Example:
        >>> tx = modopt.contrib.scale_by_madgrad(1e-2)

    Reference: Defazio & Jelassi, 2021, "Adaptivity without Compromise: A Momentumized,
    Adaptive, Dual Averaged Gradient Method for Stochastic Optimization",
    https://arxiv.org/abs/2101.11075
    """

    elementwise_updates = True

    learning_rate: ScalarOrSchedule = fields.learning_rate()
    momentum: Scalar = fields.decay_rate(0.9, check=UNIT)
    eps: Scalar = fields.eps(1e-6)
    mu_dtype: DTypeLike | None = fields.dtype(kw_only=True)
    nu_dtype: DTypeLike | None = fields.dtype(kw_only=True)
    param_dtype: DTypeLike | None = fields.dtype(kw_only=True)

    def learning_rates(self, state):
        return {"learning_rate": value_at(self.learning_rate, state.count)}

    def init(self, params):
        if any(jnp.iscomplexobj(leaf) for leaf in jax.tree_util.tree_leaves(params)):
            raise TypeError(
                "scale_by_madgrad does not support complex parameters (it takes cube roots of sums of "
                "squares): wrap it as `modopt.experimental.split_real_and_imaginary(...)`."
            )
        return MadgradState(
            count=jnp.zeros([], jnp.int32),
            grad_sum_sq=init_state(params, self.nu_dtype),
            s=init_state(params, self.mu_dtype),
            x0=copy_state(params, self.param_dtype),
        )

    def update(self, updates, state, params=None, **extra_args):
        require_params(params, self)
        count = state.count
        lamb = (value_at(self.learning_rate, count) + self.eps) * jnp.sqrt(count + 1)
        mu_dtype, nu_dtype, param_dtype = self.mu_dtype, self.nu_dtype, self.param_dtype
        # The increments in each leaf's dtype, so bf16 sums stay bf16; with state dtypes, the
        # stored state and the gradients are read in float32 (`widen`).
        grad_sum_sq = map_updates(
            lambda g, acc: acc + (lamb * g**2).astype(g.dtype),
            widen(updates, nu_dtype),
            widen(state.grad_sum_sq, nu_dtype),
        )
        s = map_updates(lambda g, acc: acc + (lamb * g).astype(g.dtype), widen(updates, mu_dtype), widen(state.s, mu_dtype))
        momentum = self.momentum

        def step(acc_sq, acc, x0, x):
            z = x0 - acc / (jnp.cbrt(acc_sq) + self.eps)
            return (1 - momentum) * z + momentum * x - x

        new_updates = map_updates(step, grad_sum_sq, s, widen(state.x0, param_dtype), params)
        new_updates = in_update_dtype(new_updates, updates, mu_dtype, nu_dtype, param_dtype)
        return new_updates, MadgradState(
            count=safe_increment(count),
            grad_sum_sq=store(grad_sum_sq, nu_dtype, state.grad_sum_sq),
            s=store(s, mu_dtype, state.s),
            x0=state.x0,
        )


class Madgrad(AbstractComposite):
    r"""MADGRAD: momentumized, adaptive, dual-averaged gradient descent, with L2 weight decay.

    `weight_decay * params` is added to the gradient (coupled, L2-style), then
    `scale_by_madgrad` makes the step (see there for the update rule). MADGRAD matches SGD with
    momentum on vision tasks and Adam on language tasks.

    Args:
        learning_rate: the step size: a number >= 0 or a schedule of the step count.
        momentum: the weight of the current parameters in the new ones, in [0, 1].
        weight_decay: the strength of the L2 regularization added to the gradient.
        eps: added to the learning rate and to the denominator's cube root, >= 0.
        mu_dtype: the dtype of the sum of gradients (modopt's, keyword-only; see
            `scale_by_madgrad`).
        nu_dtype: the dtype of the sum of squared gradients (keyword-only).
        param_dtype: the dtype of the copy of the initial parameters (keyword-only).

    Example:
        >>> optimizer = modopt.Optimizer(modopt.contrib.madgrad(1e-2), model)

    Reference: Defazio & Jelassi, 2021, https://arxiv.org/abs/2101.11075
    """

    learning_rate: ScalarOrSchedule = fields.learning_rate()
    momentum: Scalar = fields.decay_rate(0.9, check=UNIT)
    weight_decay: ScalarOrSchedule = fields.weight_decay(0.0)
    eps: Scalar = fields.eps(1e-6)
    mu_dtype: DTypeLike | None = fields.dtype(kw_only=True)
    nu_dtype: DTypeLike | None = fields.dtype(kw_only=True)
    param_dtype: DTypeLike | None = fields.dtype(kw_only=True)

    def build(self):
        dtypes = {"mu_dtype": self.mu_dtype, "nu_dtype": self.nu_dtype, "param_dtype": self.param_dtype}
        return Chain(
            AddDecayedWeights(self.weight_decay), ScaleByMadgrad(self.learning_rate, self.momentum, self.eps, **dtypes)
        )


scale_by_madgrad = ScaleByMadgrad
madgrad = Madgrad
