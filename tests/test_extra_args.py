"""Extra arguments of `update` end to end: Polyak's step size reads the loss `value`.

`Optimizer.step(model, grads, value=loss)` reaches the transform, alone or inside
`modopt.chain` and `optax.chain`, and a missing `value` is a `TypeError` naming the
transform and the argument, raised before anything runs.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import modopt


def make_model():
    return eqx.nn.MLP(3, 1, 8, 1, key=jax.random.key(0))


def make_data():
    x = jax.random.normal(jax.random.key(1), (16, 3))
    return x, jnp.sum(x, axis=1, keepdims=True)


def loss_fn(model, x, y):
    return jnp.mean((jax.vmap(model)(x) - y) ** 2)


@eqx.filter_jit
def train_step(model, optimizer, x, y):
    loss, grads = eqx.filter_value_and_grad(loss_fn)(model, x, y)
    model, optimizer = optimizer.step(model, grads, value=loss)
    return model, optimizer, loss


def train(tx, steps=5):
    model, (x, y) = make_model(), make_data()
    optimizer = modopt.Optimizer(tx, model)
    losses = []
    for _ in range(steps):
        model, optimizer, loss = train_step(model, optimizer, x, y)
        losses.append(float(loss))
    return model, losses


def optax_reference(tx, steps=5):
    """The same training with an optax transform on the model's arrays."""
    model, (x, y) = make_model(), make_data()
    params, static = eqx.partition(model, eqx.is_inexact_array)
    state = tx.init(params)
    for _ in range(steps):
        loss, grads = jax.value_and_grad(lambda p: loss_fn(eqx.combine(p, static), x, y))(params)
        updates, state = tx.update(grads, state, params, value=loss)
        params = optax.apply_updates(params, updates)
    return eqx.combine(params, static)


# The reference of the chains below: clip, Polyak's step size, descend.
OPTAX_CLIPPED_POLYAK = optax.chain(
    optax.clip_by_global_norm(10.0), optax.scale_by_polyak(max_learning_rate=0.5), optax.scale(-1.0)
)


def assert_models_close(a, b):
    arrays = [jax.tree.leaves(eqx.filter(model, eqx.is_array)) for model in (a, b)]
    for u, v in zip(*arrays):
        np.testing.assert_allclose(np.asarray(u), np.asarray(v), rtol=1e-5, atol=1e-6)


def test_polyak_sgd_steps_an_equinox_model_with_the_loss():
    model, losses = train(modopt.polyak_sgd(max_learning_rate=0.5))
    assert losses[-1] < 0.5 * losses[0]
    assert_models_close(model, optax_reference(optax.polyak_sgd(max_learning_rate=0.5)))


def test_polyak_inside_modopt_chain():
    polyak = modopt.scale_by_polyak(max_learning_rate=0.5)
    model, losses = train(modopt.chain(modopt.clip_by_global_norm(10.0), polyak, modopt.scale(-1.0)))
    assert losses[-1] < losses[0]
    assert_models_close(model, optax_reference(OPTAX_CLIPPED_POLYAK))


def test_polyak_inside_optax_chain():
    """optax's chain passes extra arguments only to its own `GradientTransformationExtraArgs`;
    a modopt transform unpacks into one. Unwrapped, the missing `value` is named."""
    polyak = modopt.scale_by_polyak(max_learning_rate=0.5)
    wrapped = optax.GradientTransformationExtraArgs(*polyak)
    model, losses = train(optax.chain(optax.clip_by_global_norm(10.0), wrapped, optax.scale(-1.0)))
    assert losses[-1] < losses[0]
    assert_models_close(model, optax_reference(OPTAX_CLIPPED_POLYAK))

    unwrapped = optax.chain(optax.clip_by_global_norm(10.0), polyak, optax.scale(-1.0))
    params = {"w": jnp.ones(3)}
    with pytest.raises(TypeError, match=r"ScaleByPolyak.*`value`"):
        unwrapped.update(params, unwrapped.init(params), params, value=1.0)


@pytest.mark.parametrize(
    "tx, owner",
    [
        (modopt.polyak_sgd(), "PolyakSgd"),
        (modopt.chain(modopt.clip(1.0), modopt.scale_by_polyak()), "ScaleByPolyak"),
    ],
    ids=["polyak_sgd", "modopt_chain"],
)
def test_missing_polyak_value_is_a_clear_error(tx, owner):
    model, (x, y) = make_model(), make_data()
    optimizer = modopt.Optimizer(tx, model)
    grads = eqx.filter_grad(loss_fn)(model, x, y)
    expected = rf"Optimizer.step needs the extra argument `value` \(the loss[^)]*\) for [^:]*{owner}"
    with pytest.raises(TypeError, match=expected):
        optimizer.step(model, grads)
    with pytest.raises(TypeError, match=r"`value`"):
        eqx.filter_jit(lambda m, o, g: o.step(m, g))(model, optimizer, grads)  # at trace time
    params = optimizer.trainable(model)
    with pytest.raises(TypeError, match=r"ScaleByPolyak.update needs the extra argument `value`"):
        tx.update(grads, tx.init(params), params)


def test_polyak_rejects_an_extra_argument_nothing_reads():
    model, (x, y) = make_model(), make_data()
    optimizer = modopt.Optimizer(modopt.polyak_sgd(), model)
    loss, grads = eqx.filter_value_and_grad(loss_fn)(model, x, y)
    with pytest.raises(TypeError, match=r"`loss`.*reads: `value`"):
        optimizer.step(model, grads, value=loss, loss=loss)
