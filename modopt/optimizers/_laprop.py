"""LaProp as a named optimizer."""

from __future__ import annotations

from .. import fields
from .._core.base import AbstractComposite
from ..combinators import Chain
from ..schedules._base import ScalarOrSchedule
from ..transforms._laprop import ScaleByLaprop
from ..transforms._scale import ScaleByLearningRate
from ..transforms._weight_decay import AddDecayedWeights
from .._core.fields import Scalar
from jax.typing import DTypeLike
from .._core.masks import MaskOrFn


class Laprop(AbstractComposite):
    r"""LaProp: `params -= learning_rate * (m_hat + weight_decay * params)`, where `m_hat` is the
    bias-corrected momentum of RMS-normalized gradients (see `scale_by_laprop`).

    Momentum and adaptivity are decoupled: each gradient is divided by the RMS of the gradients
    before it enters the momentum, so `b1` and `b2` are free of Adam's `b1 <= sqrt(b2)` coupling.
    The defaults are the paper's and the reference code's (`lr=4e-4` there). Weight decay is
    decoupled as in AdamW (on the parameters before the step); pytorch_optimizer's `LaProp`
    multiplies the already stepped parameters by `1 - learning_rate * weight_decay`, which
    differs by `learning_rate**2 * weight_decay * m_hat`.

    Args:
        learning_rate: the step size: a number >= 0 or a schedule of the step count.
        b1: the decay rate of the momentum of normalized gradients, in [0, 1).
        b2: the decay rate of the second moment (the EMA of squared gradients), in [0, 1).
        eps: added to the bias-corrected RMS before dividing, >= 0.
        weight_decay: the coefficient of decoupled weight decay: `weight_decay * params` is added
            to the update before the learning rate scales it.
        mask: which parameters the weight decay applies to: `None` for all, a pytree of bools with
            the params' structure, or a function of the params returning one.
        mu_dtype: the dtype of the momentum (for instance `jnp.bfloat16` to save memory); `None`
            keeps the parameters' dtype.
        nu_dtype: the dtype of the second moment; `None` keeps the parameters' dtype.

    Example:
        >>> optimizer = modopt.Optimizer(modopt.laprop(4e-4), model)

    Reference: Ziyin, Wang & Ueda, 2020, "LaProp: Separating Momentum and Adaptivity in Adam",
    https://arxiv.org/abs/2002.04839
    """

    learning_rate: ScalarOrSchedule = fields.learning_rate()
    b1: Scalar = fields.decay_rate(0.9)
    b2: Scalar = fields.decay_rate(0.999)
    eps: Scalar = fields.eps(1e-15)
    weight_decay: ScalarOrSchedule = fields.weight_decay(0.0)
    mask: MaskOrFn = fields.mask()
    mu_dtype: DTypeLike | None = fields.dtype()
    nu_dtype: DTypeLike | None = fields.dtype(kw_only=True)

    def build(self):
        return Chain(
            ScaleByLaprop(self.b1, self.b2, self.eps, self.mu_dtype, nu_dtype=self.nu_dtype),
            AddDecayedWeights(self.weight_decay, self.mask),
            ScaleByLearningRate(self.learning_rate),
        )


laprop = Laprop
