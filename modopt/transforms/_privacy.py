"""Differential privacy: DP-SGD's aggregation of per-example gradients."""

from __future__ import annotations

from typing import Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp

from .._core.base import AbstractTransform
from .._core.fields import NONNEGATIVE, POSITIVE, hyperparameter, prng_key
from ..fields import MISSING
from ._clipping import _check_batched, per_example_global_norm_clip
from ._noise import key_or_seed
from .._core.fields import Scalar


def dp_l2_norm_clip(default: Any = MISSING, **kwargs: Any):
    """`C`: the largest global L2 norm an example's gradient keeps, > 0."""
    return hyperparameter(default, check=POSITIVE, **kwargs)


def dp_noise_multiplier(default: Any = MISSING, **kwargs: Any):
    """`sigma`: the noise's standard deviation in units of `C`, >= 0."""
    return hyperparameter(default, check=NONNEGATIVE, **kwargs)


def private_key(key: Any, seed: Any, owner: str) -> jax.Array:
    """The PRNG key of the noise from `seed` or `key` (each a key or an integer seed).

    One of the two is required: the noise is what makes the step private, so modopt does not
    pick a seed silently (optax 0.2.8 warns and uses 0).
    """
    if key is None and seed is None:
        raise TypeError(
            f"{owner} needs the PRNG seed of its noise: pass `seed=` (an integer) or `key=jax.random.key(...)`."
        )
    return key_or_seed(key, seed, owner)


class DifferentiallyPrivateAggregateState(NamedTuple):
    """The PRNG key of the next step's noise."""

    rng_key: jax.Array  # a typed PRNG key


class DifferentiallyPrivateAggregate(AbstractTransform):
    r"""Reduces per-example gradients to one noisy, clipped mean: DP-SGD's aggregation.

    It takes *per-example* updates: every leaf has a leading batch axis of size `B`, the
    parameter's shape after it (`jax.vmap(jax.grad(loss), in_axes=(None, 0))` gives them). Each
    example's gradient `g_i` (all leaves together) is scaled to global L2 norm at most `C`,
    the clipped gradients are summed, Gaussian noise is added and the sum divided by `B`:

        update = (sum_i g_i * min(1, C / ||g_i||) + C * sigma * n) / B,   n ~ N(0, I)

    A fresh key for every leaf is split off the state's key at each step (the same stream as
    optax's, so a seed gives optax's noise bit for bit). The result has the parameters'
    shapes, so it must come first in a chain; the transforms after it see ordinary updates.
    With `Optimizer`, `step(model, grads)` then takes per-example `grads` (see
    `AbstractTransform.takes_per_example_updates`). Wrappers that accumulate or average
    gradients over steps (`MultiSteps`, `apply_every`) do not fit it: the privacy accounting
    is per aggregated step.

    Args:
        l2_norm_clip: `C`, the largest global L2 norm an example's gradient keeps, > 0.
        noise_multiplier: `sigma`, the noise's standard deviation relative to `C`, >= 0.
        seed: an integer seed, or a PRNG key (`jax.random.key(0)`).
        key: the same as `seed`, as optax 0.2.8 names it; give exactly one of the two.

    Example:
        >>> tx = modopt.chain(modopt.differentially_private_aggregate(1.0, 1.1, seed=0), modopt.sgd(0.1))
        >>> per_example = jax.vmap(jax.grad(loss), in_axes=(None, 0, 0))(params, x, y)
        >>> updates, state = tx.update(per_example, state, params)

    Reference: Abadi et al., 2016, "Deep Learning with Differential Privacy",
    https://arxiv.org/abs/1607.00133
    """

    per_example_updates: ClassVar[bool] = True

    l2_norm_clip: Scalar = dp_l2_norm_clip()
    noise_multiplier: Scalar = dp_noise_multiplier()
    key: jax.Array = prng_key()

    def __init__(self, l2_norm_clip: Scalar, noise_multiplier: Scalar, seed: Any = None, *, key: Any = None):
        self.l2_norm_clip = l2_norm_clip
        self.noise_multiplier = noise_multiplier
        self.key = private_key(key, seed, "differentially_private_aggregate")

    def init(self, params):
        # A copy: the state's key must not be the transform's buffer (both are donated).
        return DifferentiallyPrivateAggregateState(rng_key=jnp.copy(self.key))

    def update(self, updates, state, params=None, **extra_args):
        _check_per_example(updates, params)
        leaves, treedef = jax.tree_util.tree_flatten(updates)
        batch_size = leaves[0].shape[0]
        summed, _ = per_example_global_norm_clip(leaves, self.l2_norm_clip)
        next_key, *keys = jax.random.split(state.rng_key, len(leaves) + 1)
        std = self.l2_norm_clip * self.noise_multiplier
        noisy = [(g + std * jax.random.normal(k, g.shape, g.dtype)) / batch_size for g, k in zip(summed, keys)]
        return treedef.unflatten(noisy), DifferentiallyPrivateAggregateState(rng_key=next_key)


def _check_per_example(updates: Any, params: Any) -> None:
    """Every update leaf is its parameter's shape after one batch axis, the same for all."""
    where = "differentially_private_aggregate"
    if params is not None and jax.tree_util.tree_structure(params) == jax.tree_util.tree_structure(updates):
        for (path, u), p in zip(jax.tree_util.tree_flatten_with_path(updates)[0], jax.tree_util.tree_leaves(params)):
            if jnp.ndim(u) != jnp.ndim(p) + 1 or jnp.shape(u)[1:] != jnp.shape(p):
                raise ValueError(
                    f"{where} takes per-example updates, each the parameter's shape after one leading batch axis; "
                    f"the update at {jax.tree_util.keystr(path) or 'the root'} has shape {jnp.shape(u)} for a "
                    f"parameter of shape {jnp.shape(p)}. Compute per-example gradients with "
                    "`jax.vmap(jax.grad(loss), in_axes=(None, 0))(params, batch)`, and apply this transform "
                    "to them first (first in a chain)."
                )
    _check_batched(updates, where)  # one batch size for all leaves


differentially_private_aggregate = DifferentiallyPrivateAggregate
