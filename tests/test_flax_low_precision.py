"""The Flax adapters' options for low-precision parameters and memory: `compensation=`,
`key=` and `state_memory_kind=`, as `modopt.Optimizer` takes them.

The oracle is `modopt.Optimizer` on the same parameters and gradients: the linen TrainState
and the NNX optimizer must give its parameters, state and compensation bit for bit (the
compensated updates themselves are checked against their references in `test_low_precision.py`,
the offload in `test_offload.py`). Small models, three steps, one jit per configuration.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from modopt.integrations.flax import NnxOptimizer, TrainState, state_shardings

import modopt

STEPS = 3
HOST = "pinned_host"


def make_params():
    keys = jax.random.split(jax.random.key(0), 2)
    return {
        "w": jax.random.normal(keys[0], (6, 4)).astype(jnp.bfloat16),
        "b": jax.random.normal(keys[1], (4,)),  # float32: no buffer, updated as without compensation
    }


def gradients(step, params):
    keys = jax.random.split(jax.random.fold_in(jax.random.key(1), step), len(params))
    return {
        k: (1e-3 * jax.random.normal(key, params[k].shape)).astype(params[k].dtype)
        for key, k in zip(keys, sorted(params))
    }


def tx():
    return modopt.adam(1e-2)


def assert_same_bits(a, b):
    a_leaves, b_leaves = jax.tree.leaves(a), jax.tree.leaves(b)
    assert len(a_leaves) == len(b_leaves)
    for x, y in zip(a_leaves, b_leaves):
        if jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
            x, y = jax.random.key_data(x), jax.random.key_data(y)
        assert x.dtype == y.dtype and x.shape == y.shape
        np.testing.assert_array_equal(np.asarray(x, np.float64), np.asarray(y, np.float64))


def kinds(tree):
    return {x.sharding.memory_kind for x in jax.tree.leaves(tree)}


OPTIONS = {
    "kahan": dict(compensation="kahan"),
    "stochastic_rounding": dict(compensation="stochastic_rounding", key=jax.random.key(3)),
    "pinned_host": dict(state_memory_kind=HOST),
    "kahan_pinned_host": dict(compensation="kahan", state_memory_kind=HOST),
}


@functools.cache
def optimizer_run(name):
    """`modopt.Optimizer`'s parameters, state and compensation after `STEPS` steps, with the
    options `OPTIONS[name]`."""
    options, params = OPTIONS[name], make_params()
    optimizer = modopt.Optimizer(tx(), params, group_small_leaves=False, **options)

    @jax.jit
    def step(params, optimizer, grads):
        return optimizer.step(params, grads)

    for i in range(STEPS):
        params, optimizer = step(params, optimizer, gradients(i, params))
    return params, optimizer


@pytest.mark.parametrize("name", list(OPTIONS))
def test_train_state_gives_the_optimizers_numbers(name):
    options = OPTIONS[name]
    state = TrainState.create(apply_fn=None, params=make_params(), tx=tx(), **options)
    if "state_memory_kind" in options:
        assert kinds(state.opt_state) == {HOST}

    @jax.jit
    def step(state, grads):
        return state.apply_gradients(grads=grads)

    for i in range(STEPS):
        state = step(state, gradients(i, state.params))
    params, optimizer = optimizer_run(name)
    assert_same_bits(state.params, params)
    assert_same_bits(state.opt_state, optimizer.state)
    assert_same_bits(state.compensation, optimizer.compensation)
    assert int(state.step) == STEPS
    if "state_memory_kind" in options:
        assert kinds((state.opt_state, state.compensation)) == {HOST}
        assert kinds(state.params) != {HOST}


class Model(nnx.Module):
    def __init__(self, params):
        self.w = nnx.Param(params["w"])
        self.b = nnx.Param(params["b"])


@pytest.mark.parametrize("name", list(OPTIONS))
def test_nnx_optimizer_gives_the_optimizers_numbers(name):
    options = OPTIONS[name]
    model = Model(make_params())
    optimizer = NnxOptimizer(model, tx(), group_small_leaves=False, **options)
    if "state_memory_kind" in options:
        assert kinds(nnx.as_pure(optimizer.opt_state)) == {HOST}

    @nnx.jit
    def step(model, optimizer, grads):
        optimizer.update(model, grads)

    for i in range(STEPS):
        params = nnx.as_pure(nnx.state(model, nnx.Param))
        step(model, optimizer, nnx.State(gradients(i, params)))
    params, reference = optimizer_run(name)
    assert_same_bits(dict(nnx.as_pure(nnx.state(model, nnx.Param))), params)
    assert_same_bits(nnx.as_pure(optimizer.opt_state), reference.state)
    compensation = None if optimizer.compensation is None else nnx.as_pure(optimizer.compensation)
    assert_same_bits(compensation, reference.compensation)
    if "state_memory_kind" in options:
        assert kinds((nnx.as_pure(optimizer.opt_state), compensation)) == {HOST}


def test_bad_options_are_errors_naming_them():
    params = make_params()
    with pytest.raises(ValueError, match=r"^TrainState: Invalid compensation: 'kahn'"):
        TrainState.create(apply_fn=None, params=params, tx=tx(), compensation="kahn")
    with pytest.raises(
        ValueError, match=r"^NnxOptimizer: compensation='stochastic_rounding' needs a PRNG key"
    ):
        NnxOptimizer(Model(params), tx(), compensation="stochastic_rounding")
    with pytest.raises(
        ValueError, match=r"^TrainState: `key` is the PRNG key of compensation='stochastic_rounding'"
    ):
        TrainState.create(apply_fn=None, params=params, tx=tx(), key=jax.random.key(0))
    with pytest.raises(ValueError, match=r"^NnxOptimizer: Invalid state_memory_kind: 'host'"):
        NnxOptimizer(Model(params), tx(), state_memory_kind="host")


def test_a_subclass_adds_fields_without_defaults_and_state_shardings_place_the_compensation():
    """The new fields are keyword-only, so a subclass still adds plain fields (as with Flax's
    TrainState); `state_shardings` gives the compensation buffers their parameters' shardings,
    in the state's memory kind."""

    class WithStats(TrainState):
        batch_stats: dict

    state = WithStats.create(
        apply_fn=None,
        params=make_params(),
        tx=tx(),
        batch_stats={},
        compensation="kahan",
        state_memory_kind=HOST,
    )
    assert [f.name for f in dataclasses.fields(state)][-1] == "batch_stats"
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("data",))
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    shardings = state_shardings(state, {"w": replicated, "b": replicated})
    assert kinds_of_shardings(shardings.compensation) == {HOST} and kinds_of_shardings(
        shardings.opt_state
    ) == {HOST}
    assert (
        shardings.compensation.buffers["b"] is None
        and shardings.compensation.buffers["w"].spec == replicated.spec
    )


def kinds_of_shardings(tree):
    return {s.memory_kind for s in jax.tree.leaves(tree)}
