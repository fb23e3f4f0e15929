"""Layer-wise adaptive optimizers (LARS, LAMB, Fromage), signSGD and Signum."""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp

from .. import fields
from .._core.base import AbstractComposite
from .._core.fields import NONNEGATIVE, UNIT, hyperparameter, static
from ..combinators import Chain, Masked
from ..schedules._base import MappedSchedule, ScalarOrSchedule, is_schedule
from ..transforms import (
    AddDecayedWeights,
    Ema,
    ScaleByAdam,
    ScaleByLearningRate,
    ScaleBySign,
    ScaleByTrustRatio,
    Trace,
)
from .._core.fields import Scalar
from jax.typing import DTypeLike
from .._core.masks import MaskOrFn


class Lars(AbstractComposite):
    r"""LARS: SGD with momentum whose step for each layer is scaled by the layer's trust ratio.

    With `g` the gradient of a layer (a leaf) with parameters `p`:

        d = g + weight_decay * p                           (where `weight_decay_mask`)
        d = trust_coefficient * ||p|| / (||d|| + eps) * d   (where `trust_ratio_mask`)
        t = -learning_rate * d + momentum * t
        params += t                                        (Nesterov: -learning_rate * d + momentum * t)

    The masks (`True` for all layers, a pytree of bools, or a function of the params) usually
    exclude biases and normalization scales.

    Args:
        learning_rate: the step size: a number >= 0 or a schedule of the step count.
        weight_decay: the coefficient of weight decay added to the gradient, >= 0.
        weight_decay_mask: where the weight decay applies: `True` for all layers, a pytree of bools
            or a function of the params returning one.
        trust_coefficient: the factor `eta` of the trust ratio `eta * ||p|| / (||d|| + eps)`, >= 0.
        eps: added to the update's norm in the trust ratio, >= 0.
        trust_ratio_mask: where the trust ratio applies: `True` for all layers, a pytree of bools or
            a function of the params returning one.
        momentum: the decay of the momentum trace, in [0, 1].
        nesterov: use Nesterov's momentum `g + momentum * t` in place of `t` (static).
        accumulator_dtype: the dtype of the momentum trace (as `sgd`'s); `None` keeps the
            parameters' dtype.

    Example:
        >>> optimizer = modopt.Optimizer(modopt.lars(0.1, weight_decay=1e-4), model)

    Reference: You et al., 2017, https://arxiv.org/abs/1708.03888
    """

    learning_rate: ScalarOrSchedule = fields.learning_rate()
    weight_decay: ScalarOrSchedule = fields.weight_decay(0.0)
    weight_decay_mask: MaskOrFn = fields.mask(True)
    trust_coefficient: Scalar = hyperparameter(default=0.001, check=NONNEGATIVE)
    eps: Scalar = fields.eps(0.0)
    trust_ratio_mask: MaskOrFn = fields.mask(True)
    momentum: Scalar = fields.momentum(0.9)
    nesterov: bool = static(default=False)
    accumulator_dtype: DTypeLike | None = fields.dtype(kw_only=True)

    def build(self):
        return Chain(
            AddDecayedWeights(self.weight_decay, mask=self.weight_decay_mask),
            Masked(
                ScaleByTrustRatio(trust_coefficient=self.trust_coefficient, eps=self.eps),
                self.trust_ratio_mask,
            ),
            ScaleByLearningRate(self.learning_rate),
            Trace(self.momentum, self.nesterov, self.accumulator_dtype),
        )


class Lamb(AbstractComposite):
    r"""LAMB: Adam whose step for each layer is scaled by the layer's trust ratio.

    With `a` Adam's update for a layer with parameters `p` (see `scale_by_adam`):

        d = a + weight_decay * p                 (where `mask`; everywhere if `mask` is None)
        params -= learning_rate * ||p|| / ||d|| * d

    (the ratio is 1 where either norm is zero).

    Args:
        learning_rate: the step size: a number >= 0 or a schedule of the step count.
        b1: the decay rate of the first moment (the EMA of gradients), in [0, 1).
        b2: the decay rate of the second moment (the EMA of squared gradients), in [0, 1).
        eps: added to the denominator's square root for numerical stability, >= 0.
        eps_root: added to the second moment inside the square root, >= 0 (for instance to keep
            gradients through the square root finite when differentiating through the optimizer).
        weight_decay: the coefficient of weight decay added to Adam's update before the trust ratio,
            >= 0.
        mask: which parameters the weight decay applies to: `None` for all, a pytree of bools with
            the params' structure, a function of the params returning one (such as `modopt.weight_decay_mask`).
        mu_dtype: the dtype of the first moment; `None` keeps the parameters' dtype.
        nu_dtype: the dtype of the second moment; `None` keeps the parameters' dtype.

    Example:
        >>> optimizer = modopt.Optimizer(modopt.lamb(1e-3, weight_decay=1e-2), model)

    Reference: You et al., 2020, https://arxiv.org/abs/1904.00962
    """

    learning_rate: ScalarOrSchedule = fields.learning_rate()
    b1: Scalar = fields.decay_rate(0.9)
    b2: Scalar = fields.decay_rate(0.999)
    eps: Scalar = fields.eps(1e-6)
    eps_root: Scalar = fields.eps(0.0)
    weight_decay: ScalarOrSchedule = fields.weight_decay(0.0)
    mask: MaskOrFn = fields.mask()
    mu_dtype: DTypeLike | None = fields.dtype(kw_only=True)
    nu_dtype: DTypeLike | None = fields.dtype(kw_only=True)

    def build(self):
        return Chain(
            ScaleByAdam(self.b1, self.b2, self.eps, self.eps_root, self.mu_dtype, nu_dtype=self.nu_dtype),
            AddDecayedWeights(self.weight_decay, mask=self.mask),
            ScaleByTrustRatio(),
            ScaleByLearningRate(self.learning_rate),
        )


