"""`inject_hyperparams`: hyperparameters in the state, read and written there, against optax."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from registry.inject import SeedsLayout

import modopt

PARAMS = {"w": jnp.linspace(-1.0, 1.0, 6).reshape(2, 3), "b": jnp.ones(3)}


def grads(step):
    return jax.tree.map(lambda p: jnp.sin(p * (step + 1.0)), PARAMS)


def test_a_number_written_into_the_state_is_used_from_the_next_step_as_in_optax():
    """optax's documented use: `state.hyperparams["b2"] = 0.95` between steps."""
    ours = modopt.inject_hyperparams(modopt.scale_by_adam)(b1=modopt.linear_schedule(0.5, 0.9, 4), b2=0.99)
    theirs = SeedsLayout(optax.inject_hyperparams(optax.scale_by_adam)(b1=optax.linear_schedule(0.5, 0.9, 4), b2=0.99), ["b1"])
    state, their_state = ours.init(PARAMS), theirs.init(PARAMS)
    for step in range(6):
        if step == 3:
            state.hyperparams["b2"] = 0.95
            their_state.hyperparams["b2"] = 0.95
        updates, state = ours.update(grads(step), state)
        their_updates, their_state = theirs.update(grads(step), their_state)
        for a, b in zip(jax.tree.leaves((updates, state)), jax.tree.leaves((their_updates, their_state))):
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    assert float(state.hyperparams["b2"]) == pytest.approx(0.95) and float(state.hyperparams["b1"]) == pytest.approx(0.9)


def test_optimizer_set_writes_where_the_value_lives_without_retracing():
    tx = modopt.inject_hyperparams(modopt.sgd)(learning_rate=0.1, momentum=0.9)
    optimizer = modopt.Optimizer(tx, PARAMS)
    traces = []

    @eqx.filter_jit
    def step(params, optimizer, g):
        traces.append(None)
        return optimizer.step(params, g)

    params, optimizer = step(PARAMS, optimizer, grads(0))
    optimizer = optimizer.set(learning_rate=0.01)
    assert float(optimizer.state.hyperparams["learning_rate"]) == pytest.approx(0.01)
    assert float(optimizer.hyperparameters["learning_rate"]) == pytest.approx(0.01)
    assert float(optimizer.learning_rate) == pytest.approx(0.01)
    new_params, optimizer = step(params, optimizer, grads(1))
    assert len(traces) == 1
    # sgd with momentum by hand: t1 = g0, t2 = g1 + 0.9 g0; the second step uses 0.01.
    expected = jax.tree.map(lambda p, g0, g1: p - 0.01 * (g1 + 0.9 * g0), params, grads(0), grads(1))
    for a, b in zip(jax.tree.leaves(new_params), jax.tree.leaves(expected)):
        np.testing.assert_allclose(a, b, rtol=1e-6)


def test_a_scheduled_hyperparameter_is_reported_at_the_next_step_and_set_to_a_constant():
    tx = modopt.inject_hyperparams(modopt.adam)(learning_rate=modopt.linear_schedule(1.0, 0.0, 10))
    optimizer = modopt.Optimizer(tx, PARAMS)
    params = PARAMS
    for i in range(3):
        params, optimizer = optimizer.step(params, grads(i))
    assert float(optimizer.learning_rate) == pytest.approx(0.7)  # the next step's, at count 3
    assert float(optimizer.state.hyperparams["learning_rate"]) == pytest.approx(0.8)  # the last one used
    constant = optimizer.set(learning_rate=0.05)
    _, constant = constant.step(params, grads(3))
    assert float(constant.state.hyperparams["learning_rate"]) == pytest.approx(0.05)


def test_flax_train_state_and_nnx_optimizer_set_the_state():
    from flax import nnx
    from modopt.integrations.flax import NnxOptimizer, TrainState

    tx = modopt.inject_hyperparams(modopt.adam)(learning_rate=0.1)
    state = TrainState.create(apply_fn=None, params=PARAMS, tx=tx).set(learning_rate=0.02)
    assert float(state.opt_state.hyperparams["learning_rate"]) == pytest.approx(0.02)
    assert float(state.learning_rate) == pytest.approx(0.02)

    model = nnx.Linear(3, 2, rngs=nnx.Rngs(0))
    optimizer = NnxOptimizer(model, tx, wrt=nnx.Param)
    optimizer.set(learning_rate=0.03)
    assert float(optimizer.hyperparameters["learning_rate"]) == pytest.approx(0.03)
    assert float(optimizer.learning_rate) == pytest.approx(0.03)


def test_hyperparameters_cast_to_bfloat16_that_break_the_inner_checks_say_so():
    """In bf16 (the params' dtype by default), b2 = 0.999 rounds to 1: a clear error, not NaNs."""
    params = jax.tree.map(lambda p: p.astype(jnp.bfloat16), PARAMS)
    tx = modopt.inject_hyperparams(modopt.adam)(learning_rate=0.1)
    with pytest.raises(ValueError, match="hyperparam_dtype.*Invalid b2: 1"):
        tx.init(params)
    # With float32 hyperparameters it runs, and (as in optax) they promote the updates.
    tx = modopt.inject_hyperparams(modopt.adam, hyperparam_dtype=jnp.float32)(learning_rate=0.1)
    theirs = optax.inject_hyperparams(optax.adam, hyperparam_dtype=jnp.float32)(learning_rate=0.1)
    updates, _ = tx.update(params, tx.init(params), params)
    their_updates, _ = theirs.update(params, theirs.init(params), params)
    assert jax.tree.map(lambda u: u.dtype, updates) == jax.tree.map(lambda u: u.dtype, their_updates)


def test_static_args_must_name_parameters():
    with pytest.raises(ValueError, match=r"static_args \['msk'\] are not parameters of AdamW"):
        modopt.inject_hyperparams(modopt.adamw, static_args="msk")
