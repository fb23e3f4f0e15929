"""Restoring into freshly created targets, and where hyperparameters come from on restore.

One checkpoint, written once for the module, holds a `modopt.Optimizer`, one with
`inject_hyperparams`, both linen TrainStates (modopt's and Flax's own, with a modopt `tx`),
an NNX model with its `NnxOptimizer` (as objects and as `nnx.state`s), and a few numbers,
each after `K` steps. The reference runs of `N` steps are kept beside it.
"""

from __future__ import annotations

import re
import types
import warnings

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from flax.training import train_state as flax_train_state
from modopt.integrations.flax import NnxOptimizer, TrainState
from modopt.integrations.orbax import CheckpointError, CheckpointManager, HyperparameterWarning

import modopt

K, N = 3, 5
X = jax.random.normal(jax.random.key(0), (8, 4))
Y = jnp.sin(X[:, :2])


def make_tx(decay_steps=10, b1=0.9):
    schedule = modopt.warmup_cosine_decay_schedule(0.0, 1e-2, 2, decay_steps)
    return modopt.chain(modopt.clip_by_global_norm(1.0), modopt.adamw(schedule, b1=b1, weight_decay=1e-3))


def make_injected(learning_rate=0.1):
    return modopt.inject_hyperparams(modopt.adam)(learning_rate=learning_rate, b1=modopt.linear_schedule(0.9, 0.5, 4))


def make_params():
    keys = jax.random.split(jax.random.key(2), 2)
    return {"w": jax.random.normal(keys[0], (4, 3)), "b": jax.random.normal(keys[1], (3,))}


def grads_at(i, params):
    return jax.tree.map(lambda p: jnp.cos(p + i), params)


class NnxMLP(nnx.Module):
    def __init__(self, rngs):
        self.hidden = nnx.Linear(4, 8, rngs=rngs)
        self.out = nnx.Linear(8, 2, rngs=rngs)

    def __call__(self, x):
        return self.out(nnx.relu(self.hidden(x)))


TRACES: dict[str, int] = {}


def traced(name, fn):
    def counted(*args):
        TRACES[name] = TRACES.get(name, 0) + 1
        return fn(*args)

    return counted


optimizer_step = jax.jit(traced("optimizer", lambda p, o, g: o.step(p, g)))
state_step = jax.jit(traced("state", lambda s, g: s.apply_gradients(grads=g)))


@nnx.jit
def nnx_step(model, optimizer):
    grads = nnx.grad(lambda m: jnp.mean((m(X) - Y) ** 2))(model)
    optimizer.update(model, grads)


def train_states():
    params = make_params()
    return {
        "state": TrainState.create(apply_fn=None, params=params, tx=make_tx()),
        "flax_state": flax_train_state.TrainState.create(apply_fn=None, params=params, tx=make_tx()),
    }


def bitwise_equal(a, b):
    if jax.tree.structure(a) != jax.tree.structure(b):
        return False
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        x, y = np.asarray(x), np.asarray(y)
        if x.dtype != y.dtype or x.shape != y.shape or x.tobytes() != y.tobytes():
            return False
    return True


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """The checkpoint at step `K` and the results of `N` steps straight."""
    directory = tmp_path_factory.mktemp("checkpoint")
    items, straight = {}, {}

    for name, tx in (("optimizer", make_tx()), ("injected", make_injected())):
        params = make_params()
        optimizer = modopt.Optimizer(tx, params)
        for i in range(N):
            if i == K:
                items[name], items[f"{name}_params"] = optimizer, params
            params, optimizer = optimizer_step(params, optimizer, grads_at(i, params))
        straight[name] = (params, optimizer)

    for name, state in train_states().items():
        for i in range(N):
            if i == K:
                items[name] = state
            state = state_step(state, grads_at(i, state.params))
        straight[name] = state

    model = NnxMLP(nnx.Rngs(0))
    optimizer = NnxOptimizer(model, make_tx())
    for i in range(N):
        if i == K:
            items.update(model=model, nnx_optimizer=optimizer)
            items.update(model_state=nnx.state(model), nnx_optimizer_state=nnx.state(optimizer))
            items = jax.tree.map(lambda x: x, items)  # a snapshot: NNX objects change in place
        nnx_step(model, optimizer)
    straight["nnx"] = (nnx.state(model), nnx.state(optimizer))

    items["numbers"] = {"epoch": jnp.asarray(7), "position": 12, "best": 0.5}
    with CheckpointManager(directory) as manager:
        manager.save(K, **items)
    return types.SimpleNamespace(directory=directory, straight=straight, items=items)


