"""Linear algebra (`power_iteration`, `matrix_inverse_pth_root`) and the numerics not covered
by test_utilities.py.

optax (the oracle) returns `(eigenvalue, eigenvector)` from `power_iteration` since 0.2.2;
modopt keeps the seeds' order, `(eigenvector, eigenvalue)`. Independent checks use
`numpy.linalg.eigh` in float64.
"""

from __future__ import annotations

import doctest

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import modopt
from modopt._util import numerics as _numerics
from modopt.linalg import _matrix_root, _power_iteration, matrix_inverse_pth_root, power_iteration

INT32_MAX = np.iinfo(np.int32).max

# optax compiled once per shape (its eager while loops recompile at every call: slow on 2 cores).
_optax_power_iteration = jax.jit(optax.power_iteration)
_optax_root = jax.jit(optax.matrix_inverse_pth_root, static_argnums=1)


def _spd(n, seed, rank=None, scale=1.0):
    """A random symmetric positive (semi-)definite float32 matrix `x x^T / n`."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, rank or 2 * n))
    return jnp.asarray((scale * x @ x.T / n).astype(np.float32))


def _eigh(m):
    return np.linalg.eigh(np.asarray(m, np.float64))


def _assert_same_direction(v, u, atol=1e-4):
    """`v` and `u` span the same line (eigenvectors are defined up to sign)."""
    v, u = np.asarray(v, np.float64), np.asarray(u, np.float64)
    np.testing.assert_allclose(abs(np.dot(v, u)) / (np.linalg.norm(v) * np.linalg.norm(u)), 1.0, atol=atol)


# --------------------------------------------------------------------------------------------
# power_iteration
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n,seed", [(1, 0), (5, 2), (16, 3)])
def test_power_iteration_parity_and_eigh(n, seed):
    m = _spd(n, seed)
    vector, value = power_iteration(m)
    their_value, their_vector = _optax_power_iteration(m)  # optax >= 0.2.2 order
    assert vector.shape == (n,) and value.shape == ()
    assert vector.dtype == value.dtype == jnp.float32
    np.testing.assert_allclose(value, their_value, rtol=1e-6)
    np.testing.assert_allclose(vector, their_vector, rtol=1e-5, atol=1e-6)
    w, u = _eigh(m)
    np.testing.assert_allclose(value, w[-1], rtol=1e-5)
    _assert_same_direction(vector, u[:, -1])
    np.testing.assert_allclose(np.linalg.norm(vector), 1.0, rtol=1e-6)


@pytest.mark.parametrize("num_iters", [0, 1, 3])
def test_power_iteration_parity_few_iterations(num_iters):
    """Unconverged, the iterates still match optax's step by step (same start, same loop)."""
    m = _spd(5, 4)
    key = jax.random.PRNGKey(7)
    vector, value = power_iteration(m, num_iters, key=key)
    their_value, their_vector = _optax_power_iteration(m, num_iters=max(num_iters, 1), key=key)
    if num_iters == 0:  # optax starts from eigenvalue 0; modopt from <v0, A v0>: no step taken
        v0 = jax.random.uniform(key, (5,), minval=-1.0, maxval=1.0)
        v0 = v0 / jnp.linalg.norm(v0)
        np.testing.assert_allclose(value, v0 @ m @ v0, rtol=1e-6)
        z = m @ v0
        np.testing.assert_allclose(vector, z / jnp.linalg.norm(z), rtol=1e-6)
        return
    np.testing.assert_allclose(value, their_value, rtol=1e-6)
    np.testing.assert_allclose(vector, their_vector, rtol=1e-5, atol=1e-7)


def test_power_iteration_v0_and_key():
    m = _spd(5, 5)
    v0 = jnp.array([1.0, -2.0, 0.5, 3.0, -1.0])
    vector, value = power_iteration(m, v0=v0)
    their_value, their_vector = _optax_power_iteration(m, v0=v0)
    np.testing.assert_allclose(value, their_value, rtol=1e-6)
    np.testing.assert_allclose(vector, their_vector, rtol=1e-5, atol=1e-6)
    # Another key draws another start and lands on the same eigenpair.
    other_vector, other_value = power_iteration(m, key=jax.random.PRNGKey(3))
    np.testing.assert_allclose(other_value, value, rtol=1e-5)
    _assert_same_direction(other_vector, vector)


