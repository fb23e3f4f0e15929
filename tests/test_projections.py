"""`modopt.projections` and `modopt.nnls` against optax 0.2.8 and against the definitions.

Every projection is compared with optax's on the same inputs (arrays and trees), and checked
for what makes it a Euclidean projection onto a convex set C: it lands in C, it is idempotent,
and it satisfies the variational inequality <x - P(x), y - P(x)> <= 0 for every y in C. The
simplex projection is also checked against its KKT conditions; `nnls` against optax, against
scipy's active-set solver and against its own KKT conditions.
"""

from __future__ import annotations

import doctest

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import modopt
from modopt import projections as P
from modopt.projections import _projections

RNG = np.random.default_rng(0)


def _tree(seed, scale=1.0):
    rng = np.random.default_rng(seed)
    return {
        "w": jnp.asarray((scale * rng.normal(size=(3, 2))).astype(np.float32)),
        "b": jnp.asarray((scale * rng.normal(size=(4,))).astype(np.float32)),
    }


def _flat(tree):
    return np.concatenate([np.ravel(np.asarray(x, np.float64)) for x in jax.tree_util.tree_leaves(tree)])


def _close(a, b, rtol=1e-5, atol=1e-6):
    assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b)
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        assert jnp.shape(x) == jnp.shape(y)
        np.testing.assert_allclose(np.asarray(x, np.float64), np.asarray(y, np.float64), rtol=rtol, atol=atol)


# --------------------------------------------------------------------------------------------
# The sets: name -> (modopt projection, optax projection, membership test on the flat vector)
# --------------------------------------------------------------------------------------------

A_TREE = _tree(100)


def _leafwise(f):
    return lambda tree: jax.tree_util.tree_map(f, tree)


B = 0.3
SCALE = 1.7

CASES = {
    "non_negative": (
        P.projection_non_negative,
        optax.projections.projection_non_negative,
        lambda v: v.min() >= -1e-6,
    ),
    # optax 0.2.8's hypercube takes a single array only (its scalar bounds do not map over a
    # tree): its oracle runs leaf by leaf.
    "hypercube": (
        P.projection_hypercube,
        _leafwise(optax.projections.projection_hypercube),
        lambda v: (v >= 0).all() and (v <= 1 + 1e-6).all(),
    ),
    "hypercube_scaled": (
        lambda t: P.projection_hypercube(t, SCALE),
        _leafwise(lambda t: optax.projections.projection_hypercube(t, SCALE)),
        lambda v: (v >= 0).all() and (v <= SCALE + 1e-6).all(),
    ),
    "simplex": (
        P.projection_simplex,
        optax.projections.projection_simplex,
        lambda v: v.min() >= 0 and abs(v.sum() - 1) < 1e-5,
    ),
    "simplex_scaled": (
        lambda t: P.projection_simplex(t, SCALE),
        lambda t: optax.projections.projection_simplex(t, SCALE),
        lambda v: v.min() >= 0 and abs(v.sum() - SCALE) < 1e-5,
    ),
    "l1_ball": (
        lambda t: P.projection_l1_ball(t, SCALE),
        lambda t: optax.projections.projection_l1_ball(t, SCALE),
        lambda v: np.abs(v).sum() <= SCALE + 1e-5,
    ),
    "l2_ball": (
        lambda t: P.projection_l2_ball(t, SCALE),
        lambda t: optax.projections.projection_l2_ball(t, SCALE),
        lambda v: np.linalg.norm(v) <= SCALE + 1e-5,
    ),
    "linf_ball": (
        lambda t: P.projection_linf_ball(t, SCALE),
        lambda t: optax.projections.projection_linf_ball(t, SCALE),
        lambda v: np.abs(v).max() <= SCALE + 1e-6,
    ),
    "hyperplane": (
        lambda t: P.projection_hyperplane(t, A_TREE, B),
        lambda t: optax.projections.projection_hyperplane(t, A_TREE, B),
        lambda v: abs(v @ _flat(A_TREE) - B) < 1e-5,
    ),
    "halfspace": (
        lambda t: P.projection_halfspace(t, A_TREE, B),
        lambda t: optax.projections.projection_halfspace(t, A_TREE, B),
        lambda v: v @ _flat(A_TREE) <= B + 1e-5,
    ),
    "line": (
        lambda t: P.projection_vector(t, A_TREE),
        lambda t: optax.projections.projection_vector(t, A_TREE),
        lambda v: np.linalg.matrix_rank(np.stack([v, _flat(A_TREE)]), tol=1e-5) <= 1,
    ),
}
CONVEX = list(CASES)
# The two spheres are not convex: there, the projection is the nearest point, checked apart.


