"""Adam's rescaling of updates by bias-corrected first and second moments."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from .._base import AbstractTransform
from .._fields import static
from .._moments import bias_correction, update_moment, update_moment_per_elem_norm
from .._numerics import safe_increment
from .. import _shared_fields as fields
from .._trees import cast, cast_like, zeros_like


class ScaleByAdamState(NamedTuple):
    """Adam's step count and moment estimates."""

    count: jax.Array  # int32 scalar
    mu: Any  # first moment, like the params (in `mu_dtype` if set)
    nu: Any  # second moment, like the params


class ScaleByAdam(AbstractTransform):
    r"""Rescales updates by Adam's bias-corrected moment estimates.

    With `t` the step (from 1): `m = b1 m + (1 - b1) g`, `v = b2 v + (1 - b2) |g|^2`,
    `update = m_hat / (sqrt(v_hat + eps_root) + eps)` where `m_hat = m / (1 - b1^t)` and
    `v_hat = v / (1 - b2^t)`. With `nesterov=True`, `m_hat` is replaced by Nesterov's
    look-ahead `b1 m / (1 - b1^(t+1)) + (1 - b1) g / (1 - b1^t)` (Dozat, 2016).

    Reference: Kingma & Ba, 2014, https://arxiv.org/abs/1412.6980
    """

    b1: Any = fields.decay_rate(0.9)
    b2: Any = fields.decay_rate(0.999)
    eps: Any = fields.eps(1e-8)
    eps_root: Any = fields.eps(0.0)
    mu_dtype: Any = fields.dtype()
    nesterov: bool = static(default=False, kw_only=True)

    def init(self, params):
        return ScaleByAdamState(
            count=jnp.zeros([], jnp.int32),
            mu=zeros_like(params, self.mu_dtype),
            nu=zeros_like(params),
        )

    def update(self, updates, state, params=None, **extra_args):
        b1, b2 = self.b1, self.b2
        mu = update_moment(updates, state.mu, b1, 1)
        nu = update_moment_per_elem_norm(updates, state.nu, b2, 2)
        count = safe_increment(state.count)
        if self.nesterov:
            mu_hat = jax.tree_util.tree_map(
                lambda m, g: b1 * m + (1 - b1) * g,
                bias_correction(mu, b1, safe_increment(count)),
                bias_correction(updates, b1, count),
            )
        else:
            mu_hat = bias_correction(mu, b1, count)
        nu_hat = bias_correction(nu, b2, count)
        updates = jax.tree_util.tree_map(
            lambda m, v: m / (jnp.sqrt(v + self.eps_root) + self.eps), mu_hat, nu_hat
        )
        return updates, ScaleByAdamState(count, cast(mu, self.mu_dtype), cast_like(nu, state.nu))


scale_by_adam = ScaleByAdam
