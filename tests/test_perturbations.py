"""`modopt.perturbations` against optax 0.2.8 (same key, same numbers) and against the math.

Independent checks: for f(x) = relu(x) summed and Normal noise, the smoothed function is
E relu(x + sigma z), whose gradient is Phi(x / sigma) (the normal CDF); for a linear f the
smoothed gradient is f's own; the noise log-densities differ from scipy's by a constant.
"""

from __future__ import annotations

import doctest
import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from modopt.perturbations import Gumbel, Normal, _perturbed, make_perturbed_fun

KEY = jax.random.key(0)
X = {"a": jnp.array([0.1, -0.2, 0.3]), "b": jnp.array([[0.05, -0.4]])}


def _argmax_one_hot(tree):
    """A piecewise-constant function of a tree: one-hot argmax of a's scores, and b's signs."""
    return {"onehot": jax.nn.one_hot(jnp.argmax(tree["a"]), 3), "sign": jnp.sign(tree["b"]).sum()}


def _loss(tree):
    return jnp.sum(jnp.maximum(tree["a"], 0.0)) + jnp.sum(tree["b"] ** 3)


NOISES = [(Gumbel(), optax.perturbations.Gumbel()), (Normal(), optax.perturbations.Normal())]


@pytest.mark.parametrize("noise", [0, 1], ids=["gumbel", "normal"])
@pytest.mark.parametrize("use_baseline", [True, False])
def test_values_and_gradients_equal_optax_with_the_same_key(noise, use_baseline):
    ours_noise, their_noise = NOISES[noise]
    ours = make_perturbed_fun(_loss, 64, 0.5, ours_noise, use_baseline)
    theirs = optax.perturbations.make_perturbed_fun(_loss, 64, 0.5, their_noise, use_baseline)
    v_ours, g_ours = jax.jit(jax.value_and_grad(ours, argnums=1))(KEY, X)
    v_theirs, g_theirs = jax.jit(jax.value_and_grad(theirs, argnums=1))(KEY, X)
    np.testing.assert_allclose(v_ours, v_theirs, rtol=1e-6)
    for a, b in zip(jax.tree_util.tree_leaves(g_ours), jax.tree_util.tree_leaves(g_theirs)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_tree_outputs_and_second_derivatives_equal_optax():
    ours = make_perturbed_fun(_argmax_one_hot, 32, 0.3)
    theirs = optax.perturbations.make_perturbed_fun(_argmax_one_hot, 32, 0.3)
    out_ours, out_theirs = jax.jit(ours)(KEY, X), jax.jit(theirs)(KEY, X)
    for a, b in zip(jax.tree_util.tree_leaves(out_ours), jax.tree_util.tree_leaves(out_theirs)):
        np.testing.assert_allclose(a, b, rtol=1e-6)
    # The Jacobian of a one-hot argmax (zero almost everywhere for the raw function).
    j_ours = jax.jit(jax.jacobian(lambda k, x: ours(k, x)["onehot"], argnums=1))(KEY, X)
    j_theirs = jax.jit(jax.jacobian(lambda k, x: theirs(k, x)["onehot"], argnums=1))(KEY, X)
    for a, b in zip(jax.tree_util.tree_leaves(j_ours), jax.tree_util.tree_leaves(j_theirs)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert np.abs(np.asarray(j_ours["a"])).sum() > 0
    # Second derivatives of a scalar function, through the magic box.
    x = jnp.array([0.2, -0.1])
    f = lambda v: jnp.sum(jnp.abs(v))  # noqa: E731
    h_ours = jax.jit(jax.hessian(make_perturbed_fun(f, 32, 0.5, Normal()), argnums=1))(KEY, x)
    h_theirs = jax.jit(
        jax.hessian(
            optax.perturbations.make_perturbed_fun(f, 32, 0.5, optax.perturbations.Normal()), argnums=1
        )
    )(KEY, x)
    np.testing.assert_allclose(h_ours, h_theirs, rtol=1e-4, atol=1e-5)


def test_gradient_of_smoothed_relu_is_the_normal_cdf():
    sigma = 0.5
    x = jnp.array([-0.6, -0.1, 0.0, 0.3, 0.9])
    smoothed = make_perturbed_fun(lambda v: jnp.sum(jax.nn.relu(v)), 20_000, sigma, Normal())
    gradient = jax.jit(jax.grad(smoothed, argnums=1))(jax.random.key(3), x)
    cdf = np.array([0.5 * (1 + math.erf(v / sigma / math.sqrt(2))) for v in np.asarray(x)])
    np.testing.assert_allclose(gradient, cdf, atol=0.04)


@pytest.mark.parametrize("noise", [Gumbel(), Normal()], ids=["gumbel", "normal"])
def test_gradient_of_a_linear_function_is_its_slope(noise):
    w = jnp.array([1.0, -2.0, 0.5])
    smoothed = make_perturbed_fun(lambda v: jnp.dot(w, v), 20_000, 0.2, noise)
    gradient = jax.jit(jax.grad(smoothed, argnums=1))(jax.random.key(5), jnp.array([0.3, 0.1, -0.2]))
    np.testing.assert_allclose(gradient, w, atol=0.1)


def test_noise_samples_and_log_densities():
    key = jax.random.key(9)
    np.testing.assert_array_equal(Normal().sample(key, (4,)), jax.random.normal(key, (4,)))
    np.testing.assert_array_equal(Gumbel().sample(key, (2, 2)), jax.random.gumbel(key, (2, 2)))
    assert Normal().sample(key, (3,), jnp.bfloat16).dtype == jnp.bfloat16
    z = np.linspace(-3, 3, 13)
    # Unnormalized: the difference with the exact log-density is a constant.
    normal_gap = np.asarray(Normal().log_prob(jnp.asarray(z))) - (-(z**2) / 2 - 0.5 * np.log(2 * np.pi))
    gumbel_gap = np.asarray(Gumbel().log_prob(jnp.asarray(z))) - (-(z + np.exp(-z)))
    np.testing.assert_allclose(normal_gap, normal_gap[0], atol=1e-5)
    np.testing.assert_allclose(gumbel_gap, 0, atol=1e-5)
    for ours, theirs in NOISES:
        np.testing.assert_allclose(ours.log_prob(jnp.asarray(z)), theirs.log_prob(jnp.asarray(z)), rtol=1e-6)


def test_sigma_is_a_leaf_so_a_new_value_does_not_retrace():
    traces = []

    @eqx.filter_jit
    def grad(fn, key, x):
        traces.append(None)
        return jax.grad(fn, argnums=1)(key, x)

    x = jnp.array([0.1, 0.2])
    f = lambda v: jnp.sum(jnp.maximum(v, 0.0))  # noqa: E731
    first = grad(make_perturbed_fun(f, 16, 0.1), KEY, x)
    second = grad(make_perturbed_fun(f, 16, 0.3), KEY, x)
    assert len(traces) == 1
    np.testing.assert_allclose(
        second, jax.grad(optax.perturbations.make_perturbed_fun(f, 16, 0.3), argnums=1)(KEY, x), rtol=1e-5
    )
    assert not np.allclose(first, second)


def test_bad_arguments():
    with pytest.raises(ValueError, match="Invalid sigma: 0.0"):
        make_perturbed_fun(jnp.sum, sigma=0.0)
    with pytest.raises(ValueError, match="Invalid num_samples: 0"):
        make_perturbed_fun(jnp.sum, num_samples=0)
    with pytest.raises(TypeError, match="`sample` method"):
        make_perturbed_fun(jnp.sum, noise=object())


def test_doctests():
    result = doctest.testmod(_perturbed, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0
