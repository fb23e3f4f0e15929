"""Lion: updates of uniform magnitude, the sign of an interpolated momentum."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from .. import fields
from .._core.base import AbstractTransform
from .._core.fields import POSITIVE, UNIT, choice, hyperparameter
from .._state.moments import in_update_dtype, init_state, store, update_moment, widen
from .._util.numerics import safe_increment
from .._util.trees import map_updates
from .._core.fields import Scalar
from jax.typing import DTypeLike

MODES = ("hard", "smooth", "refined")


class ScaleByLionState(NamedTuple):
    """Lion's step count and momentum."""

    count: jax.Array  # int32 scalar
    mu: Any  # momentum, like the params (in `mu_dtype` if set)


class ScaleByLion(AbstractTransform):
    r"""Rescales updates to the sign of an interpolation of the gradient and the momentum (Lion).

    `c = (1 - b1) g + b1 m`, `update = sign(c)`, then `m = b2 m + (1 - b2) g`. The `mode`
    picks the sign function: "hard" is `sign(c)`, "smooth" is `tanh(smooth_beta c)`, and
    "refined" is `c` where `|c| < 1` and `sign(c)` elsewhere. The update has unit size per
    coordinate, so Lion's learning rate is typically 3-10x smaller than AdamW's.

    Args:
        b1: the interpolation between momentum and gradient inside the sign, `(1 - b1) g + b1 m`, in
            [0, 1].
        b2: the decay rate of the momentum `m`, in [0, 1).
        mu_dtype: the dtype of the first moment (for instance `jnp.bfloat16` to save memory); `None`
            keeps the parameters' dtype.
        mode: the sign function (static): `"hard"`, `"smooth"` or `"refined"`, as above.
        smooth_beta: the sharpness of the smooth sign function `tanh(smooth_beta c)`, > 0 (used only
            with `mode="smooth"`).

    Reference: Chen et al., 2023, https://arxiv.org/abs/2302.06675
    """

    elementwise_updates = True

    b1: Scalar = fields.decay_rate(0.9, check=UNIT)  # an interpolation weight: 1 is allowed
    b2: Scalar = fields.decay_rate(0.99)
    mu_dtype: DTypeLike | None = fields.dtype()
    mode: str = choice("hard", MODES, kw_only=True)
    smooth_beta: Scalar = hyperparameter(1.0, check=POSITIVE, kw_only=True)


    def _sign(self, c: jax.Array) -> jax.Array:
        if self.mode == "smooth":
            return jnp.tanh(self.smooth_beta * c)
        if self.mode == "refined":
            return jnp.where(jnp.abs(c) < 1.0, c, jnp.sign(c))
        return jnp.sign(c)

    def init(self, params):
        return ScaleByLionState(count=jnp.zeros([], jnp.int32), mu=init_state(params, self.mu_dtype))

    def update(self, updates, state, params=None, **extra_args):
        b1 = self.b1
        grads, stored = widen(updates, self.mu_dtype), widen(state.mu, self.mu_dtype)
        new_updates = map_updates(lambda g, m: self._sign((1 - b1) * g + b1 * m), grads, stored)
        mu = store(update_moment(grads, stored, self.b2, 1), self.mu_dtype)
        new_updates = in_update_dtype(new_updates, updates, self.mu_dtype)
        return new_updates, ScaleByLionState(count=safe_increment(state.count), mu=mu)


scale_by_lion = ScaleByLion
