"""Annealed Gaussian gradient noise."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from .._core.base import AbstractTransform
from .._core.fields import NONNEGATIVE, as_key, hyperparameter, prng_key
from .._util.numerics import safe_increment
from ..fields import MISSING
from .._core.fields import Scalar


def noise_variance(default: Any = MISSING, **kwargs: Any):
    """`eta`: the variance of the noise at the first step, >= 0."""
    return hyperparameter(default, check=NONNEGATIVE, **kwargs)


def noise_decay(default: Any = MISSING, **kwargs: Any):
    """`gamma`: the exponent of the variance's decay `(1 + t)^-gamma`, >= 0."""
    return hyperparameter(default, check=NONNEGATIVE, **kwargs)


def key_or_seed(key: Any, seed: Any, owner: str) -> jax.Array:
    """The PRNG key from `key` (a key or an integer seed) or `seed` (optax's older keyword).

    Giving both is an error; giving neither means seed 0, as the seeds' `seed=0` default.
    """
    if key is not None and seed is not None:
        raise ValueError(f"{owner}: pass either `key` or `seed`, not both (they name the same thing).")
    chosen = seed if key is None else key
    return as_key(0 if chosen is None else chosen, "seed" if key is None else "key", owner)


class AddNoiseState(NamedTuple):
    """The step count the variance anneals with, and the PRNG key of the next step."""

    count: jax.Array  # int32 scalar
    rng_key: jax.Array  # a typed PRNG key


class AddNoise(AbstractTransform):
    r"""Adds Gaussian noise of annealed variance to the updates.

    At step `t` (from 1), `update = g + sqrt(eta / t^gamma) * n` with `n ~ N(0, I)` drawn
    afresh for every leaf in the leaf's dtype; the key advances in the state.

    Args:
        eta: the variance of the noise at the first step, >= 0.
        gamma: the decay exponent of the variance, >= 0.
        key: a PRNG key (`jax.random.key(0)`), its raw data, or an integer seed.
        seed: the same as `key`, under the seeds' name; give one of the two (neither: seed 0).

    Reference: Neelakantan et al., 2015, https://arxiv.org/abs/1511.06807
    """

    eta: Scalar = noise_variance()
    gamma: Scalar = noise_decay()
    key: jax.Array = prng_key()

    def __init__(self, eta: Scalar, gamma: Scalar, key: Any = None, *, seed: Any = None):
        self.eta = eta
        self.gamma = gamma
        self.key = key_or_seed(key, seed, "add_noise")

    def init(self, params):
        # A copy: the state's key must not be the transform's buffer (both are donated).
        return AddNoiseState(count=jnp.zeros([], jnp.int32), rng_key=jnp.copy(self.key))

    def update(self, updates, state, params=None, **extra_args):
        count = safe_increment(state.count)
        scale = jnp.sqrt(self.eta / count**self.gamma)
        next_key, sample_key = jax.random.split(state.rng_key)
        leaves, treedef = jax.tree_util.tree_flatten(updates)
        keys = jax.random.split(sample_key, len(leaves))
        noisy = [g + scale * jax.random.normal(k, g.shape, g.dtype) for g, k in zip(leaves, keys)]
        return treedef.unflatten(noisy), AddNoiseState(count=count, rng_key=next_key)


add_noise = AddNoise
