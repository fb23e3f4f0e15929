"""LaProp: the momentum of gradients already normalized by their RMS (normalize, then average)."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from .. import fields
from .._core.base import AbstractTransform
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
from .._util.trees import map_updates
from ._adam import moment_ratio
from .._core.fields import Scalar
from jax.typing import DTypeLike


class ScaleByLapropState(NamedTuple):
    """LaProp's step count, momentum of normalized gradients, and second moment."""

    count: jax.Array  # int32 scalar
    mu: Any  # EMA of g / (sqrt(nu_hat) + eps), like the params (in `mu_dtype` if set)
    nu: Any  # EMA of |g|^2, like the params (in `nu_dtype` if set)


class ScaleByLaprop(AbstractTransform):
    r"""Rescales updates to LaProp's momentum of RMS-normalized gradients.

    With `t` the step (from 1): `v = b2 v + (1 - b2) |g|^2`, `v_hat = v / (1 - b2^t)`,
    `m = b1 m + (1 - b1) g / (sqrt(v_hat) + eps)` and `update = m / (1 - b1^t)`. Adam averages
    the gradients and then divides by the RMS; LaProp divides each gradient by the RMS and then
    averages, which decouples the momentum from the adaptivity: `b1` and `b2` may be chosen
    freely (no `b1 <= sqrt(b2)` condition) and a step is bounded by `1 / (1 - b1)`.

    Checked against `pytorch_optimizer.LaProp` (4.1.0) and heavyball's `LaProp` (3.2.1) in
    `tests/test_beyond_adam.py`. Departures: the learning rate is applied outside the momentum (as
    in the paper's Algorithm 1 and every optax optimizer; both references fold the learning rate of
    each step into `m`, which differs only while the rate changes); `eps` is added to the
    bias-corrected RMS as in the paper (pytorch_optimizer adds it before the bias correction,
    heavyball takes `max(rms, eps)`), a difference of order `eps`.

    Args:
        b1: the decay rate of the momentum of normalized gradients, in [0, 1).
        b2: the decay rate of the second moment (the EMA of squared gradients), in [0, 1).
        eps: added to the bias-corrected RMS `sqrt(v_hat)` before dividing, >= 0.
        mu_dtype: the dtype of the momentum (for instance `jnp.bfloat16` to save memory); `None`
            keeps the parameters' dtype.
        nu_dtype: the dtype of the second moment; `None` keeps the parameters' dtype.

    Example:
        >>> tx = modopt.chain(modopt.scale_by_laprop(), modopt.scale_by_learning_rate(4e-4))

    Reference: Ziyin, Wang & Ueda, 2020, "LaProp: Separating Momentum and Adaptivity in Adam",
    https://arxiv.org/abs/2002.04839
    """

    elementwise_updates = True

    b1: Scalar = fields.decay_rate(0.9)
    b2: Scalar = fields.decay_rate(0.999)
    eps: Scalar = fields.eps(1e-15)
    mu_dtype: DTypeLike | None = fields.dtype()
    nu_dtype: DTypeLike | None = fields.dtype(kw_only=True)

    def init(self, params):
        return ScaleByLapropState(
            count=jnp.zeros([], jnp.int32), mu=init_state(params, self.mu_dtype), nu=init_state(params, self.nu_dtype)
        )

    def update(self, updates, state, params=None, **extra_args):
        count = safe_increment(state.count)
        nu = widened_update_moment_per_elem_norm(updates, state.nu, self.b2, 2, self.nu_dtype)
        normalized = moment_ratio(widen(updates, self.mu_dtype), bias_correction(nu, self.b2, count), self.eps)
        mu = widened_update_moment(normalized, state.mu, self.b1, 1, self.mu_dtype)
        # In the gradients' dtype (promoted with the state dtypes that are set).
        dtype = lambda g: update_dtype(g.dtype, self.mu_dtype, self.nu_dtype)  # noqa: E731
        new_updates = map_updates(lambda m, g: m.astype(dtype(g)), bias_correction(mu, self.b1, count), updates)
        mu, nu = store(mu, self.mu_dtype, state.mu), store(nu, self.nu_dtype, state.nu)
        return new_updates, ScaleByLapropState(count, mu, nu)


scale_by_laprop = ScaleByLaprop
