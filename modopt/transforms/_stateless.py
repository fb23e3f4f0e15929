"""Stateless transforms: identity, zeroing, and transforms made from plain functions."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from .._core.base import AbstractTransform, init_empty_state
from .._core.fields import static


class Identity(AbstractTransform):
    """Leaves updates untouched."""

    elementwise_updates = True

    def init(self, params):
        return init_empty_state(params)

    def update(self, updates, state, params=None, **extra_args):
        return updates, state


class SetToZero(AbstractTransform):
    """Maps every update to zero (e.g. for frozen parameters inside `partition`)."""

    elementwise_updates = True

    def init(self, params):
        return init_empty_state(params)

    def update(self, updates, state, params=None, **extra_args):
        return jax.tree_util.tree_map(jnp.zeros_like, updates), state


class Stateless(AbstractTransform):
    """A transform from a function `f(updates, params) -> updates` of whole pytrees.

    `f` is code and therefore static.

    Args:
        f: the function `f(updates, params) -> updates`; `params` is `None` when `update` gets none.
    """

    f: Callable[[Any, Any], Any] = static()

    def init(self, params):
        return init_empty_state(params)

    def update(self, updates, state, params=None, **extra_args):
        return self.f(updates, params), state


class StatelessWithTreeMap(AbstractTransform):
    """A transform from a function `f(update, param) -> update` applied leaf by leaf.

    `param` is `None` when `update` is called without params.

    Args:
        f: the function `f(update, param) -> update` of one leaf.
    """

    f: Callable[[Any, Any], Any] = static()

    def init(self, params):
        return init_empty_state(params)

    def update(self, updates, state, params=None, **extra_args):
        if params is None:
            return jax.tree_util.tree_map(lambda u: self.f(u, None), updates), state
        return jax.tree_util.tree_map(self.f, updates, params), state


identity = Identity
set_to_zero = SetToZero
stateless = Stateless
stateless_with_tree_map = StatelessWithTreeMap
