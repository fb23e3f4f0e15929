"""Adam and AdamW."""

from __future__ import annotations

from .. import fields
from .._core.base import AbstractComposite
from .._core.fields import static
from ..combinators import Chain
from ..schedules._base import ScalarOrSchedule, schedule_annotations
from ..transforms import AddDecayedWeights, ScaleByAdam, ScaleByLearningRate
from .._core.fields import Scalar
from jax.typing import DTypeLike
from .._core.masks import MaskOrFn


class Adam(AbstractComposite):
    r"""Adam: `params -= learning_rate * m_hat / (sqrt(v_hat + eps_root) + eps)`.

    `m_hat`, `v_hat` are the bias-corrected moment estimates of `scale_by_adam`; with
    `nesterov=True` this is NAdam.

    Args:
        learning_rate: the step size: a number >= 0 or a schedule of the step count.
        b1: the decay rate of the first moment (the EMA of gradients), in [0, 1).
        b2: the decay rate of the second moment (the EMA of squared gradients), in [0, 1).
        eps: added to the denominator's square root for numerical stability, >= 0.
        eps_root: added to the second moment inside the square root, >= 0 (for instance to keep
            gradients through the square root finite when differentiating through the optimizer).
        mu_dtype: the dtype of the first moment (for instance `jnp.bfloat16` to save memory); `None`
            keeps the parameters' dtype.
        nu_dtype: the dtype of the second moment; `None` keeps the parameters' dtype. With either
            dtype set, the moments are accumulated in float32 and stored in it (see `fields.dtype`).
        nesterov: use Nesterov's look-ahead first moment (NAdam) instead of the bias-corrected one
            (static).

    Example:
        >>> optimizer = modopt.Optimizer(modopt.adam(1e-3), model)

    Reference: Kingma & Ba, 2014, https://arxiv.org/abs/1412.6980
    """

    learning_rate: ScalarOrSchedule = fields.learning_rate()
    b1: Scalar = fields.decay_rate(0.9)
    b2: Scalar = fields.decay_rate(0.999)
    eps: Scalar = fields.eps(1e-8)
    eps_root: Scalar = fields.eps(0.0)
    mu_dtype: DTypeLike | None = fields.dtype()
    nu_dtype: DTypeLike | None = fields.dtype(kw_only=True)
    nesterov: bool = static(default=False, kw_only=True)

    def build(self):
        return Chain(
            ScaleByAdam(
                self.b1, self.b2, self.eps, self.eps_root, self.mu_dtype, nu_dtype=self.nu_dtype, nesterov=self.nesterov
            ),
            ScaleByLearningRate(self.learning_rate),
        )


class AdamW(AbstractComposite):
    r"""Adam with decoupled weight decay:
    `params -= learning_rate * (adam_update + weight_decay * params)`.

    `mask` restricts the decay to some parameters (see `add_decayed_weights`).

    Args:
        learning_rate: the step size: a number >= 0 or a schedule of the step count.
        b1: the decay rate of the first moment (the EMA of gradients), in [0, 1).
        b2: the decay rate of the second moment (the EMA of squared gradients), in [0, 1).
        eps: added to the denominator's square root for numerical stability, >= 0.
        eps_root: added to the second moment inside the square root, >= 0 (for instance to keep
            gradients through the square root finite when differentiating through the optimizer).
        mu_dtype: the dtype of the first moment (for instance `jnp.bfloat16` to save memory); `None`
            keeps the parameters' dtype.
        nu_dtype: the dtype of the second moment; `None` keeps the parameters' dtype. With either
            dtype set, the moments are accumulated in float32 and stored in it (see `fields.dtype`).
        weight_decay: the coefficient of decoupled weight decay: `weight_decay * params` is added to
            the update before the learning rate scales it, >= 0.
        mask: which parameters the weight decay applies to: `None` for all, a pytree of bools with
            the params' structure, a function of the params returning one (such as `modopt.weight_decay_mask`).
        nesterov: use Nesterov's look-ahead first moment (NAdam) instead of the bias-corrected one
            (static).

    Reference: Loshchilov & Hutter, 2019, https://arxiv.org/abs/1711.05101
    """

    learning_rate: ScalarOrSchedule = fields.learning_rate()
    b1: Scalar = fields.decay_rate(0.9)
    b2: Scalar = fields.decay_rate(0.999)
    eps: Scalar = fields.eps(1e-8)
    eps_root: Scalar = fields.eps(0.0)
    mu_dtype: DTypeLike | None = fields.dtype()
    nu_dtype: DTypeLike | None = fields.dtype(kw_only=True)
    weight_decay: ScalarOrSchedule = fields.weight_decay(1e-4)
    mask: MaskOrFn = fields.mask()
    nesterov: bool = static(default=False, kw_only=True)

    def build(self):
        return Chain(
            ScaleByAdam(
                self.b1, self.b2, self.eps, self.eps_root, self.mu_dtype, nu_dtype=self.nu_dtype, nesterov=self.nesterov
            ),
            AddDecayedWeights(self.weight_decay, self.mask),
            ScaleByLearningRate(self.learning_rate),
        )


