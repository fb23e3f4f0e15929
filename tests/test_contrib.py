"""contrib and experimental: `mechanize` and `split_real_and_imaginary`.

The registry (`registry/contrib.py`) runs both through the shared checks on real
parameters. Here: parity with optax in more configurations and on complex parameters, the
reference point `x0` that Mechanic keeps surviving donated steps on every path (Equinox
`Optimizer`, linen `TrainState`, `NnxOptimizer`), hyperparameters, errors, sharding rules.
"""

from __future__ import annotations

import re

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import AbstractMesh, AxisType
from jax.sharding import PartitionSpec as P
from testing_transforms import AddGrad, ScaleByValueFn

import modopt
from modopt.contrib import MechanicState, mechanize
from modopt.experimental import RealAndImaginary, SplitRealAndImaginaryState, split_real_and_imaginary

STEPS = 4


def real_params():
    k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
    return {
        "w": jax.random.normal(k1, (4, 3)),
        "b": jax.random.normal(k2, (3,)),
        "s": jax.random.normal(k3, ()),
    }


def complex_params():
    k1, k2, k3 = jax.random.split(jax.random.key(1), 3)
    z = jax.random.normal(k1, (4, 3)) + 1j * jax.random.normal(k2, (4, 3))
    return {"z": z.astype(jnp.complex64), "r": jax.random.normal(k3, (5,))}


def grads_at(step, params):
    """Deterministic gradients shaped (and typed) like `params`, complex where they are."""
    leaves, treedef = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.fold_in(jax.random.key(7), step), 2 * len(leaves))
    out = []
    for i, leaf in enumerate(leaves):
        g = jax.random.normal(keys[2 * i], leaf.shape)
        if jnp.iscomplexobj(leaf):
            g = g + 1j * jax.random.normal(keys[2 * i + 1], leaf.shape)
        out.append(g.astype(leaf.dtype))
    return treedef.unflatten(out)


def assert_trees_close(ours, theirs, what, rtol=1e-6, atol=1e-6):
    """Same structure (by path), shapes and dtypes; values close, complex ones part by part."""
    our_flat = jax.tree_util.tree_flatten_with_path(ours)[0]
    their_flat = jax.tree_util.tree_flatten_with_path(theirs)[0]
    our_paths = [jax.tree_util.keystr(p) for p, _ in our_flat]
    assert our_paths == [jax.tree_util.keystr(p) for p, _ in their_flat], f"{what}: structure differs"
    for path, (_, a), (_, b) in zip(our_paths, our_flat, their_flat):
        assert jnp.shape(a) == jnp.shape(b) and jnp.result_type(a) == jnp.result_type(b), f"{what} at {path}"
        np.testing.assert_allclose(
            np.asarray(a), np.asarray(b), rtol=rtol, atol=atol, err_msg=f"{what} at {path}"
        )


def run_parity(ours, theirs, params, *, init_params=None, tolerance=1e-6):
    """`ours` against optax's `theirs` for STEPS updates, eager and jitted, updates and states."""
    init_params = params if init_params is None else init_params
    expected, their_state, p = [], theirs.init(init_params), params
    expected_init = their_state
    for step in range(STEPS):
        updates, their_state = theirs.update(grads_at(step, params), their_state, p)
        expected.append((updates, their_state))
        p = optax.apply_updates(p, updates)
    for jit in (False, True):
        init = jax.jit(ours.init) if jit else ours.init
        update = jax.jit(ours.update) if jit else ours.update
        state, p = init(init_params), params
        assert_trees_close(state, expected_init, "initial state", rtol=tolerance, atol=tolerance)
        for step in range(STEPS):
            updates, state = update(grads_at(step, params), state, p)
            what = f"{'jitted' if jit else 'eager'} step {step}"
            assert_trees_close(updates, expected[step][0], f"updates, {what}", rtol=tolerance, atol=tolerance)
            assert_trees_close(state, expected[step][1], f"state, {what}", rtol=tolerance, atol=tolerance)
            p = modopt.apply_updates(p, updates)


