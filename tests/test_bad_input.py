"""Bad input: each case paired with the error message it must produce."""

from __future__ import annotations

import re

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import modopt

PARAMS = {"w": jnp.ones((3, 2)), "b": jnp.zeros(2)}


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: modopt.adam(1e-3, b2=1.0), "Invalid b2: 1.0 (must be in [0, 1))"),
        (lambda: modopt.adam(1e-3, b1=-0.1), "Invalid b1: -0.1 (must be in [0, 1))"),
        (lambda: modopt.adam(-1e-3), "Invalid learning_rate: -0.001 (must be >= 0 and finite)"),
        (lambda: modopt.adamw(1e-3, eps=-1e-8), "Invalid eps: -1e-08 (must be >= 0)"),
        (lambda: modopt.adamw(1e-3, weight_decay="0.1"), "Invalid weight_decay: '0.1' of type str (expected a number or a schedule"),
        (lambda: modopt.sgd(0.1, momentum=1.5), "Invalid momentum: 1.5 (must be in [0, 1])"),
        (lambda: modopt.scale_by_adam(b1=1.0), "Invalid b1: 1.0 (must be in [0, 1))"),
        (lambda: modopt.clip_by_global_norm(0.0), "Invalid max_norm: 0.0 (must be > 0)"),
        (lambda: modopt.clip(-1.0), "Invalid max_delta: -1.0 (must be >= 0)"),
        (lambda: modopt.adafactor(decay_rate=1.5), "Invalid decay_rate: 1.5 (must be in [0, 1])"),
        (lambda: modopt.trace(decay=-0.5), "Invalid decay: -0.5 (must be in [0, 1])"),
        (lambda: modopt.cosine_decay_schedule(0.1, decay_steps=0), "Invalid decay_steps: 0 (must be > 0)"),
        (lambda: modopt.warmup_cosine_decay_schedule(0.0, 1.0, 10, 5), "Invalid decay_steps: 5 (must be > warmup_steps"),
    ],
)
def test_invalid_hyperparameters(make, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        make()


def test_invalid_hyperparameter_through_set():
    optimizer = modopt.Optimizer(modopt.adam(1e-3), PARAMS)
    with pytest.raises(ValueError, match=re.escape("Invalid b2: 1.0 (must be in [0, 1))")):
        optimizer.set(b2=1.0)
    with pytest.raises(ValueError, match=re.escape("Invalid learning_rate: -0.1 (must be >= 0 and finite)")):
        optimizer.set(learning_rate=-0.1)


@pytest.mark.parametrize(
    "grads, message",
    [
        ({"w": jnp.ones((3, 2))}, "found no entry for 'b' in the dict at the root"),
        ({"w": jnp.ones((3, 2)), "b": jnp.zeros(2), "extra": jnp.ones(1)}, "found unexpected entries 'extra' in the dict at the root"),
        ({"w": jnp.ones((2, 3)), "b": jnp.zeros(2)}, "gradient at ['w'] has shape (2, 3), but the parameter has shape (3, 2)"),
        ({"w": jnp.ones((3, 2), jnp.int32), "b": jnp.zeros(2)}, "gradient at ['w'] has dtype int32 (integer), but the parameter has dtype float32 (floating)"),
        ({"w": jnp.ones((3, 2)), "b": jnp.zeros(2, jnp.complex64)}, "gradient at ['b'] has dtype complex64 (complex)"),
        ({"w": [1.0, 2.0], "b": jnp.zeros(2)}, "The gradient at ['w'] is a list, expected an array"),
        ({"w": jnp.ones((3, 2)), "b": {"x": jnp.zeros(2)}}, "The gradient at ['b'] is a dict, expected an array"),
        ([jnp.ones((3, 2)), jnp.zeros(2)], "found a list at the root, where a dict is expected"),
    ],
    ids=["missing", "extra", "shape", "int_dtype", "complex_for_real", "list_for_leaf", "dict_for_leaf", "list_for_dict"],
)
def test_mismatched_gradients(grads, message):
    optimizer = modopt.Optimizer(modopt.sgd(0.1), PARAMS)
    with pytest.raises(ValueError, match=re.escape(message)):
        optimizer.step(PARAMS, grads)


def test_mismatched_gradients_of_equinox_model_name_the_path():
    model = eqx.nn.MLP(2, 2, 4, 1, key=jax.random.key(0))
    optimizer = modopt.Optimizer(modopt.adam(1e-3), model)
    wider = eqx.nn.MLP(2, 2, 5, 1, key=jax.random.key(0))
    grads = eqx.filter_grad(lambda m: jnp.sum(m(jnp.ones(2))))(wider)
    with pytest.raises(ValueError, match=re.escape("found a MLP at the root whose static field width_size is 5, where 4 is expected")):
        optimizer.step(model, grads)
    bad = eqx.filter_grad(lambda m: jnp.sum(m(jnp.ones(2))))(model)
    bad = eqx.tree_at(lambda m: m.layers[1].weight, bad, jnp.ones((3, 4)))
    with pytest.raises(ValueError, match=re.escape("gradient at .layers[1].weight has shape (3, 4), but the parameter has shape (2, 4)")):
        optimizer.step(model, bad)


def test_swapped_model_and_gradients_are_caught():
    model = eqx.nn.MLP(2, 2, 4, 1, key=jax.random.key(0))
    optimizer = modopt.Optimizer(modopt.adam(1e-3), model)
    grads = eqx.filter_grad(lambda m: m(jnp.ones(2)).sum())(model)
    with pytest.raises(ValueError, match=re.escape("found a NoneType at .activation") + ".*look swapped"):
        optimizer.step(grads, model)
    with pytest.raises(ValueError, match=re.escape("Pass the model the optimizer was made for")):
        optimizer.step({"w": jnp.ones(2)}, grads)


def test_state_from_another_optimizer():
    adam = modopt.Optimizer(modopt.adam(1e-3), PARAMS)
    sgd = modopt.Optimizer(modopt.sgd(1e-3, momentum=0.9), PARAMS)
    mixed = eqx.tree_at(lambda o: o.state, adam, sgd.state)
    with pytest.raises(ValueError, match=re.escape("optimizer state does not belong to this transform (Adam)")):
        mixed.step(PARAMS, PARAMS)


def test_state_for_other_parameters():
    optimizer = modopt.Optimizer(modopt.adam(1e-3), PARAMS)
    bigger = {"w": jnp.ones((4, 2)), "b": jnp.zeros(2)}
    with pytest.raises(ValueError, match=re.escape("state at [0].mu['w'] has shape (3, 2)")):
        optimizer.step(bigger, bigger)


def test_pure_api_wrong_state():
    tx = modopt.chain(modopt.clip(1.0), modopt.scale_by_adam())
    with pytest.raises(ValueError, match="chain of 2 transforms got a state with 1 entries"):
        tx.update(PARAMS, (modopt.EmptyState(),), PARAMS)
    with pytest.raises(ValueError, match=re.escape("optimizer state does not belong to this transform (Chain)")):
        modopt.check_state(tx, modopt.sgd(0.1).init(PARAMS), PARAMS)


def test_missing_params_is_a_clear_error():
    tx = modopt.add_decayed_weights(1e-2)
    with pytest.raises(ValueError, match=re.escape("AddDecayedWeights.update needs the current parameters")):
        tx.update(PARAMS, tx.init(PARAMS))


def test_error_raised_before_anything_changes_with_donation():
    params = {k: v + 1 for k, v in PARAMS.items()}
    optimizer = modopt.Optimizer(modopt.adam(1e-3), params)
    step = eqx.filter_jit(lambda p, o, g: o.step(p, g), donate="all")
    with pytest.raises(ValueError, match="has shape"):
        step(params, optimizer, {"w": jnp.ones((2, 3)), "b": jnp.zeros(2)})
    # Nothing was donated or modified: the inputs are intact and still usable.
    np.testing.assert_array_equal(params["w"], 2.0)
    assert int(optimizer.count) == 0
    new_params, optimizer = step(params, optimizer, {"w": jnp.ones((3, 2)), "b": jnp.zeros(2)})
    assert int(optimizer.count) == 1


def test_non_transform_component():
    with pytest.raises(TypeError, match="chain argument 1: expected a gradient transformation, got int"):
        modopt.chain(modopt.scale(1.0), 3)
