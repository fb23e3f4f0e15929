"""Rprop: per-element step sizes adapted from the sign agreement of successive gradients."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax.numpy as jnp
import numpy as np

from .. import fields
from .._core.base import AbstractTransform
from .._core.fields import NONNEGATIVE, hyperparameter, interval, is_concrete
from .._util.trees import map_updates
from ._real_only import reject_complex
from .._core.fields import Scalar
from .._state.moments import in_update_dtype, init_state, store, widen
from jax.typing import DTypeLike

SHRINK_FACTOR = interval(0, 1, closed_lo=False, closed_hi=True)  # (0, 1]
GROWTH_FACTOR = interval(1, float("inf"))  # [1, inf)


class ScaleByRpropState(NamedTuple):
    """Rprop's per-element step sizes and the previous step."""

    step_sizes: Any  # like the params (in `state_dtype` if set, like the next)
    prev_updates: Any  # the last step taken, `step_size * sign(g)` (0 after a sign change)


class ScaleByRprop(AbstractTransform):
    r"""Scales updates to `step_size * sign(g)`, with per-element step sizes adapted by Rprop.

    With `s = g * prev` (`prev` the previous step), each element's step size grows to
    `clip(step_size * eta_plus, min_step_size, max_step_size)` where `s > 0` (the gradient
    kept its sign), shrinks to `clip(step_size * eta_minus, ...)` where `s < 0` (it changed
    sign: the last step overshot), and stays where `s = 0`. The output is
    `step_size * sign(g)`, except 0 where the sign changed, and it is also stored as `prev`,
    so the step after a sign change never shrinks again (the iRprop- variant).

    The output points along the gradient: negate it to descend (`rprop` does).

    Unlike optax 0.2.8, which emits the previous step (its first step is 0 and every step
    lags by one; optax PR #1725), this emits the step just computed, as the paper and
    `torch.optim.Rprop` do. The state holds the same values as optax's.

    Args:
        learning_rate: the initial step size of every element, >= 0.
        eta_minus: factor applied to a step size after a sign change, in (0, 1].
        eta_plus: factor applied to a step size while the sign holds, >= 1.
        min_step_size: the smallest step size, >= 0.
        max_step_size: the largest step size, >= `min_step_size`.
        state_dtype: the dtype of the step sizes and of the previous step (modopt's,
            keyword-only); `None` keeps the parameters' dtype (see `fields.dtype`: state dtypes
            are computed in float32 and stored in this dtype).

    References: Riedmiller & Braun, 1993, https://ieeexplore.ieee.org/document/298623;
    Igel & Hüsken, 2003, https://doi.org/10.1016/S0925-2312(01)00700-7
    """

    elementwise_updates = True

    learning_rate: Scalar = hyperparameter(check=fields.FINITE_NONNEGATIVE)
    eta_minus: Scalar = hyperparameter(0.5, check=SHRINK_FACTOR)
    eta_plus: Scalar = hyperparameter(1.2, check=GROWTH_FACTOR)
    min_step_size: Scalar = hyperparameter(1e-6, check=NONNEGATIVE)
    max_step_size: Scalar = hyperparameter(50.0, check=NONNEGATIVE)
    state_dtype: DTypeLike | None = fields.dtype(kw_only=True)

    def __check_init__(self):
        check_step_size_bounds(self)

    def init(self, params):
        reject_complex(params, self)
        step_sizes = init_state(params, self.state_dtype, self.learning_rate)
        return ScaleByRpropState(step_sizes=step_sizes, prev_updates=init_state(params, self.state_dtype))

    def update(self, updates, state, params=None, **extra_args):
        dtype, grads = self.state_dtype, updates
        updates = widen(updates, dtype)  # with a state dtype, all in float32 at least
        agreement = map_updates(lambda g, prev: g * prev, updates, widen(state.prev_updates, dtype))

        def new_step_size(s, step_size):
            factor = jnp.where(s > 0, self.eta_plus, self.eta_minus)
            adapted = jnp.clip(step_size * factor, min=self.min_step_size, max=self.max_step_size)
            return jnp.where(s == 0, step_size, adapted)

        def step(s, g, step_size):
            return jnp.where(s < 0, jnp.zeros_like(g), step_size * jnp.sign(g))

        step_sizes = map_updates(new_step_size, agreement, widen(state.step_sizes, dtype))
        steps = map_updates(step, agreement, updates, step_sizes)
        new_state = ScaleByRpropState(step_sizes=store(step_sizes, dtype), prev_updates=store(steps, dtype))
        return in_update_dtype(steps, grads, dtype), new_state


def check_step_size_bounds(module: Any) -> None:
    """`min_step_size <= max_step_size`, where both are concrete."""
    low, high = module.min_step_size, module.max_step_size
    if is_concrete(low) and is_concrete(high) and np.any(np.asarray(low) > np.asarray(high)):
        raise ValueError(
            f"Invalid step-size bounds: min_step_size={np.asarray(low)} is above "
            f"max_step_size={np.asarray(high)} in {type(module).__name__}."
        )


scale_by_rprop = ScaleByRprop
