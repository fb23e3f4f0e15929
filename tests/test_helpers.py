"""The shared helpers every family builds on: rates, PRNG-key fields, masks, extra arguments,
the wrapper base, schedules as jit functions, counters, and the transform protocol."""

from __future__ import annotations

import re
from typing import Any, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

import modopt

PARAMS = {"w": jnp.ones((3, 2)), "b": jnp.zeros(2)}


# ---- rates -----------------------------------------------------------------------------------


@pytest.mark.parametrize("b", [0.999, 0.99, 0.9, 0.5, 0.0])
def test_rate_complement_is_the_double_precision_one_rounded(b):
    """`1 - rate` is `1 - b` computed in double precision and rounded once to float32, as a
    Python float gives in optax; `1 - float32(b)` would lose digits for b near 1."""
    r = modopt.scale_by_adam(b2=b).b2
    assert isinstance(r, modopt.Rate)
    assert float(1 - r) == float(np.float32(1.0 - b))
    assert float(r) == float(np.float32(b))
    np.testing.assert_array_equal(r * jnp.ones(2), np.float32(b) * np.ones(2, np.float32))


def test_rate_gradient_flows_through_its_value():
    """Differentiating through `1 - rate` gives -1 per unit of the rate, as for a plain number."""

    def ema_weight(b):
        return 1 - modopt.Rate(b, 1 - b) + 2 * modopt.Rate(b, 1 - b)

    assert float(jax.grad(ema_weight)(jnp.asarray(0.9))) == pytest.approx(1.0)


def test_rate_set_keeps_its_type_and_exact_complement():
    optimizer = modopt.Optimizer(modopt.adam(1e-3), PARAMS)
    changed = optimizer.set(b2=0.995)
    assert float(1 - changed.tx.b2) == float(np.float32(1 - 0.995))
    assert changed.tx.b2.value.weak_type and changed.tx.b2.complement.weak_type
    assert float(changed.hyperparameters["b2"]) == pytest.approx(0.995)


# ---- PRNG keys ---------------------------------------------------------------------------------


class WithKey(modopt.AbstractTransform):
    key: jax.Array = modopt.prng_key()

    def init(self, params):
        return modopt.EmptyState()

    def update(self, updates, state, params=None, **extra_args):
        return updates, state


@pytest.mark.parametrize("given", [3, np.int64(3), jax.random.key(3), jax.random.PRNGKey(3)], ids=["int", "numpy", "typed", "raw"])
def test_prng_key_field_accepts_seeds_and_keys_and_hashes(given):
    tx = WithKey(given)
    assert jnp.issubdtype(tx.key.dtype, jax.dtypes.prng_key)
    np.testing.assert_array_equal(jax.random.key_data(tx.key), jax.random.key_data(jax.random.key(3)))
    assert hash(tx) == hash(WithKey(jax.random.key(3))) and tx == WithKey(3)
    assert hash(tx) != hash(WithKey(4))


@pytest.mark.parametrize("bad", [None, 1.5, True, "seed"])
def test_prng_key_field_rejects_what_is_not_a_key(bad):
    with pytest.raises(TypeError, match="Expected a PRNG key"):
        WithKey(bad)


# ---- masks and labels ------------------------------------------------------------------------


@pytest.mark.parametrize("true", [True, np.bool_(True), jnp.asarray(True)], ids=["python", "numpy", "jax"])
def test_masks_may_hold_numpy_and_jax_bools(true):
    false = not bool(true) if isinstance(true, bool) else ~true
    ours = modopt.masked(modopt.scale(2.0), {"w": true, "b": false})
    updates, _ = ours.update(PARAMS, ours.init(PARAMS), PARAMS)
    np.testing.assert_array_equal(updates["w"], 2 * PARAMS["w"])
    np.testing.assert_array_equal(updates["b"], PARAMS["b"])


def test_mask_shaped_like_an_equinox_module_is_a_tree_not_a_function():
    """An Equinox model is callable; a mask built from one (bool leaves) must not be called."""
    model = eqx.nn.MLP(2, 1, 4, 1, key=jax.random.key(0))
    params = eqx.filter(model, eqx.is_array)
    mask = jax.tree.map(lambda x: x.ndim == 2, params)  # weights yes, biases no
    tx = modopt.add_decayed_weights(0.5, mask=mask)
    updates, _ = tx.update(jax.tree.map(jnp.zeros_like, params), tx.init(params), params)
    for u, p in zip(jax.tree.leaves(updates), jax.tree.leaves(params)):
        np.testing.assert_allclose(u, 0.5 * p if p.ndim == 2 else 0 * p)
    theirs = optax.add_decayed_weights(0.5, mask=mask)
    their_updates, _ = theirs.update(jax.tree.map(jnp.zeros_like, params), theirs.init(params), params)
    assert jax.tree.all(jax.tree.map(lambda a, b: bool(jnp.array_equal(a, b)), updates, their_updates))


