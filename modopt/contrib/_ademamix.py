"""AdEMAMix: Adam with a second, slow momentum (and its simplified one-momentum form)."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from .. import fields
from .._core.base import AbstractComposite, AbstractTransform
from .._core.fields import FINITE_NONNEGATIVE, PROBABILITY_EXCLUSIVE, as_rate
from .._state.moments import (
    bias_correction,
    in_update_dtype,
    init_state,
    store,
    widen,
    widened_update_moment,
    widened_update_moment_per_elem_norm,
)
from .._util.numerics import safe_increment
from .._util.trees import map_updates
from ..combinators import Chain
from ..schedules._base import ScalarOrSchedule, as_schedule, value_at
from ..transforms import AddDecayedWeights, ScaleByLearningRate
from ..transforms._adam import moment_ratio
from .._core.fields import Scalar
from jax.typing import DTypeLike
from .._core.masks import MaskOrFn


def _rate_or_schedule(value: Any) -> Any:
    """A decay rate given as a number (kept with its exact complement, see `Rate`) or a schedule."""
    return as_schedule(as_rate(value))


def rate_or_schedule(default: Any, **kwargs: Any):
    """A decay-rate field, in [0, 1), that also accepts a schedule of the step count (`b3`)."""
    return fields.hyperparameter(
        default, check=PROBABILITY_EXCLUSIVE, kind="number_or_schedule", converter=_rate_or_schedule, **kwargs
    )


class ScaleByAdemamixState(NamedTuple):
    """AdEMAMix's step counts, its two momenta and its second moment."""

    count: jax.Array  # int32 scalar: the steps of the fast EMA and the second moment
    count_m2: jax.Array  # int32 scalar: the steps at which `b3` and `alpha` are evaluated
    m1: Any  # the fast EMA of the gradients (decay `b1`), like the params (in `mu_dtype` if set)
    m2: Any  # the slow EMA of the gradients (decay `b3`), like `m1`
    nu: Any  # the EMA of the squared gradients (decay `b2`), like `m1` (in `nu_dtype` if set)


