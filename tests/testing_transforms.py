"""Transforms written for the tests (not part of modopt)."""

from __future__ import annotations

import jax

import modopt


class ScaleByValueFn(modopt.AbstractTransform):
    """Descends along the gradient scaled by `value_fn(params)`, a function of the parameters."""

    extra_args_spec = (modopt.ExtraArg("value_fn", "the loss as a function of the parameters", of_params=True),)

    def init(self, params):
        return modopt.EmptyState()

    def update(self, updates, state, params=None, **extra_args):
        factor = modopt.extra_arg(extra_args, "value_fn", self)(params)
        return jax.tree.map(lambda g: -factor * g, updates), state


class AddGrad(modopt.AbstractTransform):
    """Adds the extra argument `grad` (a tree like the parameters) to the updates."""

    extra_args_spec = (modopt.ExtraArg("grad", "the gradient at the current parameters", like_params=True),)

    def init(self, params):
        return modopt.EmptyState()

    def update(self, updates, state, params=None, **extra_args):
        return jax.tree.map(lambda u, g: u + g, updates, modopt.extra_arg(extra_args, "grad", self)), state
