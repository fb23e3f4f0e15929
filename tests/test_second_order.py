"""Second-order utilities (`hvp`, `hessian_diag`, `fisher_diag`) against `jax.hessian` on small
models, per-example gradients, and optax.second_order (the oracle, deprecated in optax 0.2.8).
"""

from __future__ import annotations

import doctest
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.flatten_util import ravel_pytree

from modopt.second_order import _curvature, fisher_diag, hessian_diag, hvp

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

# The parity tests compile each computation once (`loss` static): op-by-op eager autodiff
# compiles every primitive and is slow on 2 cores. `test_jit_equals_eager` covers eager calls.
_hvp, _hessian_diag, _fisher_diag = (jax.jit(f, static_argnums=0) for f in (hvp, hessian_diag, fisher_diag))
_optax_hvp, _optax_hessian_diag, _optax_fisher_diag = (
    jax.jit(f, static_argnums=0)
    for f in (optax.second_order.hvp, optax.second_order.hessian_diag, optax.second_order.fisher_diag)
)

RTOL = 1e-5
ATOL = 1e-6


def _data(seed, batch=4, features=3, outputs=2):
    rng = np.random.default_rng(seed)
    inputs = jnp.asarray(rng.normal(size=(batch, features)).astype(np.float32))
    targets = jnp.asarray(rng.normal(size=(batch, outputs)).astype(np.float32))
    return inputs, targets


def _linear_params(seed, features=3, outputs=2):
    rng = np.random.default_rng(seed)
    return {
        "w": jnp.asarray(rng.normal(size=(features, outputs)).astype(np.float32)),
        "b": jnp.asarray(rng.normal(size=(outputs,)).astype(np.float32)),
    }


def linear_mse(params, inputs, targets):
    return jnp.mean((inputs @ params["w"] + params["b"] - targets) ** 2)


def _mlp_params(seed, features=3, hidden=4, outputs=2):
    rng = np.random.default_rng(seed)

    def normal(*shape):
        return jnp.asarray((0.5 * rng.normal(size=shape)).astype(np.float32))

    return [(normal(features, hidden), normal(hidden)), (normal(hidden, outputs), normal(outputs))]


def mlp_mse(params, inputs, targets):
    (w1, b1), (w2, b2) = params
    return jnp.mean((jnp.tanh(inputs @ w1 + b1) @ w2 + b2 - targets) ** 2)


def logistic_nll(params, inputs, targets):
    """Binary logistic regression: negative log-likelihood summed over the batch (labels 0/1)."""
    logits = inputs @ params["w"][:, 0] + params["b"][0]
    return jnp.sum(optax.sigmoid_binary_cross_entropy(logits, targets[:, 0] > 0))


MODELS = {
    "linear": (linear_mse, _linear_params),
    "mlp": (mlp_mse, _mlp_params),
    "logistic": (logistic_nll, _linear_params),
}


@functools.partial(jax.jit, static_argnums=0)
def _dense_hessian(loss, params, inputs, targets):
    """`jax.hessian` of the loss as a function of the flat parameter vector."""
    flat, unravel = ravel_pytree(params)
    return jax.hessian(lambda f: loss(unravel(f), inputs, targets))(flat)


# --------------------------------------------------------------------------------------------
# hvp
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("model", sorted(MODELS))
def test_hvp_against_dense_hessian_and_optax(model):
    loss, make = MODELS[model]
    params, (inputs, targets) = make(0), _data(1)
    n = ravel_pytree(params)[0].size
    v = jnp.asarray(np.random.default_rng(2).normal(size=n).astype(np.float32))
    out = _hvp(loss, v, params, inputs, targets)
    # A pytree shaped like params, as optax's.
    assert jax.tree_util.tree_structure(out) == jax.tree_util.tree_structure(params)
    flat_out = ravel_pytree(out)[0]
    expected = _dense_hessian(loss, params, inputs, targets) @ v
    np.testing.assert_allclose(flat_out, expected, rtol=1e-4, atol=ATOL)
    theirs = _optax_hvp(loss, v, params, inputs, targets)
    np.testing.assert_allclose(flat_out, ravel_pytree(theirs)[0], rtol=RTOL, atol=ATOL)
    # v given as a pytree shaped like params gives the same product.
    unravel = ravel_pytree(params)[1]
    tree_out = _hvp(loss, unravel(v), params, inputs, targets)
    np.testing.assert_allclose(ravel_pytree(tree_out)[0], flat_out, rtol=1e-6)


