"""Optimistic gradients: the current gradient plus a correction by the previous one."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from .._core.base import AbstractTransform
from .._core.fields import NONNEGATIVE, hyperparameter
from .._util.trees import map_updates
from .._core.fields import Scalar
from .. import fields
from .._state.moments import in_update_dtype, init_state, store, widen
from jax.typing import DTypeLike


def optimism_coefficient(default: Any = 1.0, **kwargs: Any):
    """A coefficient of generalized optimistic gradient descent (`alpha` or `beta`), >= 0."""
    return hyperparameter(default, check=NONNEGATIVE, **kwargs)


class ScaleByOptimisticGradientState(NamedTuple):
    """Whether no step was taken yet, and the gradient of the last step."""

    is_initial_step: jax.Array  # bool scalar
    previous_gradient: Any  # like the params (in `mu_dtype` if set)


class ScaleByOptimisticGradient(AbstractTransform):
    r"""Replaces each gradient `g_t` by the optimistic `(alpha + beta) g_t - beta g_{t-1}`.

    At the first step there is no previous gradient and `g_{t-1} = g_t` is used, so the
    output is `alpha g_1`. With `alpha = beta = 1` this is optimistic gradient descent,
    `2 g_t - g_{t-1}`; `beta` is the weight of the negative momentum.

    Args:
        alpha: weight of the current gradient, >= 0.
        beta: weight of the change since the previous gradient, >= 0.
        mu_dtype: the dtype of the previous gradient kept in the state (modopt's, keyword-only);
            `None` keeps the parameters' dtype for the initial state and the gradients' after
            (optax's). Set, it is read in float32 with the gradients (see `fields.dtype`).

    Reference: Mokhtari et al., 2019, https://arxiv.org/abs/1901.08511
    """

    elementwise_updates = True

    alpha: Scalar = optimism_coefficient()
    beta: Scalar = optimism_coefficient()
    mu_dtype: DTypeLike | None = fields.dtype(kw_only=True)

    def init(self, params):
        return ScaleByOptimisticGradientState(
            is_initial_step=jnp.array(True), previous_gradient=init_state(params, self.mu_dtype)
        )

    def update(self, updates, state, params=None, **extra_args):
        def optimistic(g, previous):
            previous = jnp.where(state.is_initial_step, g, previous)
            return (self.alpha + self.beta) * g - self.beta * previous

        grads = widen(updates, self.mu_dtype)
        new_updates = map_updates(optimistic, grads, widen(state.previous_gradient, self.mu_dtype))
        new_updates = in_update_dtype(new_updates, updates, self.mu_dtype)
        previous = store(grads, self.mu_dtype)
        return new_updates, ScaleByOptimisticGradientState(jnp.array(False), previous_gradient=previous)


scale_by_optimistic_gradient = ScaleByOptimisticGradient
