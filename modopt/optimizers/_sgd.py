"""Stochastic gradient descent, with optional (Nesterov) momentum."""

from __future__ import annotations

from .. import fields
from .._core.base import AbstractComposite
from .._core.fields import static
from ..combinators import Chain
from ..schedules._base import ScalarOrSchedule
from ..transforms import Identity, ScaleByLearningRate, Trace
from .._core.fields import Scalar
from jax.typing import DTypeLike


class Sgd(AbstractComposite):
    r"""Stochastic gradient descent: `params -= learning_rate * t`, with `t` the gradient or,
    given `momentum`, its trace `t = g + momentum * t` (Nesterov's variant with `nesterov`).

    Args:
        learning_rate: the step size: a number >= 0 or a schedule of the step count.
        momentum: the decay of the momentum trace `t = g + momentum * t`, in [0, 1], or `None` for
            no momentum.
        nesterov: use Nesterov's momentum `g + momentum * t` in place of `t` (static).
        accumulator_dtype: the dtype of the momentum trace; `None` keeps the parameters' dtype.

    Reference: Sutskever et al., 2013, http://proceedings.mlr.press/v28/sutskever13.pdf
    """

    learning_rate: ScalarOrSchedule = fields.learning_rate()
    momentum: Scalar | None = fields.momentum(None)
    nesterov: bool = static(default=False)
    accumulator_dtype: DTypeLike | None = fields.dtype()

    def build(self):
        if self.momentum is None:
            accumulate = Identity()
        else:
            accumulate = Trace(self.momentum, self.nesterov, self.accumulator_dtype)
        return Chain(accumulate, ScaleByLearningRate(self.learning_rate))


sgd = Sgd