def test_hvp_single_array_params_and_linearity():
    """With one array of parameters, v and H v are arrays of its shape; H (a u + b v) is linear."""
    inputs, targets = _data(3, outputs=1)

    def loss(w, x, y):
        return jnp.mean(jnp.sin(x @ w) - y[:, 0]) ** 2

    w = jnp.array([0.3, -0.2, 0.5])
    u, v = jnp.array([1.0, 0.0, 2.0]), jnp.array([0.0, -1.0, 0.5])
    hu, hv = _hvp(loss, u, w, inputs, targets), _hvp(loss, v, w, inputs, targets)
    assert hu.shape == (3,)
    np.testing.assert_allclose(
        _hvp(loss, 2 * u - 3 * v, w, inputs, targets), 2 * hu - 3 * hv, rtol=1e-5, atol=1e-6
    )
    hessian = jax.jit(jax.hessian(loss))(w, inputs, targets)
    np.testing.assert_allclose(hu, hessian @ u, rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------------------------
# hessian_diag
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("model", sorted(MODELS))
def test_hessian_diag_against_dense_hessian_and_optax(model):
    loss, make = MODELS[model]
    params, (inputs, targets) = make(4), _data(5)
    out = _hessian_diag(loss, params, inputs, targets)
    n = ravel_pytree(params)[0].size
    assert out.shape == (n,) and out.dtype == jnp.float32
    dense = _dense_hessian(loss, params, inputs, targets)
    np.testing.assert_allclose(out, jnp.diagonal(dense), rtol=1e-4, atol=ATOL)
    theirs = _optax_hessian_diag(loss, params, inputs, targets)
    np.testing.assert_allclose(out, theirs, rtol=RTOL, atol=ATOL)


def test_hessian_diag_linear_model_closed_form():
    """For `mean ||X w + b - Y||^2` the diagonal is `2/(B k) * sum_i x_ij^2` (weights), `2/k` (biases)."""
    inputs, targets = _data(6, batch=5, features=3, outputs=2)
    params = _linear_params(7)
    out = _hessian_diag(linear_mse, params, inputs, targets)
    x = np.asarray(inputs, np.float64)
    batch, outputs = 5, 2
    w_diag = np.repeat(2.0 * np.sum(x**2, axis=0) / (batch * outputs), outputs)  # row-major (3, 2)
    b_diag = np.full(outputs, 2.0 / outputs)
    expected = np.concatenate([b_diag, w_diag])  # ravel_pytree orders the dict keys: "b", "w"
    np.testing.assert_allclose(out, expected, rtol=1e-5)


# --------------------------------------------------------------------------------------------
# fisher_diag
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("model", sorted(MODELS))
def test_fisher_diag_is_the_squared_gradient_and_matches_optax(model):
    loss, make = MODELS[model]
    params, (inputs, targets) = make(8), _data(9)
    out = _fisher_diag(loss, params, inputs, targets)
    gradient = ravel_pytree(jax.jit(jax.grad(loss))(params, inputs, targets))[0]
    np.testing.assert_allclose(out, np.asarray(gradient) ** 2, rtol=1e-6)
    np.testing.assert_allclose(out, _optax_fisher_diag(loss, params, inputs, targets), rtol=1e-6)
    assert np.all(np.asarray(out) >= 0)


def test_fisher_diag_per_example_is_the_empirical_fisher():
    """Per example, `fisher_diag` is that example's squared gradient; averaged over the batch
    (vmap), the diagonal of the empirical Fisher `mean_i g_i g_i^T` from `jax.jacrev`."""
    params, (inputs, targets) = _linear_params(10), _data(11, batch=6)

    def nll_one(p, x, y):
        return logistic_nll(p, x[None], y[None])

    per_example = jax.jit(jax.vmap(functools.partial(fisher_diag, nll_one), in_axes=(None, 0, 0)))(
        params, inputs, targets
    )
    assert per_example.shape == (6, ravel_pytree(params)[0].size)
    flat, unravel = ravel_pytree(params)

    def losses(f):
        return jax.vmap(lambda x, y: nll_one(unravel(f), x, y))(inputs, targets)

    jacobian = np.asarray(jax.jit(jax.jacrev(losses))(flat), np.float64)  # (batch, n): per-example gradients
    empirical = np.mean(jacobian[:, :, None] * jacobian[:, None, :], axis=0)
    np.testing.assert_allclose(per_example.mean(0), np.diagonal(empirical), rtol=1e-5, atol=1e-7)
    for i in range(2):
        np.testing.assert_allclose(
            per_example[i], _fisher_diag(nll_one, params, inputs[i], targets[i]), rtol=1e-6
        )


def test_expected_fisher_equals_the_hessian_diagonal_for_a_gaussian_nll():
    """For a linear model with Gaussian NLL, the expected Fisher equals the Hessian `x x^T`:
    with one example, E_y[(x (w.x - y))^2] = x^2 (unit noise). Checked by Monte Carlo."""
    x = jnp.array([1.0, -2.0, 0.5])
    w = jnp.array([0.2, 0.1, -0.3])

    def nll(p, inputs, target):
        return 0.5 * (inputs @ p - target) ** 2

    noise = jax.random.normal(jax.random.PRNGKey(0), (20000,))
    samples = jax.jit(jax.vmap(lambda e: fisher_diag(nll, w, x, x @ w + e)))(noise)
    np.testing.assert_allclose(samples.mean(0), np.asarray(x) ** 2, rtol=0.05)
    np.testing.assert_allclose(_hessian_diag(nll, w, x, x @ w), np.asarray(x) ** 2, rtol=1e-6)


# --------------------------------------------------------------------------------------------
# jit, dtypes, doc examples
# --------------------------------------------------------------------------------------------


def test_jit_equals_eager():
    params, (inputs, targets) = _linear_params(12), _data(13)
    n = ravel_pytree(params)[0].size
    v = jnp.linspace(-1.0, 1.0, n)
    pairs = [
        (lambda p, x, y: hessian_diag(linear_mse, p, x, y), ()),
        (lambda p, x, y: fisher_diag(linear_mse, p, x, y), ()),
        (lambda p, x, y, v: ravel_pytree(hvp(linear_mse, v, p, x, y))[0], (v,)),
    ]
    for fn, extra in pairs:
        eager = fn(params, inputs, targets, *extra)
        jitted = jax.jit(fn)(params, inputs, targets, *extra)
        np.testing.assert_allclose(jitted, eager, rtol=1e-5, atol=1e-6)


def test_mixed_dtype_params():
    """bfloat16 and float32 leaves: the flat results are float32 (ravel_pytree's promotion)."""
    inputs, targets = _data(14)
    params = {"w": _linear_params(15)["w"].astype(jnp.bfloat16), "b": _linear_params(15)["b"]}

    def loss(p, x, y):
        return jnp.mean((x @ p["w"].astype(jnp.float32) + p["b"] - y) ** 2)

    out = _hessian_diag(loss, params, inputs, targets)
    assert out.dtype == jnp.float32
    np.testing.assert_allclose(out, _optax_hessian_diag(loss, params, inputs, targets), rtol=1e-5)
    h = _hvp(loss, jnp.ones(out.size), params, inputs, targets)
    assert h["w"].dtype == jnp.bfloat16 and h["b"].dtype == jnp.float32


def test_docstring_examples():
    result = doctest.testmod(_curvature)
    assert result.attempted > 0 and result.failed == 0


# --------------------------------------------------------------------------------------------
# Bad input
# --------------------------------------------------------------------------------------------

_P = {"w": jnp.ones((3, 2)), "b": jnp.zeros(2)}
_X, _Y = _data(16)

BAD_SECOND_ORDER = [
    (lambda: hvp("mse", jnp.ones(8), _P, _X, _Y), TypeError, r"Invalid loss: a str \(expected a function"),
    (lambda: hessian_diag(None, _P, _X, _Y), TypeError, "Invalid loss: a NoneType"),
    (
        lambda: fisher_diag(3.0, _P, _X, _Y),
        TypeError,
        r"Invalid negative_log_likelihood: a float .*negative_log_likelihood\(params, inputs, targets\)",
    ),
    (
        lambda: hessian_diag(lambda p, x, y: (x @ p["w"] + p["b"] - y) ** 2, _P, _X, _Y),
        ValueError,
        r"Invalid loss: it returned .*\(4, 2\).* \(expected a real floating scalar\).*\.mean\(\)",
    ),
    (
        lambda: fisher_diag(lambda p, x, y: jnp.ones(3), _P, _X, _Y),
        ValueError,
        "Invalid negative_log_likelihood: it returned",
    ),
    (
        lambda: hvp(linear_mse, jnp.ones(8), {"w": jnp.ones((3, 2), jnp.int32), "b": jnp.zeros(2)}, _X, _Y),
        TypeError,
        r"Invalid params: the leaf at \['w'\] has dtype int32 \(expected a real floating dtype\)",
    ),
    (lambda: hessian_diag(linear_mse, {}, _X, _Y), ValueError, "Invalid params: {} holds no arrays"),
    (lambda: hvp(linear_mse, jnp.ones(7), _P, _X, _Y), ValueError, r"Invalid v: shape \(7,\) .*\(8,\)"),
    (lambda: hvp(linear_mse, jnp.ones((2, 4)), _P, _X, _Y), ValueError, r"Invalid v: shape \(2, 4\)"),
    (
        lambda: hvp(linear_mse, {"w": jnp.ones((2, 3)), "b": jnp.ones(2)}, _P, _X, _Y),
        ValueError,
        "Invalid v: dict",
    ),
]


@pytest.mark.parametrize("call,error,match", BAD_SECOND_ORDER)
def test_second_order_bad_input(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_bad_input_raises_at_trace_time_under_jit():
    with pytest.raises(ValueError, match="Invalid loss: it returned"):
        jax.jit(lambda p: hessian_diag(lambda q, x, y: x @ q["w"], p, _X, _Y))(_P)


def test_hvp_and_hessian_diag_against_finite_differences_of_the_gradient():
    """Central differences of the float64 gradient, independent of forward-over-reverse."""
    inputs, targets = (np.asarray(a, np.float64) for a in _data(5))
    params = jax.tree.map(lambda a: np.asarray(a, np.float64), _mlp_params(5))
    flat, unravel = ravel_pytree(params)
    flat = np.asarray(flat, np.float64)
    v = np.random.default_rng(0).normal(size=flat.shape)

    def grad_at(f):
        with jax.enable_x64(True):
            g = jax.grad(mlp_mse)(unravel(jnp.asarray(f)), jnp.asarray(inputs), jnp.asarray(targets))
            return np.asarray(ravel_pytree(g)[0])

    h = 1e-5
    fd_hvp = (grad_at(flat + h * v) - grad_at(flat - h * v)) / (2 * h)
    fd_diag = np.array(
        [(grad_at(flat + h * e)[i] - grad_at(flat - h * e)[i]) / (2 * h) for i, e in enumerate(np.eye(flat.size))]
    )
    params32 = jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), params)
    inputs32, targets32 = jnp.asarray(inputs, jnp.float32), jnp.asarray(targets, jnp.float32)
    got_hvp = ravel_pytree(_hvp(mlp_mse, unravel(jnp.asarray(v, jnp.float32)), params32, inputs32, targets32))[0]
    np.testing.assert_allclose(got_hvp, fd_hvp, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(_hessian_diag(mlp_mse, params32, inputs32, targets32), fd_diag, rtol=1e-4, atol=1e-5)
