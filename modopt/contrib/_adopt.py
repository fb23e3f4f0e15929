"""ADOPT: Adam with the second moment of the previous step (`adopt`, `scale_by_adopt`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from .. import fields
from .._core.base import AbstractComposite, AbstractTransform
from .._core.fields import Rate, static
from .._state.moments import (
    in_update_dtype,
    init_state,
    store,
    update_moment,
    widen,
    widened_update_moment,
    widened_update_moment_per_elem_norm,
)
from .._util.numerics import safe_increment
from .._util.trees import map_updates
from ..combinators import Chain
from ..schedules._base import ScalarOrSchedule
from ..transforms import ScaleByLearningRate
from ..transforms._adam import ScaleByAdamState
from .._core.fields import Scalar
from jax.typing import DTypeLike


def default_clip_value(count: jax.Array) -> jax.Array:
    """ADOPT's default clipping bound at step `count` (from 0): `count ** 0.25`.

    Args:
        count: the number of updates made before this one.
    """
    return count**0.25


def _value(rate: Any) -> Any:
    """A rate's value, keeping its weak type (`jnp.asarray` of a `Rate` would drop it)."""
    return rate.value if isinstance(rate, Rate) else rate


class ScaleByAdopt(AbstractTransform):
    r"""Rescales updates by ADOPT: the gradient normalized by the second moment of the step
    before, then averaged.

    With `v` and `m` starting at zero and `t` the number of past updates:

        v_new = g^2                               (t = 0: the first step only initializes v)
        v_new = b2 v + (1 - b2) g^2               (t > 0)
        n     = g / max(sqrt(v), eps)             (v from before this step)
        n     = clip(n, -clip_value_fn(t), clip_value_fn(t))   (with `use_clipping`)
        m     = b1 m + (1 - b1) n                 (t > 0; m stays 0 at t = 0)
        update = m, or with `nesterov` b1 m + (1 - b1) n

    Normalizing by the second moment *before* the current gradient makes ADOPT converge
    for any `b2`. The first update is zero (it only measures the gradient's scale), and so is
    the first normalized gradient with the default clipping (its bound `0 ** 0.25 = 0`).
    The state is Adam's (`ScaleByAdamState`).

    Args:
        b1: the decay rate of the first moment, in [0, 1).
        b2: the decay rate of the second moment, in [0, 1).
        eps: the floor of `sqrt(v)` in the normalization, >= 0.
        mu_dtype: the dtype of the first moment; `None` keeps the parameters' dtype.
        nu_dtype: the dtype of the second moment; `None` keeps the parameters' dtype.
        nesterov: use Nesterov's look-ahead first moment (static).
        use_clipping: clip the normalized gradient to `[-clip_value_fn(t), clip_value_fn(t)]`
            (static; recommended when training from scratch).
        clip_value_fn: the clipping bound as a function of the number of past updates `t`
            (static: code; the default is `t ** 0.25`). A new function object retraces.

    Example:
        >>> tx = modopt.chain(modopt.contrib.scale_by_adopt(), modopt.scale_by_learning_rate(1e-3))

    Reference: Taniguchi et al., 2024, "ADOPT: Modified Adam Can Converge with Any beta2 with
    the Optimal Rate", https://arxiv.org/abs/2411.02853
    """

    elementwise_updates = True

    b1: Scalar = fields.decay_rate(0.9)
    b2: Scalar = fields.decay_rate(0.9999)
    eps: Scalar = fields.eps(1e-6)
    mu_dtype: DTypeLike | None = fields.dtype()
    nesterov: bool = static(default=False, kw_only=True)
    use_clipping: bool = static(default=True, kw_only=True)
    clip_value_fn: Callable[[jax.Array], jax.Array] = static(default=default_clip_value, kw_only=True)
    nu_dtype: DTypeLike | None = fields.dtype(kw_only=True)

    def init(self, params):
        return ScaleByAdamState(
            count=jnp.zeros([], jnp.int32), mu=init_state(params, self.mu_dtype), nu=init_state(params, self.nu_dtype)
        )

    def update(self, updates, state, params=None, **extra_args):
        started = state.count > 0
        # The rates as float32 arrays, so `1 - rate` rounds as optax's does (the first step
        # uses b2 = 0 and b1 = 1).
        b2 = jnp.where(started, _value(self.b2), 0)
        b1 = jnp.where(started, _value(self.b1), 1)
        nu = widened_update_moment_per_elem_norm(updates, state.nu, b2, 2, self.nu_dtype)
        old_nu = widen(state.nu, self.nu_dtype)
        grads = widen(updates, self.mu_dtype)
        normalized = map_updates(lambda g, v: g / jnp.maximum(jnp.sqrt(v), self.eps), grads, old_nu)
        if self.use_clipping:
            bound = self.clip_value_fn(state.count)
            normalized = map_updates(lambda n: jnp.clip(n, -bound, bound), normalized)
        mu = widened_update_moment(normalized, state.mu, b1, 1, self.mu_dtype)
        new_updates = update_moment(normalized, mu, b1, 1) if self.nesterov else mu
        new_updates = in_update_dtype(new_updates, updates, self.mu_dtype, self.nu_dtype)
        return new_updates, ScaleByAdamState(
            count=safe_increment(state.count), mu=store(mu, self.mu_dtype, state.mu), nu=store(nu, self.nu_dtype)
        )


