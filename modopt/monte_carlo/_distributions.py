"""The Gaussian that the Monte Carlo estimators sample: diagonal, parametrized by its log scale."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp

from .._core.fields import as_key

_HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)


def _floating_array(value: Any) -> jax.Array:
    array = jnp.asarray(value)
    if not jnp.issubdtype(array.dtype, jnp.floating):
        array = array.astype(jnp.result_type(float))  # integers and booleans: the default float
    return array


class MultiNormalDiagFromLogScale(eqx.Module):
    r"""A Gaussian with independent coordinates, `N(loc, diag(exp(log_scale)**2))`.

    It is parametrized by the log of its standard deviation, so an unconstrained parameter
    stays a valid distribution, and it exposes those parameters (`params == [loc, log_scale]`)
    as the estimators of `modopt.monte_carlo` expect. `loc` and `log_scale` broadcast together
    (as in optax: a scalar `log_scale` gives every coordinate the same scale) to the event
    shape: a sample has that shape and `log_prob` sums over it. The estimators take `loc` and
    `log_scale` of the same shape.

    Sampling is reparametrized: `sample(shape, seed)` is `loc + exp(log_scale) * eps` with
    `eps` standard normal, differentiable in `loc` and `log_scale` for a fixed key.

    Args:
        loc: the mean, a floating array.
        log_scale: the log of the standard deviation of every coordinate, of a shape that
            broadcasts with `loc`'s.

    Example:
        >>> dist = mc.multi_normal(jnp.zeros(3), jnp.zeros(3))
        >>> dist.sample((5,), seed=jax.random.key(0)).shape
        (5, 3)
        >>> float(dist.log_prob(jnp.zeros(3)))  # -3/2 log(2 pi)
        -2.756...
    """

    loc: jax.Array = eqx.field(converter=_floating_array)
    log_scale: jax.Array = eqx.field(converter=_floating_array)

    def __check_init__(self):
        try:
            jnp.broadcast_shapes(self.loc.shape, self.log_scale.shape)
        except ValueError:
            raise ValueError(
                f"Incompatible shapes for broadcasting: log_scale of shape {self.log_scale.shape} and loc "
                f"of shape {self.loc.shape} in MultiNormalDiagFromLogScale. multi_normal(loc, log_scale) "
                "takes a log scale per coordinate, or one that broadcasts to loc's shape."
            ) from None

    @property
    def params(self) -> list[jax.Array]:
        """`[loc, log_scale]`, the arguments that rebuild this distribution."""
        return [self.loc, self.log_scale]

    @property
    def scale(self) -> jax.Array:
        """The standard deviation of every coordinate, `exp(log_scale)`."""
        return jnp.exp(self.log_scale)

    @property
    def event_shape(self) -> tuple[int, ...]:
        """The shape of one sample: `loc`'s and `log_scale`'s shapes broadcast together."""
        return jnp.broadcast_shapes(self.loc.shape, self.log_scale.shape)

    def sample(self, sample_shape: Sequence[int] = (), seed: Any = None) -> jax.Array:
        """Draws samples of shape `(*sample_shape, *event_shape)`.

        `seed` is a PRNG key (typed or raw) or an integer seed.
        """
        if seed is None:
            raise TypeError("MultiNormalDiagFromLogScale.sample needs a seed: a PRNG key or an integer.")
        dtype = jnp.result_type(self.loc, self.log_scale)
        noise = jax.random.normal(as_key(seed), (*tuple(sample_shape), *self.event_shape), dtype)
        return self.loc + self.scale * noise

    def log_prob(self, x: Any) -> jax.Array:
        """The log density at `x` (shape `(..., *event_shape)`), summed over the event axes."""
        x = jnp.asarray(x)
        standardized = (x - self.loc) * jnp.exp(-self.log_scale)
        per_coordinate = -0.5 * jnp.square(standardized) - self.log_scale - _HALF_LOG_2PI
        ndim = per_coordinate.ndim
        event_axes = tuple(range(ndim - len(self.event_shape), ndim))
        return jnp.sum(per_coordinate, axis=event_axes)


multi_normal = MultiNormalDiagFromLogScale
