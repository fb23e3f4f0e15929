"""`modopt.assignment` against optax 0.2.8, scipy's `linear_sum_assignment` and brute force.

On matrices with distinct costs (random floats) the optimal matching is unique, so both
solvers must return optax's pairs in optax's order. With ties (small integer costs) any optimal
matching is right: the cost must equal the brute-force (or scipy) optimum.
"""

from __future__ import annotations

import doctest
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from modopt.assignment import _hungarian, base_hungarian_algorithm, hungarian_algorithm

SOLVERS = {
    "hungarian_algorithm": (jax.jit(hungarian_algorithm), jax.jit(optax.assignment.hungarian_algorithm)),
    "base_hungarian_algorithm": (
        jax.jit(base_hungarian_algorithm),
        jax.jit(optax.assignment.base_hungarian_algorithm),
    ),
}
SHAPES = [(1, 1), (1, 4), (4, 1), (3, 3), (6, 6), (3, 7), (7, 3), (2, 5)]


def _brute_force(cost):
    """The least cost over all matchings of min(n, m) pairs."""
    n, m = cost.shape
    if n > m:
        return _brute_force(cost.T)
    return min(
        sum(cost[i, j] for i, j in zip(range(n), cols)) for cols in itertools.permutations(range(m), n)
    )


def _check_matching(i, j, shape):
    i, j = np.asarray(i), np.asarray(j)
    k = min(shape)
    assert i.shape == j.shape == (k,)
    assert len(set(i.tolist())) == k and len(set(j.tolist())) == k
    assert (0 <= i).all() and (i < shape[0]).all() and (0 <= j).all() and (j < shape[1]).all()


@pytest.mark.parametrize("name", list(SOLVERS))
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_parity_with_optax_on_distinct_costs(name, shape):
    ours, theirs = SOLVERS[name]
    rng = np.random.default_rng(sum(shape))
    for _ in range(3):
        cost = jnp.asarray(rng.normal(size=shape).astype(np.float32))
        i, j = ours(cost)
        oi, oj = theirs(cost)
        np.testing.assert_array_equal(i, oi)
        np.testing.assert_array_equal(j, oj)
        _check_matching(i, j, shape)
        np.testing.assert_allclose(
            float(cost[i, j].sum()), _brute_force(np.asarray(cost, np.float64)), rtol=1e-5
        )


@pytest.mark.parametrize("name", list(SOLVERS))
@pytest.mark.parametrize("shape", [(3, 3), (4, 4), (2, 5), (5, 3)], ids=str)
def test_ties_give_an_optimal_matching(name, shape):
    ours, _ = SOLVERS[name]
    rng = np.random.default_rng(10 + sum(shape))
    for _ in range(6):
        cost = rng.integers(0, 3, size=shape)
        i, j = ours(jnp.asarray(cost))
        _check_matching(i, j, shape)
        assert int(cost[np.asarray(i), np.asarray(j)].sum()) == _brute_force(cost)


@pytest.mark.parametrize("name", list(SOLVERS))
def test_against_scipy_on_larger_matrices(name):
    scipy_optimize = pytest.importorskip("scipy.optimize")
    ours, _ = SOLVERS[name]
    rng = np.random.default_rng(1)
    for shape in [(20, 20), (12, 30), (30, 12)]:
        for cost in (rng.normal(size=shape).astype(np.float32), rng.integers(0, 10, size=shape)):
            i, j = ours(jnp.asarray(cost))
            _check_matching(i, j, shape)
            r, c = scipy_optimize.linear_sum_assignment(cost)
            np.testing.assert_allclose(cost[np.asarray(i), np.asarray(j)].sum(), cost[r, c].sum(), rtol=1e-5)


@pytest.mark.parametrize("name", list(SOLVERS))
def test_output_order_matches_optax(name):
    ours, theirs = SOLVERS[name]
    cost = jnp.array([[8, 4, 7], [5, 2, 3], [9, 6, 7], [9, 4, 8]])
    for c in (cost, cost.T, cost[:3]):
        for a, b in zip(ours(c), theirs(c)):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("name", list(SOLVERS))
def test_empty_batched_and_bad_input(name):
    solver = getattr(_hungarian, name)
    for shape in [(0, 3), (2, 0)]:
        i, j = solver(jnp.zeros(shape))
        assert i.shape == j.shape == (0,)
    costs = jnp.asarray(np.random.default_rng(2).normal(size=(4, 3, 5)).astype(np.float32))
    bi, bj = jax.jit(jax.vmap(solver))(costs)
    for k in range(4):
        i, j = solver(costs[k])
        np.testing.assert_array_equal(bi[k], i)
        np.testing.assert_array_equal(bj[k], j)
    with pytest.raises(ValueError, match="2-D"):
        solver(jnp.ones(3))


def test_doctests():
    result = doctest.testmod(_hungarian, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0