class ScaleByAdemamix(AbstractTransform):
    r"""Rescales updates by AdEMAMix: Adam's step plus `alpha` times a slow, uncorrected momentum.

    With `t` the step (from 1): `m1 = b1 m1 + (1 - b1) g`, `m2 = b3 m2 + (1 - b3) g`,
    `nu = b2 nu + (1 - b2) |g|^2`, and
    `update = (m1 / (1 - b1^t) + alpha m2) / (sqrt(nu / (1 - b2^t) + eps_root) + eps)`.
    The slow EMA `m2` is not bias-corrected, so that it fills up slowly. `b3` and `alpha`
    may be schedules of the step count (the paper warms both up), evaluated at `count_m2`
    before it is incremented.

    With `mu_dtype` set, the three accumulators are stored in it (the update of a step is
    computed, in float32 at least, before they are cast), or the second moment in `nu_dtype`
    where that is set; optax 0.2.8 lets them take the gradients' dtype after the first step
    instead.

    Args:
        b1: the decay rate of the fast EMA of the gradients, in [0, 1).
        b2: the decay rate of the EMA of squared gradients, in [0, 1).
        b3: the decay rate of the slow EMA of the gradients, in [0, 1), or a schedule of the step
            count.
        alpha: the weight of the slow EMA in the numerator, >= 0, or a schedule of the step count.
        eps: added to the denominator's square root for numerical stability, >= 0.
        eps_root: added to the second moment inside the square root, >= 0.
        mu_dtype: the dtype of the accumulators; `None` keeps the parameters' dtype.
        nu_dtype: the dtype of the second moment; `None` is `mu_dtype` (as optax's single
            dtype).

    Example:
        >>> tx = modopt.chain(modopt.contrib.scale_by_ademamix(b3=0.999), modopt.scale(-1e-3))

    Reference: Pagliardini, Ablin & Grangier, 2024, "The AdEMAMix Optimizer: Better, Faster,
    Older", https://arxiv.org/abs/2409.03137
    """

    elementwise_updates = True

    b1: Scalar = fields.decay_rate(0.9)
    b2: Scalar = fields.decay_rate(0.999)
    b3: ScalarOrSchedule = rate_or_schedule(0.9999)
    alpha: ScalarOrSchedule = fields.scalar_or_schedule(6.0, check=FINITE_NONNEGATIVE)
    eps: Scalar = fields.eps(1e-8)
    eps_root: Scalar = fields.eps(0.0)
    mu_dtype: DTypeLike | None = fields.dtype()
    nu_dtype: DTypeLike | None = fields.dtype(kw_only=True)

    def _nu_dtype(self) -> Any:
        return self.mu_dtype if self.nu_dtype is None else self.nu_dtype

    def init(self, params):
        return ScaleByAdemamixState(
            count=jnp.zeros([], jnp.int32),
            count_m2=jnp.zeros([], jnp.int32),
            m1=init_state(params, self.mu_dtype),
            m2=init_state(params, self.mu_dtype),
            nu=init_state(params, self._nu_dtype()),
        )

    def update(self, updates, state, params=None, **extra_args):
        b3 = value_at(self.b3, state.count_m2)
        alpha = value_at(self.alpha, state.count_m2)
        m1 = widened_update_moment(updates, state.m1, self.b1, 1, self.mu_dtype)
        m2 = widened_update_moment(updates, state.m2, b3, 1, self.mu_dtype)
        nu = widened_update_moment_per_elem_norm(updates, state.nu, self.b2, 2, self._nu_dtype())
        count = safe_increment(state.count)
        numerator = map_updates(
            lambda fast, slow: fast + alpha * slow, bias_correction(m1, self.b1, count), m2
        )
        new_updates = moment_ratio(numerator, bias_correction(nu, self.b2, count), self.eps, self.eps_root)
        new_updates = in_update_dtype(new_updates, updates, self.mu_dtype, self._nu_dtype())
        return new_updates, ScaleByAdemamixState(
            count=count,
            count_m2=safe_increment(state.count_m2),
            m1=store(m1, self.mu_dtype, state.m1),  # `None`: the dtype of `init`, the params'
            m2=store(m2, self.mu_dtype, state.m2),
            nu=store(nu, self._nu_dtype(), state.nu),
        )


class Ademamix(AbstractComposite):
    r"""AdEMAMix: AdamW whose numerator mixes a fast and a slow momentum.

    `params -= learning_rate * ((m1_hat + alpha m2) / (sqrt(nu_hat + eps_root) + eps)
    + weight_decay * params)`, with `m1_hat`, `m2`, `nu_hat` from `scale_by_ademamix` (the fast
    EMA and the second moment bias-corrected, the slow EMA with decay `b3` not). The slow EMA
    remembers gradients over about `1 / (1 - b3)` steps, which pays off in long runs; the paper
    warms `alpha` and `b3` up with schedules, which both accept. The weight decay is multiplied
    by the learning rate, as in PyTorch.

    Note the default `alpha` here is 5.0, and 6.0 in `scale_by_ademamix` (as in optax).

    Args:
        learning_rate: the step size: a number >= 0 or a schedule of the step count.
        b1: the decay rate of the fast EMA of the gradients, in [0, 1).
        b2: the decay rate of the EMA of squared gradients, in [0, 1).
        b3: the decay rate of the slow EMA of the gradients, in [0, 1), or a schedule of the step
            count.
        alpha: the weight of the slow EMA in the numerator, >= 0, or a schedule of the step count.
        eps: added to the denominator's square root for numerical stability, >= 0.
        eps_root: added to the second moment inside the square root, >= 0.
        mu_dtype: the dtype of the accumulators; `None` keeps the parameters' dtype.
        weight_decay: the coefficient of the weight decay added to the update before the learning
            rate scales it (a number or a schedule).
        mask: which parameters the weight decay applies to: `None` for all, a pytree of bools with
            the params' structure, or a function of the params returning one.
        nu_dtype: the dtype of the second moment; `None` is `mu_dtype`.

    Example:
        >>> optimizer = modopt.Optimizer(modopt.contrib.ademamix(1e-3, b3=0.999), model)

    Reference: Pagliardini, Ablin & Grangier, 2024, "The AdEMAMix Optimizer: Better, Faster,
    Older", https://arxiv.org/abs/2409.03137
    """

    learning_rate: ScalarOrSchedule = fields.learning_rate()
    b1: Scalar = fields.decay_rate(0.9)
    b2: Scalar = fields.decay_rate(0.999)
    b3: ScalarOrSchedule = rate_or_schedule(0.9999)
    alpha: ScalarOrSchedule = fields.scalar_or_schedule(5.0, check=FINITE_NONNEGATIVE)
    eps: Scalar = fields.eps(1e-8)
    eps_root: Scalar = fields.eps(0.0)
    mu_dtype: DTypeLike | None = fields.dtype()
    weight_decay: ScalarOrSchedule = fields.weight_decay(0.0)
    mask: MaskOrFn = fields.mask()
    nu_dtype: DTypeLike | None = fields.dtype(kw_only=True)

    def build(self):
        adam_part = (self.b1, self.b2, self.b3, self.alpha, self.eps, self.eps_root, self.mu_dtype)
        return Chain(
            ScaleByAdemamix(*adam_part, nu_dtype=self.nu_dtype),
            AddDecayedWeights(self.weight_decay, self.mask),
            ScaleByLearningRate(self.learning_rate),
        )


