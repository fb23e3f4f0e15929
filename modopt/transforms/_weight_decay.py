"""Decoupled weight decay: adding `weight_decay * params` to the updates."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from .. import fields
from .._base import AbstractTransform, EmptyState, require_params
from .._numerics import safe_increment
from .._trees import map_updates
from ..combinators._masked import Masked
from ..schedules._base import ScalarOrSchedule, is_schedule


class WeightDecaySchedule(NamedTuple):
    """The step count of a scheduled weight decay."""

    count: jax.Array  # int32 scalar


class AddDecayedWeights(AbstractTransform):
    """Adds `weight_decay * param` to each update (decoupled weight decay, as in AdamW).

    `weight_decay` is a number or a schedule. `mask` (a pytree of bools shaped like a prefix
    of the params, or a function of the params returning one) limits the decay to the leaves
    marked `True`; the transform is then applied through `masked`, and so is its state.

    Args:
        weight_decay: the coefficient of the decay, a number >= 0 or a schedule.
        mask: which leaves the decay applies to: `None` for all, a pytree of bools shaped like a
            prefix of the params, or a function of the params returning one (such as
            `modopt.weight_decay_mask`).

    Reference: Loshchilov & Hutter, 2019, https://arxiv.org/abs/1711.05101
    """

    elementwise_updates = True

    weight_decay: ScalarOrSchedule = fields.weight_decay(0.0)
    mask: Any = fields.mask()

    def _as_masked(self) -> Masked:
        return Masked(AddDecayedWeights(self.weight_decay), self.mask)

    def acts_elementwise(self) -> bool:
        return self.mask is None  # a mask picks leaves, which grouping would merge

    def init(self, params):
        if self.mask is not None:
            return self._as_masked().init(params)
        if is_schedule(self.weight_decay):
            return WeightDecaySchedule(count=jnp.zeros([], jnp.int32))
        return EmptyState()

    def update(self, updates, state, params=None, **extra_args):
        if self.mask is not None:
            return self._as_masked().update(updates, state, params, **extra_args)
        require_params(params, self)
        if is_schedule(self.weight_decay):
            decay = self.weight_decay(state.count)
            state = WeightDecaySchedule(count=safe_increment(state.count))
        else:
            decay = self.weight_decay
        updates = map_updates(lambda g, p: g + decay * p, updates, params)
        return updates, state


add_decayed_weights = AddDecayedWeights
AddDecayedWeightsState = EmptyState  # the state of a constant weight decay, named as in optax
