"""Decoupled weight decay: adding `weight_decay * params` to the updates."""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

from .. import fields
from .._core.base import AbstractTransform, EmptyState, require_params
from .._util.numerics import is_concrete_zero, safe_increment
from .._util.trees import map_updates
from ..schedules._base import ScalarOrSchedule, is_schedule
from .._core.masking import masked_init, masked_update
from .._core.masks import MaskOrFn


class WeightDecaySchedule(NamedTuple):
    """The step count of a scheduled weight decay."""

    count: jax.Array  # int32 scalar


def decay_init(tx: Any, params: Any) -> Any:
    """The state of a weight decay `tx` (a transform with fields `weight_decay` and `mask`):
    its masked state with a mask, the step count of a scheduled decay, else empty."""
    if tx.mask is not None:
        return masked_init(_unmasked(tx), tx.mask, params)
    if is_schedule(tx.weight_decay):
        return WeightDecaySchedule(count=jnp.zeros([], jnp.int32))
    return EmptyState()


def decay_update(
    tx: Any, updates: Any, state: Any, params: Any, extra_args: dict, rule: Callable[[Any, Any, Any], Any]
) -> tuple[Any, Any]:
    """The step of a weight decay `tx` (see `decay_init`): `rule(update, param, decay)` on each
    leaf, with `decay` the coefficient at this step; through `masked` when `tx` has a mask.
    A decay known to be 0 where the step is traced (`weight_decay=0.0`, see
    `modopt.fields.weight_decay`) leaves the updates as they are, as optax's does."""
    if tx.mask is not None:
        return masked_update(_unmasked(tx), tx.mask, updates, state, params, extra_args)
    require_params(params, tx)
    if is_schedule(tx.weight_decay):
        decay = tx.weight_decay(state.count)
        state = WeightDecaySchedule(count=safe_increment(state.count))
    else:
        decay = tx.weight_decay
    if is_concrete_zero(decay):
        return updates, state
    return map_updates(lambda u, p: rule(u, p, decay), updates, params), state


def _unmasked(tx: Any) -> Any:
    """`tx` without its mask, which the masking core (that of `masked`) applies it under."""
    return type(tx)(tx.weight_decay)


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
    mask: MaskOrFn = fields.mask()

    def acts_elementwise(self) -> bool:
        return self.mask is None  # a mask picks leaves, which grouping would merge

    def init(self, params):
        return decay_init(self, params)

    def update(self, updates, state, params=None, **extra_args):
        return decay_update(self, updates, state, params, extra_args, lambda g, p, decay: g + decay * p)


add_decayed_weights = AddDecayedWeights
AddDecayedWeightsState = EmptyState  # the state of a constant weight decay, named as in optax