class ScaleBySimplifiedAdEMAMixState(NamedTuple):
    """Simplified AdEMAMix's step count, momentum and second moment."""

    t: jax.Array  # int32 scalar
    m: Any  # the momentum, a sum of gradients discounted by `b1` (not an average), like the params (or `mu_dtype`)
    n: Any  # the EMA of the squared gradients (decay `b2`), like the params (or `nu_dtype`)


class ScaleBySimplifiedAdEMAMix(AbstractTransform):
    r"""Rescales updates by Simplified AdEMAMix: a long momentum plus `alpha` times the gradient,
    over Adam's denominator.

    With `t` the step (from 1): `m = b1 m + g` (a discounted sum, not an average),
    `n = b2 n + (1 - b2) g^2`, and `update = (m + alpha g) / (sqrt(n / (1 - b2^t) + eps_root) + eps)`.
    One momentum buffer replaces AdEMAMix's two. `alpha` may be a schedule of the step count,
    evaluated at `t` before it is incremented.

    Args:
        b1: the discount of the momentum `m = b1 m + g`, in [0, 1).
        b2: the decay rate of the EMA of squared gradients, in [0, 1).
        alpha: the weight of the current gradient added to the momentum, >= 0, or a schedule of
            the step count.
        eps: added to the denominator's square root for numerical stability, >= 0.
        eps_root: added to the second moment inside the square root, >= 0.
        mu_dtype: the dtype of the momentum `m`; `None` keeps the parameters' dtype.
        nu_dtype: the dtype of the second moment `n`; `None` keeps the parameters' dtype.

    Example:
        >>> tx = modopt.chain(modopt.contrib.scale_by_simplified_ademamix(), modopt.scale(-1e-4))

    Reference: Morwani et al., 2025, "Connections between Schedule-Free Optimizers, AdEMAMix, and
    Accelerated SGD Variants", https://arxiv.org/abs/2502.02431
    """

    elementwise_updates = True

    b1: Scalar = fields.decay_rate(0.99)
    b2: Scalar = fields.decay_rate(0.95)
    alpha: ScalarOrSchedule = fields.scalar_or_schedule(0.0, check=FINITE_NONNEGATIVE)
    eps: Scalar = fields.eps(1e-8)
    eps_root: Scalar = fields.eps(0.0)
    mu_dtype: DTypeLike | None = fields.dtype(kw_only=True)
    nu_dtype: DTypeLike | None = fields.dtype(kw_only=True)

    def init(self, params):
        return ScaleBySimplifiedAdEMAMixState(
            t=jnp.zeros([], jnp.int32), m=init_state(params, self.mu_dtype), n=init_state(params, self.nu_dtype)
        )

    def update(self, updates, state, params=None, **extra_args):
        alpha = value_at(self.alpha, state.t)
        b1 = self.b1
        grads = widen(updates, self.mu_dtype)
        m = map_updates(lambda g, m: g + b1 * m, grads, widen(state.m, self.mu_dtype))
        n = widened_update_moment(updates, state.n, self.b2, 2, self.nu_dtype)
        t = safe_increment(state.t)
        numerator = map_updates(lambda g, m: m + alpha * g, grads, m)
        new_updates = moment_ratio(numerator, bias_correction(n, self.b2, t), self.eps, self.eps_root)
        new_updates = in_update_dtype(new_updates, updates, self.mu_dtype, self.nu_dtype)
        m, n = store(m, self.mu_dtype), store(n, self.nu_dtype)
        return new_updates, ScaleBySimplifiedAdEMAMixState(t=t, m=m, n=n)


