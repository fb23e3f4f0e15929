"""`Optimizer` steps many small leaves as flat buffers where the transform acts elementwise.

The grouped step must give the numbers of the leaf-by-leaf step (which `test_registry.py`
compares with optax) for every registry entry that declares itself elementwise; transforms
with a norm per leaf must not declare it, since grouping changes their numbers.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from modopt.integrations.orbax import CheckpointError, CheckpointManager
from registry import ENTRIES
from test_registry import assert_trees_close, quadratic

import modopt
from modopt._step import grouping as _grouping


def small_params(count=10, dtype=jnp.float32):
    """`count` small leaves of assorted shapes, and one too large to group."""
    keys = jax.random.split(jax.random.key(0), count + 1)
    shapes = [(3,), (2, 2), (), (5,), (1, 4), (2, 3)]
    params = {f"s{i}": jax.random.normal(k, shapes[i % len(shapes)], dtype) for i, k in enumerate(keys[:-1])}
    params["big"] = jax.random.normal(keys[-1], (40, 30), dtype)
    return params


def grads_at(step, params):
    return jax.tree.map(lambda p: jnp.cos(p * (step + 1.0)) + 0.1 * step, params)


def _steps(optimizer, params, entry=None, steps=3):
    """`steps` steps on the quadratic's gradient plus a drift (so moments differ), traced once:
    a `fori_loop` compiles one step body where a Python loop would compile `steps` of them."""
    dynamic, static = eqx.partition(optimizer, eqx.is_array)

    def body(k, carry):
        params, dynamic = carry
        optimizer = eqx.combine(dynamic, static)
        grads = jax.tree.map(jnp.add, jax.grad(quadratic)(params), grads_at(k, params))
        extra = {} if entry is None else entry.args(quadratic(params), params)
        params, optimizer = optimizer.step(params, grads, **extra)
        new_dynamic, new_static = eqx.partition(optimizer, eqx.is_array)
        assert eqx.tree_equal(new_static, static), "a step changed the optimizer's static part"
        return params, new_dynamic

    params, dynamic = jax.lax.fori_loop(0, steps, body, (params, dynamic))
    return params, eqx.combine(dynamic, static)


# At module level, so that calls on trees of the same structure share one compile.
_run_steps = eqx.filter_jit(_steps)


def run_steps(optimizer, params, steps=3):
    """`steps` jitted steps (see `_steps`)."""
    return _run_steps(optimizer, params, steps=steps)


ELEMENTWISE = [e for e in ENTRIES if e.make().acts_elementwise()]


def test_the_common_optimizers_are_elementwise():
    """The optimizers whose math is element by element say so; the rest must not."""
    for tx in (
        modopt.adam(1e-3),
        modopt.adamw(1e-3),
        modopt.nadam(1e-3),
        modopt.sgd(0.1, momentum=0.9, nesterov=True),
        modopt.rmsprop(1e-3, momentum=0.9),
        modopt.adagrad(0.1),
        modopt.lion(1e-4),
        modopt.adabelief(1e-3),
        modopt.apply_if_finite(modopt.adam(1e-3), 3),
        modopt.chain(modopt.scale_by_adam(), modopt.scale_by_learning_rate(modopt.cosine_decay_schedule(0.1, 100))),
    ):
        assert tx.acts_elementwise(), tx
    mask = {"w": True, "b": False}
    for tx in (
        modopt.lars(0.1),
        modopt.lamb(1e-3),
        modopt.adafactor(1e-3),
        modopt.noisy_sgd(0.1),
        modopt.fromage(0.1),
        modopt.adamw(1e-3, mask=mask),
        modopt.chain(modopt.clip_by_global_norm(1.0), modopt.adam(1e-3)),
        modopt.dpsgd(0.1, 1.0, 1.0, seed=0),
    ):
        assert not tx.acts_elementwise(), tx


@pytest.fixture
def few_small_leaves(monkeypatch):
    """Group as few as two small leaves, so that small trees (cheap to compile) are grouped."""
    monkeypatch.setattr(_grouping, "MIN_SMALL_LEAVES", 2)


@pytest.mark.parametrize("entry", ELEMENTWISE, ids=str)
def test_grouped_steps_give_the_leafwise_numbers(entry, few_small_leaves):
    params = small_params(count=4)
    grouped = modopt.Optimizer(entry.make(), params)
    leafwise = modopt.Optimizer(entry.make(), params, group_small_leaves=False)
    assert grouped.groups is not None and leafwise.groups is None
    # Both in one program: one compile per entry.
    ours, theirs = eqx.filter_jit(lambda a, b: (_steps(a, params, entry)[0], _steps(b, params, entry)[0]))(grouped, leafwise)
    # The two programs fuse differently (XLA may contract a multiply-add in one and not the
    # other), so they agree to float32 rounding, a few ulps after 3 steps; a piece cut from the
    # wrong place would be off by far more.
    tolerance = max(entry.tolerance, 1e-5)
    assert_trees_close(ours, theirs, f"{entry}: grouped vs leaf by leaf", rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("name", ["lars", "fromage", "novograd"])
def test_grouping_would_change_a_transform_with_per_leaf_norms(name, few_small_leaves, monkeypatch):
    """Why the declaration matters: forced onto a transform that normalizes each leaf, grouping
    changes the numbers, so such transforms keep the leaf-by-leaf step."""
    make = lambda: getattr(modopt, name)(0.1)  # noqa: E731
    params = small_params(count=4)
    assert modopt.Optimizer(make(), params).groups is None
    leafwise, _ = run_steps(modopt.Optimizer(make(), params), params)
    monkeypatch.setattr(type(make()), "acts_elementwise", lambda self: True)
    forced = modopt.Optimizer(make(), params)
    assert forced.groups is not None
    grouped, _ = run_steps(forced, params)
    assert not all(np.allclose(a, b, rtol=1e-4) for a, b in zip(jax.tree.leaves(grouped), jax.tree.leaves(leafwise)))


def test_which_leaves_are_grouped():
    params = {
        **{f"f{i:03d}": jnp.ones((4, 4)) for i in range(150)},  # 150 small float32 leaves
        **{f"h{i}": jnp.ones(3, jnp.bfloat16) for i in range(9)},  # 9 bfloat16: one buffer of their own
        **{f"g{i}": jnp.ones(3, jnp.float16) for i in range(7)},  # 7 float16: too few to group
        "edge": jnp.ones(1024),  # at the limit: grouped
        "big": jnp.ones(1025),  # over it: alone
        "count": jnp.ones(3, jnp.int32),  # not trained
    }
    optimizer = modopt.Optimizer(modopt.adam(1e-3), params)
    names = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(optimizer.trainable(params))[0]]
    groups = [[names[i] for i in group] for group in optimizer.groups.groups]
    assert _grouping.LEAVES_PER_GROUP == 16
    assert [len(g) for g in groups] == [16] * 9 + [7, 9]
    assert sorted(sum(groups, [])) == sorted([f"['f{i:03d}']" for i in range(150)] + ["['edge']"] + [f"['h{i}']" for i in range(9)])
    state = optimizer.state[0]
    # Leaves in the tree's order, "edge" first: 1024 + 15 * 16, then 16 * 16, 7 * 16, and 9 * 3 bfloat16.
    assert [b.shape for b in state.mu["grouped"]] == [(1264,)] + [(256,)] * 8 + [(112,), (27,)]
    assert state.mu["grouped"][-1].dtype == jnp.bfloat16
    assert state.mu["ungrouped"]["big"].shape == (1025,) and state.mu["ungrouped"]["f000"] is None
    assert "160 small leaves grouped into 11 buffers" in repr(optimizer)
    # Nothing grouped: not asked to, too few small leaves, or a transform that is not elementwise.
    assert modopt.Optimizer(modopt.adam(1e-3), params, group_small_leaves=False).groups is None
    assert modopt.Optimizer(modopt.adam(1e-3), {f"f{i}": jnp.ones(3) for i in range(7)}).groups is None
    assert modopt.Optimizer(modopt.lamb(1e-3), params).groups is None


def test_leafwise_state_is_shaped_like_the_model():
    params = small_params()
    state = modopt.Optimizer(modopt.adam(1e-3), params, group_small_leaves=False).state[0]
    assert jax.tree.structure(state.mu) == jax.tree.structure(params)


def test_grouped_step_in_jit_step_keeps_untrained_and_none_gradient_leaves():
    """The documented pattern on an Equinox model: a `None` gradient leaves its (grouped) leaf
    as it was, integer leaves pass through, and the numbers are the leaf-by-leaf ones."""

    class Model(eqx.Module):
        layers: list
        steps: jax.Array

    model = Model([eqx.nn.Linear(3, 3, key=jax.random.key(i)) for i in range(6)], jnp.arange(3))

    def grads_of(model):
        grads = jax.tree.map(lambda x: jnp.full_like(x, 0.5) if eqx.is_inexact_array(x) else None, model)
        return eqx.tree_at(lambda g: g.layers[0].bias, grads, None, is_leaf=lambda x: x is None)

    @modopt.jit_step
    def train_step(model, optimizer):
        return optimizer.step(model, grads_of(model))

    results = []
    for group in (True, False):
        m = jax.tree.map(lambda x: jnp.copy(x) if eqx.is_array(x) else x, model)
        optimizer = modopt.Optimizer(modopt.adamw(0.1), m, group_small_leaves=group)
        assert (optimizer.groups is not None) == group
        for _ in range(3):
            m, optimizer = train_step(m, optimizer)
        results.append(m)
    grouped, leafwise = results
    assert_trees_close(eqx.filter(grouped, eqx.is_array), eqx.filter(leafwise, eqx.is_array), "grouped vs leafwise")
    np.testing.assert_array_equal(grouped.layers[0].bias, model.layers[0].bias)
    assert not np.allclose(grouped.layers[1].bias, model.layers[1].bias)
    np.testing.assert_array_equal(grouped.steps, model.steps)


def test_grouped_optimizer_checkpoints_and_resumes(tmp_path):
    params = small_params(count=12)
    optimizer = modopt.Optimizer(modopt.adam(0.05), params)
    params, optimizer = run_steps(optimizer, params)
    with CheckpointManager(tmp_path) as manager:
        manager.save(3, params=params, optimizer=optimizer)
    with CheckpointManager(tmp_path) as manager:
        restored = manager.restore(params=params, optimizer=modopt.Optimizer(modopt.adam(0.05), params))
    assert_trees_close(restored["optimizer"].state, optimizer.state, "restored state", rtol=0, atol=0)
    resumed, _ = run_steps(restored["optimizer"], restored["params"])
    straight, _ = run_steps(optimizer, params)
    assert_trees_close(resumed, straight, "resumed vs uninterrupted", rtol=0, atol=0)
    # A checkpoint of the grouped layout does not go into a leaf-by-leaf optimizer unnoticed.
    leafwise = modopt.Optimizer(modopt.adam(0.05), params, group_small_leaves=False)
    with CheckpointManager(tmp_path) as manager, pytest.raises(CheckpointError, match=r"\[.grouped.\].*group_small_leaves="):
        manager.restore(optimizer=leafwise)


def test_nnx_optimizer_groups_small_variables_with_the_same_numbers():
    from flax import nnx
    from modopt.integrations.flax import NnxOptimizer

    class Stack(nnx.Module):
        def __init__(self, rngs):
            self.layers = nnx.List([nnx.Linear(3, 3, rngs=rngs) for _ in range(5)])  # 10 small variables

        def __call__(self, x):
            for layer in self.layers:
                x = jnp.tanh(layer(x))
            return x

    @nnx.jit
    def train_step(model, optimizer, x):
        grads = nnx.grad(lambda m: jnp.sum((m(x) - 0.5) ** 2))(model)
        optimizer.update(model, grads)

    x = jnp.linspace(-1.0, 1.0, 12).reshape(4, 3)
    results = []
    for group in (True, False):
        model = Stack(nnx.Rngs(0))
        optimizer = NnxOptimizer(model, modopt.adam(0.05), wrt=nnx.Param, group_small_leaves=group)
        assert ("'grouped'" in str(jax.tree_util.tree_structure(nnx.as_pure(optimizer.opt_state)))) == group
        for _ in range(3):
            train_step(model, optimizer, x)
        results.append(nnx.as_pure(nnx.state(model, nnx.Param)))
    assert_trees_close(results[0], results[1], "NNX grouped vs leaf by leaf", rtol=1e-5, atol=1e-5)
    initial = nnx.as_pure(nnx.state(Stack(nnx.Rngs(0)), nnx.Param))
    assert all(not np.allclose(a, b) for a, b in zip(jax.tree.leaves(results[0]), jax.tree.leaves(initial)))
