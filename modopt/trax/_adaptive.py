"""trax's diagonal adaptive optimizers: `RMSProp` and `Adam`."""

from __future__ import annotations

from .. import fields
from .._core.base import EmptyState
from .._core.fields import FINITE, POSITIVE, PROBABILITY_EXCLUSIVE, hyperparameter
from ..combinators import Chain
from ..transforms import ScaleByAdam, ScaleByAdamState, ScaleByLearningRate, ScaleByRms, ScaleByRmsState
from ._base import Optimizer, learning_rate_field, weight_decay_after_learning_rate
from .._core.fields import Scalar
from jax.typing import DTypeLike


class RMSProp(Optimizer):
    r"""trax's RMSProp: a moving average of squared gradients that starts at **one**.

    With `s` the slot of a weight (ones at first), `gamma` its decay and `lr` the learning rate:

        s <- gamma * s + (1 - gamma) * g^2
        w <- w - lr * g / (sqrt(s) + eps)

    `eps` is outside the square root. No weight decay. `clip_grad_norm`, if given, first
    rescales all gradients together to that global norm (trax's `clip_grads`).

    Built from modopt's transforms: `scale_by_rms(gamma, eps, initial_scale=1.0,
    eps_in_sqrt=False)` and `scale_by_learning_rate(lr)`. Slot: the `nu` of `ScaleByRmsState`.

    Args:
        learning_rate: the step size, >= 0.
        gamma: the decay of the average of squared gradients, in [0, 1).
        eps: added to the root of the average, >= 0.
        clip_grad_norm: the global-norm threshold of the gradients, > 0, or `None` (default).
        nu_dtype: the dtype of the slot (modopt's, keyword-only; `None`: the weights' dtype).

    Reference: Hinton, 2012, http://www.cs.toronto.edu/~tijmen/csc321/slides/lecture_slides_lec6.pdf
    """

    learning_rate: Scalar = learning_rate_field(0.001)
    gamma: Scalar = hyperparameter(0.9, check=PROBABILITY_EXCLUSIVE)
    eps: Scalar = fields.eps(1e-8)
    clip_grad_norm: Scalar | None = hyperparameter(None, check=POSITIVE)
    nu_dtype: DTypeLike | None = fields.dtype(kw_only=True)

    @property
    def opt_param_names(self):
        return ("gamma", "eps", "learning_rate")

    def step_transform(self):
        return Chain(
            ScaleByRms(self.gamma, self.eps, initial_scale=1.0, eps_in_sqrt=False, nu_dtype=self.nu_dtype),
            ScaleByLearningRate(self.learning_rate),
        )

    def slot_to_state(self, step, slot):
        return (ScaleByRmsState(nu=slot), EmptyState())

    def state_to_slot(self, state):
        return state[0].nu


class Adam(Optimizer):
    r"""trax's Adam, with decoupled weight decay that the learning rate does not scale.

    With slots `(m, v)` (zeros at first) and `t = step + 1` (the caller's step, from 0):

        m <- (1 - b1) g + b1 m,     v <- (1 - b2) g^2 + b2 v
        m_hat = m / (1 - b1^t),     v_hat = v / (1 - b2^t)
        w <- (1 - weight_decay_rate) w - lr * m_hat / (sqrt(v_hat) + eps)

    Differences from `modopt.adam` / `modopt.adamw` (optax's): `eps` defaults to 1e-5 (not
    1e-8), the learning rate to 1e-4, and weight decay is on (1e-5) and is **not** multiplied
    by the learning rate (`adamw`'s is). `clip_grad_norm`, if given, first rescales all
    gradients together to that global norm.

    Built from modopt's transforms: `scale_by_adam(b1, b2, eps)`, `scale_by_learning_rate(lr)`
    and `add_decayed_weights(-weight_decay_rate)` after it (see
    `weight_decay_after_learning_rate`). Slots: the `mu` and `nu` of `ScaleByAdamState`, whose
    `count` is the step.

    Args:
        learning_rate: the step size, >= 0.
        weight_decay_rate: the fraction of each weight removed per step (any finite number).
        b1: the decay of the first moment, in [0, 1).
        b2: the decay of the second moment, in [0, 1).
        eps: added to the root of the second moment, >= 0.
        clip_grad_norm: the global-norm threshold of the gradients, > 0, or `None` (default).
        mu_dtype: the dtype of the slot `m` (modopt's, keyword-only; `None`: the weights' dtype).
        nu_dtype: the dtype of the slot `v` (modopt's, keyword-only; `None`: the weights' dtype).

    Example:
        >>> optimizer = modopt.Optimizer(modopt.trax.Adam(1e-3), model)

    Reference: Kingma & Ba, 2014, https://arxiv.org/abs/1412.6980
    """

    learning_rate: Scalar = learning_rate_field(1e-4)
    weight_decay_rate: Scalar = hyperparameter(1e-5, check=FINITE)
    b1: Scalar = hyperparameter(0.9, check=PROBABILITY_EXCLUSIVE)
    b2: Scalar = hyperparameter(0.999, check=PROBABILITY_EXCLUSIVE)
    eps: Scalar = fields.eps(1e-5)
    clip_grad_norm: Scalar | None = hyperparameter(None, check=POSITIVE)
    mu_dtype: DTypeLike | None = fields.dtype(kw_only=True)
    nu_dtype: DTypeLike | None = fields.dtype(kw_only=True)

    @property
    def opt_param_names(self):
        return ("weight_decay_rate", "b1", "b2", "eps", "learning_rate")

    def step_transform(self):
        return Chain(
            ScaleByAdam(self.b1, self.b2, self.eps, mu_dtype=self.mu_dtype, nu_dtype=self.nu_dtype),
            ScaleByLearningRate(self.learning_rate),
            weight_decay_after_learning_rate(self.weight_decay_rate),
        )

    def slot_to_state(self, step, slot):
        m, v = slot
        return (ScaleByAdamState(count=step, mu=m, nu=v), EmptyState(), EmptyState())

    def state_to_slot(self, state):
        return (state[0].mu, state[0].nu)
