"""SM3: Adagrad-like scaling with one accumulator per index of each dimension."""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from .. import fields
from .._core.base import AbstractTransform
from .._core.fields import UNIT
from .._state.moments import (
    in_update_dtype,
    init_state,
    state_dtype_for,
    store,
    widen,
    widened_update_moment,
)
from .._core.specs import REPLICATED, padded
from ._real_only import reject_complex
from .._core.fields import Scalar
from jax.typing import DTypeLike


class ScaleBySM3State(NamedTuple):
    """SM3's accumulators and its momentum."""

    mu: Any  # per parameter, a list of vectors: one per dimension, as long as that dimension (in `nu_dtype` if set)
    nu: Any  # the momentum of the normalized updates, like the params (in `mu_dtype` if set)


class ScaleBySM3(AbstractTransform):
    r"""Scales updates by SM3's memory-efficient estimate of the sum of squared gradients.

    A leaf of rank `k` keeps `k` accumulator vectors `a_1..a_k`, `a_i` as long as its `i`-th
    dimension, instead of a full-size Adagrad accumulator. At each step, for every element
    `j = (j_1, ..., j_k)`,

        v_j = c * g_j^2 + b2 * min_i a_i[j_i],      c = 1 if b2 == 1 else 1 - b2
        u_j = g_j / sqrt(v_j + eps)  (0 where v_j == 0)
        nu  = b1 * nu + (1 - b1) * u

    and each `a_i[n]` becomes the maximum of `v` over the elements with `j_i = n`. The
    output is `nu`. With `b2 = 1` (the default) `v` is a running sum (SM3-II of the paper);
    `b2 < 1` makes it an exponential moving average. A vector keeps its full accumulator, and
    a scalar keeps one number (optax fails on scalar parameters; this is the same rule
    applied to their single element).

    State: `mu` holds the accumulator vectors, `nu` the momentum. Under sharding, `a_i` is
    split like dimension `i` of its parameter.

    Args:
        b1: decay rate of the momentum of the normalized updates, in [0, 1).
        b2: decay of the squared-gradient accumulators, in [0, 1]; 1 sums them.
        eps: added to the accumulator under the square root, >= 0.
        mu_dtype: the dtype of the momentum (the state's `nu`: state dtypes are named by role, see
            `fields.dtype`); `None` keeps the parameters' dtype.
        nu_dtype: the dtype of the accumulators of squared gradients (the state's `mu`); `None`
            keeps the parameters' dtype.

    Reference: Anil et al., 2019, "Memory-Efficient Adaptive Optimization",
    https://arxiv.org/abs/1901.11150
    """

    b1: Scalar = fields.decay_rate(0.9)
    b2: Scalar = fields.decay_rate(1.0, check=UNIT)
    eps: Scalar = fields.eps(1e-8)
    mu_dtype: DTypeLike | None = fields.dtype(kw_only=True)
    nu_dtype: DTypeLike | None = fields.dtype(kw_only=True)

    def init(self, params):
        reject_complex(params, self)
        accumulators = jax.tree_util.tree_map(functools.partial(_zero_accumulators, dtype=self.nu_dtype), params)
        return ScaleBySM3State(mu=accumulators, nu=init_state(params, self.mu_dtype))

    def update(self, updates, state, params=None, **extra_args):
        treedef = jax.tree_util.tree_structure(state.nu)
        grads = treedef.flatten_up_to(widen(updates, self.nu_dtype))
        accumulators = treedef.flatten_up_to(widen(state.mu, self.nu_dtype))
        sums = [self._accumulate(g, a) for g, a in zip(grads, accumulators)]
        normalized = [
            g * jnp.where(v > 0, jax.lax.rsqrt(v + self.eps), 0.0) for g, v in zip(grads, sums)
        ]
        nu = widened_update_moment(treedef.unflatten(normalized), state.nu, self.b1, 1, self.mu_dtype)
        mu = treedef.unflatten([_reduce_to_accumulators(v) for v in sums])
        new_updates = in_update_dtype(nu, updates, self.mu_dtype, self.nu_dtype)
        return new_updates, ScaleBySM3State(mu=store(mu, self.nu_dtype, state.mu), nu=store(nu, self.mu_dtype, state.nu))

    def _accumulate(self, g: jax.Array, accumulators: list[jax.Array]) -> jax.Array:
        """`c * g^2 + b2 * (the tightest accumulator bound of each element)`."""
        new_weight = jnp.where(jnp.asarray(self.b2) == 1, 1.0, 1 - self.b2)
        if g.ndim == 0:
            previous = accumulators[0]
        else:
            previous = functools.reduce(
                jnp.minimum,
                [jnp.reshape(a, _along(g.ndim, i, a.shape[0])) for i, a in enumerate(accumulators)],
            )
        return new_weight * jnp.square(g) + self.b2 * previous

    def state_specs(self, params, param_specs):
        # Accumulator `a_i` takes the spec entry of dimension `i`; `nu` follows the parameter.
        treedef = jax.tree_util.tree_structure(params)
        specs = treedef.flatten_up_to(param_specs)
        mu = [_accumulator_specs(p.ndim, spec) for p, spec in zip(treedef.flatten_up_to(params), specs)]
        return ScaleBySM3State(mu=treedef.unflatten(mu), nu=treedef.unflatten(specs))


def _along(ndim: int, axis: int, size: int) -> tuple[int, ...]:
    """The shape that lays a vector of `size` along `axis` of a rank-`ndim` array."""
    return (1,) * axis + (size,) + (1,) * (ndim - axis - 1)


def _zero_accumulators(p: Any, dtype: Any = None) -> list[jax.Array]:
    dtype = state_dtype_for(dtype, p.dtype)
    if p.ndim == 0:
        return [jnp.zeros((), dtype)]
    return [jnp.zeros((n,), dtype) for n in p.shape]


def _reduce_to_accumulators(v: jax.Array) -> list[jax.Array]:
    """Each dimension's accumulator: the maximum of `v` over all the other dimensions (0 over
    none, for a parameter without elements: `v` is non-negative, so 0 changes no maximum)."""
    if v.ndim < 2:
        return [v]
    return [jnp.max(v, axis=tuple(j for j in range(v.ndim) if j != i), initial=0) for i in range(v.ndim)]


def _accumulator_specs(ndim: int, spec: PartitionSpec) -> list[PartitionSpec]:
    if ndim == 0:
        return [REPLICATED]
    return [PartitionSpec(entry) for entry in padded(spec, ndim)]


scale_by_sm3 = ScaleBySM3
