"""Differentially private SGD."""

from __future__ import annotations

from typing import Any

import jax

from .. import fields
from .._core.base import AbstractComposite
from .._core.fields import prng_key, static
from ..combinators import Chain
from ..schedules._base import ScalarOrSchedule
from ..transforms import Identity, ScaleByLearningRate, Trace
from ..transforms._privacy import (
    DifferentiallyPrivateAggregate,
    dp_l2_norm_clip,
    dp_noise_multiplier,
    private_key,
)
from .._core.fields import Scalar
from jax.typing import DTypeLike


class Dpsgd(AbstractComposite):
    r"""DP-SGD: SGD on per-example gradients clipped, summed, noised and averaged.

    `differentially_private_aggregate` reduces the per-example gradients to
    `g = (sum_i clip_C(g_i) + C * sigma * n) / B` with `n ~ N(0, I)`; then SGD steps:
    `params -= learning_rate * t`, with `t = g`, or with `momentum` its trace
    `t = g + momentum * t` (Nesterov's variant with `nesterov`).

    It takes per-example gradients, every leaf with a leading batch axis:
    `optimizer.step(model, grads)` with `grads` from
    `jax.vmap(eqx.filter_grad(loss), in_axes=(None, 0, 0))(model, x, y)`, `loss` taking one
    example. The privacy guarantee (epsilon, delta) follows from `noise_multiplier`, the
    sampling rate `B / N` and the number of steps by a privacy accountant; modopt does not
    compute it.

    Args:
        learning_rate: a number >= 0 or a schedule.
        l2_norm_clip: `C`, the largest global L2 norm an example's gradient keeps, > 0.
        noise_multiplier: `sigma`, the noise's standard deviation relative to `C`, >= 0.
        seed: an integer seed, or a PRNG key, of the noise.
        momentum: the momentum in [0, 1], or `None` for none.
        nesterov: Nesterov's momentum.
        key: the same as `seed`, under the name of `add_noise` and `noisy_sgd`; give one of
            the two.
        accumulator_dtype: the dtype of the momentum's trace (modopt's, keyword-only); `None`
            keeps the parameters' dtype (see `fields.dtype` and `trace`).

    Example:
        >>> optimizer = modopt.Optimizer(modopt.dpsgd(0.25, l2_norm_clip=1.0, noise_multiplier=1.1, seed=0), model)
        >>> grads = jax.vmap(eqx.filter_grad(loss), in_axes=(None, 0, 0))(model, x, y)
        >>> model, optimizer = optimizer.step(model, grads)

    Reference: Abadi et al., 2016, "Deep Learning with Differential Privacy",
    https://arxiv.org/abs/1607.00133
    """

    learning_rate: ScalarOrSchedule = fields.learning_rate()
    l2_norm_clip: Scalar = dp_l2_norm_clip()
    noise_multiplier: Scalar = dp_noise_multiplier()
    key: jax.Array = prng_key()
    momentum: Scalar | None = fields.momentum(None)
    nesterov: bool = static(default=False)
    accumulator_dtype: DTypeLike | None = fields.dtype(kw_only=True)

    def __init__(
        self,
        learning_rate: Any,
        l2_norm_clip: Scalar,
        noise_multiplier: Scalar,
        seed: Any = None,
        momentum: Scalar | None = None,
        nesterov: bool = False,
        *,
        key: Any = None,
        accumulator_dtype: DTypeLike | None = None,
    ):
        self.learning_rate = learning_rate
        self.l2_norm_clip = l2_norm_clip
        self.noise_multiplier = noise_multiplier
        self.key = private_key(key, seed, "dpsgd")
        self.momentum = momentum
        self.nesterov = nesterov
        self.accumulator_dtype = accumulator_dtype

    def build(self):
        if self.momentum is None:
            accumulate = Identity()
        else:
            accumulate = Trace(self.momentum, self.nesterov, accumulator_dtype=self.accumulator_dtype)
        return Chain(
            DifferentiallyPrivateAggregate(self.l2_norm_clip, self.noise_multiplier, key=self.key),
            accumulate,
            ScaleByLearningRate(self.learning_rate),
        )


dpsgd = Dpsgd
