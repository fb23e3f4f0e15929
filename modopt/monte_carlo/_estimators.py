r"""Monte Carlo estimators of the gradient of an expectation, `\nabla_\theta E_{p(x; \theta)} f(x)`.

The three estimators share one signature,

    estimator(function, params, dist_builder, rng, num_samples) -> jacobians

- `function` is `f`: one sample in, one float out (it is vmapped, so it need not batch);
- `params` is a list of arrays and `dist_builder(*params)` the distribution `p(x; theta)`,
  with `sample(sample_shape, seed=key)` (and `log_prob(x)` for the score function);
- `rng` is a PRNG key (typed or raw) or an integer seed;
- `num_samples` a Python int (static under `jax.jit`).

They return a list with one array per entry of `params`, of shape `(num_samples, *param.shape)`:
row `i` is the estimate from sample `i` alone. The mean over rows estimates the gradient, the
spread of the rows the estimator's variance.

Every estimator draws its samples as `dist_builder(*params).sample((num_samples,), seed=rng)`,
so for one `rng` they share samples (`control_variates_jacobians` relies on this). `f` must
not depend on `params`: if it does, pass `jax.lax.stop_gradient` of them into it and apply the
chain rule for that dependence outside.

Reference: Mohamed, Rosca, Figurnov and Mnih, "Monte Carlo Gradient Estimation in Machine
Learning", JMLR 21(132), 2020, https://jmlr.org/papers/v21/19-346.html
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from .._core.fields import as_key
from ._distributions import MultiNormalDiagFromLogScale
from ._inputs import Function, check_callable, check_count, check_params, evaluate

DistBuilder = Callable[..., Any]
_FUNCTION = "a callable of one sample returning one float"
_BUILDER = "a callable building a distribution from the arrays in params, such as multi_normal"


def _inputs(function, params, dist_builder, rng, num_samples):
    check_callable("function", function, _FUNCTION)
    check_callable("dist_builder", dist_builder, _BUILDER)
    count = check_count("num_samples", num_samples)
    return check_params(params, dist_builder), as_key(rng), count


def score_function_jacobians(
    function: Function, params: list, dist_builder: DistBuilder, rng: Any, num_samples: int
) -> list[jax.Array]:
    r"""Score function (REINFORCE, likelihood ratio) estimates of the gradient of `E_p f`.

    Uses the identity

        \nabla_\theta E_{p(x; \theta)} f(x) = E_{p(x; \theta)} [f(x) \nabla_\theta \log p(x; \theta)]

    Row `i` of the result is `f(x_i) * grad_theta log p(x_i; theta)`. It needs only `log_prob`
    to be differentiable in `params`: `f` may be non-differentiable, and `x` discrete. Its
    variance is often high; see `control_variates_jacobians` to reduce it.

    Args:
        function: `f`, one sample in, one float out.
        params: a list of arrays, the arguments of `dist_builder` (`[loc, log_scale]` for
            `multi_normal`).
        dist_builder: builds the distribution from `*params`; it needs `sample` and `log_prob`.
        rng: a PRNG key or an integer seed.
        num_samples: the number of samples, a Python int >= 1.

    Returns:
        A list, one array per entry of `params`, of shape `(num_samples, *param.shape)`.

    Example:
        >>> params = [jnp.zeros(3), jnp.zeros(3)]  # loc, log_scale
        >>> estimate = jax.jit(mc.score_function_jacobians, static_argnums=(0, 2, 4))
        >>> jacobians = estimate(jnp.sum, params, mc.multi_normal, jax.random.key(0), 100)
        >>> [j.shape for j in jacobians]
        [(100, 3), (100, 3)]
        >>> grads = [j.mean(axis=0) for j in jacobians]  # estimates of (1, 0)
    """
    params, key, count = _inputs(function, params, dist_builder, rng, num_samples)
    samples = jax.lax.stop_gradient(dist_builder(*params).sample((count,), seed=key))
    values = evaluate(function, samples)

    def log_prob(theta, x):
        return dist_builder(*theta).log_prob(x)

    scores = jax.vmap(jax.grad(log_prob), in_axes=(None, 0))(params, samples)
    return [values.reshape((count,) + (1,) * (score.ndim - 1)) * score for score in scores]


def pathwise_jacobians(
    function: Function, params: list, dist_builder: DistBuilder, rng: Any, num_samples: int
) -> list[jax.Array]:
    r"""Pathwise (reparametrization) estimates of the gradient of `E_p f`.

    Writes a sample as a differentiable function of the parameters and parameter-free noise,
    `x = g(eps; theta)`, and uses

        \nabla_\theta E_{p(x; \theta)} f(x) = E_{p(\epsilon)} \nabla_\theta f(g(\epsilon; \theta))

    Row `i` is `grad_theta f(g(eps_i; theta))`. It needs a continuous, reparametrized
    distribution (`sample` differentiable in `params` for a fixed key, as `multi_normal`'s
    is) and a differentiable `f`. Its variance is usually the lowest of the three.

    Args:
        function: `f`, one sample in, one differentiable float out.
        params: a list of arrays, the arguments of `dist_builder`.
        dist_builder: builds the distribution from `*params`; its `sample` is differentiated.
        rng: a PRNG key or an integer seed.
        num_samples: the number of samples, a Python int >= 1.

    Returns:
        A list, one array per entry of `params`, of shape `(num_samples, *param.shape)`.

    Example:
        >>> params = [jnp.zeros(2), jnp.zeros(2)]
        >>> estimate = jax.jit(mc.pathwise_jacobians, static_argnums=(0, 2, 4))
        >>> loc_rows, _ = estimate(jnp.sum, params, mc.multi_normal, jax.random.key(0), 4)
        >>> loc_rows.tolist()  # exact for a linear function: d/d loc sum(loc + scale eps) = 1
        [[1.0, 1.0], [1.0, 1.0], [1.0, 1.0], [1.0, 1.0]]
    """
    params, key, count = _inputs(function, params, dist_builder, rng, num_samples)

    def per_sample_values(theta):
        return evaluate(function, dist_builder(*theta).sample((count,), seed=key))

    # Forward mode: one pass per parameter element, each over the whole batch of samples.
    return list(jax.jacfwd(per_sample_values)(params))


def measure_valued_jacobians(
    function: Function,
    params: list,
    dist_builder: DistBuilder,
    rng: Any,
    num_samples: int,
    coupling: bool = True,
) -> list[jax.Array]:
    r"""Measure-valued estimates of the gradient of `E_p f`, for the Gaussian `multi_normal`.

    The derivative of a density in one parameter is a difference of two densities, scaled:
    `d/d theta p = c (p_+ - p_-)`, so each coordinate's derivative is

        d/d theta_d E_p f = c (E_{p_+} f(x) - E_{p_-} f(x))

    where `x` is a sample of `p` (drawn as the other estimators draw theirs) whose coordinate
    `d` alone is redrawn. For `N(mu, sigma^2)` per coordinate (`sigma = exp(log_scale)`), with
    `R` Rayleigh (Weibull of scale `sqrt(2)`, concentration 2), `M` double-sided Maxwell and
    `Z` standard normal:

        d/d mu_d    = (f(x; x_d = mu + sigma R) - f(x; x_d = mu - sigma R')) / (sqrt(2 pi) sigma)
        d/d sigma_d = (f(x; x_d = mu + sigma M) - f(x; x_d = mu + sigma Z)) / sigma

    and `d/d log_scale = sigma d/d sigma` (the chain rule; the `sigma`s cancel). With
    `coupling=True` the two measures share randomness, `R' = R` and `Z = U M` with `U`
    uniform on [0, 1) (which is standard normal), which lowers the variance.
    `f` need not be differentiable; it is evaluated `4 * num_samples * loc.size` times.

    Args:
        function: `f`, one sample in, one float out.
        params: `[loc, log_scale]`, arrays of the same shape.
        dist_builder: `multi_normal` (the only supported distribution).
        rng: a PRNG key or an integer seed.
        num_samples: the number of samples, a Python int >= 1.
        coupling: whether the positive and negative parts share their randomness.

    Returns:
        `[loc_jacobians, log_scale_jacobians]`, each of shape `(num_samples, *loc.shape)`.

    Example:
        >>> params = [jnp.zeros((2, 2)), jnp.zeros((2, 2))]
        >>> estimate = jax.jit(mc.measure_valued_jacobians, static_argnums=(0, 2, 4, 5))
        >>> jacobians = estimate(jnp.cos, params, mc.multi_normal, jax.random.key(0), 10, True)
        Traceback (most recent call last):
        ...
        ValueError: Invalid function: it must return one number per sample, ...
        >>> def f(x):
        ...     return jnp.sum(jnp.cos(x))
        >>> jacobians = estimate(f, params, mc.multi_normal, jax.random.key(0), 10, True)
        >>> [j.shape for j in jacobians]
        [(10, 2, 2), (10, 2, 2)]

    Reference: Mohamed et al., 2020, https://jmlr.org/papers/v21/19-346.html, section 6 (after
    Pflug, 1996, "Optimization of Stochastic Models").
    """
    if dist_builder is not MultiNormalDiagFromLogScale:
        raise ValueError(
            f"Invalid dist_builder: {dist_builder!r}. measure_valued_jacobians is implemented for "
            f"the Gaussian modopt.monte_carlo.multi_normal only."
        )
    if not isinstance(coupling, (bool, jnp.bool_)):
        raise TypeError(f"Invalid coupling: {coupling!r} (expected True or False).")
    (loc, log_scale), key, count = _inputs(function, params, dist_builder, rng, num_samples)
    dist = dist_builder(loc, log_scale)
    shape, size = loc.shape, loc.size
    base = dist.sample((count,), seed=key).reshape(count, size)
    mean = loc.reshape(size)
    scale = dist.scale.reshape(size)
    # All the auxiliary draws from one call (each call to the PRNG costs compile time), built
    # from standard normals: a Rayleigh draw is the norm of 2 of them, a double-sided Maxwell
    # one a random sign times the norm of 3, a uniform one the normal CDF of 1.
    z = jax.random.normal(jax.random.fold_in(key, 1), (9, count, size), base.dtype)

    def norm(*rows):
        return jnp.sqrt(sum(jnp.square(z[row]) for row in rows))

    # loc: a Rayleigh step to either side; log_scale: a double-sided Maxwell draw against a
    # normal one.
    step_up = norm(0, 1)
    step_down = step_up if coupling else norm(2, 3)
    maxwell = jnp.where(z[4] >= 0, 1.0, -1.0) * norm(5, 6, 7)
    normal = jax.scipy.special.ndtr(z[8]) * maxwell if coupling else z[8]
    redrawn = jnp.stack(
        [mean + scale * step_up, mean - scale * step_down, mean + scale * maxwell, mean + scale * normal]
    )
    # One evaluation of f for all four: values[k, i, d] = f(base[i] with coordinate d set to
    # redrawn[k, i, d]).
    points = jnp.where(jnp.eye(size, dtype=bool), redrawn[..., None], base[None, :, None, :])
    values = evaluate(function, points.reshape(4 * count * size, *shape)).reshape(4, count, size)
    loc_jacobians = (values[0] - values[1]) / (math.sqrt(2 * math.pi) * scale)
    log_scale_jacobians = values[2] - values[3]  # sigma d/d sigma: the sigmas cancel
    return [loc_jacobians.reshape((count, *shape)), log_scale_jacobians.reshape((count, *shape))]
