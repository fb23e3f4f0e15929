"""NovoGrad: Adam-like steps with a second moment per layer (one scalar per parameter leaf)."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from .. import fields
from .._core.base import AbstractTransform, require_params
from .._state.moments import init_state, state_dtype_for, store, update_moment, widen
from .._util.numerics import is_concrete_zero, safe_increment
from .._core.specs import REPLICATED
from .._util.trees import abs_sq, map_updates
from ..schedules._base import ScalarOrSchedule, value_at
from .._core.fields import Scalar
from jax.typing import DTypeLike


class ScaleByNovogradState(NamedTuple):
    """NovoGrad's step count, momentum and per-leaf second moments."""

    count: jax.Array  # int32 scalar
    mu: Any  # momentum, like the params (in `mu_dtype` if set)
    nu: Any  # one scalar per parameter leaf, in the parameter's dtype (or `nu_dtype`)


class ScaleByNovograd(AbstractTransform):
    r"""Rescales updates by NovoGrad: gradients normalized per layer, with momentum.

    For each parameter leaf (layer) with gradient `g`: `v = b2 v + (1 - b2) ||g||^2`
    (`v = ||g||^2` at the first step), `m = b1 m + g / (sqrt(v + eps_root) + eps) +
    weight_decay * params` (`m` starts at 0), and the update is `m`. The second moment is one
    scalar per leaf, so its state costs almost no memory. `update` needs `params`.

    Args:
        b1: the decay rate of the momentum `m`, in [0, 1).
        b2: the decay rate of the per-layer second moment `v`, in [0, 1).
        eps: added to `sqrt(v)` in the normalization, >= 0.
        eps_root: added to `v` inside the square root, >= 0.
        weight_decay: the coefficient of `params` added inside the momentum, >= 0.
        mu_dtype: the dtype of the first moment (for instance `jnp.bfloat16` to save memory); `None`
            keeps the parameters' dtype. As in optax, the update is the momentum as stored.
        nu_dtype: the dtype of the per-layer second moments; `None` keeps the parameters' dtype.

    Reference: Ginsburg et al., 2019, https://arxiv.org/abs/1905.11286
    """

    b1: Scalar = fields.decay_rate(0.9)
    b2: Scalar = fields.decay_rate(0.25)
    eps: Scalar = fields.eps(1e-8)
    eps_root: Scalar = fields.eps(0.0)
    weight_decay: ScalarOrSchedule = fields.weight_decay(0.0)
    mu_dtype: DTypeLike | None = fields.dtype()
    nu_dtype: DTypeLike | None = fields.dtype(kw_only=True)

    def init(self, params):
        nu = jax.tree_util.tree_map(lambda p: jnp.zeros([], state_dtype_for(self.nu_dtype, p.dtype)), params)
        mu = init_state(params, self.mu_dtype)
        return ScaleByNovogradState(count=jnp.zeros([], jnp.int32), mu=mu, nu=nu)

    def state_specs(self, params, param_specs):
        # The momentum is split like its parameter; the per-leaf scalars are replicated.
        treedef = jax.tree_util.tree_structure(params)
        specs = treedef.flatten_up_to(param_specs)
        return ScaleByNovogradState(
            count=REPLICATED, mu=treedef.unflatten(specs), nu=treedef.unflatten([REPLICATED] * len(specs))
        )

    def update(self, updates, state, params=None, **extra_args):
        require_params(params, self)
        count = safe_increment(state.count)
        weight_decay = value_at(self.weight_decay, state.count)
        stored_nu = widen(state.nu, self.nu_dtype)
        squared_norms = map_updates(
            lambda g, v: jnp.sum(abs_sq(g)).astype(v.dtype), widen(updates, self.nu_dtype), stored_nu
        )
        averaged = update_moment(squared_norms, stored_nu, self.b2, 1)
        nu = jax.tree_util.tree_map(lambda s, v: jnp.where(count == 1, s, v), squared_norms, averaged)
        scaled = lambda g, v: g / (jnp.sqrt(v + self.eps_root) + self.eps)  # noqa: E731
        if is_concrete_zero(weight_decay):  # a decay of 0 compiled in: no work for it
            step = lambda g, v, p: scaled(g, v)  # noqa: E731
        else:
            step = lambda g, v, p: scaled(g, v) + weight_decay * p  # noqa: E731
        normalized = map_updates(step, widen(updates, self.mu_dtype), nu, params)
        # At the first step `mu` is zero, so `b1 * mu + normalized` is `normalized`, as the paper starts it.
        mu = map_updates(lambda u, m: self.b1 * m + u, normalized, widen(state.mu, self.mu_dtype))
        mu = store(mu, self.mu_dtype, state.mu)  # `None`: the dtype of `init` (`nu_dtype` could promote it)
        return mu, ScaleByNovogradState(count=count, mu=mu, nu=store(nu, self.nu_dtype))


scale_by_novograd = ScaleByNovograd
