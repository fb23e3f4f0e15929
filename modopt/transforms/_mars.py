"""MARS: Adam on variance-reduced gradients (a scaled difference of successive gradients added)."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from .. import fields
from .._core.base import AbstractTransform
from .._core.fields import NONNEGATIVE, POSITIVE, hyperparameter
from .._state.moments import (
    bias_correction,
    init_state,
    store,
    update_dtype,
    widen,
    widened_update_moment,
    widened_update_moment_per_elem_norm,
)
from .._util.numerics import safe_increment
from .._util.trees import abs_sq, map_updates
from ._adam import moment_ratio
from .._core.fields import Scalar
from jax.typing import DTypeLike


class ScaleByMarsState(NamedTuple):
    """MARS's step count, moments of the corrected gradients, and the previous gradient."""

    count: jax.Array  # int32 scalar
    mu: Any  # EMA of the corrected gradients c, like the params (in `mu_dtype` if set)
    nu: Any  # EMA of |c|^2, like the params (in `nu_dtype` if set)
    last_grad: Any  # the gradient of the previous step (zeros before the first), like the params (or `mu_dtype`)


def corrected_gradient(g: jax.Array, last: jax.Array, scale: Any, max_norm: Any) -> jax.Array:
    """MARS's `c = g + scale * (g - last)`, divided by `||c|| / max_norm` where `||c|| > max_norm`
    (the norm of this one array); `max_norm=None` keeps `c` unclipped."""
    c = g + scale * (g - last)
    if max_norm is None:
        return c
    norm = jnp.sqrt(jnp.sum(abs_sq(c)))
    return jnp.where(norm > max_norm, c / norm * max_norm, c)


class ScaleByMars(AbstractTransform):
    r"""Rescales updates by Adam's moments of MARS's variance-reduced gradients (MARS-AdamW).

    With `t` the step (from 1) and `g_0 = 0`:

        c = g_t + gamma * b1 / (1 - b1) * (g_t - g_{t-1})
        c = c * max_norm / ||c||          where ||c|| > max_norm (per parameter)
        m = b1 m + (1 - b1) c,   v = b2 v + (1 - b2) |c|^2
        update = m_hat / (sqrt(v_hat) + eps),   m_hat = m / (1 - b1^t),  v_hat = v / (1 - b2^t)

    This is MARS-approx: the correction uses the previous step's gradient (one gradient per
    step), as the paper's experiments and code do. `gamma = 0` gives Adam on gradients clipped
    to `max_norm` per parameter. The state keeps the previous gradient: one more copy of the
    parameters than Adam.

    Checked against `pytorch_optimizer.MARS` (4.1.0, `mars_type="adamw"`) in
    `tests/test_beyond_adam.py`. The norm of `c` is clipped per parameter array, as the paper's
    code does (its Algorithm 1 writes the norm of the whole vector). `eps` is added to
    `sqrt(v_hat)` as in the paper's code; pytorch_optimizer adds it (with a further `1e-15` inside
    the root) before the bias correction, a difference of order `eps`.

    Args:
        b1: the decay rate of the first moment, in [0, 1); it also sets the correction's weight
            `gamma * b1 / (1 - b1)`.
        b2: the decay rate of the second moment, in [0, 1).
        gamma: the strength of the variance-reduction correction, >= 0.
        eps: added to the denominator's square root for numerical stability, >= 0.
        max_norm: the largest norm of each parameter's corrected gradient `c`, > 0; `None` for no
            clipping.
        mu_dtype: the dtype of the first-order state, the first moment and the previous gradient
            (for instance `jnp.bfloat16` to save memory); `None` keeps the parameters' dtype.
        nu_dtype: the dtype of the second moment; `None` keeps the parameters' dtype.

    Example:
        >>> tx = modopt.chain(modopt.scale_by_mars(), modopt.scale_by_learning_rate(3e-3))

    Reference: Yuan et al., 2024, "MARS: Unleashing the Power of Variance Reduction for Training
    Large Models", https://arxiv.org/abs/2411.10438
    """

    b1: Scalar = fields.decay_rate(0.95)
    b2: Scalar = fields.decay_rate(0.99)
    gamma: Scalar = hyperparameter(0.025, check=NONNEGATIVE)
    eps: Scalar = fields.eps(1e-8)
    max_norm: Scalar | None = hyperparameter(1.0, check=POSITIVE, optional=True)
    mu_dtype: DTypeLike | None = fields.dtype()
    nu_dtype: DTypeLike | None = fields.dtype(kw_only=True)

    def init(self, params):
        return ScaleByMarsState(
            count=jnp.zeros([], jnp.int32),
            mu=init_state(params, self.mu_dtype),
            nu=init_state(params, self.nu_dtype),
            last_grad=init_state(params, self.mu_dtype),
        )

    def update(self, updates, state, params=None, **extra_args):
        scale = self.gamma * self.b1 / (1 - self.b1)
        grads, last = widen(updates, self.mu_dtype), widen(state.last_grad, self.mu_dtype)
        c = map_updates(lambda g, last: corrected_gradient(g, last, scale, self.max_norm), grads, last)
        mu = widened_update_moment(c, state.mu, self.b1, 1, self.mu_dtype)
        nu = widened_update_moment_per_elem_norm(c, state.nu, self.b2, 2, self.nu_dtype)
        count = safe_increment(state.count)
        new_updates = moment_ratio(bias_correction(mu, self.b1, count), bias_correction(nu, self.b2, count), self.eps)
        new_state = ScaleByMarsState(
            count=count,
            mu=store(mu, self.mu_dtype),
            nu=store(nu, self.nu_dtype, state.nu),
            last_grad=store(updates, self.mu_dtype, state.last_grad),
        )
        # In the gradients' dtype (promoted with the state dtypes that are set).
        dtype = lambda g: update_dtype(g.dtype, self.mu_dtype, self.nu_dtype)  # noqa: E731
        return map_updates(lambda u, g: u.astype(dtype(g)), new_updates, updates), new_state


scale_by_mars = ScaleByMars
