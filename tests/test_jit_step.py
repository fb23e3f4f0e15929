"""`modopt.jit_step` against `eqx.filter_jit`: the same numbers, donation, no retrace on new
hyperparameters, static leaves as Equinox treats them, and fed-back outputs recognized."""

from __future__ import annotations

import gc

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import modopt


class Net(eqx.Module):
    """A model with a trained MLP, an integer counter, a function and a static field."""

    mlp: eqx.nn.MLP
    calls: jax.Array
    scale: float = eqx.field(static=True)

    def __call__(self, x):
        return self.scale * self.mlp(x)


def make(scale=1.0):
    return Net(eqx.nn.MLP(3, 2, 8, 2, key=jax.random.key(0)), jnp.zeros([], jnp.int32), scale)


X = jax.random.normal(jax.random.key(1), (16, 3))
Y = jax.random.normal(jax.random.key(2), (16, 2))


def loss_fn(model, x, y):
    return jnp.mean((jax.vmap(model)(x) - y) ** 2)


def body(model, optimizer, batch):
    x, y = batch
    loss, grads = eqx.filter_value_and_grad(loss_fn)(model, x, y)
    model, optimizer = optimizer.step(model, grads)
    return model, optimizer, loss


def copy(tree):
    return jax.tree_util.tree_map(lambda x: jnp.copy(x) if eqx.is_array(x) else x, tree)


def test_same_numbers_as_filter_jit():
    tx = modopt.adamw(modopt.warmup_cosine_decay_schedule(0.0, 0.05, 2, 10), weight_decay=1e-3)
    ours, theirs = modopt.jit_step(body), eqx.filter_jit(body, donate="all-except-first")
    model = make()
    a = (copy(model), modopt.Optimizer(tx, model))
    b = (copy(model), modopt.Optimizer(tx, model))
    for _ in range(4):
        *a, loss_a = ours(*a, (X, Y))
        *b, loss_b = theirs(*b, (X, Y))
        np.testing.assert_array_equal(loss_a, loss_b)
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        np.testing.assert_array_equal(x, y)
    # Non-array leaves come back as they went in.
    assert a[0].scale == 1.0 and a[0].mlp.activation is model.mlp.activation
    assert int(a[1].count) == 4


def test_donates_model_and_optimizer_not_the_batch():
    step = modopt.jit_step(body)
    model = copy(make())
    optimizer = modopt.Optimizer(modopt.adam(1e-2), model)
    old_leaves = [x for x in jax.tree_util.tree_leaves((model, optimizer)) if eqx.is_array(x)]
    x, y = jnp.copy(X), jnp.copy(Y)
    new_model, new_optimizer, _ = step(model, optimizer, (x, y))
    # Every array but the scalars is donated; the scalars the step leaves unchanged (the
    # transform's hyperparameters, the model's counter) come back as the caller's own arrays,
    # and a module of only those (the transform) as the same object.
    assert all(leaf.is_deleted() == (leaf.ndim > 0) for leaf in old_leaves)
    assert new_optimizer.tx is optimizer.tx and new_model.calls is model.calls
    assert not new_optimizer.count.is_deleted() and int(new_optimizer.count) == 1
    assert not x.is_deleted() and not y.is_deleted()
    # XLA reuses every byte of the model's float leaves and of the optimizer's state.
    fresh = make()
    memory = step.lower(fresh, modopt.Optimizer(modopt.adam(1e-2), fresh), (X, Y)).compile().memory_analysis()
    float_bytes = sum(p.nbytes for p in jax.tree_util.tree_leaves(eqx.filter(fresh, eqx.is_inexact_array)))
    assert memory.alias_size_in_bytes >= 3 * float_bytes  # params, mu, nu


def test_reusing_a_donated_model_names_the_argument_and_what_to_pass_instead():
    """XLA's own error says only that a buffer was deleted or donated; the step's names the
    argument, its first spent leaf, and the objects to use."""
    step = modopt.jit_step(body)
    model = copy(make())
    optimizer = modopt.Optimizer(modopt.adam(1e-2), model)
    new_model, new_optimizer, _ = step(model, optimizer, (X, Y))
    with pytest.raises(ValueError, match=r"argument 0 \(Net, first at `\.mlp\.layers\[0\]\.weight`\)") as info:
        step(model, new_optimizer, (X, Y))
    assert "donates its arguments 0 and 1" in str(info.value) and "the ones it returned" in str(info.value)
    with pytest.raises(ValueError, match=r"argument 1 \(Optimizer, first at `\.state"):
        step(new_model, optimizer, (X, Y))


