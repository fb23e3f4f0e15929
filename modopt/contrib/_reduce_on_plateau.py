"""Reducing the scale of the updates when the loss stops improving (`reduce_on_plateau`)."""

from __future__ import annotations

from typing import Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .._core.base import AbstractTransform
from .._core.extra_args import ExtraArg, extra_arg
from .._core.fields import (
    NONNEGATIVE,
    NONNEGATIVE_INTEGER,
    POSITIVE_INTEGER,
    UNIT,
    hyperparameter,
    interval,
    is_concrete,
)
from .._util.numerics import safe_increment
from .._core.fields import Scalar

READS_VALUE = (ExtraArg("value", "the loss (or metric) to monitor, a scalar"),)


class ReduceLROnPlateauState(NamedTuple):
    """The state of `reduce_on_plateau`.

    scale: the factor applied to the updates (in the lowest float dtype of the params).
    best_value: the best average value seen (in the highest float dtype of the params).
    plateau_count: averages without improvement since the last improvement or reduction (int32).
    cooldown_count: averages left to ignore after a reduction (int32).
    count: values accumulated into the current average (int32).
    avg_value: the running average of the values of the current accumulation.
    """

    scale: jax.Array
    best_value: jax.Array
    plateau_count: jax.Array
    cooldown_count: jax.Array
    count: jax.Array
    avg_value: jax.Array


class ReduceOnPlateau(AbstractTransform):
    r"""Multiplies the updates by a scale that drops by `factor` when the loss plateaus.

    Pass the monitored value at every step: `update(updates, state, params, value=loss)` or
    `optimizer.step(model, grads, value=loss)`. Values are averaged over
    `accumulation_size` calls; each average `a` then counts as an improvement when
    `a < (1 - rtol) * best - atol` (and becomes `best`). After `patience` averages in a row
    without improvement, `scale = max(scale * factor, min_scale)` and the next `cooldown`
    averages are ignored. The updates returned are `scale * updates`, with the scale after
    this call's bookkeeping.

    Put it after the learning rate, e.g. `chain(adam(1e-3), reduce_on_plateau())`: it scales
    the steps, whatever the learning rate's schedule. Every number is a hyperparameter:
    changing one does not retrace.

    Args:
        factor: the multiplier of the scale at a plateau, in (0, 1).
        patience: averages without improvement before a reduction, an integer >= 0.
        rtol: the relative improvement needed, in [0, 1].
        atol: the absolute improvement needed, >= 0; `rtol` and `atol` are not both 0.
        cooldown: averages ignored after a reduction, an integer >= 0.
        accumulation_size: values averaged before each comparison, an integer >= 1 (1 for a
            validation loss; more for noisy minibatch losses).
        min_scale: the scale never drops below this, >= 0.

    Example:
        >>> tx = modopt.chain(modopt.adam(1e-3), modopt.contrib.reduce_on_plateau(patience=5))
        >>> model, optimizer = optimizer.step(model, grads, value=loss)

    Reference: the `ReduceLROnPlateau` callback of Keras and PyTorch,
    https://pytorch.org/docs/stable/generated/torch.optim.lr_scheduler.ReduceLROnPlateau.html
    """

    extra_args_spec: ClassVar[tuple[ExtraArg, ...]] = READS_VALUE
    elementwise_updates = True

    factor: Scalar = hyperparameter(0.1, check=interval(0, 1, closed_lo=False))
    patience: Scalar = hyperparameter(10, check=NONNEGATIVE_INTEGER)
    rtol: Scalar = hyperparameter(1e-4, check=UNIT)
    atol: Scalar = hyperparameter(0.0, check=NONNEGATIVE)
    cooldown: Scalar = hyperparameter(0, check=NONNEGATIVE_INTEGER)
    accumulation_size: Scalar = hyperparameter(1, check=POSITIVE_INTEGER)
    min_scale: Scalar = hyperparameter(0.0, check=NONNEGATIVE)

    def __check_init__(self):
        if (
            is_concrete(self.rtol)
            and is_concrete(self.atol)
            and float(self.rtol) == 0
            and float(self.atol) == 0
        ):
            raise ValueError(
                "Invalid rtol and atol: both are 0 in ReduceOnPlateau (at least one must be > 0, or every "
                "equal value would count as an improvement)."
            )

    def init(self, params):
        dtypes = [jnp.result_type(leaf) for leaf in jax.tree_util.tree_leaves(params)]
        lowest, highest = _lowest_and_highest(dtypes)
        return ReduceLROnPlateauState(
            scale=jnp.asarray(1.0, lowest),
            best_value=jnp.asarray(np.inf, highest),
            plateau_count=jnp.zeros([], jnp.int32),
            cooldown_count=jnp.zeros([], jnp.int32),
            count=jnp.zeros([], jnp.int32),
            avg_value=jnp.asarray(0.0, highest),
        )

    def update(self, updates, state, params=None, **extra_args):
        value = jnp.asarray(extra_arg(extra_args, "value", self))
        if value.shape != ():
            raise ValueError(
                f"ReduceOnPlateau.update: `value` must be a scalar (the loss), got shape {value.shape}."
            )
        count = safe_increment(state.count)
        average = (state.count * state.avg_value + value.astype(state.avg_value.dtype)) / count
        state = state._replace(avg_value=average.astype(state.avg_value.dtype), count=count)
        # A closure, not the bound method: `cond` hashes its functions, and `self` may hold tracers.
        state = jax.lax.cond(count == self.accumulation_size, lambda s: self._compare(s), lambda s: s, state)
        return jax.tree_util.tree_map(lambda g: state.scale * g, updates), state

    def _compare(self, state: ReduceLROnPlateauState) -> ReduceLROnPlateauState:
        """The bookkeeping at the end of an accumulation: improvement, plateau, reduction."""
        improved = state.avg_value < (1 - self.rtol) * state.best_value - self.atol
        best = jnp.where(improved, state.avg_value.astype(state.best_value.dtype), state.best_value)
        plateau = jnp.where(improved, 0, safe_increment(state.plateau_count))
        reduce = plateau == self.patience
        cooling = state.cooldown_count > 0
        # In a cooldown the plateau count stays 0 and the scale is kept; otherwise a plateau
        # of `patience` averages reduces the scale and starts a cooldown.
        new_plateau = jnp.where(cooling | reduce, 0, plateau).astype(jnp.int32)
        reduced = jnp.maximum(jnp.where(reduce, state.scale * self.factor, state.scale), self.min_scale)
        new_scale = jnp.where(cooling, state.scale, reduced.astype(state.scale.dtype))
        new_cooldown = jnp.where(
            cooling, state.cooldown_count - 1, jnp.where(reduce, self.cooldown, 0)
        ).astype(jnp.int32)
        return ReduceLROnPlateauState(
            scale=new_scale,
            best_value=best.astype(state.best_value.dtype),
            plateau_count=new_plateau,
            cooldown_count=new_cooldown,
            count=jnp.zeros([], jnp.int32),
            avg_value=jnp.zeros([], state.avg_value.dtype),
        )


def _lowest_and_highest(dtypes: list[Any]) -> tuple[Any, Any]:
    """The dtypes every other one promotes from and to (bf16 and f32 among them); JAX's
    default float dtype for no parameters."""
    if not dtypes:
        default = jnp.asarray(0.0).dtype
        return default, default
    lowest = highest = dtypes[0]
    for dtype in dtypes[1:]:
        if jnp.promote_types(lowest, dtype) == lowest:
            lowest = dtype
        if jnp.promote_types(highest, dtype) == dtype:
            highest = dtype
    return lowest, highest


reduce_on_plateau = ReduceOnPlateau
