"""Smoothing a function by random perturbations of its input, differentiable by autodiff.

`make_perturbed_fun(f)` gives a Monte-Carlo estimate of `f_sigma(x) = E_z f(x + sigma z)` whose
derivatives of every order (by JAX autodiff) are unbiased estimates of `f_sigma`'s, computed from
values of `f` only (the score-function estimator written with the DiCE "magic box").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._core.fields import as_hyperparameter, is_concrete
from .._core.fields import Scalar


class Normal(eqx.Module):
    """The standard normal distribution, a noise for `make_perturbed_fun`.

    `log_prob(z) = -z**2 / 2` (up to an additive constant, which the estimator does not need).

    Example:
        >>> import jax
        >>> from modopt.perturbations import Normal
        >>> Normal().sample(jax.random.key(0), (3,)).shape
        (3,)
    """

    def sample(self, key: Any, sample_shape: tuple[int, ...] = (), dtype: Any = float) -> jax.Array:
        """Draws standard normal samples.

        Args:
            key: a JAX PRNG key.
            sample_shape: the shape of the sample.
            dtype: the floating dtype of the sample.
        """
        return jax.random.normal(key, sample_shape, dtype)

    def log_prob(self, inputs: jax.Array) -> jax.Array:
        """The log-density at `inputs`, up to a constant: `-inputs**2 / 2`.

        Args:
            inputs: points at which to evaluate it.
        """
        return -0.5 * inputs**2


class Gumbel(eqx.Module):
    """The standard Gumbel distribution, the default noise of `make_perturbed_fun`.

    `log_prob(z) = -z - exp(-z)`. With Gumbel noise, the perturbed argmax of scores is a sample
    of the softmax distribution (the Gumbel-max trick).

    Example:
        >>> import jax
        >>> from modopt.perturbations import Gumbel
        >>> Gumbel().sample(jax.random.key(0), (2, 3)).shape
        (2, 3)
    """

    def sample(self, key: Any, sample_shape: tuple[int, ...] = (), dtype: Any = float) -> jax.Array:
        """Draws standard Gumbel samples.

        Args:
            key: a JAX PRNG key.
            sample_shape: the shape of the sample.
            dtype: the floating dtype of the sample.
        """
        return jax.random.gumbel(key, sample_shape, dtype)

    def log_prob(self, inputs: jax.Array) -> jax.Array:
        """The log-density at `inputs`: `-inputs - exp(-inputs)`.

        Args:
            inputs: points at which to evaluate it.
        """
        return -inputs - jnp.exp(-inputs)


def _magic_box(x: jax.Array) -> jax.Array:
    """DiCE's operator: the value 1, and the derivatives of `exp(x)` (Foerster et al., 2018)."""
    return jnp.exp(x - jax.lax.stop_gradient(x))


def _noise_like(noise: Any, key: Any, tree: Any) -> Any:
    """A sample of `noise` shaped like each leaf of `tree`, one subkey per leaf in leaf order."""
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    keys = jax.random.split(key, len(leaves))
    return jax.tree_util.tree_unflatten(
        treedef, [noise.sample(k, jnp.shape(x), jnp.result_type(x)) for k, x in zip(keys, leaves)]
    )


@jax.tree_util.register_pytree_node_class
class _PerturbedFun:
    """`(key, x) -> ` the Monte-Carlo estimate of `E_z fun(x + sigma z)` (see `make_perturbed_fun`).

    Not a closure: `sigma` is a pytree leaf (a jitted caller that takes the function as an
    argument, e.g. through `eqx.filter_jit`, does not retrace for a new value) and the
    configuration shows in its repr. Not an Equinox module either: it hashes by identity, so
    `jax.jit(fn)` works as it does on a function.
    """

    def __init__(
        self, fun: Callable[[Any], Any], num_samples: int, sigma: Any, noise: Any, use_baseline: bool
    ):
        self.fun = fun
        self.num_samples = num_samples
        self.sigma = as_hyperparameter(sigma)
        self.noise = noise
        self.use_baseline = use_baseline

    def tree_flatten(self):
        return (self.sigma,), (self.fun, self.num_samples, self.noise, self.use_baseline)

    @classmethod
    def tree_unflatten(cls, static, children):
        fun, num_samples, noise, use_baseline = static
        new = object.__new__(cls)
        new.fun, new.num_samples, new.sigma, new.noise, new.use_baseline = (
            fun,
            num_samples,
            children[0],
            noise,
            use_baseline,
        )
        return new

    def __repr__(self):
        return (
            f"make_perturbed_fun({getattr(self.fun, '__name__', self.fun)!s}, num_samples={self.num_samples}, "
            f"sigma={self.sigma!r}, noise={self.noise!r}, use_baseline={self.use_baseline})"
        )

    def __call__(self, key: Any, x: Any) -> Any:
        baseline = self.fun(jax.lax.stop_gradient(x)) if self.use_baseline else None

        def one_sample(sample_key):
            z = _noise_like(self.noise, sample_key, x)
            # The perturbed point is a constant for autodiff; z is rebuilt from it so that the
            # log-probability carries the dependence on x (the score function).
            shifted = jax.lax.stop_gradient(jax.tree_util.tree_map(lambda xi, zi: xi + self.sigma * zi, x, z))
            z = jax.tree_util.tree_map(lambda xi, yi: (yi - xi) / self.sigma, x, shifted)
            log_prob = sum((jnp.sum(self.noise.log_prob(zi)) for zi in jax.tree_util.tree_leaves(z)), 0)
            box = _magic_box(log_prob)
            out = jax.tree_util.tree_map(lambda o: box * o, self.fun(shifted))
            if self.use_baseline:
                out = jax.tree_util.tree_map(lambda o, b: o + (1 - box) * b, out, baseline)
            return out

        outs = jax.vmap(one_sample)(jax.random.split(key, self.num_samples))
        return jax.tree_util.tree_map(lambda o: jnp.mean(o, axis=0), outs)