# ---- mechanize: parity -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "ours, theirs",
    [
        (
            lambda: mechanize(modopt.lion(0.3), weight_decay=0.1, eps=1e-6, s_init=1e-3, num_betas=3),
            lambda: optax.contrib.mechanize(
                optax.lion(0.3), weight_decay=0.1, eps=1e-6, s_init=1e-3, num_betas=3
            ),
        ),
        (
            lambda: mechanize(modopt.sgd(1.0, momentum=0.9), weight_decay=0.0, num_betas=1),
            lambda: optax.contrib.mechanize(optax.sgd(1.0, momentum=0.9), weight_decay=0.0, num_betas=1),
        ),
        (  # an optax base optimizer inside modopt's mechanize
            lambda: mechanize(optax.adam(0.1), s_init=1e-2),
            lambda: optax.contrib.mechanize(optax.adam(0.1), s_init=1e-2),
        ),
    ],
    ids=["lion_all_hyperparameters", "momentum_one_beta", "optax_adam_inside"],
)
def test_mechanize_matches_optax(ours, theirs):
    run_parity(ours(), theirs(), real_params())


def test_mechanize_reference_point_is_the_first_update_params():
    """`x0` is a copy of the params given to `init` until the first update, then the params of
    that update (optax does the same): a state built on placeholder zeros works."""
    params = real_params()
    zeros = jax.tree.map(jnp.zeros_like, params)
    run_parity(
        mechanize(modopt.adam(0.1)), optax.contrib.mechanize(optax.adam(0.1)), params, init_params=zeros
    )
    tx = mechanize(modopt.sgd(0.1))
    state = tx.init(zeros)
    _, state = tx.update(grads_at(0, params), state, params)
    _, state = tx.update(grads_at(1, params), state, zeros)
    for a, b in zip(jax.tree.leaves(state.x0), jax.tree.leaves(params), strict=True):
        np.testing.assert_array_equal(a, b)


def test_mechanize_state_fields_and_dtypes():
    params = {"w": jnp.ones((2, 3), jnp.float32), "h": jnp.ones(3, jnp.bfloat16)}
    state = mechanize(modopt.sgd(0.1), num_betas=4, s_init=1e-3).init(params)
    assert isinstance(state, MechanicState)
    assert MechanicState._fields == ("base_optimizer_state", "count", "r", "m", "v", "s", "x0")
    for name in ("r", "m", "v", "s"):
        leaf = getattr(state, name)
        assert leaf.shape == (4,) and leaf.dtype == jnp.bfloat16, (name, leaf)  # the lowest dtype, as optax
    np.testing.assert_allclose(np.asarray(state.s, np.float32), 1e-3, rtol=1e-2)
    assert state.count.dtype == jnp.int32 and state.count.shape == ()


def test_mechanize_needs_params():
    tx = mechanize(modopt.sgd(0.1))
    params = real_params()
    with pytest.raises(ValueError, match=re.escape("Mechanize.update needs the current parameters")):
        tx.update(params, tx.init(params))


# ---- mechanize: the reference point survives donation on every path ----------------------------


def assert_untouched(x0, original):
    """`x0` holds the original values and every buffer is alive."""
    for a, b in zip(jax.tree.leaves(x0), jax.tree.leaves(original), strict=True):
        assert not a.is_deleted()
        np.testing.assert_array_equal(np.asarray(a), b)


def buffers(tree):
    return {x.unsafe_buffer_pointer() for x in jax.tree.leaves(tree)}


def test_mechanize_init_copies_the_params():
    params = real_params()
    state = mechanize(modopt.adam(0.1)).init(params)
    assert not buffers(state.x0) & buffers(params)
    assert all(a is not b for a, b in zip(jax.tree.leaves(state.x0), jax.tree.leaves(params)))


def test_mechanize_x0_survives_donated_optimizer_steps():
    params = real_params()
    original = jax.tree.map(np.array, params)  # copies: a view would keep the buffer from donation
    optimizer = modopt.Optimizer(mechanize(modopt.adam(0.1), s_init=0.1), params)
    assert not buffers(optimizer.state.x0) & buffers(params)

    @eqx.filter_jit(donate="all-except-first")
    def step(grads, model, optimizer):
        return optimizer.step(model, grads)

    model = params
    for i in range(3):
        model, optimizer = step(grads_at(i, params), model, optimizer)
        jax.block_until_ready((model, optimizer))
    assert params["w"].is_deleted()  # the step really donates
    assert_untouched(optimizer.state.x0, original)
    assert not np.array_equal(np.asarray(model["w"]), original["w"])
    assert int(optimizer.state.count) == 3