def test_power_iteration_tolerance_and_num_iters():
    """The loop stops at the relative residual asked for, and never takes more than num_iters."""
    m = jnp.diag(jnp.array([1.0, 0.9, 0.5]))  # slow: ratio 0.9
    v0 = jnp.ones(3)
    _, few = power_iteration(m, 2, 0.0, v0=v0)
    _, many = power_iteration(m, 400, 0.0, v0=v0)
    _, loose = power_iteration(m, 400, 1e-1, v0=v0)
    assert abs(float(many) - 1.0) < 1e-6
    assert abs(float(few) - 1.0) > abs(float(loose) - 1.0) > abs(float(many) - 1.0)
    # NumPy: two products from v0, as modopt counts them.
    v = np.ones(3) / np.sqrt(3.0)
    for _ in range(2):
        z = np.diag([1.0, 0.9, 0.5]) @ v
        v = z / np.linalg.norm(z)
    np.testing.assert_allclose(few, v @ np.diag([1.0, 0.9, 0.5]) @ v, rtol=1e-6)


def test_power_iteration_negative_dominant_and_zero_matrix():
    vector, value = power_iteration(jnp.diag(jnp.array([-3.0, 1.0, 0.5])))
    np.testing.assert_allclose(value, -3.0, rtol=1e-6)
    _assert_same_direction(vector, np.array([1.0, 0.0, 0.0]))
    # The zero matrix: optax gives NaN; modopt gives a unit vector and 0.
    vector, value = power_iteration(jnp.zeros((3, 3)))
    assert float(value) == 0.0
    np.testing.assert_allclose(np.linalg.norm(vector), 1.0, rtol=1e-6)


def test_power_iteration_operator_on_a_pytree():
    """A matrix-free operator (here block diagonal) on a dict, with the start vector given."""
    a, b = _spd(3, 6, scale=4.0), _spd(2, 7)

    def matvec(t):
        return {"a": a @ t["a"], "b": b @ t["b"]}

    v0 = {"a": jnp.ones(3), "b": jnp.ones(2)}
    vector, value = power_iteration(matvec, v0=v0)
    their_value, their_vector = optax.power_iteration(matvec, v0=v0)
    np.testing.assert_allclose(value, their_value, rtol=1e-5)
    w = max(_eigh(a)[0][-1], _eigh(b)[0][-1])
    np.testing.assert_allclose(value, w, rtol=1e-5)
    flat = np.concatenate([vector["a"], vector["b"]])
    dense = np.block([[np.asarray(a), np.zeros((3, 2))], [np.zeros((2, 3)), np.asarray(b)]])
    _assert_same_direction(flat, _eigh(dense)[1][:, -1])