def restore(saved, **like):
    with CheckpointManager(saved.directory) as manager:
        return manager.restore(**like)


# ---- fresh targets -------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["state", "flax_state"])
def test_linen_train_state_restores_into_a_freshly_created_one(saved, name):
    """`restore(state=TrainState.create(...))`: `step` (the Python int 0 there) comes back as the
    weakly typed int32 a jitted step makes, so the step compiled for the fresh state serves the
    restored one, and N - K more steps equal N steps straight, bit for bit."""
    fresh = train_states()[name]
    assert type(fresh.step) is int
    traces = TRACES["state"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # same hyperparameters: nothing to warn about
        state = restore(saved, **{name: fresh})[name]
    assert isinstance(state.step, jax.Array) and state.step.dtype == jnp.int32 and state.step.weak_type
    assert int(state.step) == K
    for i in range(K, N):
        state = state_step(state, grads_at(i, state.params))
    assert TRACES["state"] == traces, "the restored state retraced the step"
    assert int(state.step) == N
    assert bitwise_equal(state, saved.straight[name])


def test_nnx_optimizer_resumes_bit_exactly_as_objects_and_as_states(saved):
    """The model and its `NnxOptimizer` restore as objects (new ones come back) or as their
    `nnx.state`s (merged into fresh objects with `nnx.update`); both resume bit for bit."""
    model = NnxMLP(nnx.Rngs(1))  # other weights: restored over
    optimizer = NnxOptimizer(model, make_tx())
    restored = restore(saved, model=model, nnx_optimizer=optimizer)
    model, optimizer = restored["model"], restored["nnx_optimizer"]
    assert isinstance(optimizer, NnxOptimizer) and int(optimizer.step.get_value()) == K
    for _ in range(K, N):
        nnx_step(model, optimizer)
    assert bitwise_equal((nnx.state(model), nnx.state(optimizer)), saved.straight["nnx"])

    model = NnxMLP(nnx.Rngs(1))
    optimizer = NnxOptimizer(model, make_tx())
    restored = restore(saved, model_state=nnx.state(model), nnx_optimizer_state=nnx.state(optimizer))
    nnx.update(model, restored["model_state"])
    nnx.update(optimizer, restored["nnx_optimizer_state"])
    for _ in range(K, N):
        nnx_step(model, optimizer)
    assert bitwise_equal((nnx.state(model), nnx.state(optimizer)), saved.straight["nnx"])


def test_numbers_and_scalar_arrays_restore_into_each_other(saved):
    """A Python number in the target takes a saved scalar array (weakly typed, as `jit` makes
    it), an array or a NumPy scalar takes a saved number (in its dtype and type); other kinds
    are still an error."""
    like = {"epoch": 0, "position": jnp.zeros((), jnp.int32), "best": np.float32(0)}
    numbers = restore(saved, numbers=like)["numbers"]
    assert numbers["epoch"].weak_type and int(numbers["epoch"]) == 7
    assert numbers["position"].dtype == jnp.int32 and not numbers["position"].weak_type
    assert int(numbers["position"]) == 12
    assert type(numbers["best"]) is np.float32 and numbers["best"] == 0.5
    expected = "at ['epoch'] the checkpoint has an array of shape () and dtype int32, the target the value 0.0"
    with pytest.raises(CheckpointError, match=re.escape(expected)):
        restore(saved, numbers={**like, "epoch": 0.0})


# ---- the hyperparameters policy ------------------------------------------------------------


def test_target_hyperparameters_are_kept_with_a_warning_naming_each(saved):
    """The default keeps the target's schedule and betas and restores the state; the warning
    names each differing hyperparameter by its path. The kept values are copies: donating the
    restored optimizer leaves the target intact."""
    target = modopt.Optimizer(make_tx(decay_steps=20, b1=0.8), make_params())
    with pytest.warns(HyperparameterWarning) as record:
        optimizer = restore(saved, optimizer=target)["optimizer"]
    (warning,) = record
    assert str(warning.message) == (
        f"The hyperparameters saved at step {K} differ from the target's: "
        "optimizer.transforms[1].learning_rate.decay_steps: saved 10, target 20; "
        "optimizer.transforms[1].b1: saved 0.9, target 0.8 "
        "(keeping the target's; pass hyperparameters='saved' to take the checkpoint's)."
    )
    assert bitwise_equal(optimizer.tx, target.tx)
    assert bitwise_equal(optimizer.state, saved.items["optimizer"].state)
    assert int(optimizer.count) == K
    assert optimizer.tx.transforms[1].learning_rate.decay_steps.weak_type
    kept, original = optimizer.tx.transforms[1].b1.value, target.tx.transforms[1].b1.value
    assert kept.unsafe_buffer_pointer() != original.unsafe_buffer_pointer()


def test_saved_hyperparameters_are_taken_without_a_warning(saved):
    target = modopt.Optimizer(make_tx(decay_steps=20, b1=0.8), make_params())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        optimizer = restore(saved, optimizer=target, hyperparameters="saved")["optimizer"]
    assert bitwise_equal(optimizer, saved.items["optimizer"])
    assert int(optimizer.tx.transforms[1].learning_rate.decay_steps) == 10
    with CheckpointManager(saved.directory) as manager:
        expected = "Invalid hyperparameters: 'checkpoint' (must be 'target', to keep the target's, or 'saved'"
        with pytest.raises(ValueError, match=re.escape(expected)):
            manager.restore(optimizer=target, hyperparameters="checkpoint")


def test_injected_hyperparameters_follow_the_policy_and_scheduled_values_are_state(saved):
    """`inject_hyperparams` keeps its numbers in the state: they are hyperparameters (the
    target's by default); a scheduled value there is recomputed from the count, so it is state."""
    target = modopt.Optimizer(make_injected(learning_rate=0.2), make_params())
    with pytest.warns(HyperparameterWarning) as record:
        optimizer = restore(saved, injected=target)["injected"]
    message = str(record[0].message)
    assert "injected.hyperparams['learning_rate']: saved 0.1, target 0.2" in message
    assert "injected.learning_rate (in the state): saved 0.1, target 0.2" in message
    assert "b1" not in message
    assert float(optimizer.hyperparameters["learning_rate"]) == pytest.approx(0.2)
    saved_state = saved.items["injected"].state
    assert bitwise_equal(optimizer.state.hyperparams["b1"], saved_state.hyperparams["b1"])
    assert bitwise_equal(optimizer.state.inner_state, saved_state.inner_state)

    optimizer = restore(saved, injected=target, hyperparameters="saved")["injected"]
    assert bitwise_equal(optimizer, saved.items["injected"])


def test_policy_applies_to_train_states_and_nnx_optimizers(saved):
    """modopt's TrainState and the NnxOptimizer carry their transform as data: the policy
    applies and names the paths. Flax's own TrainState keeps `tx` static: it is never written,
    so it is always the target's."""
    state = TrainState.create(apply_fn=None, params=make_params(), tx=make_tx(b1=0.8))
    flax_state = flax_train_state.TrainState.create(apply_fn=None, params=make_params(), tx=make_tx(b1=0.8))
    optimizer = NnxOptimizer(NnxMLP(nnx.Rngs(0)), make_tx(b1=0.8))
    with pytest.warns(HyperparameterWarning) as record:
        restored = restore(
            saved, state=state, flax_state=flax_state, nnx_optimizer=optimizer, nnx_optimizer_state=nnx.state(optimizer)
        )
    message = str(record[0].message)
    assert "state.transforms[1].b1: saved 0.9, target 0.8" in message
    assert "nnx_optimizer.transforms[1].b1: saved 0.9, target 0.8" in message
    # The NNX state's variable holding the transform: named by the transform's paths.
    assert "nnx_optimizer_state['_hyperparameters'].transforms[1].b1: saved 0.9, target 0.8" in message, message
    assert "flax_state" not in message
    assert float(restored["state"].hyperparameters["b1"]) == pytest.approx(0.8)
    assert float(restored["nnx_optimizer"].hyperparameters["b1"]) == pytest.approx(0.8)
    assert bitwise_equal(restored["state"].opt_state, saved.items["state"].opt_state)

    restored = restore(saved, state=state, nnx_optimizer=optimizer, hyperparameters="saved")
    assert float(restored["state"].hyperparameters["b1"]) == pytest.approx(0.9)
    assert float(restored["nnx_optimizer"].hyperparameters["b1"]) == pytest.approx(0.9)


def test_an_abstract_target_takes_the_saved_hyperparameters(saved):
    abstract = eqx.filter_eval_shape(modopt.Optimizer, make_tx(decay_steps=20), jax.eval_shape(make_params))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        optimizer = restore(saved, optimizer=abstract)["optimizer"]
    assert bitwise_equal(optimizer, saved.items["optimizer"])
