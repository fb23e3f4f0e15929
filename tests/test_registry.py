"""Shared checks run over every entry of the registry: parity with optax, jit, no retrace on
hyperparameter change, dtype preservation, convergence on a quadratic."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import modopt
from registry import ENTRIES, Entry

STEPS = 4


def make_params(dtype=jnp.float32):
    """Matrix, vector, scalar and 3-d leaves, plus a matrix large enough for Adafactor to factor."""
    keys = jax.random.split(jax.random.key(0), 5)
    shapes = {"matrix": (3, 5), "vector": (5,), "scalar": (), "cube": (2, 3, 4), "big": (130, 136)}
    return {name: jax.random.normal(k, shape, dtype) for k, (name, shape) in zip(keys, shapes.items())}


def make_grads(step, params):
    keys = jax.random.split(jax.random.fold_in(jax.random.key(1), step), len(params))
    return {
        name: jax.random.normal(k, p.shape, jnp.float32).astype(p.dtype)
        for k, (name, p) in zip(keys, sorted(params.items()))
    }


def paths_and_leaves(tree):
    flat = jax.tree_util.tree_flatten_with_path(tree)[0]
    return [jax.tree_util.keystr(p) for p, _ in flat], [leaf for _, leaf in flat]


def assert_trees_close(ours, theirs, what, rtol=1e-5, atol=1e-6):
    our_paths, our_leaves = paths_and_leaves(ours)
    their_paths, their_leaves = paths_and_leaves(theirs)
    assert our_paths == their_paths, f"{what}: structure differs\n{our_paths}\n{their_paths}"
    for path, a, b in zip(our_paths, our_leaves, their_leaves):
        assert jnp.shape(a) == jnp.shape(b), f"{what} at {path}: shape {jnp.shape(a)} vs {jnp.shape(b)}"
        assert jnp.result_type(a) == jnp.result_type(b), f"{what} at {path}: dtype {jnp.result_type(a)} vs {jnp.result_type(b)}"
        # Hyperparameters are float32 arrays where optax keeps Python floats: results may
        # differ by rounding, i.e. by about one unit in the last place of the leaf's dtype.
        ulp = float(jnp.finfo(a.dtype).eps) if jnp.issubdtype(jnp.result_type(a), jnp.floating) else 0.0
        np.testing.assert_allclose(
            np.asarray(a, np.float64),
            np.asarray(b, np.float64),
            rtol=max(rtol, 2 * ulp),
            atol=max(atol, 2 * ulp),
            err_msg=f"{what} at {path}",
        )


ids = [e.name for e in ENTRIES]


@pytest.mark.parametrize("entry", ENTRIES, ids=ids)
def test_parity_with_optax(entry: Entry):
    """Updates and state equal optax's, step by step (state compared by field path)."""
    ours, theirs = entry.make(), entry.oracle()
    params = make_params()
    state, their_state = ours.init(params), theirs.init(params)
    assert_trees_close(state, their_state, f"{entry} initial state")
    our_params = their_params = params
    for step in range(STEPS):
        grads = make_grads(step, params)
        updates, state = ours.update(grads, state, our_params)
        their_updates, their_state = theirs.update(grads, their_state, their_params)
        assert_trees_close(updates, their_updates, f"{entry} updates, step {step}", rtol=entry.tolerance, atol=entry.tolerance)
        assert_trees_close(state, their_state, f"{entry} state, step {step}", rtol=entry.tolerance, atol=entry.tolerance)
        our_params = modopt.apply_updates(our_params, updates)
        their_params = optax.apply_updates(their_params, their_updates)


@pytest.mark.parametrize("entry", ENTRIES, ids=ids)
def test_jit_matches_eager(entry: Entry):
    tx = entry.make()
    params = make_params()
    grads = make_grads(0, params)
    state = tx.init(params)

    @jax.jit
    def update(tx, grads, state, params):
        return tx.update(grads, state, params)

    jitted = update(tx, grads, jax.jit(tx.init)(params), params)
    eager = tx.update(grads, state, params)
    assert_trees_close(jitted, eager, f"{entry} jit vs eager")


@pytest.mark.parametrize("entry", ENTRIES, ids=ids)
def test_no_retrace(entry: Entry):
    """A changed hyperparameter, or a rebuilt transform of the same configuration, reuses the trace."""
    params = make_params()
    grads = make_grads(0, params)
    traces = []

    @eqx.filter_jit(donate="all-except-first")
    def step(grads, optimizer, params):
        traces.append(None)
        params, optimizer = optimizer.step(params, grads)
        return optimizer, params

    optimizer = modopt.Optimizer(entry.make(), params)
    optimizer, params = step(grads, optimizer, params)
    rebuilt = modopt.Optimizer(entry.make(), params)
    rebuilt, params = step(grads, rebuilt, params)
    assert len(traces) == 1, f"{entry}: rebuilding the same configuration retraced"
    if entry.change is not None:
        name, value = entry.change
        before = rebuilt.hyperparameters[name]
        changed = rebuilt.set(**{name: value})
        assert float(changed.hyperparameters[name]) == pytest.approx(value)
        assert float(before) != pytest.approx(value)
        step(grads, changed, params)
        assert len(traces) == 1, f"{entry}: changing {name} retraced"


@pytest.mark.parametrize("entry", ENTRIES, ids=ids)
def test_dtype_preserved(entry: Entry):
    """bf16 params and grads: updates have the dtypes optax gives, and params stay bf16."""
    params = make_params(jnp.bfloat16)
    grads = make_grads(0, params)
    ours, theirs = entry.make(), entry.oracle()
    updates, _ = jax.jit(ours.update)(grads, ours.init(params), params)
    their_updates, _ = theirs.update(grads, theirs.init(params), params)
    assert jax.tree.map(jnp.result_type, updates) == jax.tree.map(jnp.result_type, their_updates)
    optimizer = modopt.Optimizer(ours, params)
    new_params, _ = eqx.filter_jit(optimizer.step)(params, grads)
    assert all(p.dtype == jnp.bfloat16 for p in jax.tree.leaves(new_params))


def quadratic(params):
    """0.5 * sum_i a_i (x_i - 1)^2 with curvatures a in [0.5, 1.5]."""

    def leaf(x):
        a = jnp.linspace(0.5, 1.5, x.size).reshape(x.shape)
        return 0.5 * jnp.sum(a * (x - 1.0) ** 2)

    return sum(leaf(x) for x in jax.tree.leaves(params))


@pytest.mark.parametrize("entry", [e for e in ENTRIES if e.converges], ids=[e.name for e in ENTRIES if e.converges])
def test_converges_on_quadratic(entry: Entry):
    tx = entry.make()
    if not entry.descent:
        tx = modopt.chain(tx, modopt.scale(-entry.descent_lr))
    params = make_params()
    optimizer = modopt.Optimizer(tx, params)

    @eqx.filter_jit
    def run(params, optimizer):
        def body(carry, _):
            params, optimizer = carry
            return optimizer.step(params, jax.grad(quadratic)(params)), None

        return jax.lax.scan(body, (params, optimizer), length=entry.steps_to_converge)[0]

    start = quadratic(params)
    params, _ = run(params, optimizer)
    assert quadratic(params) < 0.05 * start, f"{entry}: loss {quadratic(params)} from {start}"