def _fromage_step(learning_rate: Any) -> Any:
    """Fromage's step size, `lr / sqrt(1 + lr^2)`."""
    return learning_rate / jnp.sqrt(1 + learning_rate**2)


def _fromage_shrink(learning_rate: Any) -> Any:
    """Fromage's (negative) weight decay, `1 / sqrt(1 + lr^2) - 1`, free of cancellation."""
    root = jnp.sqrt(1 + learning_rate**2)
    return -(learning_rate**2) / (root * (1 + root))


class Fromage(AbstractComposite):
    r"""Fromage: steps of a fixed size relative to each layer's norm, then a shrink.

    With `g` the gradient of a layer with parameters `p`:

        p <- (p - learning_rate * ||p|| / ||g|| * g) / sqrt(1 + learning_rate^2)

    Both norms are floored at `min_norm`. The division keeps the parameters' norms from
    growing; it is applied as a negative weight decay `1 / sqrt(1 + lr^2) - 1`.

    Args:
        learning_rate: the relative step size: each layer moves by about `learning_rate` times its
            norm; a number >= 0 or a schedule.
        min_norm: the floor of both norms `||p||` and `||g||`, > 0, so that zero layers and zero
            gradients are safe.

    Example:
        >>> optimizer = modopt.Optimizer(modopt.fromage(1e-2), model)

    Reference: Bernstein et al., 2020, https://arxiv.org/abs/2002.03432
    """

    learning_rate: ScalarOrSchedule = fields.learning_rate()
    min_norm: Scalar = hyperparameter(default=1e-6, check=NONNEGATIVE)

    def build(self):
        if is_schedule(self.learning_rate):
            step = MappedSchedule(self.learning_rate, _fromage_step)
            shrink = MappedSchedule(self.learning_rate, _fromage_shrink)
        else:
            step, shrink = _fromage_step(self.learning_rate), _fromage_shrink(self.learning_rate)
        return Chain(ScaleByTrustRatio(self.min_norm), ScaleByLearningRate(step), AddDecayedWeights(shrink))


class SignSgd(AbstractComposite):
    r"""signSGD: steps of `learning_rate` along the sign of each gradient element.

        params -= learning_rate * sign(g)

    Args:
        learning_rate: the step size: a number >= 0 or a schedule of the step count.

    Example:
        >>> optimizer = modopt.Optimizer(modopt.sign_sgd(1e-3), model)

    References: Bernstein et al., 2018, https://arxiv.org/abs/1802.04434;
    Balles et al., 2020, https://arxiv.org/abs/2002.08056
    """

    learning_rate: ScalarOrSchedule = fields.learning_rate()

    def build(self):
        return Chain(ScaleBySign(), ScaleByLearningRate(self.learning_rate))


class Signum(AbstractComposite):
    r"""Signum: steps along the sign of a moving average of the gradients (signSGD with momentum).

        m = beta * m + (1 - beta) * g
        params -= learning_rate * sign(m)

    The average is not debiased: only its sign is used.

    Args:
        learning_rate: the step size: a number >= 0 or a schedule of the step count.
        beta: the decay rate of the moving average, in [0, 1].
        accumulator_dtype: the dtype of the moving average; `None` for the gradients' dtype (static).

    Example:
        >>> optimizer = modopt.Optimizer(modopt.signum(1e-3), model)

    References: Bernstein et al., 2018, https://arxiv.org/abs/1802.04434;
    Zhao et al., 2024, https://arxiv.org/abs/2407.07972
    """

    learning_rate: ScalarOrSchedule = fields.learning_rate()
    beta: Scalar = fields.decay_rate(0.9, check=UNIT)
    accumulator_dtype: DTypeLike | None = fields.dtype()

    def build(self):
        return Chain(
            Ema(self.beta, debias=False, accumulator_dtype=self.accumulator_dtype),
            ScaleBySign(),
            ScaleByLearningRate(self.learning_rate),
        )


lars = Lars
lamb = Lamb
fromage = Fromage
sign_sgd = SignSgd
signum = Signum
