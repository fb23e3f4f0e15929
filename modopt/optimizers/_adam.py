"""Adam and AdamW."""

from __future__ import annotations

from typing import Any

from .._base import AbstractComposite
from .._fields import (
    NONNEGATIVE,
    PROBABILITY_EXCLUSIVE,
    as_static_tree,
    canonical_dtype,
    hyperparameter,
    static,
)
from ..combinators import Chain
from ..schedules._base import scalar_or_schedule
from ..transforms import AddDecayedWeights, ScaleByAdam, ScaleByLearningRate


class Adam(AbstractComposite):
    r"""Adam: `params -= learning_rate * m_hat / (sqrt(v_hat + eps_root) + eps)`.

    `m_hat`, `v_hat` are the bias-corrected moment estimates of `scale_by_adam`; with
    `nesterov=True` this is NAdam.

    Example:
        >>> optimizer = modopt.Optimizer(modopt.adam(1e-3), model)

    Reference: Kingma & Ba, 2014, https://arxiv.org/abs/1412.6980
    """

    learning_rate: Any = scalar_or_schedule(check=NONNEGATIVE)
    b1: Any = hyperparameter(default=0.9, check=PROBABILITY_EXCLUSIVE)
    b2: Any = hyperparameter(default=0.999, check=PROBABILITY_EXCLUSIVE)
    eps: Any = hyperparameter(default=1e-8, check=NONNEGATIVE)
    eps_root: Any = hyperparameter(default=0.0, check=NONNEGATIVE)
    mu_dtype: Any = static(default=None, converter=canonical_dtype)
    nesterov: bool = static(default=False, kw_only=True)

    def build(self):
        return Chain(
            ScaleByAdam(self.b1, self.b2, self.eps, self.eps_root, self.mu_dtype, nesterov=self.nesterov),
            ScaleByLearningRate(self.learning_rate),
        )


class AdamW(AbstractComposite):
    r"""Adam with decoupled weight decay:
    `params -= learning_rate * (adam_update + weight_decay * params)`.

    `mask` restricts the decay to some parameters (see `add_decayed_weights`).

    Reference: Loshchilov & Hutter, 2019, https://arxiv.org/abs/1711.05101
    """

    learning_rate: Any = scalar_or_schedule(check=NONNEGATIVE)
    b1: Any = hyperparameter(default=0.9, check=PROBABILITY_EXCLUSIVE)
    b2: Any = hyperparameter(default=0.999, check=PROBABILITY_EXCLUSIVE)
    eps: Any = hyperparameter(default=1e-8, check=NONNEGATIVE)
    eps_root: Any = hyperparameter(default=0.0, check=NONNEGATIVE)
    mu_dtype: Any = static(default=None, converter=canonical_dtype)
    weight_decay: Any = scalar_or_schedule(default=1e-4, check=NONNEGATIVE)
    mask: Any = static(default=None, converter=as_static_tree)
    nesterov: bool = static(default=False, kw_only=True)

    def build(self):
        return Chain(
            ScaleByAdam(self.b1, self.b2, self.eps, self.eps_root, self.mu_dtype, nesterov=self.nesterov),
            AddDecayedWeights(self.weight_decay, self.mask),
            ScaleByLearningRate(self.learning_rate),
        )


adam = Adam
adamw = AdamW