def test_a_mask_of_arrays_is_a_clear_error():
    with pytest.raises(TypeError, match=re.escape("at ['w'] there is an array of shape (3, 2)")):
        modopt.masked(modopt.scale(2.0), {"w": jnp.ones((3, 2), bool), "b": True})


# ---- the transform protocol --------------------------------------------------------------------


def test_a_transform_unpacks_like_optax_pair():
    init, update = modopt.adam(1e-2)
    tx = modopt.adam(1e-2)
    assert tx[0] == tx.init and tx[1] == tx.update
    state = init(PARAMS)
    updates, _ = update(PARAMS, state, PARAMS)
    their_updates, _ = optax.adam(1e-2).update(PARAMS, optax.adam(1e-2).init(PARAMS), PARAMS)
    assert jax.tree.all(jax.tree.map(lambda a, b: bool(jnp.array_equal(a, b)), updates, their_updates))


def test_schedules_are_jit_functions_and_take_huge_step_counts():
    schedule = modopt.cosine_decay_schedule(1.0, decay_steps=10**10)
    assert float(jax.jit(schedule)(jnp.asarray(5))) == pytest.approx(float(optax.cosine_decay_schedule(1.0, 10**10)(5)))
    assert hash(schedule) == hash(modopt.cosine_decay_schedule(1.0, decay_steps=10**10))


@pytest.mark.parametrize("dtype", [jnp.uint32, jnp.uint8, jnp.int8, jnp.int32])
def test_safe_increment_under_jit_saturates_every_integer_dtype(dtype):
    top = jnp.iinfo(dtype).max
    assert int(jax.jit(modopt.safe_increment)(jnp.asarray(top - 1, dtype))) == top
    assert int(jax.jit(modopt.safe_increment)(jnp.asarray(top, dtype))) == top
    assert jax.jit(modopt.safe_increment)(jnp.asarray(0, dtype)).dtype == dtype