def test_mechanize_x0_survives_donated_linen_train_state_steps():
    from modopt.integrations.flax import TrainState

    params = real_params()
    original = jax.tree.map(np.array, params)  # copies: a view would keep the buffer from donation
    loss = lambda p: sum(jnp.sum((x - 1.0) ** 2) for x in jax.tree.leaves(p))
    state = TrainState.create(apply_fn=None, params=params, tx=mechanize(modopt.adam(0.1), s_init=0.1))
    assert not buffers(state.opt_state.x0) & buffers(params)
    step = jax.jit(lambda s: s.apply_gradients(grads=jax.grad(loss)(s.params)), donate_argnums=0)
    first = state
    for _ in range(3):
        state = step(state)
        jax.block_until_ready(state)
    assert first.params["w"].is_deleted()
    assert_untouched(state.opt_state.x0, original)
    assert int(state.step) == 3
    assert not np.array_equal(np.asarray(state.params["w"]), original["w"])


def test_mechanize_x0_survives_donated_nnx_optimizer_steps():
    from flax import nnx
    from modopt.integrations.flax import NnxOptimizer

    model = nnx.Linear(3, 2, rngs=nnx.Rngs(0))
    original = jax.tree.map(np.array, nnx.as_pure(nnx.state(model, nnx.Param)))
    optimizer = NnxOptimizer(model, mechanize(modopt.adam(0.1), s_init=0.1), wrt=nnx.Param)
    x0 = nnx.as_pure(optimizer.opt_state).x0
    assert not buffers(x0) & buffers(nnx.as_pure(nnx.state(model, nnx.Param)))
    x = jnp.ones((4, 3))

    @nnx.jit(donate_argnums=(0, 1))
    def step(model, optimizer):
        grads = nnx.grad(lambda m: jnp.mean((m(x) - 1.0) ** 2))(model)
        optimizer.update(model, grads)

    for _ in range(3):
        step(model, optimizer)
        jax.block_until_ready(nnx.state(model))
    assert x0["kernel"].is_deleted()  # the step really donates the optimizer state
    assert_untouched(nnx.as_pure(optimizer.opt_state).x0, original)
    assert int(optimizer.step.get_value()) == 3
    assert not np.array_equal(np.asarray(model.kernel.get_value()), original["kernel"])


# ---- mechanize: hyperparameters --------------------------------------------------------------