class Adopt(AbstractComposite):
    r"""ADOPT: `params -= learning_rate * m`, with `m` the average of gradients normalized by
    the previous step's second moment (see `scale_by_adopt`).

    A modification of Adam that converges for any `b2`: the gradient is divided by the
    second-moment estimate from *before* it, then averaged (Adam averages first and divides
    after). The clipping (on by default) keeps early steps stable.

    Args:
        learning_rate: the step size: a number >= 0 or a schedule of the step count.
        b1: the decay rate of the first moment, in [0, 1).
        b2: the decay rate of the second moment, in [0, 1).
        eps: the floor of `sqrt(v)` in the normalization, >= 0.
        mu_dtype: the dtype of the first moment; `None` keeps the parameters' dtype.
        nu_dtype: the dtype of the second moment; `None` keeps the parameters' dtype.
        nesterov: use Nesterov's look-ahead first moment (static).
        use_clipping: clip the normalized gradient to `[-clip_value_fn(t), clip_value_fn(t)]`
            with `t` the number of past updates (static).
        clip_value_fn: the clipping bound as a function of `t` (static: code; default
            `t ** 0.25`).

    Example:
        >>> optimizer = modopt.Optimizer(modopt.contrib.adopt(1e-3), model)

    Reference: Taniguchi et al., 2024, "ADOPT: Modified Adam Can Converge with Any beta2 with
    the Optimal Rate", https://arxiv.org/abs/2411.02853
    """

    learning_rate: ScalarOrSchedule = fields.learning_rate()
    b1: Scalar = fields.decay_rate(0.9)
    b2: Scalar = fields.decay_rate(0.9999)
    eps: Scalar = fields.eps(1e-6)
    mu_dtype: DTypeLike | None = fields.dtype()
    nesterov: bool = static(default=False, kw_only=True)
    use_clipping: bool = static(default=True, kw_only=True)
    clip_value_fn: Callable[[jax.Array], jax.Array] = static(default=default_clip_value, kw_only=True)
    nu_dtype: DTypeLike | None = fields.dtype(kw_only=True)

    def build(self):
        return Chain(
            ScaleByAdopt(
                self.b1,
                self.b2,
                self.eps,
                self.mu_dtype,
                nesterov=self.nesterov,
                use_clipping=self.use_clipping,
                clip_value_fn=self.clip_value_fn,
                nu_dtype=self.nu_dtype,
            ),
            ScaleByLearningRate(self.learning_rate),
        )


scale_by_adopt = ScaleByAdopt
adopt = Adopt