def make_perturbed_fun(
    fun: Callable[[Any], Any],
    num_samples: int = 1000,
    sigma: Scalar = 0.1,
    noise: Any = Gumbel(),
    use_baseline: bool = True,
) -> Callable[[Any, Any], Any]:
    r"""A stochastic, differentiable smoothing of `fun` by random perturbations of its input.

    For a noise distribution $\mu$ and a scale $\sigma$, the smoothed function is
    $$f_\sigma(x) = \mathbb{E}_{z \sim \mu}\, f(x + \sigma z).$$
    The returned function `g(key, x)` averages `num_samples` perturbed values. Its value and its
    derivatives of any order, taken by JAX autodiff, are unbiased Monte-Carlo estimates of those
    of $f_\sigma$, computed from values of $f$ alone: $f$ may be piecewise constant (an argmax, a
    ranking, a combinatorial solver). The gradient is the score-function (REINFORCE) estimator
    $$\nabla f_\sigma(x) \approx \frac{1}{N}\sum_i \big(f(x + \sigma z_i) - f(x)\big)\,
    \nabla_x \log \mu\big((x + \sigma z_i - x)/\sigma\big),$$
    written with the DiCE magic box $\exp(s - \text{stop\_gradient}(s))$ so that higher
    derivatives come out too; $f(x)$ is the baseline (`use_baseline=True`) that reduces its
    variance without biasing it.

    With the same key, the samples are optax 0.2.8's: the key is split into `num_samples` keys,
    and each of those into one key per leaf of `x` in leaf order.

    Args:
        fun: the function to smooth, from a pytree of arrays to a pytree of arrays.
        num_samples: the number of perturbed evaluations averaged (default 1000).
        sigma: the scale of the perturbation (default 0.1).
        noise: the noise distribution, an object with `sample(key, shape, dtype)` and
            `log_prob(z)` such as `Gumbel()` (the default) or `Normal()`.
        use_baseline: subtract the unperturbed value `fun(x)` inside the estimator to reduce
            the variance of the derivatives (default True).

    Returns:
        A function `(key, x) -> ` an estimate of $f_\sigma(x)$, structured like `fun(x)`.

    Example:
        >>> import jax
        >>> import jax.numpy as jnp
        >>> from modopt.perturbations import make_perturbed_fun
        >>> f = lambda x: jnp.sum(jnp.maximum(x, 0.0))
        >>> g = make_perturbed_fun(f, num_samples=1000, sigma=0.1)
        >>> grad = jax.grad(g, argnums=1)(jax.random.key(0), jnp.zeros(3))
        >>> grad.shape
        (3,)

    References:
        Berthet et al., [Learning with Differentiable Perturbed
        Optimizers](https://arxiv.org/abs/2002.08676), 2020.

        Foerster et al., [DiCE: The Infinitely Differentiable Monte Carlo
        Estimator](https://arxiv.org/abs/1802.05098), 2018.
    """
    if not isinstance(num_samples, int) or isinstance(num_samples, bool) or num_samples < 1:
        raise ValueError(f"Invalid num_samples: {num_samples!r} (must be an int >= 1) in make_perturbed_fun.")
    if is_concrete(sigma) and not (np.ndim(sigma) == 0 and np.asarray(sigma) > 0):
        raise ValueError(f"Invalid sigma: {sigma!r} (must be a scalar > 0) in make_perturbed_fun.")
    for method in ("sample", "log_prob"):
        if not callable(getattr(noise, method, None)):
            raise TypeError(
                f"make_perturbed_fun: `noise` must have a `{method}` method, like "
                f"modopt.perturbations.Gumbel() or Normal(); got {noise!r}."
            )
    return _PerturbedFun(fun, num_samples, sigma, noise, bool(use_baseline))