def test_mechanize_hyperparameters_change_without_retrace():
    params = real_params()
    traces = []

    @eqx.filter_jit
    def step(model, optimizer, grads):
        traces.append(1)
        return optimizer.step(model, grads)

    base = modopt.Optimizer(mechanize(modopt.sgd(0.1), s_init=0.1), params)
    # Three steps, so that the last depends on every hyperparameter (the first has no history).
    outcomes = {}
    for name, value in (("weight_decay", 0.3), ("eps", 1e-2), ("s_init", 0.2), (None, None)):
        optimizer = base if name is None else base.set(**{name: value})
        if name is not None:
            assert float(optimizer.hyperparameters[name]) == pytest.approx(value)
        model = params
        for i in range(3):
            model, optimizer = step(model, optimizer, grads_at(i, params))
        outcomes[name] = np.asarray(model["w"])
    assert len(traces) == 1
    for name in ("weight_decay", "eps", "s_init"):
        assert not np.allclose(outcomes[name], outcomes[None], rtol=1e-4, atol=1e-6), name
    # A new optimizer with the same configuration reuses the trace too.
    step(params, modopt.Optimizer(mechanize(modopt.sgd(0.1), s_init=0.1), params), grads_at(0, params))
    assert len(traces) == 1
    assert set(modopt.Optimizer(mechanize(modopt.adam(0.1)), params).hyperparameters) >= {
        "weight_decay",
        "s_init",
        "learning_rate",
        "b1",
        "b2",
    }


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"num_betas": 0}, "Invalid num_betas: 0 (must be an integer >= 1) in Mechanize."),
        ({"num_betas": 2.5}, "Invalid num_betas: 2.5 (must be an integer >= 1) in Mechanize."),
        ({"num_betas": True}, "Invalid num_betas: True (must be an integer >= 1) in Mechanize."),
        ({"weight_decay": -0.1}, "Invalid weight_decay: -0.1 (must be >= 0) in Mechanize."),
        ({"eps": -1e-8}, "Invalid eps: -1e-08 (must be >= 0) in Mechanize."),
        ({"s_init": 0.0}, "Invalid s_init: 0.0 (must be > 0) in Mechanize."),
        ({"s_init": "big"}, "Invalid s_init: 'big' of type str (expected a number) in Mechanize."),
    ],
)
def test_mechanize_invalid_hyperparameters(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        mechanize(modopt.sgd(0.1), **kwargs)


def test_mechanize_accepts_numpy_integers_and_rejects_bad_set():
    assert mechanize(modopt.sgd(0.1), num_betas=np.int64(3)).num_betas == 3
    optimizer = modopt.Optimizer(mechanize(modopt.sgd(0.1)), real_params())
    with pytest.raises(
        ValueError, match=re.escape("Invalid weight_decay: -1.0 (must be >= 0) in Mechanize.")
    ):
        optimizer.set(weight_decay=-1.0)


def test_mechanize_rejects_complex_params_and_points_to_the_split():
    with pytest.raises(TypeError, match=re.escape("split_real_and_imaginary(mechanize(...))")):
        mechanize(modopt.sgd(0.1)).init(complex_params())


def test_mechanize_inside_split_real_and_imaginary_matches_optax():
    run_parity(
        split_real_and_imaginary(mechanize(modopt.adam(0.1), s_init=1e-3)),
        optax.contrib.split_real_and_imaginary(optax.contrib.mechanize(optax.adam(0.1), s_init=1e-3)),
        complex_params(),
    )


# ---- split_real_and_imaginary ------------------------------------------------------------------


@pytest.mark.parametrize(
    "ours, theirs",
    [
        (lambda: modopt.adam(0.1), lambda: optax.adam(0.1)),
        (lambda: modopt.rmsprop(0.05, momentum=0.5), lambda: optax.rmsprop(0.05, momentum=0.5)),
        (
            lambda: modopt.chain(modopt.clip_by_global_norm(1.0), modopt.lion(0.1)),
            lambda: optax.chain(optax.clip_by_global_norm(1.0), optax.lion(0.1)),
        ),
    ],
    ids=["adam", "rmsprop_momentum", "clip_then_lion"],
)
def test_split_real_and_imaginary_matches_optax_on_complex_params(ours, theirs):
    run_parity(
        split_real_and_imaginary(ours()), optax.contrib.split_real_and_imaginary(theirs()), complex_params()
    )


def test_split_real_and_imaginary_state_and_pass_through():
    params = complex_params()
    tx = split_real_and_imaginary(modopt.adam(0.1))
    state = tx.init(params)
    assert isinstance(state, SplitRealAndImaginaryState)
    mu = state.inner_state[0].mu
    assert isinstance(mu["z"], RealAndImaginary) and mu["z"].real.dtype == jnp.float32
    assert not isinstance(mu["r"], RealAndImaginary)
    # Real leaves get exactly what the inner transform gives them alone.
    grads = grads_at(0, params)
    updates, _ = tx.update(grads, state, params)
    alone, _ = modopt.adam(0.1).update(
        {"r": grads["r"]}, modopt.adam(0.1).init({"r": params["r"]}), {"r": params["r"]}
    )
    np.testing.assert_allclose(updates["r"], alone["r"], rtol=1e-6)
    assert updates["z"].dtype == jnp.complex64 and updates["r"].dtype == jnp.float32
    # The parts are independent real parameters: Adam's first step is -lr * sign, part by part.
    expected = -0.1 * (np.sign(grads["z"].real) + 1j * np.sign(grads["z"].imag))
    np.testing.assert_allclose(updates["z"], expected, rtol=1e-5)


def test_split_real_and_imaginary_in_an_optimizer_keeps_complex_params():
    params = complex_params()
    optimizer = modopt.Optimizer(split_real_and_imaginary(modopt.adam(0.1)), params)

    @eqx.filter_jit(donate="all-except-first")
    def step(grads, model, optimizer):
        return optimizer.step(model, grads)

    model = jax.tree.map(jnp.copy, params)
    for i in range(3):
        model, optimizer = step(grads_at(i, params), model, optimizer)
    assert model["z"].dtype == jnp.complex64 and model["r"].dtype == jnp.float32
    assert not np.allclose(model["z"].imag, params["z"].imag)
    lr_set = optimizer.set(learning_rate=0.0)
    assert float(lr_set.learning_rate) == 0.0


def test_split_real_and_imaginary_adapts_extra_args():
    """A function of the params (`value_fn`) sees them complex; a tree like them (`grad`) is split."""
    params = complex_params()
    tx = split_real_and_imaginary(modopt.chain(ScaleByValueFn(), AddGrad()))
    value_fn = lambda p: jnp.sum(jnp.abs(p["z"]) ** 2) + jnp.sum(p["r"])
    grads, extra = grads_at(0, params), grads_at(1, params)
    updates, _ = eqx.filter_jit(tx.update)(grads, tx.init(params), params, value_fn=value_fn, grad=extra)
    factor = value_fn(params)
    for name in params:
        np.testing.assert_allclose(updates[name], -factor * grads[name] + extra[name], rtol=1e-5, atol=1e-5)


# ---- sharding rules ---------------------------------------------------------------------------

MESH = AbstractMesh((2, 4), ("data", "model"), axis_types=(AxisType.Auto, AxisType.Auto))


def placed_state(tx, params, specs, zero_axis=None):
    optimizer = eqx.filter_eval_shape(modopt.Optimizer, tx, params)
    return modopt.sharding.shardings(optimizer, specs, mesh=MESH, zero_axis=zero_axis).state


def test_mechanize_rule_places_x0_like_the_params_and_replicates_the_rest():
    # A single parameter of shape (num_betas,): shaped like the per-beta vectors, which stay replicated.
    params = jnp.zeros(4)
    state = placed_state(mechanize(modopt.adam(0.1), num_betas=4), params, P("model"))
    assert state.x0.spec == P("model")
    assert state.base_optimizer_state[0].mu.spec == P("model")
    for name in ("count", "r", "m", "v", "s"):
        assert getattr(state, name).spec == P(), name
    params = {"w": jnp.zeros((8, 6)), "b": jnp.zeros(8)}
    specs = {"w": P("model", None), "b": P("model")}
    state = placed_state(mechanize(modopt.sgd(0.1)), params, specs, zero_axis="data")
    assert state.x0["w"].spec == P("model", "data")
    assert state.s.spec in (P(), P("data"))


def test_split_real_and_imaginary_rule_places_both_parts_like_the_param():
    params = {"z": jnp.zeros((8, 6), jnp.complex64), "r": jnp.zeros(8)}
    specs = {"z": P("model", None), "r": P("model")}
    state = placed_state(split_real_and_imaginary(modopt.adafactor(0.1)), params, specs)
    leaves = jax.tree_util.tree_flatten_with_path(state)[0]
    z_parts = [(jax.tree_util.keystr(p), s.spec) for p, s in leaves if "['z']" in jax.tree_util.keystr(p)]
    assert {path.rsplit(".", 1)[-1] for path, _ in z_parts} == {"real", "imaginary"}
    by_part = {}
    for path, spec in z_parts:
        by_part.setdefault(path.rsplit(".", 1)[0], set()).add(spec)
    assert all(len(s) == 1 for s in by_part.values()), by_part  # real and imaginary placed alike
    state = placed_state(split_real_and_imaginary(modopt.adam(0.1)), params, specs, zero_axis="data")
    mu = state.inner_state[0].mu
    assert mu["z"].real.spec == mu["z"].imaginary.spec == P("model", "data")
    assert mu["r"].spec == P(("model", "data"))
