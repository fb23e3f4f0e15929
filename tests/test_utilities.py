"""Numerical utilities: parity with optax (the oracle) and with NumPy formulas.

Covers norms (`global_norm`, `safe_norm`, `safe_root_mean_squares`), counters
(`safe_increment`, `safe_int32_increment`), `abs_sq`, the moment helpers shared by the
adaptive transforms, and the parameter-update helpers (`apply_updates`,
`incremental_update`, `periodic_update`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import modopt

RTOL = 1e-6
ATOL = 1e-7
INT32_MAX = np.iinfo(np.int32).max

SHAPES = {"mat": (3, 4), "vec": (5,), "scalar": (), "cube": (2, 3, 2)}


def _tree(seed, dtype=np.float32, shapes=SHAPES):
    """A pytree with a matrix, a vector, a scalar and a 3-d leaf, nested one level."""
    rng = np.random.default_rng(seed)

    def leaf(shape):
        x = rng.normal(size=shape)
        if np.issubdtype(dtype, np.complexfloating):
            x = x + 1j * rng.normal(size=shape)
        return jnp.asarray(x.astype(dtype))

    return {
        "mat": leaf(shapes["mat"]),
        "inner": {"vec": leaf(shapes["vec"]), "scalar": leaf(shapes["scalar"])},
        "cube": leaf(shapes["cube"]),
    }


def _assert_tree_close(ours, theirs, rtol=RTOL, atol=ATOL, check_dtype=True):
    ours_leaves, ours_def = jax.tree_util.tree_flatten(ours, is_leaf=lambda x: x is None)
    theirs_leaves, theirs_def = jax.tree_util.tree_flatten(theirs, is_leaf=lambda x: x is None)
    assert ours_def == theirs_def, (ours_def, theirs_def)
    for a, b in zip(ours_leaves, theirs_leaves):
        if b is None:
            assert a is None
            continue
        a, b = jnp.asarray(a), jnp.asarray(b)
        assert a.shape == b.shape, (a.shape, b.shape)
        if check_dtype:
            assert a.dtype == b.dtype, (a.dtype, b.dtype)
        np.testing.assert_allclose(
            np.asarray(a.astype(jnp.complex64) if jnp.iscomplexobj(a) else a.astype(jnp.float32)),
            np.asarray(b.astype(jnp.complex64) if jnp.iscomplexobj(b) else b.astype(jnp.float32)),
            rtol=rtol,
            atol=atol,
        )


# --------------------------------------------------------------------------------------------
# global_norm
# --------------------------------------------------------------------------------------------


@pytest.mark.filterwarnings("ignore:optax.global_norm is deprecated:DeprecationWarning")
@pytest.mark.parametrize("dtype", [np.float32, np.complex64])
def test_global_norm(dtype):
    tree = _tree(0, dtype)
    expected = np.sqrt(sum(np.sum(np.abs(np.asarray(x)) ** 2) for x in jax.tree_util.tree_leaves(tree)))
    ours = modopt.global_norm(tree)
    np.testing.assert_allclose(ours, optax.tree.norm(tree), rtol=RTOL)
    np.testing.assert_allclose(ours, optax.global_norm(tree), rtol=RTOL)
    np.testing.assert_allclose(ours, expected, rtol=1e-5)
    assert ours.shape == ()
    assert not jnp.iscomplexobj(ours)
    np.testing.assert_allclose(jax.jit(modopt.global_norm)(tree), ours, rtol=RTOL)


@pytest.mark.filterwarnings("ignore:optax.global_norm is deprecated:DeprecationWarning")
def test_global_norm_empty_and_zero():
    np.testing.assert_allclose(modopt.global_norm({}), optax.global_norm({}))
    zeros = jax.tree_util.tree_map(jnp.zeros_like, _tree(1))
    assert float(modopt.global_norm(zeros)) == 0.0


def test_global_norm_bf16_tree():
    tree = _tree(2, jnp.bfloat16)
    np.testing.assert_allclose(
        np.float32(modopt.global_norm(tree)), np.float32(optax.tree.norm(tree)), rtol=1e-2
    )


# --------------------------------------------------------------------------------------------
# safe_norm
# --------------------------------------------------------------------------------------------


def _with_zero_slices(shape, seed):
    """Random values with the first slice along axis 0 set to zero (a norm below any min)."""
    x = np.random.default_rng(seed).normal(size=shape).astype(np.float32)
    if len(shape) >= 2:
        x[0] = 0.0
    return jnp.asarray(x)


SAFE_NORM_CASES = [
    # (shape, ord, axis)
    ((5,), None, None),
    ((5,), 1, None),
    ((5,), jnp.inf, None),
    ((5,), 3, 0),
    ((3, 4), None, None),
    ((3, 4), 1, None),
    ((3, 4), jnp.inf, None),
    ((3, 4), None, 1),
    ((3, 4), jnp.inf, -1),
    ((3, 4), "fro", (0, 1)),
    ((2, 3, 4), None, None),
    ((2, 3, 4), None, -1),
    ((2, 3, 4), "fro", (1, 2)),
    ((2, 3, 4), jnp.inf, (1, 2)),
    ((2, 3, 4), 1, (0, 2)),
]


@pytest.mark.parametrize("keepdims", [False, True])
@pytest.mark.parametrize("min_norm", [0.0, 1.5])
@pytest.mark.parametrize("shape,ord,axis", SAFE_NORM_CASES)
def test_safe_norm_parity(shape, ord, axis, min_norm, keepdims):  # noqa: A002
    x = _with_zero_slices(shape, seed=len(shape))
    ours = modopt.safe_norm(x, min_norm, ord=ord, axis=axis, keepdims=keepdims)
    theirs = optax.safe_norm(x, min_norm, ord=ord, axis=axis, keepdims=keepdims)
    assert ours.shape == theirs.shape
    np.testing.assert_allclose(ours, theirs, rtol=RTOL, atol=ATOL)
    # NumPy: max(norm, min_norm).
    expected = np.maximum(np.linalg.norm(np.asarray(x), ord=ord, axis=axis, keepdims=keepdims), min_norm)
    np.testing.assert_allclose(ours, expected, rtol=1e-5, atol=1e-6)
    if keepdims:
        return  # the gradient does not depend on keepdims; check it once

    def total(f):
        return lambda v: jnp.sum(f(v, min_norm, ord=ord, axis=axis, keepdims=keepdims))

    grad_ours = jax.grad(total(modopt.safe_norm))(x)
    grad_theirs = jax.grad(total(optax.safe_norm))(x)
    assert np.all(np.isfinite(grad_ours))
    np.testing.assert_allclose(grad_ours, grad_theirs, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("ord", [None, 1, jnp.inf])
def test_safe_norm_gradient_at_zero_is_zero(ord):  # noqa: A002
    x = jnp.zeros((4,))
    # The naive version has a NaN gradient at 0, which is the point of safe_norm.
    naive = jax.grad(lambda v: jnp.maximum(jnp.linalg.norm(v, ord=ord), 0.0))(x)
    grad = jax.grad(lambda v: modopt.safe_norm(v, 0.0, ord=ord))(x)
    assert np.all(np.asarray(grad) == 0.0), grad
    if ord is None:
        assert np.any(np.isnan(naive))
    assert float(modopt.safe_norm(x, 0.0, ord=ord)) == 0.0
    assert float(modopt.safe_norm(x, 0.25, ord=ord)) == 0.25
    # Also per row, under jit.
    m = jnp.zeros((3, 2)).at[1].set(jnp.array([3.0, 4.0]))
    g = jax.jit(jax.grad(lambda v: jnp.sum(modopt.safe_norm(v, 0.0, axis=1))))(m)
    np.testing.assert_allclose(g, np.array([[0, 0], [0.6, 0.8], [0, 0]], np.float32), rtol=1e-6)


def test_safe_norm_gradient_above_min_is_the_norm_gradient():
    x = jnp.array([3.0, -4.0])
    grad = jax.grad(lambda v: modopt.safe_norm(v, 1.0))(x)
    np.testing.assert_allclose(grad, np.array([0.6, -0.8]), rtol=1e-6)
    # Below min_norm the value is the constant min_norm: zero gradient.
    grad = jax.grad(lambda v: modopt.safe_norm(v, 10.0))(x)
    np.testing.assert_array_equal(grad, np.zeros(2))


# --------------------------------------------------------------------------------------------
# safe_root_mean_squares
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float32, np.complex64])
@pytest.mark.parametrize("min_rms", [0.0, 0.3, 10.0])
@pytest.mark.parametrize("shape", [(5,), (3, 4), (2, 3, 2)])
def test_safe_root_mean_squares(shape, min_rms, dtype):
    rng = np.random.default_rng(3)
    x = rng.normal(size=shape)
    if dtype == np.complex64:
        x = x + 1j * rng.normal(size=shape)
    x = jnp.asarray(x.astype(dtype))
    ours = modopt.safe_root_mean_squares(x, min_rms)
    np.testing.assert_allclose(ours, optax.safe_root_mean_squares(x, min_rms), rtol=RTOL)
    expected = max(np.sqrt(np.mean(np.abs(np.asarray(x)) ** 2)), min_rms)
    np.testing.assert_allclose(ours, expected, rtol=1e-5)
    if dtype == np.float32:
        g_ours = jax.grad(lambda v: modopt.safe_root_mean_squares(v, min_rms))(x)
        g_theirs = jax.grad(lambda v: optax.safe_root_mean_squares(v, min_rms))(x)
        np.testing.assert_allclose(g_ours, g_theirs, rtol=1e-5, atol=1e-7)


def test_safe_root_mean_squares_gradient_at_zero():
    x = jnp.zeros((3, 2))
    grad = jax.grad(lambda v: modopt.safe_root_mean_squares(v, 0.0))(x)
    np.testing.assert_array_equal(grad, np.zeros((3, 2)))
    assert float(modopt.safe_root_mean_squares(x, 0.5)) == 0.5


# --------------------------------------------------------------------------------------------
# Counters
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "count,expected", [(0, 1), (5, 6), (INT32_MAX - 1, INT32_MAX), (INT32_MAX, INT32_MAX)]
)
def test_safe_int32_increment(count, expected):
    c = jnp.asarray(count, jnp.int32)
    for fn in (modopt.safe_int32_increment, jax.jit(modopt.safe_int32_increment)):
        out = fn(c)
        assert out.dtype == jnp.int32
        assert int(out) == expected
        assert int(out) == int(optax.safe_int32_increment(c))
        assert int(out) == int(optax.safe_increment(c))


def test_safe_int32_increment_saturates_repeatedly():
    c = jnp.asarray(INT32_MAX - 2, jnp.int32)
    for _ in range(5):
        c = modopt.safe_int32_increment(c)
    assert int(c) == INT32_MAX


@pytest.mark.parametrize(
    "dtype,top", [(jnp.int8, 127), (jnp.uint8, 255), (jnp.int32, INT32_MAX), (jnp.float32, None)]
)
def test_safe_increment_other_dtypes(dtype, top):
    if top is None:
        top = float(jnp.finfo(dtype).max)
    for start in (0, top):
        c = jnp.asarray(start, dtype)
        out = modopt.safe_increment(c)
        want = optax.safe_increment(c)
        assert out.dtype == want.dtype == dtype
        assert out.item() == want.item()
    assert modopt.safe_increment(jnp.asarray(top, dtype)).item() == top


def test_safe_increment_rejects_bool():
    with pytest.raises(ValueError):
        modopt.safe_increment(jnp.asarray(True))


# --------------------------------------------------------------------------------------------
# abs_sq
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float32, np.complex64])
def test_abs_sq(dtype):
    for x in jax.tree_util.tree_leaves(_tree(4, dtype)):
        out = modopt.abs_sq(x)
        assert out.shape == x.shape
        assert out.dtype == jnp.float32  # real, also for complex inputs
        np.testing.assert_allclose(out, np.abs(np.asarray(x)) ** 2, rtol=1e-6)
    np.testing.assert_allclose(modopt.abs_sq(jnp.asarray(3.0 - 4.0j)), 25.0, rtol=1e-6)


# --------------------------------------------------------------------------------------------
# Moments
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("count", [1, 3, 100])
@pytest.mark.parametrize("decay", [0.9, 0.999])
def test_bias_correction(decay, count):
    moment = _tree(5)
    c = jnp.asarray(count, jnp.int32)
    theirs = optax.tree.bias_correction(moment, decay, c)
    # optax's bias_correction is always compiled (jax.jit, inline=True): compare compiled.
    _assert_tree_close(jax.jit(modopt.bias_correction)(moment, decay, c), theirs)
    # Eagerly, XLA evaluates `decay ** count` slightly differently, and `1 - decay ** count`
    # cancels (0.999 ** 3 is ~1e-5 relative off in float32 either way): a looser tolerance.
    ours = modopt.bias_correction(moment, decay, c)
    _assert_tree_close(ours, theirs, rtol=5e-5)
    # The decay is a float32 number in both libraries: 1 - 0.999 is 1.3e-5 off in float32.
    correction = 1 - np.float64(np.float32(decay)) ** count
    expected = jax.tree_util.tree_map(lambda m: np.asarray(m) / correction, moment)
    _assert_tree_close(ours, expected, rtol=1e-4, check_dtype=False)


def test_bias_correction_keeps_bf16():
    moment = _tree(6, jnp.bfloat16)
    c = jnp.asarray(2, jnp.int32)
    ours = modopt.bias_correction(moment, 0.999, c)
    theirs = optax.tree.bias_correction(moment, 0.999, c)
    for leaf in jax.tree_util.tree_leaves(ours):
        assert leaf.dtype == jnp.bfloat16
    _assert_tree_close(ours, theirs, rtol=1e-2, atol=1e-2)
    # b2 ** 1 in low precision would round the correction to 0; it must stay finite.
    ours = modopt.bias_correction(moment, 0.9999, jnp.asarray(1, jnp.int32))
    assert all(np.all(np.isfinite(np.asarray(x, np.float32))) for x in jax.tree_util.tree_leaves(ours))


@pytest.mark.parametrize("order", [1, 2, 3])
def test_update_moment(order):
    updates, moments = _tree(7), _tree(8)
    ours = modopt.update_moment(updates, moments, 0.9, order)
    _assert_tree_close(ours, optax.tree.update_moment(updates, moments, 0.9, order))
    expected = jax.tree_util.tree_map(
        lambda g, m: 0.1 * np.asarray(g) ** order + 0.9 * np.asarray(m), updates, moments
    )
    _assert_tree_close(ours, expected, rtol=1e-5, atol=1e-6, check_dtype=False)


def test_update_moment_with_none_leaves():
    updates = {"a": None, "b": jnp.arange(3.0), "c": jnp.ones((2, 2))}
    moments = {"a": None, "b": jnp.ones(3), "c": jnp.zeros((2, 2))}
    ours = modopt.update_moment(updates, moments, 0.5, 2)
    theirs = optax.tree.update_moment(updates, moments, 0.5, 2)
    assert ours["a"] is None
    _assert_tree_close(ours, theirs)
    ours = modopt.update_infinity_moment(updates, moments, 0.5, 1e-3)
    assert ours["a"] is None
    _assert_tree_close(ours, optax.tree.update_infinity_moment(updates, moments, 0.5, 1e-3))
    ours = modopt.update_moment_per_elem_norm(updates, moments, 0.5, 2)
    assert ours["a"] is None
    _assert_tree_close(ours, optax.tree.update_moment_per_elem_norm(updates, moments, 0.5, 2))


@pytest.mark.parametrize("order", [1, 2])
def test_update_moment_per_elem_norm_real(order):
    updates, moments = _tree(9), _tree(10)
    ours = modopt.update_moment_per_elem_norm(updates, moments, 0.99, order)
    _assert_tree_close(ours, optax.tree.update_moment_per_elem_norm(updates, moments, 0.99, order))
    # For real leaves it is the EMA of g ** order, as optax defines it.
    expected = jax.tree_util.tree_map(
        lambda g, m: 0.01 * np.asarray(g) ** order + 0.99 * np.asarray(m), updates, moments
    )
    _assert_tree_close(ours, expected, rtol=1e-5, atol=1e-6, check_dtype=False)


@pytest.mark.parametrize("order", [1, 2, 3])
def test_update_moment_per_elem_norm_complex(order):
    updates = _tree(11, np.complex64)
    moments = jax.tree_util.tree_map(lambda x: jnp.abs(x) ** order, _tree(12, np.complex64))
    ours = modopt.update_moment_per_elem_norm(updates, moments, 0.9, order)
    theirs = optax.tree.update_moment_per_elem_norm(updates, moments, 0.9, order)
    _assert_tree_close(ours, theirs, rtol=1e-5)
    for leaf in jax.tree_util.tree_leaves(ours):
        assert not jnp.iscomplexobj(leaf)
    expected = jax.tree_util.tree_map(
        lambda g, m: 0.1 * np.abs(np.asarray(g)) ** order + 0.9 * np.asarray(m), updates, moments
    )
    _assert_tree_close(ours, expected, rtol=1e-5, atol=1e-6, check_dtype=False)


@pytest.mark.parametrize("decay,eps", [(0.9, 0.0), (0.999, 1e-3)])
def test_update_infinity_moment(decay, eps):
    updates, moments = _tree(13), jax.tree_util.tree_map(jnp.abs, _tree(14))
    ours = modopt.update_infinity_moment(updates, moments, decay, eps)
    _assert_tree_close(ours, optax.tree.update_infinity_moment(updates, moments, decay, eps))
    expected = jax.tree_util.tree_map(
        lambda g, m: np.maximum(np.abs(np.asarray(g)) + eps, decay * np.asarray(m)), updates, moments
    )
    _assert_tree_close(ours, expected, rtol=1e-6, check_dtype=False)


def test_moments_under_jit():
    updates, moments = _tree(15), _tree(16)

    @jax.jit
    def both(u, m, decay):
        first = modopt.update_moment(u, m, decay, 1)
        second = modopt.update_moment_per_elem_norm(u, m, decay, 2)
        return first, second, modopt.bias_correction(second, decay, jnp.asarray(4, jnp.int32))

    ours = both(updates, moments, 0.8)
    first = optax.tree.update_moment(updates, moments, 0.8, 1)
    second = optax.tree.update_moment_per_elem_norm(updates, moments, 0.8, 2)
    _assert_tree_close(ours, (first, second, optax.tree.bias_correction(second, 0.8, 4)), rtol=1e-5)


# --------------------------------------------------------------------------------------------
# apply_updates, incremental_update, periodic_update
# --------------------------------------------------------------------------------------------


def test_apply_updates_parity():
    params, updates = _tree(17), _tree(18)
    ours = modopt.apply_updates(params, updates)
    _assert_tree_close(ours, optax.apply_updates(params, updates))
    expected = jax.tree_util.tree_map(lambda p, u: np.asarray(p) + np.asarray(u), params, updates)
    _assert_tree_close(ours, expected, check_dtype=False)


def test_apply_updates_keeps_param_dtype():
    params = _tree(19, jnp.bfloat16)
    updates = _tree(20, np.float32)
    ours = modopt.apply_updates(params, updates)
    theirs = optax.apply_updates(params, updates)
    for leaf in jax.tree_util.tree_leaves(ours):
        assert leaf.dtype == jnp.bfloat16
    _assert_tree_close(ours, theirs, rtol=0, atol=0)  # the same rounding
    # Under jit too, and for a mixed tree.
    mixed_params = {"bf16": params["mat"], "f32": _tree(21)["mat"], "int": jnp.arange(4, dtype=jnp.int32)}
    mixed_updates = {"bf16": updates["mat"], "f32": updates["mat"], "int": jnp.ones(4, jnp.int32)}
    out = jax.jit(modopt.apply_updates)(mixed_params, mixed_updates)
    assert {k: v.dtype for k, v in out.items()} == {k: v.dtype for k, v in mixed_params.items()}
    _assert_tree_close(out, optax.apply_updates(mixed_params, mixed_updates), rtol=0, atol=0)


def test_apply_updates_none_leaves():
    params = {"w": jnp.ones((2, 3)), "frozen": None, "b": jnp.zeros(3)}
    updates = {"w": jnp.full((2, 3), 0.5), "frozen": None, "b": jnp.arange(3.0)}
    ours = modopt.apply_updates(params, updates)
    assert ours["frozen"] is None
    _assert_tree_close(ours, optax.apply_updates(params, updates))
    np.testing.assert_array_equal(ours["w"], np.full((2, 3), 1.5, np.float32))


@pytest.mark.parametrize("step_size", [0.0, 0.1, 1.0, "array"])
def test_incremental_update(step_size):
    if step_size == "array":
        step_size = jnp.asarray(0.25)
    new, old = _tree(22), _tree(23)
    ours = modopt.incremental_update(new, old, step_size)
    _assert_tree_close(ours, optax.incremental_update(new, old, step_size))
    s = float(step_size)
    expected = jax.tree_util.tree_map(lambda n, o: s * np.asarray(n) + (1 - s) * np.asarray(o), new, old)
    _assert_tree_close(ours, expected, rtol=1e-6, atol=1e-7, check_dtype=False)
    # Under jit, with the step size as an argument.
    _assert_tree_close(jax.jit(modopt.incremental_update)(new, old, step_size), ours)


def test_incremental_update_none_leaves():
    new = {"a": jnp.ones(2), "b": None}
    old = {"a": jnp.zeros(2), "b": None}
    ours = modopt.incremental_update(new, old, 0.3)
    assert ours["b"] is None
    np.testing.assert_allclose(ours["a"], [0.3, 0.3], rtol=1e-6)


def test_periodic_update():
    new, old = _tree(24), _tree(25)
    jitted = jax.jit(modopt.periodic_update)
    for step in range(8):
        steps = jnp.asarray(step, jnp.int32)
        period = jnp.asarray(3, jnp.int32)
        ours = modopt.periodic_update(new, old, steps, period)
        _assert_tree_close(ours, optax.periodic_update(new, old, steps, period), rtol=0, atol=0)
        _assert_tree_close(jitted(new, old, steps, period), ours, rtol=0, atol=0)
        _assert_tree_close(ours, new if step % 3 == 0 else old, rtol=0, atol=0)
