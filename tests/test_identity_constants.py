"""Hyperparameters at their identity (a weight decay of 0, an eps of 0) compiled in as constants.

A field declaring an identity (`modopt.fields.hyperparameter(identity=...)`) holds that value,
given as a number, as a `Constant`: part of the structure, not an array leaf. These tests check
the rule against what it must keep: the same numbers as the array it replaces and as optax, a
jitted step compiled again only when a value moves to or from the identity, the work it makes
void left out of the compiled step, and checkpoints that restore across it.
"""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from registry import ENTRIES

import modopt
from modopt._core.fields import field_identity
from modopt._step.hyperparameters import _hyperparameter_index
from modopt._core.module import Constant

PARAMS = {"w": jnp.linspace(-1.0, 1.0, 12).reshape(3, 4), "b": jnp.array([0.5, -0.25, 2.0])}
GRADS = jax.tree.map(lambda p: 0.1 * jnp.cos(3 * p), PARAMS)


def steps(tx, n=3, params=PARAMS):
    """`n` jitted steps of `tx` (passed as an argument) on `params`; the last params."""
    state = tx.init(params)
    step = jax.jit(lambda tx, p, s, g: tx.update(g, s, p))
    for _ in range(n):
        updates, state = step(tx, params, state, GRADS)
        params = optax.apply_updates(params, updates)
    return params


def constants(tx):
    """The names of the hyperparameters of `tx` held as constants."""
    index = _hyperparameter_index(tx, all_paths=False)
    return sorted(name for name, (get, _) in index.items() if isinstance(get(tx), Constant))


def test_every_entry_holds_its_identities_as_constants_without_leaves():
    """Registry-wide, without compiling: each hyperparameter at its field's identity is a
    `Constant` with no leaf, reads back as the weakly typed array a number gives, and moving it
    off the identity (a JAX array at the same value) makes it a leaf again."""
    checked = 0
    for entry in ENTRIES:
        tx = entry.make()
        index = _hyperparameter_index(tx, all_paths=True, with_fields=True)
        for name, (get, _, field) in index.items():
            value = get(tx)
            if not isinstance(value, Constant) or "." in name or "[" in name:
                continue
            assert field is not None and value.value == field_identity(field), f"{entry}: {name}"
            read = modopt.hyperparameters(tx)[name]
            assert read.weak_type and float(read) == value.value
            as_array = modopt.set_hyperparameters(tx, **{name: jnp.asarray(value.value)})
            assert len(jax.tree.leaves(as_array)) == len(jax.tree.leaves(tx)) + 1, f"{entry}: {name}"
            back = modopt.set_hyperparameters(as_array, **{name: value.value})
            assert jax.tree.structure(back) == jax.tree.structure(tx), f"{entry}: {name}"
            checked += 1
    assert checked >= 50  # the adam family's eps_root, weight decays of 0, eps of 0


@pytest.mark.parametrize(
    "make, theirs",
    [
        (lambda wd: modopt.adadelta(0.5, weight_decay=wd), lambda: optax.adadelta(0.5)),
        (lambda wd: modopt.lars(0.1, weight_decay=wd), lambda: optax.lars(0.1)),
        (lambda eps_root: modopt.adam(0.1, eps_root=eps_root), lambda: optax.adam(0.1)),
    ],
    ids=["adadelta weight_decay", "lars weight_decay", "adam eps_root"],
)
def test_a_constant_gives_the_numbers_of_the_array_it_replaces_and_of_optax(make, theirs):
    ours = steps(make(0.0))
    as_array = steps(make(jnp.asarray(0.0)))  # a JAX array is always a leaf
    assert len(constants(make(0.0))) == len(constants(make(jnp.asarray(0.0)))) + 1
    state = theirs().init(PARAMS)
    params = PARAMS
    for _ in range(3):
        updates, state = theirs().update(GRADS, state, params)
        params = optax.apply_updates(params, updates)
    for a, b, c in zip(jax.tree.leaves(ours), jax.tree.leaves(as_array), jax.tree.leaves(params)):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(a, c, rtol=1e-6, atol=1e-7)


def test_the_step_compiles_again_only_when_a_value_crosses_its_identity():
    traces = []

    @modopt.jit_step
    def train(params, optimizer, grads):
        traces.append(1)
        return optimizer.step(params, grads)

    params = jax.tree.map(jnp.copy, PARAMS)
    optimizer = modopt.Optimizer(modopt.adamw(1e-2, weight_decay=0.0), params)
    params, optimizer = train(params, optimizer, GRADS)
    # Back at 0 (an int too: a number keeps the kind it replaces), the first step serves again.
    for value, compiles in [(1e-4, True), (2e-4, False), (jnp.asarray(3e-4), False), (0.0, False), (0, False)]:
        before = len(traces)
        optimizer = optimizer.set(weight_decay=value)
        params, optimizer = train(params, optimizer, GRADS)
        assert (len(traces) > before) == compiles, value
    assert isinstance(optimizer.tx.weight_decay, Constant) and len(traces) == 2
    assert float(optimizer.hyperparameters["weight_decay"]) == 0.0


def test_a_decay_of_zero_is_left_out_of_the_compiled_step():
    """As optax leaves out `weight_decay=0.0`: no `g + 0 * p` pass, and no NaN from a NaN parameter."""
    params = {"w": jnp.array([1.0, jnp.nan, 2.0])}
    grads = {"w": jnp.ones(3)}
    for tx in (modopt.adadelta(1.0, weight_decay=0.0), modopt.novograd(0.1)):
        updates, _ = jax.jit(lambda tx, s: tx.update(grads, s, params))(tx, tx.init(params))
        assert np.isfinite(np.asarray(updates["w"])).all(), type(tx).__name__

    def hlo(tx):
        state = tx.init(PARAMS)
        return jax.jit(lambda tx, s, p: tx.update(GRADS, s, p)).lower(tx, state, PARAMS).compile().as_text()

    constant, array = hlo(modopt.adadelta(1.0)), hlo(modopt.adadelta(1.0, weight_decay=jnp.asarray(0.0)))
    assert "weight_decay" not in constant and "weight_decay" in array
    assert constant.count(" fusion(") < array.count(" fusion(")


def test_a_checkpoint_restores_across_an_identity(tmp_path):
    """Saved with a decay of 0 (a constant), restored into a target decaying by 1e-4 (a leaf):
    the target's is kept, with a warning, or the saved one taken, as for any hyperparameter."""
    from modopt.integrations.orbax import CheckpointManager, HyperparameterWarning

    params = jax.tree.map(jnp.copy, PARAMS)
    with CheckpointManager(tmp_path) as manager:
        manager.save(1, optimizer=modopt.Optimizer(modopt.adamw(1e-3, weight_decay=0.0), params))
        target = modopt.Optimizer(modopt.adamw(1e-3, weight_decay=1e-4), params)
        with pytest.warns(HyperparameterWarning, match="weight_decay: saved 0.0, target 0.0001"):
            kept = manager.restore(optimizer=target)["optimizer"]
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            saved = manager.restore(optimizer=target, hyperparameters="saved")["optimizer"]
    assert float(kept.hyperparameters["weight_decay"]) == pytest.approx(1e-4)
    assert float(saved.hyperparameters["weight_decay"]) == 0.0
