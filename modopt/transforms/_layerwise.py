"""Layer-wise and normalizing transforms: trust ratios, centralization, normalization, signs.

A "layer" (or block) is one leaf of the params. These transforms are stateless.
"""

from __future__ import annotations


import jax.numpy as jnp

from .. import fields
from .._core.base import AbstractTransform, EmptyState, init_empty_state, require_params
from .._core.fields import FINITE, NONNEGATIVE, hyperparameter
from .._util.numerics import global_norm, safe_norm
from .._util.trees import map_updates
from .._core.fields import Scalar


class ScaleByTrustRatio(AbstractTransform):
    r"""Rescales each update leaf by its layer's trust ratio `||p|| / ||u||`.

    For every leaf, with both norms floored at `min_norm`:

        u <- u * trust_coefficient * ||p|| / (||u|| + eps)

    Where either norm is zero (a zero-initialized layer, a zero update) the ratio is 1, so
    the update passes unchanged. Used by `lars`, `lamb` and `fromage`.

    Args:
        min_norm: the floor of both norms, >= 0.
        trust_coefficient: a factor applied to the ratio, >= 0.
        eps: added to the update's norm in the ratio, >= 0.

    Reference: You et al., 2020 (LAMB), https://arxiv.org/abs/1904.00962
    """

    min_norm: Scalar = hyperparameter(default=0.0, check=NONNEGATIVE)
    trust_coefficient: Scalar = hyperparameter(default=1.0, check=NONNEGATIVE)
    eps: Scalar = fields.eps(0.0)

    def init(self, params):
        return init_empty_state(params)

    def update(self, updates, state, params=None, **extra_args):
        require_params(params, self)

        def rescale(u, p):
            param_norm = safe_norm(p, self.min_norm)
            update_norm = safe_norm(u, self.min_norm)
            ratio = self.trust_coefficient * param_norm / (update_norm + self.eps)
            degenerate = (param_norm == 0.0) | (update_norm == 0.0)
            return u * jnp.where(degenerate, jnp.ones([], p.dtype), ratio)

        return map_updates(rescale, updates, params), state


class Centralize(AbstractTransform):
    """Subtracts from each update leaf of rank >= 2 its mean over all axes but the first.

    For a weight matrix this centres every row (every output unit's incoming gradient) at
    zero mean; vectors and scalars pass through unchanged.

    Reference: Yong et al., 2020, https://arxiv.org/abs/2004.01461
    """

    def init(self, params):
        return init_empty_state(params)

    def update(self, updates, state, params=None, **extra_args):
        def centred(g):
            if g.ndim < 2:
                return g
            return g - jnp.mean(g, axis=tuple(range(1, g.ndim)), keepdims=True)

        return map_updates(centred, updates), state


class NormalizeByUpdateNorm(AbstractTransform):
    """Divides all updates by their global L2 norm: `u <- scale_factor * u / (||u|| + eps)`.

    `scale_factor` may have any sign (`-1.0` makes it a normalized descent step).

    Args:
        scale_factor: the norm of the result, any sign (`-1.0` for a normalized descent step).
        eps: added to the global norm, >= 0, so that a zero update stays finite.
    """

    scale_factor: Scalar = hyperparameter(default=1.0, check=FINITE)
    eps: Scalar = fields.eps(1e-6)

    def init(self, params):
        return init_empty_state(params)

    def update(self, updates, state, params=None, **extra_args):
        divisor = (global_norm(updates) + self.eps) / self.scale_factor
        return map_updates(lambda g: g / divisor, updates), state


class ScaleBySign(AbstractTransform):
    """Replaces every update element by its sign (-1, 0 or 1).

    Reference: Bernstein et al., 2018 (signSGD), https://arxiv.org/abs/1802.04434
    """

    elementwise_updates = True

    def init(self, params):
        return init_empty_state(params)

    def update(self, updates, state, params=None, **extra_args):
        return map_updates(jnp.sign, updates), state


scale_by_trust_ratio = ScaleByTrustRatio
centralize = Centralize
normalize_by_update_norm = NormalizeByUpdateNorm
scale_by_sign = ScaleBySign

ScaleByTrustRatioState = EmptyState  # named as in optax