@pytest.mark.parametrize("name", CONVEX)
@pytest.mark.parametrize("scale", [0.1, 3.0])
def test_parity_with_optax_on_trees(name, scale):
    ours, theirs, _ = CASES[name]
    x = _tree(1, scale)
    _close(ours(x), theirs(x))
    _close(jax.jit(ours)(x), theirs(x))


@pytest.mark.parametrize("name", CONVEX)
def test_lands_in_the_set_and_is_idempotent(name):
    ours, _, member = CASES[name]
    ours = jax.jit(ours)
    for seed in range(3):
        x = _tree(seed, scale=2.0)
        p = ours(x)
        assert member(_flat(p)), (name, _flat(p))
        _close(ours(p), p, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", CONVEX)
def test_variational_inequality(name):
    """p = P(x) is the projection onto a closed convex C iff <x - p, y - p> <= 0 for all y in C."""
    ours = jax.jit(CASES[name][0])
    x = _tree(7, scale=2.0)
    p = _flat(ours(x))
    residual = _flat(x) - p
    for seed in range(20):
        y = _flat(ours(_tree(1000 + seed, scale=3.0)))  # a point of C
        assert residual @ (y - p) <= 1e-4 * (1 + np.linalg.norm(residual) * np.linalg.norm(y - p)), name


def test_points_inside_are_fixed():
    x = {"w": jnp.array([0.2, -0.1]), "b": jnp.array(0.3)}
    for f in (P.projection_l1_ball, P.projection_l2_ball, P.projection_linf_ball):
        _close(f(x), x)
    _close(P.projection_halfspace(x, x, 10.0), x)


@pytest.mark.parametrize("scale", [1.0, 2.5])
def test_spheres_parity_and_nearest_point(scale):
    x = _tree(3)
    for ours, theirs, norm in [
        (P.projection_l2_sphere, optax.projections.projection_l2_sphere, lambda v: np.linalg.norm(v)),
        (P.projection_l1_sphere, optax.projections.projection_l1_sphere, lambda v: np.abs(v).sum()),
    ]:
        p = ours(x, scale)
        _close(p, theirs(x, scale))
        np.testing.assert_allclose(norm(_flat(p)), scale, rtol=1e-5)
        # Nearer to x than random points of the sphere.
        distance = np.linalg.norm(_flat(x) - _flat(p))
        for seed in range(20):
            z = _flat(_tree(200 + seed))
            y = z * scale / norm(z)
            assert distance <= np.linalg.norm(_flat(x) - y) + 1e-5


def test_l2_sphere_from_inside_scales_up():
    x = jnp.array([0.3, 0.4])
    np.testing.assert_allclose(P.projection_l2_sphere(x, 2.0), [1.2, 1.6], rtol=1e-6)


def _simplex_numpy(v, scale):
    """The simplex projection by bisection on the threshold (independent of the sort)."""
    lo, hi = v.min() - scale, v.max()
    for _ in range(200):
        tau = (lo + hi) / 2
        if np.maximum(v - tau, 0).sum() > scale:
            lo = tau
        else:
            hi = tau
    return np.maximum(v - (lo + hi) / 2, 0)


@pytest.mark.parametrize("n,scale,seed", [(1, 1.0, 0), (5, 1.0, 1), (17, 0.3, 2), (40, 4.0, 3)])
def test_simplex_kkt_and_bisection(n, scale, seed):
    x = np.random.default_rng(seed).normal(size=n).astype(np.float32) * 2
    p = np.asarray(P.projection_simplex(jnp.asarray(x), scale), np.float64)
    np.testing.assert_allclose(p, _simplex_numpy(x.astype(np.float64), scale), atol=1e-5)
    # KKT: p = max(x - tau, 0) for one tau; sum p = scale; p >= 0.
    assert p.min() >= 0
    np.testing.assert_allclose(p.sum(), scale, rtol=1e-5)
    support = p > 0
    tau = (x[support] - p[support]).mean()
    np.testing.assert_allclose(x[support] - p[support], tau, atol=1e-5)
    assert (x[~support] <= tau + 1e-5).all()


def test_simplex_derivatives_match_optax_and_the_formula():
    x = jnp.asarray(np.random.default_rng(4).normal(size=7).astype(np.float32))
    ours = jax.jit(jax.jacfwd(P.projection_simplex))(x)
    theirs = jax.jit(jax.jacfwd(optax.projections.projection_simplex))(x)
    np.testing.assert_allclose(ours, theirs, atol=1e-6)
    # On the support S, J = I - 1 1^T / |S| (restricted to S); zero elsewhere.
    s = np.asarray(P.projection_simplex(x) > 0, np.float64)
    expected = np.diag(s) - np.outer(s, s) / s.sum()
    np.testing.assert_allclose(ours, expected, atol=1e-6)
    np.testing.assert_allclose(jax.jit(jax.jacrev(P.projection_simplex))(x), expected, atol=1e-6)
    # The l1 ball's derivative goes through the simplex's.
    np.testing.assert_allclose(
        jax.jit(jax.jacfwd(P.projection_l1_ball))(2 * x),
        jax.jit(jax.jacfwd(optax.projections.projection_l1_ball))(2 * x),
        atol=1e-6,
    )


def test_box_with_tree_bounds_and_scalar_bounds_on_trees():
    x = _tree(5, scale=2.0)
    lower = jax.tree_util.tree_map(lambda v: -0.5 * jnp.ones_like(v), x)
    upper = jax.tree_util.tree_map(lambda v: 0.8 * jnp.ones_like(v), x)
    _close(P.projection_box(x, lower, upper), optax.projections.projection_box(x, lower, upper))
    # A scalar bound applies to every leaf (optax 0.2.8 accepts one only for a single array).
    _close(P.projection_box(x, -0.5, 0.8), optax.projections.projection_box(x, lower, upper))
    _close(P.projection_box(x["w"], -0.5, 0.8), optax.projections.projection_box(x["w"], -0.5, 0.8))


def test_dtypes_are_kept():
    x = {"a": jnp.array([0.5, -2.0, 3.0], jnp.bfloat16), "b": jnp.array([1.0, 2.0], jnp.bfloat16)}
    for f in (
        P.projection_non_negative,
        P.projection_hypercube,
        P.projection_l2_ball,
        P.projection_linf_ball,
        P.projection_l1_ball,
        P.projection_l2_sphere,
    ):
        out = f(x)
        assert [v.dtype for v in jax.tree_util.tree_leaves(out)] == [jnp.bfloat16] * 2, f.__name__


def test_mismatched_trees_are_reported():
    x = {"w": jnp.ones(3)}
    with pytest.raises(ValueError, match="structure"):
        P.projection_hyperplane(x, {"v": jnp.ones(3)}, 1.0)
    with pytest.raises(ValueError, match=r"\['w'\].*shape \(2,\)"):
        P.projection_halfspace(x, {"w": jnp.ones(2)}, 1.0)
    with pytest.raises(ValueError, match="projection_vector"):
        P.projection_vector(x, [jnp.ones(3)])


def test_doctests():
    result = doctest.testmod(_projections, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0


# --------------------------------------------------------------------------------------------
# nnls
# --------------------------------------------------------------------------------------------


def _problem(m, n, k=None, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.normal(size=(m, n)).astype(np.float32)
    b = rng.normal(size=(m,) if k is None else (m, k)).astype(np.float32)
    return jnp.asarray(a), jnp.asarray(b)


@pytest.mark.parametrize("m,n,k", [(6, 4, None), (5, 8, None), (7, 3, 2)])
def test_nnls_parity_with_optax(m, n, k):
    a, b = _problem(m, n, k, seed=m + n)
    for kwargs in ({}, {"unroll": 4}, {"L": 50.0}):
        ours = modopt.nnls(a, b, 100, **kwargs)
        theirs = optax.nnls(a, b, 100, **kwargs)
        assert ours.shape == theirs.shape == (n,) + (() if k is None else (k,))
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)
    assert modopt.nnls is modopt.linalg.nnls


@pytest.mark.parametrize("m,n,seed", [(8, 4, 0), (10, 6, 1), (4, 4, 2)])
def test_nnls_solves_the_problem(m, n, seed):
    scipy_optimize = pytest.importorskip("scipy.optimize")
    a, b = _problem(m, n, seed=seed)
    x = np.asarray(jax.jit(modopt.nnls, static_argnums=2)(a, b, 3000), np.float64)
    assert x.min() >= 0
    a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
    reference, _ = scipy_optimize.nnls(a64, b64)
    np.testing.assert_allclose(x, reference, atol=2e-3)
    # KKT: the gradient A^T (A x - b) is >= 0, and 0 where x > 0.
    gradient = a64.T @ (a64 @ x - b64)
    assert gradient.min() >= -2e-3
    np.testing.assert_allclose(gradient * x, 0, atol=2e-3)


def test_nnls_zero_matrix_and_bad_shapes():
    np.testing.assert_array_equal(modopt.nnls(jnp.zeros((3, 2)), jnp.ones(3), 10), [0.0, 0.0])
    with pytest.raises(ValueError, match="Invalid A"):
        modopt.nnls(jnp.ones(3), jnp.ones(3), 10)
    with pytest.raises(ValueError, match="Invalid b"):
        modopt.nnls(jnp.ones((3, 2)), jnp.ones(4), 10)
    with pytest.raises(ValueError, match="Invalid iters"):
        modopt.nnls(jnp.ones((3, 2)), jnp.ones(3), -1)


def test_nnls_doctest():
    from modopt.linalg import _nnls

    result = doctest.testmod(_nnls, extraglobs={"modopt": modopt})
    assert result.attempted > 0 and result.failed == 0
