"""Cautious updates: the cautious mask around any transform (`cautious`). Cautious weight decay,
its companion, is `modopt.transforms.add_cautious_decayed_weights`."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax.numpy as jnp

from .._core.base import AbstractTransform, AbstractWrapper, inner_transform
from .._core.fields import POSITIVE, hyperparameter, static
from .._util.trees import map_updates
from .._core.fields import Scalar


class CautiousState(NamedTuple):
    """The state of `cautious`: the wrapped transform's state."""

    inner_state: Any


class Cautious(AbstractWrapper):
    r"""Cautious updates: zeroes the components of `inner`'s update that point against the gradient.

    With `u` the update of `inner` and `g` the gradient this transform receives, for each
    parameter: `mask = (u * g > 0)` (where `u` is a direction to subtract, `negated=False`) or
    `mask = (u * g < 0)` (where `u` is a step to add, `negated=True`), and

        update = u * mask / (mean(mask) + eps)

    so that only the components moving against the gradient are applied, scaled up by the
    inverse fraction kept. The mean is taken per parameter (as the paper's code, and both
    references, take it per tensor). A cautious optimizer never steps uphill along any
    coordinate of the current gradient; the paper finds it faster than its base optimizer
    with the same hyperparameters.

    Around a complete optimizer (`cautious(adamw(1e-3))`, `negated=True`) the mask sees the
    whole step, weight decay included. The paper's C-AdamW masks the Adam direction only and
    decays unmasked: `chain(cautious(scale_by_adam(), negated=False),
    add_decayed_weights(wd), scale_by_learning_rate(lr))`.

    Checked in `tests/test_beyond_adam.py` against `pytorch_optimizer`'s `cautious=True` (4.1.0:
    `Lion`, `LaProp`), which scale by `numel / (sum(mask) + 1)`, i.e. `eps = 1 / numel` per
    parameter; here `eps` is one number, as in the paper's Algorithm 1
    (`u * m / (m.mean() + eps)`). heavyball scales by `1 / max(mean(mask), 1 / numel)`.

    Args:
        inner: the transform whose updates are masked (a modopt or optax transform).
        eps: added to the fraction of components kept, > 0 (a mask of zeros gives a zero update).
        negated: whether `inner`'s updates are steps added to the parameters, pointing against
            the gradient (a complete optimizer such as `adamw(1e-3)`: the default), or `False`
            for a direction along the gradient that a later `scale_by_learning_rate` negates
            (`scale_by_adam()`, `scale_by_lion()`) (static).

    Example:
        >>> optimizer = modopt.Optimizer(modopt.cautious(modopt.lion(1e-4)), model)

    References: Liang et al., 2024, "Cautious Optimizers: Improving Training with One Line of
    Code", https://arxiv.org/abs/2411.16085
    """

    inner: AbstractTransform = inner_transform()
    eps: Scalar = hyperparameter(1e-8, check=POSITIVE)
    negated: bool = static(default=True, kw_only=True)

    def init(self, params):
        return CautiousState(inner_state=self.inner.init(params))

    def update(self, updates, state, params=None, **extra_args):
        inner_updates, inner_state = self.inner.update(updates, state.inner_state, params, **extra_args)
        sign = -1 if self.negated else 1

        def masked(u, g):
            mask = (sign * u * g > 0).astype(u.dtype)
            return u * mask / (jnp.mean(mask) + self.eps).astype(u.dtype)

        return map_updates(masked, inner_updates, updates), CautiousState(inner_state=inner_state)


cautious = Cautious