def test_no_retrace_on_new_hyperparameters_or_rebuilt_optimizer():
    traces = []

    @modopt.jit_step
    def step(model, optimizer, batch):
        traces.append(1)
        return body(model, optimizer, batch)

    model = make()
    model, optimizer, _ = step(copy(model), modopt.Optimizer(modopt.adam(1e-2), model), (X, Y))
    model, optimizer, _ = step(model, optimizer.set(learning_rate=1e-3), (X, Y))
    model, optimizer, _ = step(model, modopt.Optimizer(modopt.adam(5e-3), model), (X, Y))
    model, optimizer, _ = step(copy(model), optimizer, (X, Y))  # not a fed-back output
    assert len(traces) == 1
    # A static field is part of the key, as with eqx.filter_jit: a new value compiles again.
    step(copy(make(scale=2.0)), modopt.Optimizer(modopt.adam(1e-2), make(scale=2.0)), (X, Y))
    assert len(traces) == 2


class Accumulator(eqx.Module):
    total: jax.Array
    last: jax.Array
    scale: jax.Array


def test_an_input_returned_unchanged_is_never_donated_under_its_caller():
    """Fed back, an output holding an argument that is not donated (the last gradient) gets a
    buffer of its own, so donating the output leaves the caller's argument intact; an unchanged
    scalar of a donated argument comes back as the caller's own array."""
    step = modopt.jit_step(lambda acc, g: Accumulator(acc.total + acc.scale * g, g, acc.scale), donate_argnums=(0,))
    acc, g = Accumulator(jnp.zeros(3), jnp.zeros(3), jnp.asarray(2.0)), jnp.ones(3)
    scale = acc.scale
    for _ in range(3):
        acc = step(acc, g)
    np.testing.assert_array_equal(acc.total, 6 * np.ones(3))
    assert not g.is_deleted() and acc.last is not g and acc.scale is scale


def test_python_numbers_are_static_and_outputs_may_be_anything():
    traces = []

    @modopt.jit_step(donate_argnums=())
    def scaled(x, factor, *, offset):
        traces.append(1)
        return {"y": x * factor + offset, "label": "done", "n": 3}

    x = jnp.arange(3.0)
    out = scaled(x, 2.0, offset=jnp.ones(3))
    np.testing.assert_array_equal(out["y"], x * 2 + 1)
    assert out["label"] == "done" and out["n"] == 3
    scaled(x, 2.0, offset=jnp.zeros(3))
    assert len(traces) == 1
    scaled(x, 3.0, offset=jnp.zeros(3))
    assert len(traces) == 2
    np.testing.assert_array_equal(scaled(np.arange(3.0), 2.0, offset=np.zeros(3))["y"], x * 2)


def test_fed_back_outputs_and_replaced_models():
    step = modopt.jit_step(body)
    model = make()
    a = (copy(model), modopt.Optimizer(modopt.sgd(0.1), model))
    b = (copy(model), modopt.Optimizer(modopt.sgd(0.1), model))
    reference = eqx.filter_jit(body)
    for i in range(3):
        *a, _ = step(*a, (X, Y))
        *b, _ = reference(*b, (X, Y))
        if i == 1:  # a new model object with the same structure: flattened again
            a[0] = eqx.tree_at(lambda m: m.calls, a[0], jnp.ones([], jnp.int32))
            b[0] = eqx.tree_at(lambda m: m.calls, b[0], jnp.ones([], jnp.int32))
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        np.testing.assert_array_equal(x, y)


def test_forgets_outputs_the_caller_dropped():
    step = modopt.jit_step(body)
    model = make()
    out = step(copy(model), modopt.Optimizer(modopt.sgd(0.1), model), (X, Y))
    assert {type(record[0]()) for record in step._outputs.values()} >= {Net, modopt.Optimizer}
    del out
    gc.collect()
    assert not step._outputs


def test_unhashable_static_leaf_is_a_clear_error():
    step = modopt.jit_step(lambda x, config: x, donate_argnums=())
    with pytest.raises(TypeError, match="must be hashable"):
        step(jnp.ones(2), bytearray(b"not hashable"))


def test_inside_an_outer_jit():
    """Called while tracing (jit_step inside jax.jit), it traces through and keeps no tracer."""
    step = modopt.jit_step(body, donate_argnums=())
    model = make()
    optimizer = modopt.Optimizer(modopt.sgd(0.1), model)
    outer = eqx.filter_jit(lambda m, o: step(m, o, (X, Y)))
    a = outer(model, optimizer)
    b = eqx.filter_jit(body)(model, optimizer, (X, Y))
    for x, y in zip(jax.tree_util.tree_leaves(eqx.filter(a, eqx.is_array)), jax.tree_util.tree_leaves(eqx.filter(b, eqx.is_array))):
        np.testing.assert_allclose(x, y, rtol=1e-6)
    assert not step._outputs
