"""COCOB: parameter-free descent by continuous coin betting, per coordinate."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax.numpy as jnp

from .. import fields
from .._core.base import AbstractComposite, AbstractTransform, require_params
from .._core.fields import POSITIVE, hyperparameter
from .._util.trees import map_updates
from ..combinators import Chain
from ..schedules._base import ScalarOrSchedule
from ..transforms import AddDecayedWeights, ScaleByLearningRate
from .._core.fields import Scalar
from .._core.masks import MaskOrFn
from .._state.moments import copy_state, in_update_dtype, init_state, store, widen
from jax.typing import DTypeLike


class COCOBState(NamedTuple):
    """COCOB's bets, per coordinate: every field is shaped like the params (`init_particles` in
    `param_dtype`, the others in `state_dtype`, where set)."""

    init_particles: Any  # the parameters at `init`, where betting starts
    cumulative_gradients: Any  # minus the sum of the gradients seen
    scale: Any  # the largest |gradient| seen (at least `eps`)
    subgradients: Any  # the sum of the |gradients| seen
    reward: Any  # the wealth won so far, at least 0


class ScaleByCocob(AbstractTransform):
    r"""Rescales updates by COCOB-Backprop: each coordinate bets a fraction of its wealth.

    Per coordinate, with `g` the gradient at `x` and `x0` the parameters at `init`:
    `L = max(L, |g|)`, `G = G + |g|`, `R = max(R - g (x - x0), 0)`, `C = C - g`, and the
    new parameter is `x0 + C / (L max(G + L, alpha L)) * (L + R)`; the update returned is that
    minus `x` (a full step: chain no learning rate after it). `L` starts at `eps`, the others at 0.

    `update` needs `params`.

    Args:
        alpha: bounds the fraction bet in the first steps (`alpha L` in the denominator), > 0;
            larger values start more cautiously.
        eps: the initial value of the scale `L`, >= 0 (it keeps the first denominator nonzero).
        state_dtype: the dtype of the bets `C`, `L`, `G` and `R` (modopt's, keyword-only);
            `None` keeps the parameters' dtype (see `fields.dtype`: state dtypes are
            accumulated in float32 and stored in this dtype).
        param_dtype: the dtype of the copy `x0` of the initial parameters (keyword-only);
            `None` keeps the parameters' dtype.

    Example:
        >>> tx = modopt.contrib.scale_by_cocob()  # a complete step: no learning rate needed

    Reference: Orabona & Tommasi, 2017, "Training Deep Networks without Learning Rates Through
    Coin Betting" (Algorithm 2), https://arxiv.org/abs/1705.07795
    """

    elementwise_updates = True

    alpha: Scalar = hyperparameter(100.0, check=POSITIVE)
    eps: Scalar = fields.eps(1e-8)
    state_dtype: DTypeLike | None = fields.dtype(kw_only=True)
    param_dtype: DTypeLike | None = fields.dtype(kw_only=True)

    def init(self, params):
        dtype = self.state_dtype
        return COCOBState(
            init_particles=copy_state(params, self.param_dtype),
            cumulative_gradients=init_state(params, dtype),
            scale=init_state(params, dtype, self.eps),
            subgradients=init_state(params, dtype),
            reward=init_state(params, dtype),
        )

    def update(self, updates, state, params=None, **extra_args):
        require_params(params, self)
        alpha, dtype = self.alpha, self.state_dtype
        # With state dtypes, the stored state and the gradients are read in float32 (`widen`).
        grads = widen(updates, dtype)
        init_particles = widen(state.init_particles, self.param_dtype)
        scale = map_updates(lambda g, scale: jnp.maximum(scale, jnp.abs(g)), grads, widen(state.scale, dtype))
        subgradients = map_updates(lambda g, total: total + jnp.abs(g), grads, widen(state.subgradients, dtype))
        reward = map_updates(
            lambda g, wealth, x, x0: jnp.maximum(wealth - g * (x - x0), 0),
            grads,
            widen(state.reward, dtype),
            params,
            init_particles,
        )
        cumulative = map_updates(lambda g, total: total - g, grads, widen(state.cumulative_gradients, dtype))

        def step(x, x0, total, scale, subgradients, reward):
            return -x + (x0 + total / (scale * jnp.maximum(subgradients + scale, alpha * scale)) * (scale + reward))

        new_updates = map_updates(
            lambda _, *args: step(*args), grads, params, init_particles, cumulative, scale, subgradients, reward
        )
        new_updates = in_update_dtype(new_updates, updates, dtype, self.param_dtype)
        return new_updates, COCOBState(
            init_particles=state.init_particles,
            cumulative_gradients=store(cumulative, dtype, state.cumulative_gradients),
            scale=store(scale, dtype, state.scale),
            subgradients=store(subgradients, dtype, state.subgradients),
            reward=store(reward, dtype, state.reward),
        )


class Cocob(AbstractComposite):
    r"""COCOB-Backprop: parameter-free descent in which each coordinate bets on the gradient's sign.

    The gradient plus `weight_decay * params` is multiplied by `learning_rate` (no sign flip),
    then `scale_by_cocob` turns it into the full step from `x` to `x0 + C / (L max(G + L,
    alpha L)) * (L + R)` (see there). No learning rate needs tuning; `learning_rate` can
    inject a schedule that scales the gradients COCOB sees.

    Args:
        learning_rate: multiplies the gradients before COCOB: a number >= 0 or a schedule of the
            step count.
        alpha: bounds the fraction bet in the first steps, > 0.
        eps: the initial value of the per-coordinate scale `L`, >= 0.
        weight_decay: the coefficient of the L2 penalty `weight_decay * params` added to the
            gradients (a number or a schedule).
        mask: which parameters the weight decay applies to: `None` for all, a pytree of bools with
            the params' structure, or a function of the params returning one.
        state_dtype: the dtype of the bets (modopt's, keyword-only; see `scale_by_cocob`).
        param_dtype: the dtype of the copy of the initial parameters (keyword-only).

    Example:
        >>> optimizer = modopt.Optimizer(modopt.contrib.cocob(), model)

    Reference: Orabona & Tommasi, 2017, "Training Deep Networks without Learning Rates Through
    Coin Betting" (Algorithm 2), https://arxiv.org/abs/1705.07795
    """

    learning_rate: ScalarOrSchedule = fields.learning_rate(1.0)
    alpha: Scalar = hyperparameter(100.0, check=POSITIVE)
    eps: Scalar = fields.eps(1e-8)
    weight_decay: ScalarOrSchedule = fields.weight_decay(0.0)
    mask: MaskOrFn = fields.mask()
    state_dtype: DTypeLike | None = fields.dtype(kw_only=True)
    param_dtype: DTypeLike | None = fields.dtype(kw_only=True)

    def build(self):
        return Chain(
            AddDecayedWeights(self.weight_decay, self.mask),
            ScaleByLearningRate(self.learning_rate, flip_sign=False),
            ScaleByCocob(self.alpha, self.eps, state_dtype=self.state_dtype, param_dtype=self.param_dtype),
        )


scale_by_cocob = ScaleByCocob
cocob = Cocob
