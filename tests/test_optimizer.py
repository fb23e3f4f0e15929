"""The Optimizer module on an Equinox model and on a dict pytree, against optax as the oracle."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from testing_transforms import ScaleByValueFn

import modopt


class Net(eqx.Module):
    """An MLP plus leaves that must never be trained: an int counter and a bool mask."""

    mlp: eqx.nn.MLP
    counter: jax.Array
    mask: jax.Array

    def __init__(self, key, dtype=jnp.float32):
        self.mlp = eqx.nn.MLP(3, 2, 8, 2, activation=jax.nn.tanh, key=key, dtype=dtype)
        self.counter = jnp.arange(3)
        self.mask = jnp.array([True, False])

    def __call__(self, x):
        return jnp.where(self.mask, self.mlp(x), 0.0)


X = jax.random.normal(jax.random.key(1), (16, 3))
Y = jax.random.normal(jax.random.key(2), (16, 2))


def loss(model, x=X, y=Y):
    return jnp.mean((jax.vmap(model)(x) - y) ** 2)


def assert_close(a, b, rtol=1e-5, atol=1e-6):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_allclose(np.asarray(x, np.float64), np.asarray(y, np.float64), rtol=rtol, atol=atol)


@pytest.mark.parametrize(
    "make, oracle",
    [
        (lambda: modopt.adamw(1e-2, weight_decay=1e-3), lambda: optax.adamw(1e-2, weight_decay=1e-3)),
        (lambda: modopt.sgd(0.1, momentum=0.9), lambda: optax.sgd(0.1, momentum=0.9)),
        (lambda: modopt.adafactor(1e-2, min_dim_size_to_factor=4), lambda: optax.adafactor(1e-2, min_dim_size_to_factor=4)),
    ],
    ids=["adamw", "sgd_momentum", "adafactor"],
)
def test_equinox_model_matches_optax(make, oracle):
    model = Net(jax.random.key(0))
    optimizer = modopt.Optimizer(make(), model)
    step = eqx.filter_jit(lambda m, o: o.step(m, eqx.filter_grad(loss)(m)), donate="all")

    reference = Net(jax.random.key(0))
    params, static = eqx.partition(reference, eqx.is_inexact_array)
    tx = oracle()
    state = tx.init(params)
    for _ in range(5):
        grads = eqx.filter_grad(loss)(eqx.combine(params, static))
        updates, state = tx.update(grads, state, params)
        params = optax.apply_updates(params, updates)
        model, optimizer = step(model, optimizer)

    assert_close(eqx.filter(model, eqx.is_inexact_array), params)
    assert int(optimizer.count) == 5
    # Non-trainable leaves pass through untouched.
    np.testing.assert_array_equal(model.counter, jnp.arange(3))
    np.testing.assert_array_equal(model.mask, jnp.array([True, False]))
    assert model.mlp.activation is jax.nn.tanh
    assert loss(model) < loss(Net(jax.random.key(0)))


def test_dict_pytree_matches_optax():
    params = {"w": jnp.ones((4, 3)), "b": jnp.zeros(3), "steps": jnp.array(7)}
    grad_fn = jax.grad(lambda p: jnp.sum((jnp.arange(4.0) @ p["w"] + p["b"]) ** 2), allow_int=True)

    optimizer = modopt.Optimizer(modopt.adam(0.1), params)
    ours = params
    theirs = {k: v for k, v in params.items() if k != "steps"}
    tx = optax.adam(0.1)
    state = tx.init(theirs)
    for _ in range(4):
        ours, optimizer = jax.jit(lambda p, o: o.step(p, grad_fn(p)))(ours, optimizer)
        grads = {k: v for k, v in grad_fn({**theirs, "steps": params["steps"]}).items() if k != "steps"}
        updates, state = tx.update(grads, state, theirs)
        theirs = optax.apply_updates(theirs, updates)
    assert_close({k: ours[k] for k in ("b", "w")}, theirs)
    assert ours["steps"] == 7 and ours["steps"].dtype == params["steps"].dtype


def test_wrt_selects_trainable_leaves_and_frozen_get_no_state():
    model = Net(jax.random.key(0))
    last_layer_only = eqx.tree_at(
        lambda m: (m.mlp.layers[-1].weight, m.mlp.layers[-1].bias),
        jax.tree.map(lambda _: False, model),
        replace=(True, True),
    )
    optimizer = modopt.Optimizer(modopt.adam(1e-2), model, wrt=last_layer_only)
    adam_state = optimizer.state[0]
    assert len(jax.tree.leaves(adam_state.mu)) == 2 and len(jax.tree.leaves(adam_state.nu)) == 2

    new_model, _ = optimizer.step(model, eqx.filter_grad(loss)(model))
    for i, (old, new) in enumerate(zip(model.mlp.layers, new_model.mlp.layers)):
        changed = not np.array_equal(old.weight, new.weight)
        assert changed == (i == len(model.mlp.layers) - 1)


def test_wrt_filter_function():
    params = {"w": jnp.ones(3), "frozen": jnp.ones(3)}
    optimizer = modopt.Optimizer(modopt.sgd(0.5), params, wrt={"w": True, "frozen": False})
    new, _ = optimizer.step(params, {"w": jnp.ones(3), "frozen": jnp.ones(3)})
    np.testing.assert_allclose(new["w"], 0.5)
    np.testing.assert_allclose(new["frozen"], 1.0)


def test_none_gradient_means_no_change():
    params = {"a": jnp.ones(3), "b": jnp.ones(2)}
    optimizer = modopt.Optimizer(modopt.adam(0.1), params)
    new, optimizer = optimizer.step(params, {"a": jnp.ones(3), "b": None})
    np.testing.assert_array_equal(new["b"], params["b"])
    assert not np.allclose(new["a"], params["a"])
    new, optimizer = optimizer.step(new, {"a": None, "b": None})
    assert int(optimizer.count) == 2


def test_bf16_model_stays_bf16():
    model = Net(jax.random.key(0), dtype=jnp.bfloat16)
    optimizer = modopt.Optimizer(modopt.adam(1e-2), model)
    grads = eqx.filter_grad(lambda m: jnp.sum(jax.vmap(m)(X.astype(jnp.bfloat16))))(model)
    new_model, optimizer = eqx.filter_jit(lambda m, o, g: o.step(m, g))(model, optimizer, grads)
    for old, new in zip(jax.tree.leaves(eqx.filter(model, eqx.is_inexact_array)), jax.tree.leaves(eqx.filter(new_model, eqx.is_inexact_array))):
        assert new.dtype == old.dtype == jnp.bfloat16


def test_gradient_dtypes_narrower_or_canonicalized_are_taken():
    """Only a gradient wider than its parameter is refused (tests/test_bad_input.py). NumPy
    float64 gradients without x64 (JAX takes them as float32) step exactly as float32 ones;
    bf16 gradients of float32 parameters keep the parameters and state float32."""
    params = {"w": jnp.linspace(-1.0, 1.0, 6, dtype=jnp.float32)}
    grads = np.linspace(0.5, -0.5, 6)  # float64
    optimizer = modopt.Optimizer(modopt.adam(0.1), params)
    expected, _ = optimizer.step(params, {"w": jnp.asarray(grads, jnp.float32)})
    new, stepped = optimizer.step(params, {"w": grads})
    np.testing.assert_array_equal(new["w"], expected["w"])
    new, stepped = optimizer.step(params, {"w": jnp.asarray(grads, jnp.bfloat16)})
    assert new["w"].dtype == stepped.state[0].mu["w"].dtype == stepped.state[0].nu["w"].dtype == jnp.float32
    np.testing.assert_allclose(new["w"], expected["w"], rtol=1e-2)  # bf16 rounding of g and g**2


def test_hyperparameters_by_name():
    schedule = modopt.cosine_decay_schedule(0.1, decay_steps=10)
    optimizer = modopt.Optimizer(modopt.adamw(schedule, b1=0.8), {"w": jnp.ones(2)})
    names = optimizer.hyperparameters
    assert float(names["b1"]) == pytest.approx(0.8)
    assert float(names["weight_decay"]) == pytest.approx(1e-4)
    assert float(names["decay_steps"]) == 10

    params = {"w": jnp.ones(2)}
    for step in range(3):
        expected = optax.cosine_decay_schedule(0.1, decay_steps=10)(step)
        assert float(optimizer.learning_rate) == pytest.approx(float(expected), rel=1e-6)
        params, optimizer = optimizer.step(params, {"w": jnp.ones(2)})

    changed = optimizer.set(b1=0.5, init_value=0.2)
    assert float(changed.hyperparameters["b1"]) == 0.5
    assert float(optimizer.hyperparameters["b1"]) == pytest.approx(0.8)  # the original is untouched
    assert float(changed.learning_rate) == pytest.approx(2 * float(optimizer.learning_rate), rel=1e-6)
    with pytest.raises(KeyError, match="No hyperparameter named 'beta1'"):
        optimizer.set(beta1=0.5)


def test_no_retrace_on_hyperparameter_change_or_rebuild():
    traces = []

    @eqx.filter_jit(donate="all")
    def train_step(model, optimizer, x, y):
        traces.append(None)
        value, grads = eqx.filter_value_and_grad(loss)(model, x, y)
        model, optimizer = optimizer.step(model, grads)
        return model, optimizer, value

    model = Net(jax.random.key(0))
    optimizer = modopt.Optimizer(modopt.adam(1e-2), model)
    model, optimizer, _ = train_step(model, optimizer, X, Y)
    # Python floats and ints, NumPy and JAX scalars of any float dtype: same types inside.
    for lr in (5e-3, 1, jnp.float32(1e-3), np.float64(2e-3), jnp.asarray(1e-3, jnp.bfloat16), 0.0):
        optimizer = optimizer.set(learning_rate=lr)
        model, optimizer, _ = train_step(model, optimizer, X, Y)
    optimizer = modopt.Optimizer(modopt.adam(3e-3), model)  # rebuilt, same configuration
    model, optimizer, _ = train_step(model, optimizer, X, Y)
    assert len(traces) == 1

    frozen = jax.tree.map(np.asarray, eqx.filter(model, eqx.is_inexact_array))  # a copy: the step donates
    model, optimizer, _ = train_step(model, optimizer.set(learning_rate=0.0), X, Y)
    assert_close(eqx.filter(model, eqx.is_inexact_array), frozen)  # lr 0 really took effect
    assert len(traces) == 1


def test_pure_pair_is_available():
    params = {"w": jnp.ones(3)}
    optimizer = modopt.Optimizer(modopt.sgd(0.5), params)
    updates, state = optimizer.tx.update({"w": jnp.ones(3)}, optimizer.state, params)
    np.testing.assert_allclose(updates["w"], -0.5)
    assert jax.tree.structure(state) == jax.tree.structure(optimizer.state)


def test_set_number_on_schedule_keeps_the_state_valid():
    params = {"w": jnp.ones(3)}
    optimizer = modopt.Optimizer(modopt.adam(modopt.cosine_decay_schedule(1e-2, 100)), params)
    params, optimizer = optimizer.step(params, {"w": jnp.ones(3)})
    with pytest.warns(UserWarning, match=r"set\(learning_rate=1e-04\) replaces the schedule CosineDecaySchedule") as record:
        constant = optimizer.set(learning_rate=1e-4)
    assert record[0].filename == __file__  # attributed to the caller
    assert float(constant.learning_rate) == pytest.approx(1e-4)
    new_params, _ = constant.step(params, {"w": jnp.ones(3)})
    np.testing.assert_allclose(new_params["w"], params["w"] - 1e-4, rtol=1e-5)  # Adam's first step is lr * sign


def test_set_schedule_on_number_of_a_bare_transform_is_a_clear_error():
    """A bare transform's state is the caller's: `set_hyperparameters` cannot add the schedule's
    step count to it (`Optimizer.set` can: tests/test_user_reports.py)."""
    with pytest.raises(ValueError, match="Cannot set learning_rate to a schedule here: it was a number .* `init` a new state"):
        modopt.set_hyperparameters(modopt.adam(1e-3), learning_rate=modopt.cosine_decay_schedule(1e-2, 100))


def test_value_fn_takes_the_model_and_extra_arguments_are_checked():
    """`value_fn` is written for the model (with its untrained leaves); the transform calls it
    with the trained parameters. A missing or unknown extra argument is a clear error."""
    model = Net(jax.random.key(0))
    grads = eqx.filter_grad(loss)(model)
    optimizer = modopt.Optimizer(ScaleByValueFn(), model)
    new_model, _ = eqx.filter_jit(lambda m, o, g: o.step(m, g, value_fn=loss))(model, optimizer, grads)
    expected = jax.tree.map(lambda p, g: p - loss(model) * g, eqx.filter(model, eqx.is_inexact_array), eqx.filter(grads, eqx.is_inexact_array))
    assert_close(eqx.filter(new_model, eqx.is_inexact_array), expected)
    np.testing.assert_array_equal(new_model.counter, model.counter)
    with pytest.raises(TypeError, match="Optimizer.step needs the extra argument `value_fn` .* for ScaleByValueFn"):
        optimizer.step(model, grads)
    with pytest.raises(TypeError, match="got the extra argument `valu_fn`, which no transform of ScaleByValueFn reads"):
        optimizer.step(model, grads, value_fn=loss, valu_fn=loss)
    with pytest.raises(TypeError, match="ScaleByValueFn.update needs the extra argument `value_fn`"):
        ScaleByValueFn().update(grads, modopt.EmptyState(), model)


def test_a_tree_like_the_params_is_given_like_the_model():
    """`grad=` is shaped like the model (its untrained leaves included); the transform gets the
    trained leaves only, as it gets `grads`."""
    from testing_transforms import AddGrad

    model = Net(jax.random.key(0))
    grads = eqx.filter_grad(loss)(model)
    optimizer = modopt.Optimizer(modopt.chain(AddGrad(), modopt.scale(-0.5)), model)
    new_model, _ = eqx.filter_jit(lambda m, o, g: o.step(m, g, grad=g))(model, optimizer, grads)
    expected = jax.tree.map(lambda p, g: p - g, eqx.filter(model, eqx.is_inexact_array), eqx.filter(grads, eqx.is_inexact_array))
    assert_close(eqx.filter(new_model, eqx.is_inexact_array), expected)


def test_repr_is_a_short_summary():
    model = Net(jax.random.key(0))
    optimizer = modopt.Optimizer(modopt.chain(modopt.clip_by_global_norm(1.0), modopt.adam(1e-3)), model)
    _, optimizer = optimizer.step(model, jax.tree.map(jnp.ones_like, eqx.filter(model, eqx.is_inexact_array)))
    text = repr(optimizer)
    trained = sum(x.size for x in jax.tree.leaves(eqx.filter(model, eqx.is_inexact_array)))
    assert len(text.splitlines()) < 20
    assert "Adam(learning_rate=0.001, b1=0.9" in text and "step=1" in text
    # Adam's state: mu and nu like the parameters, and its step count.
    assert f"{2 * trained + 1:,} numbers" in text
    assert "state=(EmptyState, (ScaleByAdamState, EmptyState))" in text
