"""Cautious weight decay: decoupled weight decay only where the update and the parameter share a sign."""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp

from .. import fields
from .._core.base import AbstractTransform
from ..schedules._base import ScalarOrSchedule
from ._weight_decay import decay_init, decay_update
from .._core.masks import MaskOrFn


class AddCautiousDecayedWeights(AbstractTransform):
    r"""Adds `weight_decay * param` to each update where the update and the parameter share a sign
    (cautious weight decay).

    `update = u + weight_decay * (u * param >= 0) * param`: the decay applies only to the
    coordinates where the optimizer's update `u` already moves the parameter toward zero, so it
    never pushes against the loss. Place it where `add_decayed_weights` goes: after the
    direction (`scale_by_adam`, `scale_by_lion`, ...) and before `scale_by_learning_rate`, so
    that `u` is the direction the learning rate then negates. `weight_decay` is a number or a
    schedule; `mask` limits the decay to some parameters, as in `add_decayed_weights`.

    Checked in `tests/test_beyond_adam.py` against NumPy from the paper's Algorithm 1 and against
    heavyball's `cautious_weight_decay=True` (3.2.1), which tests signs by sign bits (where `u`
    is exactly 0 it decays positive parameters only; the paper's `u * param >= 0` decays both).

    Args:
        weight_decay: the coefficient of the decay, a number >= 0 or a schedule.
        mask: which leaves the decay applies to: `None` for all, a pytree of bools shaped like a
            prefix of the params, or a function of the params returning one.

    Example:
        >>> tx = modopt.chain(modopt.scale_by_adam(), modopt.add_cautious_decayed_weights(0.1),
        ...                   modopt.scale_by_learning_rate(1e-3))

    Reference: Chen et al., 2025, "Cautious Weight Decay", https://arxiv.org/abs/2510.12402
    """

    elementwise_updates = True

    weight_decay: ScalarOrSchedule = fields.weight_decay(0.0)
    mask: MaskOrFn = fields.mask()

    def acts_elementwise(self) -> bool:
        return self.mask is None

    def init(self, params):
        return decay_init(self, params)

    def update(self, updates, state, params=None, **extra_args):
        return decay_update(self, updates, state, params, extra_args, _cautious)


def _cautious(u: Any, p: Any, decay: Any) -> Any:
    """`u + decay * p` where `u` and `p` share a sign (`u * p >= 0`), else `u`."""
    return u + jnp.where(u * p >= 0, decay * p, 0).astype(u.dtype)


add_cautious_decayed_weights = AddCautiousDecayedWeights
