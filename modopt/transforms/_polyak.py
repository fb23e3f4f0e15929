"""Polyak's step size: the loss gap over the squared gradient norm (reads the loss `value`)."""

from __future__ import annotations

from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from .._core.base import AbstractTransform, init_empty_state
from .._core.extra_args import ExtraArg, extra_arg
from .._core.fields import FINITE, NONNEGATIVE, choice, hyperparameter
from .._util.trees import sum_of_squares
from .._core.fields import Scalar

VARIANTS = ("sps", "sps+")
READS_VALUE = (ExtraArg("value", "the loss at the current parameters"),)
# Below this squared norm the step is 0 (optax's threshold: the float64 machine epsilon).
_TINY = float(np.finfo(np.float64).eps)


class ScaleByPolyak(AbstractTransform):
    r"""Multiplies updates by Polyak's step size, computed from the loss `value`.

    `update(updates, state, params, value=loss)` returns `step * updates` with

        step = min((value - f_min) / (||updates||^2 + eps), max_learning_rate)

    (`||.||` the L2 norm over all leaves), and `step = 0` where `||updates||^2 + eps` is
    below the float64 machine epsilon. `variant="sps+"` uses `max(value - f_min, 0)` in the
    numerator, so a loss below `f_min` gives no step. The step is computed in the dtype of
    the updates (the loss is cast to it).

    Args:
        f_min: a lower bound of the loss (`f*` of the papers), finite; 0 for interpolating models.
        max_learning_rate: the largest step, >= 0 (`inf` for none).
        eps: added to the squared norm, >= 0.
        variant: `"sps"` or `"sps+"`.

    References: Loizou et al., 2021, https://arxiv.org/abs/2002.10542; Garrigos et al., 2023
    (SPS+), https://arxiv.org/abs/2307.14528
    """

    extra_args_spec: ClassVar[tuple[ExtraArg, ...]] = READS_VALUE

    f_min: Scalar = hyperparameter(0.0, check=FINITE)
    max_learning_rate: Scalar = hyperparameter(1.0, check=NONNEGATIVE)
    eps: Scalar = hyperparameter(0.0, check=NONNEGATIVE)
    variant: str = choice("sps", VARIANTS)

    def init(self, params):
        return init_empty_state(params)

    def update(self, updates, state, params=None, **extra_args):
        value = extra_arg(extra_args, "value", self)
        squared_norm = sum_of_squares(updates)
        gap = jnp.asarray(value - self.f_min).astype(squared_norm.dtype)
        if self.variant == "sps+":
            gap = jnp.maximum(gap, 0)
        denominator = squared_norm + self.eps
        step = jnp.where(denominator <= _TINY, 0.0, jnp.minimum(gap / denominator, self.max_learning_rate))
        return jax.tree_util.tree_map(lambda u: step * u, updates), state


scale_by_polyak = ScaleByPolyak