adam = Adam
adamw = AdamW


@schedule_annotations
def nadam(
    learning_rate: ScalarOrSchedule,
    b1: Scalar = 0.9,
    b2: Scalar = 0.999,
    eps: Scalar = 1e-8,
    eps_root: Scalar = 0.0,
    mu_dtype: DTypeLike | None = None,
    *,
    nu_dtype: DTypeLike | None = None,
) -> Adam:
    r"""NAdam: Adam with Nesterov momentum, i.e. `Adam(..., nesterov=True)`.

    `params -= learning_rate * m_hat / (sqrt(v_hat + eps_root) + eps)` with Nesterov's
    look-ahead first moment `m_hat = b1 m / (1 - b1^(t+1)) + (1 - b1) g / (1 - b1^t)` and
    `v_hat = v / (1 - b2^t)`. It returns an `Adam`, so its hyperparameters are read and set
    like Adam's.

    Args:
        learning_rate: the step size: a number >= 0 or a schedule of the step count.
        b1: the decay rate of the first moment (the EMA of gradients), in [0, 1).
        b2: the decay rate of the second moment (the EMA of squared gradients), in [0, 1).
        eps: added to the denominator's square root for numerical stability, >= 0.
        eps_root: added to the second moment inside the square root, >= 0 (for instance to keep
            gradients through the square root finite when differentiating through the optimizer).
        mu_dtype: the dtype of the first moment (for instance `jnp.bfloat16` to save memory); `None`
            keeps the parameters' dtype.
        nu_dtype: the dtype of the second moment; `None` keeps the parameters' dtype. With either
            dtype set, the moments are accumulated in float32 and stored in it (see `fields.dtype`).

    Example:
        >>> optimizer = modopt.Optimizer(modopt.nadam(1e-3), model)

    Reference: Dozat, 2016, https://openreview.net/forum?id=OM0jvwB8jIp57ZJjtNEZ
    """
    return Adam(learning_rate, b1, b2, eps, eps_root, mu_dtype, nu_dtype=nu_dtype, nesterov=True)


@schedule_annotations
def nadamw(
    learning_rate: ScalarOrSchedule,
    b1: Scalar = 0.9,
    b2: Scalar = 0.999,
    eps: Scalar = 1e-8,
    eps_root: Scalar = 0.0,
    mu_dtype: DTypeLike | None = None,
    weight_decay: ScalarOrSchedule = 1e-4,
    mask: MaskOrFn = None,
    *,
    nu_dtype: DTypeLike | None = None,
) -> AdamW:
    r"""NAdamW: AdamW with Nesterov momentum, i.e. `AdamW(..., nesterov=True)`.

    `params -= learning_rate * (m_hat / (sqrt(v_hat + eps_root) + eps) + weight_decay * params)`
    with NAdam's look-ahead `m_hat` (see `nadam`). It returns an `AdamW`.

    Args:
        learning_rate: the step size: a number >= 0 or a schedule of the step count.
        b1: the decay rate of the first moment (the EMA of gradients), in [0, 1).
        b2: the decay rate of the second moment (the EMA of squared gradients), in [0, 1).
        eps: added to the denominator's square root for numerical stability, >= 0.
        eps_root: added to the second moment inside the square root, >= 0 (for instance to keep
            gradients through the square root finite when differentiating through the optimizer).
        mu_dtype: the dtype of the first moment (for instance `jnp.bfloat16` to save memory); `None`
            keeps the parameters' dtype.
        nu_dtype: the dtype of the second moment; `None` keeps the parameters' dtype. With either
            dtype set, the moments are accumulated in float32 and stored in it (see `fields.dtype`).
        weight_decay: the coefficient of decoupled weight decay: `weight_decay * params` is added to
            the update before the learning rate scales it, >= 0.
        mask: which parameters the weight decay applies to: `None` for all, a pytree of bools with
            the params' structure, a function of the params returning one (such as `modopt.weight_decay_mask`).

    References: Dozat, 2016, https://openreview.net/forum?id=OM0jvwB8jIp57ZJjtNEZ;
    Loshchilov & Hutter, 2019, https://arxiv.org/abs/1711.05101
    """
    return AdamW(learning_rate, b1, b2, eps, eps_root, mu_dtype, weight_decay, mask, nu_dtype=nu_dtype, nesterov=True)
