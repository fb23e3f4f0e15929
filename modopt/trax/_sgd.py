"""trax's `SGD` and `Momentum` (with Nesterov's variant, on by default)."""

from __future__ import annotations

from typing import Any

from .. import fields
from .._core.base import EmptyState
from .._core.fields import FINITE, POSITIVE, as_hyperparameter, hyperparameter, static
from ..combinators import Chain
from ..transforms import ScaleByLearningRate, Trace, TraceState
from ._base import Optimizer, TraxSide, learning_rate_field, weight_decay_after_learning_rate
from .._core.fields import Scalar
from jax.typing import DTypeLike


def _numbers(values: Any) -> Any:
    """`SGD`'s extra opt_params as array leaves (anything else passes on to validation)."""
    if not isinstance(values, dict):
        return values
    return {name: as_hyperparameter(value) for name, value in values.items()}


class SGD(Optimizer):
    r"""trax's stochastic gradient descent: `w <- w - learning_rate * g`.

    No slots (each weight's slot is `None`). `clip_grad_norm`, if given, first rescales all
    gradients together to that global L2 norm (trax's `clip_grads`). Extra keyword arguments
    become opt_params the math does not read, as in trax (`SGD(0.1, foo=1.0).opt_params` is
    `{"foo": 1.0, "learning_rate": 0.1}`); they are hyperparameters here too.

    Built from modopt's transforms: `scale_by_learning_rate(learning_rate)`, after
    `clip_by_global_norm(clip_grad_norm)` when clipping (trax's rule: the gradients are kept
    when their norm is strictly below the threshold).

    Example:
        >>> opt = modopt.trax.SGD(0.1)
        >>> slots, opt_params = opt.tree_init(weights)
        >>> weights, slots, metrics = opt.tree_update(0, grads, weights, slots, opt_params)

    Args:
        learning_rate: the step size, >= 0.
        clip_grad_norm: the global-norm threshold of the gradients, > 0; `None` (default): no
            clipping. Fixed at construction, as in trax (it is not an opt_param).

    Any other keyword argument (trax's `**init_opt_params`) is an extra opt_param, a number.
    """

    learning_rate: Scalar = learning_rate_field(0.01)
    clip_grad_norm: Scalar | None = hyperparameter(None, check=POSITIVE)
    init_opt_params: dict[str, Any] = hyperparameter(kind="dict", converter=_numbers)

    def __init__(self, learning_rate: Scalar = 0.01, clip_grad_norm: Scalar | None = None, **init_opt_params: Any):
        self.learning_rate = learning_rate
        self.clip_grad_norm = clip_grad_norm
        self.init_opt_params = init_opt_params
        self.trax_side = TraxSide()

    @property
    def opt_param_names(self):
        return (*self.init_opt_params, "learning_rate")

    def read_opt_params(self):
        return ("learning_rate",)

    def step_transform(self):
        return ScaleByLearningRate(self.learning_rate)

    def slot_to_state(self, step, slot):
        return EmptyState()

    def state_to_slot(self, state):
        return None


class Momentum(Optimizer):
    r"""trax's momentum SGD, Nesterov's variant by default, with decoupled weight decay.

    With velocity `v` (zeros at first, one slot per weight), `mass` `mu`, learning rate `lr`
    and weight decay `wd`:

        v <- mu * v + g
        u  = mu * v + g   (nesterov)   or   u = v
        w <- (1 - wd) * w - lr * u

    The weight decay is not multiplied by the learning rate, and is on by default (1e-5).
    The learning rate multiplies the velocity from outside, so a changing learning rate acts
    at once (trax's docstring describes the velocity with the rate inside; its code, followed
    here, keeps it outside). No gradient clipping (trax passes none).

    Built from modopt's transforms: `trace(mass, nesterov)`, `scale_by_learning_rate(lr)` and
    `add_decayed_weights(-weight_decay_rate)` after it (see
    `weight_decay_after_learning_rate`). Slot: the `trace` of `TraceState`.

    Args:
        learning_rate: the step size, >= 0.
        mass: the momentum coefficient, in [0, 1].
        weight_decay_rate: the fraction of each weight removed per step (any finite number).
        nesterov: Nesterov's look-ahead (static, fixed at construction as in trax).
        accumulator_dtype: the dtype of the velocity slot (modopt's, keyword-only; `None`: the
            weights' dtype).

    Reference: Sutskever et al., 2013, http://proceedings.mlr.press/v28/sutskever13.pdf
    """

    learning_rate: Scalar = learning_rate_field(0.01)
    mass: Scalar = fields.momentum(0.9)
    weight_decay_rate: Scalar = hyperparameter(1e-5, check=FINITE)
    nesterov: bool = static(default=True)
    accumulator_dtype: DTypeLike | None = fields.dtype(kw_only=True)

    @property
    def opt_param_names(self):
        return ("mass", "weight_decay_rate", "learning_rate")

    def step_transform(self):
        return Chain(
            Trace(self.mass, self.nesterov, self.accumulator_dtype),
            ScaleByLearningRate(self.learning_rate),
            weight_decay_after_learning_rate(self.weight_decay_rate),
        )

    def slot_to_state(self, step, slot):
        return (TraceState(trace=slot), EmptyState(), EmptyState())

    def state_to_slot(self, state):
        return state[0].trace