class SimplifiedAdEMAMix(AbstractComposite):
    r"""Simplified AdEMAMix: one long momentum plus `alpha` times the gradient, over Adam's
    denominator, with weight decay.

    `params -= learning_rate * ((m + alpha g) / (sqrt(n_hat + eps_root) + eps)
    + weight_decay * params)`, with `m = b1 m + g` and `n_hat` Adam's bias-corrected second
    moment (see `scale_by_simplified_ademamix`). With `alpha = 0` it is Adam up to a rescaling
    of `learning_rate` and `b1`. The weight decay is multiplied by the learning rate.

    Args:
        learning_rate: the step size: a number >= 0 or a schedule of the step count.
        b1: the discount of the momentum `m = b1 m + g`, in [0, 1).
        b2: the decay rate of the EMA of squared gradients, in [0, 1).
        alpha: the weight of the current gradient added to the momentum, >= 0, or a schedule of
            the step count.
        eps: added to the denominator's square root for numerical stability, >= 0.
        eps_root: added to the second moment inside the square root, >= 0.
        weight_decay: the coefficient of the weight decay added to the update before the learning
            rate scales it (a number or a schedule).
        mask: which parameters the weight decay applies to: `None` for all, a pytree of bools with
            the params' structure, or a function of the params returning one.
        mu_dtype: the dtype of the momentum `m`; `None` keeps the parameters' dtype.
        nu_dtype: the dtype of the second moment `n`; `None` keeps the parameters' dtype.

    Example:
        >>> optimizer = modopt.Optimizer(modopt.contrib.simplified_ademamix(1e-4, alpha=2.0), model)

    Reference: Morwani et al., 2025, "Connections between Schedule-Free Optimizers, AdEMAMix, and
    Accelerated SGD Variants", https://arxiv.org/abs/2502.02431
    """

    learning_rate: ScalarOrSchedule = fields.learning_rate()
    b1: Scalar = fields.decay_rate(0.99)
    b2: Scalar = fields.decay_rate(0.95)
    alpha: ScalarOrSchedule = fields.scalar_or_schedule(0.0, check=FINITE_NONNEGATIVE)
    eps: Scalar = fields.eps(1e-8)
    eps_root: Scalar = fields.eps(0.0)
    weight_decay: ScalarOrSchedule = fields.weight_decay(0.0)
    mask: MaskOrFn = fields.mask()
    mu_dtype: DTypeLike | None = fields.dtype(kw_only=True)
    nu_dtype: DTypeLike | None = fields.dtype(kw_only=True)

    def build(self):
        scaling = (self.b1, self.b2, self.alpha, self.eps, self.eps_root)
        return Chain(
            ScaleBySimplifiedAdEMAMix(*scaling, mu_dtype=self.mu_dtype, nu_dtype=self.nu_dtype),
            AddDecayedWeights(self.weight_decay, self.mask),
            ScaleByLearningRate(self.learning_rate),
        )


scale_by_ademamix = ScaleByAdemamix
ademamix = Ademamix
scale_by_simplified_ademamix = ScaleBySimplifiedAdEMAMix
simplified_ademamix = SimplifiedAdEMAMix