# ---- hyperparameter kinds ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: modopt.adam(1e-3, b1=modopt.constant_schedule(0.9)), "Invalid b1: ConstantSchedule(value=0.9) is a schedule or function, but b1 takes a number in Adam"),
        (lambda: modopt.scale_by_schedule(0.1), "Invalid step_size_fn: 0.1 (expected a schedule (a callable of the step count)) in ScaleBySchedule"),
        (lambda: modopt.scale(lambda count: 0.1), "but step_size takes a number in Scale"),
    ],
)
def test_a_schedule_where_a_number_goes_and_the_reverse_are_clear_errors(make, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        make()


def test_set_refuses_a_change_of_structure():
    optimizer = modopt.Optimizer(modopt.sgd(0.1), PARAMS)
    with pytest.raises(ValueError, match="Cannot set momentum from None to a value: that changes the structure"):
        optimizer.set(momentum=0.9)
    with_momentum = modopt.Optimizer(modopt.sgd(0.1, momentum=0.9), PARAMS)
    with pytest.raises(ValueError, match="Cannot set momentum from a value to None"):
        with_momentum.set(momentum=None)


def test_set_indexes_a_structure_once_and_reads_each_optimizer_own_values(monkeypatch):
    """The names `set` and `hyperparameters` find depend on the transform's structure alone, so
    they are indexed once per structure: a second `set` on an optimizer of the same structure
    builds no composite's parts. Its values are still its own, not those of the optimizer
    first indexed, and a new value is still validated."""
    first = modopt.Optimizer(modopt.adamw(1e-3, b1=0.8, weight_decay=0.1), PARAMS).set(learning_rate=1e-4)
    builds = []
    build = modopt.AdamW.build
    monkeypatch.setattr(modopt.AdamW, "build", lambda self: builds.append(1) or build(self))
    second = modopt.Optimizer(modopt.adamw(2e-3, b1=0.7, weight_decay=0.2), PARAMS)
    builds.clear()  # those of its construction (whose checks build the parts)
    changed = second.set(learning_rate=5e-4)
    assert builds == []
    assert {name: float(value) for name, value in modopt.hyperparameters(changed.tx).items()} == pytest.approx(
        {"learning_rate": 5e-4, "b1": 0.7, "b2": 0.999, "eps": 1e-8, "eps_root": 0.0, "weight_decay": 0.2}
    )
    assert float(first.tx.b1.value) == pytest.approx(0.8)
    with pytest.raises(ValueError, match=re.escape("Invalid b1: 1.5 (must be in [0, 1)) in AdamW.")):
        second.set(b1=1.5)


def test_negative_weight_decay_is_accepted_as_optax_does():
    ours, theirs = modopt.add_decayed_weights(-0.1), optax.add_decayed_weights(-0.1)
    a, _ = ours.update(PARAMS, ours.init(PARAMS), PARAMS)
    b, _ = theirs.update(PARAMS, theirs.init(PARAMS), PARAMS)
    np.testing.assert_array_equal(a["w"], b["w"])


# ---- extra arguments -------------------------------------------------------------------------


def test_extra_arguments_reach_an_optax_transform_with_keyword_only_arguments():
    """optax's polyak step has `update(..., *, value, **extra_args)`: inside a modopt chain it
    gets `value`, and the chain declares it (a missing one is a clear error)."""
    tx = modopt.chain(optax.scale_by_polyak(max_learning_rate=0.5), modopt.scale(-1.0))
    theirs = optax.chain(optax.scale_by_polyak(max_learning_rate=0.5), optax.scale(-1.0))
    value = jnp.asarray(0.7)
    ours, _ = tx.update(PARAMS, tx.init(PARAMS), PARAMS, value=value)
    expected, _ = theirs.update(PARAMS, theirs.init(PARAMS), PARAMS, value=value)
    np.testing.assert_array_equal(ours["w"], expected["w"])
    assert "value" in modopt.declared_extra_args(tx).args
    optimizer = modopt.Optimizer(tx, PARAMS)
    with pytest.raises(TypeError, match="Optimizer.step needs the extra argument `value`"):
        optimizer.step(PARAMS, PARAMS)
    new_params, _ = optimizer.step(PARAMS, PARAMS, value=value)
    np.testing.assert_array_equal(new_params["w"], PARAMS["w"] + expected["w"])


def test_extra_arguments_are_merged_over_a_composition():
    polyak = optax.scale_by_polyak()
    tx = modopt.partition({"a": modopt.chain(polyak, modopt.scale(-1.0)), "b": modopt.sgd(0.1)}, {"w": "a", "b": "b"})
    declared = modopt.declared_extra_args(tx)
    assert declared.args["value"][0].required and declared.open  # optax's update takes **extra_args


# ---- the wrapper base --------------------------------------------------------------------------


class CountingState(NamedTuple):
    calls: jax.Array
    last: Any
    inner_state: Any


class Counting(modopt.AbstractWrapper):
    """Test wrapper: counts calls, keeps the last inner update (shaped like the params)."""

    inner: modopt.AbstractTransform = modopt.inner_transform()

    def init(self, params):
        return CountingState(jnp.zeros([], jnp.int32), jax.tree.map(jnp.zeros_like, params), self.inner.init(params))

    def update(self, updates, state, params=None, **extra_args):
        updates, inner = self.inner.update(updates, state.inner_state, params, **extra_args)
        return updates, CountingState(state.calls + 1, updates, inner)


def test_a_wrapper_places_its_state_by_shape_and_its_inner_state_by_the_inner_rule():
    params = {"w": jnp.zeros((256, 8)), "b": jnp.zeros(8)}
    specs = {"w": P(None, "model"), "b": P("model")}
    wrapped = Counting(modopt.scale_by_factored_rms(min_dim_size_to_factor=1))
    found = wrapped.state_specs(params, specs)
    assert found.calls == P() and found.last == specs
    assert found.inner_state == modopt.scale_by_factored_rms(min_dim_size_to_factor=1).state_specs(params, specs)
    assert found.inner_state.v_row["w"] == P("model")  # the factored rule (the generic one would replicate it)


def test_safe_increment_under_jit_on_uint64_with_x64():
    """With 64-bit types on (set before jax starts, hence a subprocess), a uint64 counter
    saturates at 2**64 - 1 under jit."""
    import os
    import subprocess
    import sys

    script = (
        "import jax, jax.numpy as jnp, modopt\n"
        "top = jnp.iinfo(jnp.uint64).max\n"
        "step = jax.jit(modopt.safe_increment)\n"
        "assert int(step(jnp.asarray(top - 1, jnp.uint64))) == int(top)\n"
        "assert int(step(jnp.asarray(top, jnp.uint64))) == int(top)\n"
        "assert step(jnp.asarray(0, jnp.uint64)).dtype == jnp.uint64\n"
        "print('ok')\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env={**os.environ, "JAX_ENABLE_X64": "1"})
    assert result.stdout.strip() == "ok", result.stderr[-2000:]


def test_typed_keys_print():
    assert "key<fry>[]" in repr(modopt.noisy_sgd(0.1))


def test_full_paths_name_hyperparameters_and_stay_valid_when_a_chain_grows():
    tx = modopt.chain(modopt.clip(1.0), modopt.adam(0.1))
    assert "learning_rate" in modopt.hyperparameters(tx)  # unique: its short name
    path = "transforms[1].learning_rate"
    assert float(modopt.set_hyperparameters(tx, **{path: 0.2}).transforms[1].learning_rate) == pytest.approx(0.2)
    grown = modopt.chain(modopt.clip(1.0), modopt.adam(0.1), modopt.sgd(0.3))
    assert float(modopt.set_hyperparameters(grown, **{path: 0.2}).transforms[1].learning_rate) == pytest.approx(0.2)
    with pytest.raises(KeyError, match=re.escape("'learning_rate' is not unique here: name one of ['transforms[1].learning_rate', 'transforms[2].learning_rate']")):
        modopt.set_hyperparameters(grown, learning_rate=0.1)
