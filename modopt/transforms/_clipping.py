"""Clipping updates: element-wise, by global norm, and by per-block RMS."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from .._base import AbstractTransform, init_empty_state
from .._fields import NONNEGATIVE, POSITIVE, hyperparameter
from .._numerics import abs_sq, global_norm


class Clip(AbstractTransform):
    """Clips each update element to `[-max_delta, max_delta]`."""

    max_delta: Any = hyperparameter(check=NONNEGATIVE)

    def init(self, params):
        return init_empty_state(params)

    def update(self, updates, state, params=None, **extra_args):
        clip = lambda g: jnp.clip(g, -self.max_delta, self.max_delta)  # noqa: E731
        return jax.tree_util.tree_map(clip, updates), state


class ClipByGlobalNorm(AbstractTransform):
    """Rescales all updates together so that their global L2 norm is at most `max_norm`.

    Reference: Pascanu et al., 2012, https://arxiv.org/abs/1211.5063
    """

    max_norm: Any = hyperparameter(check=POSITIVE)

    def init(self, params):
        return init_empty_state(params)

    def update(self, updates, state, params=None, **extra_args):
        norm = global_norm(updates)
        within = norm < self.max_norm
        clip = lambda g: jax.lax.select(within, g, (g / norm.astype(g.dtype)) * self.max_norm)  # noqa: E731
        return jax.tree_util.tree_map(clip, updates), state


class ClipByBlockRms(AbstractTransform):
    """Divides each update leaf by `max(1, rms(leaf) / threshold)`.

    Reference: Shazeer & Stern, 2018 (Adafactor), https://arxiv.org/abs/1804.04235
    """

    threshold: Any = hyperparameter(check=POSITIVE)

    def init(self, params):
        return init_empty_state(params)

    def update(self, updates, state, params=None, **extra_args):
        def clip(u):
            return u / jnp.maximum(1.0, jnp.sqrt(jnp.mean(abs_sq(u))) / self.threshold)

        return jax.tree_util.tree_map(clip, updates), state


clip = Clip
clip_by_global_norm = ClipByGlobalNorm
clip_by_block_rms = ClipByBlockRms
