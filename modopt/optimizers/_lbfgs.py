"""L-BFGS with a line search."""

from __future__ import annotations

from typing import Any

import equinox as eqx

from .. import fields
from .._core.base import AbstractComposite, AbstractTransform, as_transform
from .._core.fields import static
from ..combinators import Chain
from ..schedules._base import ScalarOrSchedule
from ..transforms import Identity, Scale, ScaleByLBFGS, ScaleByLearningRate, ScaleByZoomLinesearch
from jax.typing import DTypeLike


def _default_linesearch() -> AbstractTransform:
    # L-BFGS's direction is Newton-like: a step of 1 is the natural first guess.
    return ScaleByZoomLinesearch(max_linesearch_steps=20, initial_guess_strategy="one")


def _as_linesearch(tx: Any) -> AbstractTransform:
    return Identity() if tx is None else as_transform(tx, "lbfgs linesearch")


class Lbfgs(AbstractComposite):
    r"""L-BFGS: `params -= eta_k * P_k g_k`, with `P_k` L-BFGS's inverse-Hessian approximation.

    `P_k g_k` is `scale_by_lbfgs`'s direction; the step size `eta_k` comes from `linesearch`
    (by default a zoom line search for the strong Wolfe conditions, starting from 1 at each
    step), times `learning_rate` if one is given. The line search reads the extra arguments
    `value` (the loss), `grad` (its gradient) and `value_fn` (the loss as a function of the
    parameters, or of the model with `Optimizer.step`). With `linesearch=None` the step is
    `learning_rate` alone (1 if that is `None` too) and no extra argument is needed.

    The transform is the chain `scale_by_lbfgs(memory_size, scale_init_precond)`, then
    `scale_by_learning_rate(learning_rate)` (`scale(-1)` when `learning_rate` is `None`), then
    `linesearch`. Its hyperparameters, the line search's included, are read and set by name.

    Args:
        learning_rate: an extra factor on the step, a number or a schedule; `None`: none.
        memory_size: the number of secant pairs kept (static), >= 1.
        scale_init_precond: scale the initial inverse Hessian by `<s, y> / <y, y>` (static).
        linesearch: the transform choosing the step size (a modopt or optax transform), or
            `None` for no line search.
        memory_dtype: the dtype of the memories of `s` and `y` (modopt's, keyword-only; see
            `scale_by_lbfgs`); `None` keeps the parameters' dtype.

    Example:
        >>> optimizer = modopt.Optimizer(modopt.lbfgs(), model)
        >>> value, grads = eqx.filter_value_and_grad(loss)(model)
        >>> model, optimizer = optimizer.step(model, grads, value=value, grad=grads, value_fn=loss)

    This keeps `2 * memory_size` copies of the parameters: it suits small and medium models
    and deterministic (full-batch) losses.

    References: Nocedal & Wright, Numerical Optimization, 1999 (Algorithms 7.4 and 7.5),
    https://doi.org/10.1007/978-0-387-40065-5; Liu & Nocedal, 1989,
    https://doi.org/10.1007/BF01589116
    """

    learning_rate: ScalarOrSchedule = fields.learning_rate(None)
    memory_size: int = static(default=10)
    scale_init_precond: bool = static(default=True)
    linesearch: AbstractTransform = eqx.field(default_factory=_default_linesearch, converter=_as_linesearch)
    memory_dtype: DTypeLike | None = fields.dtype(kw_only=True)

    def build(self):
        scaling = Scale(-1.0) if self.learning_rate is None else ScaleByLearningRate(self.learning_rate)
        lbfgs = ScaleByLBFGS(self.memory_size, self.scale_init_precond, memory_dtype=self.memory_dtype)
        return Chain(lbfgs, scaling, self.linesearch)


lbfgs = Lbfgs