def test_power_iteration_jit_equals_eager_and_vmaps():
    m = _spd(5, 8)
    eager = power_iteration(m, 50, 1e-6)
    jitted = jax.jit(power_iteration)(m, 50, 1e-6)  # num_iters and tolerance traced
    np.testing.assert_allclose(jitted[0], eager[0], rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(jitted[1], eager[1], rtol=1e-6)
    batch = jnp.stack([m, 2 * m])
    vectors, values = jax.vmap(power_iteration)(batch)
    np.testing.assert_allclose(values, [eager[1], 2 * eager[1]], rtol=1e-5)
    _assert_same_direction(vectors[1], eager[0])


# --------------------------------------------------------------------------------------------
# matrix_inverse_pth_root
# --------------------------------------------------------------------------------------------


def _exact_root(m, p, ridge_epsilon=1e-6):
    """NumPy: `(M + eps * lambda_max I)^(-1/p)` by eigendecomposition, in float64."""
    w, u = _eigh(m)
    damped = w + ridge_epsilon * max(w[-1], 1e-16)
    return (u * damped ** (-1.0 / p)) @ u.T, (u * damped) @ u.T


@pytest.mark.parametrize("n,seed,p", [(1, 0, 2), (7, 2, 1), (7, 2, 2), (7, 2, 4), (7, 2, 8)])
def test_matrix_inverse_pth_root_parity(n, seed, p):
    m = _spd(n, seed)
    root, error = matrix_inverse_pth_root(m, p)
    their_root, their_error = _optax_root(m, p)
    assert root.shape == (n, n) and root.dtype == jnp.float32
    assert error.shape == () and error.dtype == jnp.float32
    np.testing.assert_allclose(root, their_root, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(error, their_error, atol=1e-6)
    # NumPy: the root, and R^-p = M + ridge (R is symmetric positive definite).
    exact, damped = _exact_root(m, p)
    np.testing.assert_allclose(root, exact, rtol=2e-5, atol=2e-5 * np.abs(exact).max())
    r_inv = np.linalg.inv(np.asarray(root, np.float64))
    np.testing.assert_allclose(
        np.linalg.matrix_power(r_inv, p), damped, atol=1e-4 * np.abs(damped).max(), rtol=1e-4
    )
    np.testing.assert_allclose(root, root.T, atol=1e-5 * np.abs(exact).max())


@pytest.mark.parametrize("p", [3, 6])
def test_matrix_inverse_pth_root_any_integer_p(p):
    """Any integer root (optax 0.2.8 supports only p in {1, 2, 4, 8}: for p = 3 it computes
    a wrong root, ~10% off)."""
    m = _spd(7, 9)
    root, error = matrix_inverse_pth_root(m, p)
    exact, damped = _exact_root(m, p)
    np.testing.assert_allclose(root, exact, rtol=1e-4, atol=1e-5 * np.abs(exact).max())
    assert float(error) <= 1e-5
    power = np.linalg.matrix_power(np.linalg.inv(np.asarray(root, np.float64)), p)
    np.testing.assert_allclose(power, damped, rtol=5e-4, atol=5e-4 * np.abs(damped).max())


def test_matrix_inverse_pth_root_ridge_and_singular():
    """A rank-deficient PSD matrix is damped by ridge_epsilon * lambda_max before the root."""
    m = _spd(7, 10, rank=3)
    for ridge in (1e-3, 1e-1):
        root, _ = matrix_inverse_pth_root(m, 2, ridge_epsilon=ridge)
        their_root, _ = _optax_root(m, 2, ridge_epsilon=ridge)
        exact, _ = _exact_root(m, 2, ridge)
        np.testing.assert_allclose(root, exact, rtol=1e-3, atol=1e-4 * np.abs(exact).max())
        np.testing.assert_allclose(root, their_root, rtol=1e-5, atol=1e-5 * np.abs(exact).max())
    # The zero matrix: optax gives NaN; modopt damps it by 1e-22 and stays finite.
    root, error = matrix_inverse_pth_root(jnp.zeros((7, 7)), 2)
    assert np.all(np.isfinite(root)) and np.isfinite(error)
    np.testing.assert_allclose(np.diag(root), 1e11, rtol=1e-4)


def test_matrix_inverse_pth_root_stops_early():
    """Few iterations give a larger error; the error reported is that of the root returned."""
    m = _spd(7, 11)
    root, error = matrix_inverse_pth_root(m, 4, num_iters=3)
    their_root, their_error = _optax_root(m, 4, num_iters=3)
    np.testing.assert_allclose(root, their_root, rtol=1e-6)
    np.testing.assert_allclose(error, their_error, rtol=1e-6)
    assert float(error) > 1e-3
    _, damped = _exact_root(m, 4)
    r = np.asarray(root, np.float64)
    np.testing.assert_allclose(
        float(error), np.abs(np.linalg.matrix_power(r, 4) @ damped - np.eye(7)).max(), rtol=0.05
    )


def test_matrix_inverse_pth_root_jit_traced_p_and_vmap():
    m = _spd(7, 12)
    eager = matrix_inverse_pth_root(m, 3)
    traced = jax.jit(matrix_inverse_pth_root)(m, 3)  # p (and the rest) traced: a loop for T^p
    static = jax.jit(matrix_inverse_pth_root, static_argnums=1)(m, 3)
    for out in (traced, static):
        np.testing.assert_allclose(out[0], eager[0], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(out[1], eager[1], atol=1e-6)
    roots, _ = jax.jit(jax.vmap(lambda a: matrix_inverse_pth_root(a, 2)))(jnp.stack([m, 4 * m]))
    np.testing.assert_allclose(roots[0], matrix_inverse_pth_root(m, 2)[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(roots[1], 0.5 * roots[0], rtol=1e-4, atol=1e-6)


def test_matrix_inverse_pth_root_low_precision_dtypes():
    m = _spd(7, 13)
    exact, _ = _exact_root(m, 2)
    for dtype in (jnp.bfloat16,):
        root, error = matrix_inverse_pth_root(m.astype(dtype), 2)
        assert root.dtype == dtype and error.dtype == jnp.float32  # computed in float32
        np.testing.assert_allclose(np.asarray(root, np.float32), exact, rtol=2e-2, atol=2e-2)


# --------------------------------------------------------------------------------------------
# Bad input
# --------------------------------------------------------------------------------------------

BAD_LINALG = [
    (lambda: power_iteration(jnp.ones((2, 3))), ValueError, r"Invalid matrix: an array of shape \(2, 3\)"),
    (lambda: power_iteration(jnp.ones(3)), ValueError, r"Invalid matrix: an array of shape \(3,\)"),
    (lambda: power_iteration(jnp.ones((2, 2, 2))), ValueError, r"Invalid matrix: .*jax.vmap"),
    (
        lambda: power_iteration(jnp.eye(2, dtype=jnp.int32)),
        TypeError,
        "Invalid matrix: an array of dtype int32",
    ),
    (
        lambda: power_iteration(jnp.eye(2), -1),
        ValueError,
        r"Invalid num_iters: -1 \(must be an integer >= 0\)",
    ),
    (lambda: power_iteration(jnp.eye(2), 2.5), ValueError, "Invalid num_iters: 2.5"),
    (lambda: power_iteration(jnp.eye(2), 10, -1e-3), ValueError, "Invalid error_tolerance: -0.001"),
    (lambda: power_iteration(lambda v: v), ValueError, "Invalid v0: None .* pass the start vector"),
    (lambda: power_iteration(jnp.eye(2), v0=jnp.ones(3)), ValueError, r"Invalid v0: shape \(3,\)"),
    (lambda: power_iteration(jnp.eye(2), v0=jnp.ones(2, jnp.int32)), TypeError, "Invalid v0: .*dtype int32"),
    (lambda: matrix_inverse_pth_root(jnp.ones((2, 3)), 2), ValueError, r"Invalid matrix: .*\(2, 3\)"),
    (lambda: matrix_inverse_pth_root(jnp.ones((2, 2, 2)), 2), ValueError, "Invalid matrix"),
    (lambda: matrix_inverse_pth_root(np.eye(2, dtype=bool), 2), TypeError, "Invalid matrix: .*dtype bool"),
    (lambda: matrix_inverse_pth_root(jnp.eye(2, dtype=jnp.int32), 2), TypeError, "matrix.astype"),
    (lambda: matrix_inverse_pth_root(jnp.zeros((0, 0)), 2), ValueError, "Invalid matrix: an empty matrix"),
    (lambda: matrix_inverse_pth_root(jnp.eye(2), 0), ValueError, r"Invalid p: 0 \(must be an integer >= 1\)"),
    (lambda: matrix_inverse_pth_root(jnp.eye(2), -2), ValueError, "Invalid p: -2"),
    (lambda: matrix_inverse_pth_root(jnp.eye(2), 1.5), ValueError, "Invalid p: 1.5"),
    (lambda: matrix_inverse_pth_root(jnp.eye(2), True), TypeError, "Invalid p: True"),
    (lambda: matrix_inverse_pth_root(jnp.eye(2), 2, -1), ValueError, "Invalid num_iters: -1"),
    (lambda: matrix_inverse_pth_root(jnp.eye(2), 2, 10, -1e-6), ValueError, "Invalid ridge_epsilon"),
    (lambda: matrix_inverse_pth_root(jnp.eye(2), 2, 10, 1e-6, -1.0), ValueError, "Invalid error_tolerance"),
    (
        lambda: matrix_inverse_pth_root(jnp.eye(2), 2, ridge_epsilon=np.nan),
        ValueError,
        "Invalid ridge_epsilon",
    ),
]


@pytest.mark.parametrize("call,error,match", BAD_LINALG)
def test_linalg_bad_input(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_bad_input_raises_at_trace_time_under_jit():
    with pytest.raises(ValueError, match="Invalid matrix"):
        jax.jit(lambda m: power_iteration(m))(jnp.ones((2, 3)))
    with pytest.raises(ValueError, match="Invalid p: 0"):
        jax.jit(matrix_inverse_pth_root, static_argnums=1)(jnp.eye(2), 0)


# --------------------------------------------------------------------------------------------
# Numerics: what tests/test_utilities.py does not cover
# --------------------------------------------------------------------------------------------


def test_safe_norm_jit_equals_eager_with_traced_min_norm():
    x = jnp.asarray(np.random.default_rng(14).normal(size=(3, 4)).astype(np.float32)).at[0].set(0.0)

    def f(v, min_norm):
        return modopt.safe_norm(v, min_norm, axis=1)

    def theirs(v, min_norm):
        value = optax.safe_norm(v, min_norm, axis=1)
        return value, jax.grad(lambda v_: jnp.sum(optax.safe_norm(v_, min_norm, axis=1)))(v)

    jitted, theirs = jax.jit(f), jax.jit(theirs)
    jitted_grad = jax.jit(jax.grad(lambda v, m: jnp.sum(f(v, m))))
    for min_norm in (0.0, 1.0, 100.0):
        eager = f(x, min_norm)
        np.testing.assert_array_equal(jitted(x, jnp.float32(min_norm)), eager)
        their_value, g_theirs = theirs(x, min_norm)
        np.testing.assert_allclose(eager, their_value, rtol=1e-6)
        g = jitted_grad(x, jnp.float32(min_norm))
        assert np.all(np.isfinite(g))
        np.testing.assert_allclose(g, g_theirs, rtol=1e-6)


def test_safe_norm_and_rms_gradient_with_respect_to_the_minimum():
    """Below the minimum the result is the minimum: its gradient in `min_norm` is 1, else 0."""
    x = jnp.array([3.0, 4.0])
    for f, g in ((modopt.safe_norm, optax.safe_norm),):
        for m in (1.0, 10.0):
            ours = jax.grad(lambda m_: f(x, m_))(m)
            np.testing.assert_allclose(ours, jax.grad(lambda m_: g(x, m_))(m))
            assert float(ours) == (1.0 if m > 5.0 else 0.0)
    f = modopt.safe_root_mean_squares
    for m in (1.0, 10.0):
        ours = jax.grad(lambda m_: f(x, m_))(m)
        np.testing.assert_allclose(ours, jax.grad(lambda m_: optax.safe_root_mean_squares(x, m_))(m))


def test_safe_root_mean_squares_jit_and_gradient_at_zero_above_minimum():
    f = modopt.safe_root_mean_squares
    x = jnp.zeros((2, 3))
    g = jax.jit(jax.grad(lambda v: f(v, 0.5)))(x)
    np.testing.assert_array_equal(g, np.zeros((2, 3)))
    y = jnp.arange(6.0).reshape(2, 3)
    np.testing.assert_array_equal(jax.jit(f)(y, 0.1), f(y, 0.1))
    np.testing.assert_allclose(
        jax.jit(jax.grad(lambda v: f(v, 0.1)))(y),
        jax.jit(jax.grad(lambda v: optax.safe_root_mean_squares(v, 0.1)))(y),
        rtol=1e-6,
    )


def test_global_norm_gradient_parity():
    tree = {"a": jnp.array([3.0, -4.0]), "b": jnp.array([[1.0, 2.0]])}
    ours = jax.grad(modopt.global_norm)(tree)
    theirs = jax.grad(optax.tree.norm)(tree)
    for key in tree:
        np.testing.assert_allclose(ours[key], theirs[key], rtol=1e-6)


def test_safe_int32_increment_saturates_under_jit_and_vmap():
    counts = jnp.array([0, 41, INT32_MAX - 1, INT32_MAX], jnp.int32)
    out = jax.jit(jax.vmap(modopt.safe_int32_increment))(counts)
    assert out.dtype == jnp.int32
    np.testing.assert_array_equal(out, [1, 42, INT32_MAX, INT32_MAX])
    np.testing.assert_array_equal(out, optax.safe_int32_increment(counts))


@pytest.mark.parametrize("dtype", [jnp.int16, jnp.uint32, jnp.float32, jnp.bool_])
def test_safe_int32_increment_rejects_other_dtypes(dtype):
    """The seeds' contract is an int32 counter (optax 0.2.8 aliases it to safe_increment)."""
    with pytest.raises(
        ValueError, match=r"Invalid count: dtype .* \(expected an int32 counter\).*safe_increment"
    ):
        modopt.safe_int32_increment(jnp.asarray(1, dtype))


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16, jnp.float32], ids=lambda d: d.__name__)
def test_powers_of_two_and_exponents_are_ldexp_and_frexp(dtype):
    """The scales of the matrix optimizers' huge-gradient guards (written from the dtypes' bit
    fields) against `jnp.ldexp` and `jnp.frexp`: every power of two from far below the dtype's
    range to far above it, and the exponents of normal numbers across the range."""
    k = jnp.arange(-400, 400, dtype=jnp.int32)
    ours = jax.jit(lambda k: _numerics.power_of_two(k, dtype))(k)
    theirs = jax.jit(lambda k: jnp.ldexp(jnp.ones(k.shape, dtype), k))(k)
    np.testing.assert_array_equal(np.asarray(ours, np.float32), np.asarray(theirs, np.float32))
    info = jnp.finfo(dtype)
    exponents = jax.random.uniform(jax.random.key(0), (4096,), jnp.float32, info.minexp, info.maxexp)
    x = jnp.concatenate([jnp.exp2(exponents), jnp.asarray([info.tiny, info.max, 1.0, 0.5, 3.0])]).astype(dtype)
    x = x[jnp.isfinite(x) & (x >= info.tiny)]
    np.testing.assert_array_equal(jax.jit(_numerics._exponent)(x), jnp.frexp(x)[1])


@pytest.mark.parametrize("module", [_numerics, _power_iteration, _matrix_root])
def test_docstring_examples(module):
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
