"""Differential privacy: `differentially_private_aggregate` and `dpsgd` on real batches of
per-example gradients, and `Optimizer.step`'s per-example mode.

The registry (`registry/privacy.py`) runs both through the shared checks with batches of one
example; here: parity with optax on batches of several examples (eager and jitted, noise bit
for bit), the clipping and the noise against NumPy, the per-example mode of `Optimizer.step`
and its errors, no retrace on hyperparameter changes, Orbax resume, and DP-SGD training on
the digits data set.
"""

from __future__ import annotations

import warnings

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import modopt
from modopt.examples.digits import BATCH_SIZE, accuracy, load_data, loss_fn
from modopt.optimizers._dpsgd import dpsgd
from modopt.transforms._privacy import DifferentiallyPrivateAggregateState, differentially_private_aggregate

PARAMS = {"w": jnp.ones((3, 4)), "b": jnp.zeros(4), "s": jnp.zeros(())}
BATCH = 5


def per_example_grads(step, batch=BATCH, params=PARAMS):
    """Per-example gradients of `params`, large enough that most examples get clipped."""
    keys = jax.random.split(jax.random.fold_in(jax.random.key(11), step), len(params))
    return {name: 2.0 * jax.random.normal(k, (batch, *p.shape)) for k, (name, p) in zip(keys, sorted(params.items()))}


def key_data(key):
    return np.asarray(jax.random.key_data(key))


def quiet(make):
    """Builds an optax transform that warns about its deprecated `seed=`."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return make()


CASES = {
    "aggregate": (
        lambda: differentially_private_aggregate(1.0, 1.1, seed=3),
        lambda: optax.contrib.differentially_private_aggregate(1.0, 1.1, key=jax.random.key(3)),
    ),
    "aggregate_key": (
        lambda: differentially_private_aggregate(0.5, 2.0, key=jax.random.key(9)),
        lambda: optax.contrib.differentially_private_aggregate(0.5, 2.0, key=jax.random.key(9)),
    ),
    "dpsgd": (
        lambda: dpsgd(0.25, 1.5, 1.3, 1337),
        lambda: quiet(lambda: optax.contrib.dpsgd(0.25, 1.5, 1.3, 1337)),
    ),
    "dpsgd_nesterov": (
        lambda: dpsgd(0.1, 1.0, 1.1, 0, momentum=0.9, nesterov=True),
        lambda: quiet(lambda: optax.contrib.dpsgd(0.1, 1.0, 1.1, 0, momentum=0.9, nesterov=True)),
    ),
}


# The noise's scale `l2_norm_clip * noise_multiplier` is a float32 product in modopt (both are
# array leaves) and a double-precision one rounded once in optax (Python floats). Where the
# float32 product is exact (1.0 * 1.1, 0.5 * 2.0) every bit agrees; with 1.5 * 1.3 the scale,
# and so the noise, can differ in the last bit (the samples themselves are the same).
INEXACT_SCALE = {"dpsgd"}


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_parity_with_optax_bit_for_bit(name, jit):
    """Updates and states equal optax's for 4 steps, bit for bit, the PRNG key included
    (within 2 ulp of the noise where its scale rounds differently, see `INEXACT_SCALE`).

    Both sides run in the same mode (XLA fuses a jitted step differently from op-by-op
    execution, which moves the last bit)."""
    make, oracle = CASES[name]
    ours, theirs = make(), oracle()
    our_update = jax.jit(ours.update) if jit else ours.update
    their_update = jax.jit(theirs.update) if jit else theirs.update
    our_state, their_state = ours.init(PARAMS), theirs.init(PARAMS)
    our_params = their_params = PARAMS
    for step in range(4):
        grads = per_example_grads(step)
        updates, our_state = our_update(grads, our_state, our_params)
        their_updates, their_state = their_update(grads, their_state, their_params)
        assert jax.tree.structure(updates) == jax.tree.structure(their_updates)
        for a, b in zip(jax.tree.leaves(updates), jax.tree.leaves(their_updates)):
            assert a.dtype == b.dtype, f"step {step}"
            if name in INEXACT_SCALE:
                # 2 ulp of the noise (about 0.1 here), which may cancel the clipped sum.
                np.testing.assert_allclose(a, b, rtol=2.5e-7, atol=2e-8, err_msg=f"step {step}")
            else:
                assert np.array_equal(np.asarray(a), np.asarray(b)), f"step {step}"
        ours_flat, theirs_flat = jax.tree.leaves(our_state), jax.tree.leaves(their_state)
        assert len(ours_flat) == len(theirs_flat)
        for a, b in zip(ours_flat, theirs_flat):
            if jnp.issubdtype(a.dtype, jax.dtypes.prng_key):
                assert np.array_equal(key_data(a), key_data(b)), f"step {step}: the PRNG key differs"
            else:  # momentum traces (only in cases whose noise scale is exact)
                assert np.array_equal(np.asarray(a), np.asarray(b)), f"step {step}"
        our_params = modopt.apply_updates(our_params, updates)
        their_params = optax.apply_updates(their_params, their_updates)


def numpy_clipped_sum(grads, clip):
    """Each example's gradient scaled to global L2 norm at most `clip`, summed over examples."""
    names = sorted(grads)
    flat = np.concatenate([np.asarray(grads[n], np.float64).reshape(BATCH, -1) for n in names], axis=1)
    norms = np.linalg.norm(flat, axis=1)
    scale = np.minimum(1.0, clip / norms)
    return {n: np.tensordot(scale, np.asarray(grads[n], np.float64), axes=1) for n in names}


@pytest.mark.parametrize("clip", [0.5, 3.0, 100.0])
def test_clipping_against_numpy_without_noise(clip):
    """noise_multiplier=0: the clipped mean of the examples, exactly (float32 rounding)."""
    grads = per_example_grads(0)
    tx = differentially_private_aggregate(clip, 0.0, seed=0)
    updates, state = jax.jit(tx.update)(grads, tx.init(PARAMS), PARAMS)
    expected = numpy_clipped_sum(grads, clip)
    for name in expected:
        np.testing.assert_allclose(updates[name], expected[name] / BATCH, rtol=1e-6, atol=1e-7)
    assert isinstance(state, DifferentiallyPrivateAggregateState)
    # With a clip above every example's norm nothing is clipped: the plain mean.
    if clip == 100.0:
        for name in grads:
            np.testing.assert_allclose(updates[name], np.mean(np.asarray(grads[name]), axis=0), rtol=1e-6, atol=1e-7)


def test_noise_is_the_key_split_stream():
    """The noise is `C * sigma * normal(k_i) / B`, `k_i` split off the state's key as
    `next, k_1, ..., k_n = split(key, n + 1)` over the leaves in tree order."""
    grads = per_example_grads(1)
    clip, sigma = 1.5, 1.3
    noisy = differentially_private_aggregate(clip, sigma, seed=21)
    clean = differentially_private_aggregate(clip, 0.0, seed=21)
    state = noisy.init(PARAMS)
    with_noise, new_state = noisy.update(grads, state, PARAMS)
    without, _ = clean.update(grads, state, PARAMS)
    next_key, *keys = jax.random.split(jax.random.key(21), len(PARAMS) + 1)
    assert np.array_equal(key_data(new_state.rng_key), key_data(next_key))
    for name, k in zip(sorted(PARAMS), keys):
        noise = clip * sigma * np.asarray(jax.random.normal(k, PARAMS[name].shape)) / BATCH
        np.testing.assert_allclose(with_noise[name] - without[name], noise, rtol=1e-5, atol=1e-6)


def test_state_and_key_are_owned():
    """The state's key is a copy (both are donated) and the transform's key never advances."""
    tx = differentially_private_aggregate(1.0, 1.0, seed=5)
    state = tx.init(PARAMS)
    assert state.rng_key is not tx.key
    _, state = tx.update(per_example_grads(0), state, PARAMS)
    assert np.array_equal(key_data(tx.key), key_data(jax.random.key(5)))
    assert not np.array_equal(key_data(state.rng_key), key_data(tx.key))


# ---- hyperparameters and construction ---------------------------------------------------


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: differentially_private_aggregate(0.0, 1.0, seed=0), "Invalid l2_norm_clip: 0.0 (must be > 0)"),
        (lambda: differentially_private_aggregate(-1.0, 1.0, seed=0), "Invalid l2_norm_clip: -1.0 (must be > 0)"),
        (lambda: differentially_private_aggregate(1.0, -0.5, seed=0), "Invalid noise_multiplier: -0.5 (must be >= 0)"),
        (lambda: dpsgd(0.1, 0.0, 1.0, 0), "Invalid l2_norm_clip: 0.0 (must be > 0)"),
        (lambda: dpsgd(0.1, 1.0, -1.0, 0), "Invalid noise_multiplier: -1.0 (must be >= 0)"),
        (lambda: dpsgd(-0.1, 1.0, 1.0, 0), "Invalid learning_rate: -0.1"),
        (lambda: dpsgd(0.1, 1.0, 1.0, 0, momentum=1.5), "Invalid momentum: 1.5"),
    ],
)
def test_invalid_hyperparameters(make, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        make()


def test_seed_or_key_exactly_one():
    with pytest.raises(TypeError, match="needs the PRNG seed"):
        differentially_private_aggregate(1.0, 1.0)
    with pytest.raises(TypeError, match="needs the PRNG seed"):
        dpsgd(0.1, 1.0, 1.0)
    with pytest.raises(ValueError, match="either `key` or `seed`"):
        differentially_private_aggregate(1.0, 1.0, seed=0, key=jax.random.key(0))
    # A seed and the key made from it are the same configuration.
    assert np.array_equal(
        key_data(dpsgd(0.1, 1.0, 1.0, 4).key), key_data(dpsgd(0.1, 1.0, 1.0, key=jax.random.key(4)).key)
    )


def test_hyperparameters_are_leaves_and_readable():
    tx = dpsgd(0.25, 1.5, 1.3, 0)
    names = modopt.hyperparameters(tx)
    assert {"learning_rate", "l2_norm_clip", "noise_multiplier"} <= set(names)
    for name in ("learning_rate", "l2_norm_clip", "noise_multiplier"):
        assert isinstance(getattr(tx, name), jax.Array)
    assert tx.takes_per_example_updates()
    assert modopt.chain(differentially_private_aggregate(1.0, 1.0, seed=0), modopt.adam(1e-3)).takes_per_example_updates()
    assert not modopt.chain(modopt.scale(1.0), differentially_private_aggregate(1.0, 1.0, seed=0)).takes_per_example_updates()
    assert not modopt.sgd(0.1).takes_per_example_updates()


def test_update_without_the_batch_axis_names_the_path_and_shapes():
    tx = differentially_private_aggregate(1.0, 1.0, seed=0)
    state = tx.init(PARAMS)
    grads = per_example_grads(0)
    no_batch = {**grads, "w": grads["w"][0]}  # (3, 4), the parameter's own shape
    with pytest.raises(ValueError, match=r"update at \['w'\] has shape \(3, 4\) for a parameter of shape \(3, 4\)"):
        tx.update(no_batch, state, PARAMS)
    uneven = {**grads, "b": grads["b"][:2]}
    with pytest.raises(ValueError, match=r"batch size 5\); the leaf at \['b'\] has shape \(2, 4\)"):
        tx.update(uneven, state, PARAMS)
    with pytest.raises(ValueError, match=r"the leaf at \['s'\] has shape \(\)"):
        tx.update({**grads, "s": jnp.zeros(())}, state)  # no params: the batch axis is still checked


# ---- Optimizer.step in per-example mode --------------------------------------------------


def mlp():
    return eqx.nn.MLP(4, 3, 8, 1, key=jax.random.key(0))


def one_example_loss(model, x, y):
    return -jax.nn.log_softmax(model(x))[y]


def batch_data(batch=6):
    x = jax.random.normal(jax.random.key(1), (batch, 4))
    return x, jnp.arange(batch) % 3


@eqx.filter_jit
def per_example_grad(model, x, y):
    """The gradient of each example's loss: every leaf with the batch on axis 0."""
    return jax.vmap(eqx.filter_grad(one_example_loss), in_axes=(None, 0, 0))(model, x, y)


def test_optimizer_step_takes_per_example_gradients():
    """`Optimizer.step` with per-example gradients equals the pure `update` on the same
    gradients, and keeps the model's non-trainable leaves (its activation functions)."""
    model = mlp()
    x, y = batch_data()
    grads = per_example_grad(model, x, y)
    assert jax.tree.leaves(grads)[0].shape[0] == 6

    tx = dpsgd(0.1, 1.0, 1.1, 0, momentum=0.9)
    params, static = eqx.partition(model, eqx.is_inexact_array)
    state, update = tx.init(params), jax.jit(tx.update)
    expected = params
    for _ in range(3):
        updates, state = update(eqx.filter(grads, eqx.is_inexact_array), state, expected)
        expected = modopt.apply_updates(expected, updates)

    optimizer = modopt.Optimizer(dpsgd(0.1, 1.0, 1.1, 0, momentum=0.9), model)
    step = eqx.filter_jit(lambda m, o, g: o.step(m, g))
    for _ in range(3):
        model, optimizer = step(model, optimizer, grads)
    for a, b in zip(jax.tree.leaves(eqx.filter(model, eqx.is_inexact_array)), jax.tree.leaves(expected)):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    assert int(optimizer.count) == 3
    assert eqx.tree_equal(eqx.partition(model, eqx.is_inexact_array)[1], static)


def test_optimizer_chain_starting_with_the_aggregate_and_none_gradients():
    """A chain whose first transform is the aggregate takes per-example gradients; a `None`
    gradient leaves its parameter unchanged (the aggregate sees a batch of zeros there)."""
    model = mlp()
    x, y = batch_data()
    grads = per_example_grad(model, x, y)
    grads = eqx.tree_at(lambda g: g.layers[1].bias, grads, None, is_leaf=lambda v: v is None)
    tx = modopt.chain(differentially_private_aggregate(1.0, 0.5, seed=1), modopt.adam(1e-2))
    optimizer = modopt.Optimizer(tx, model)
    new_model, optimizer = eqx.filter_jit(lambda m, o, g: o.step(m, g))(model, optimizer, grads)
    assert np.array_equal(new_model.layers[1].bias, model.layers[1].bias)
    assert not np.array_equal(new_model.layers[0].weight, model.layers[0].weight)


def test_per_example_gradients_to_a_normal_optimizer_is_a_clear_error():
    model = mlp()
    grads = per_example_grad(model, *batch_data())
    optimizer = modopt.Optimizer(modopt.sgd(0.1), model)
    with pytest.raises(ValueError, match=r"has shape \(6, 8, 4\), but the parameter has shape \(8, 4\)\. It looks like per-example"):
        optimizer.step(model, grads)
    # The aggregate not first: the chain takes ordinary gradients, so the same error.
    late = modopt.Optimizer(modopt.chain(modopt.scale(1.0), differentially_private_aggregate(1.0, 1.0, seed=0)), model)
    with pytest.raises(ValueError, match="It looks like per-example gradients"):
        late.step(model, grads)


def test_ordinary_gradients_to_a_per_example_optimizer_is_a_clear_error():
    model = mlp()
    x, y = batch_data()
    grads = eqx.filter_grad(lambda m: jnp.mean(jax.vmap(one_example_loss, in_axes=(None, 0, 0))(m, x, y)))(model)
    optimizer = modopt.Optimizer(dpsgd(0.1, 1.0, 1.0, 0), model)
    with pytest.raises(
        ValueError,
        match=r"gradient at \.layers\[0\]\.weight has shape \(8, 4\), but this optimizer takes per-example gradients: "
        r"the parameter's shape \(8, 4\) after one leading batch axis, \(batch_size, 8, 4\)",
    ):
        optimizer.step(model, grads)
    per_example = per_example_grad(model, x, y)
    two_axes = jax.tree.map(lambda g: g[None], per_example)
    with pytest.raises(ValueError, match=r"has shape \(1, 6, 8, 4\), but this optimizer takes per-example"):
        optimizer.step(model, two_axes)
    uneven = eqx.tree_at(lambda g: g.layers[1].bias, per_example, per_example.layers[1].bias[:2])
    with pytest.raises(ValueError, match=r"disagree on the batch size: the gradient at \.layers\[1\]\.bias has shape \(2, 3\)"):
        optimizer.step(model, uneven)


def test_an_unreduced_update_is_a_clear_error():
    """A partition whose second group does not reduce the batch: the step refuses to broadcast."""
    params = {"a": jnp.ones(3), "b": jnp.ones(2)}
    tx = modopt.partition(
        {"dp": differentially_private_aggregate(1.0, 0.0, seed=0), "plain": modopt.scale(1.0)}, {"a": "dp", "b": "plain"}
    )
    optimizer = modopt.Optimizer(tx, params)
    grads = {"a": jnp.ones((4, 3)), "b": jnp.ones((4, 2))}
    with pytest.raises(ValueError, match=r"returned an update of shape \(4, 2\) at \['b'\] for a parameter of shape \(2,\)"):
        optimizer.step(params, grads)


def test_no_retrace_on_hyperparameter_change():
    model = mlp()
    batch = batch_data()
    traces = []

    @eqx.filter_jit
    def step(model, optimizer, batch):
        traces.append(1)
        return optimizer.step(model, per_example_grad(model, *batch))

    optimizer = modopt.Optimizer(dpsgd(0.1, 1.0, 1.1, 0, momentum=0.9), model)
    new_model, optimizer = step(model, optimizer, batch)
    for change in ({"noise_multiplier": 0.5}, {"l2_norm_clip": 2.0}, {"learning_rate": 0.05}, {"momentum": 0.5}):
        changed = optimizer.set(**change)
        (name, value), = change.items()
        assert float(changed.hyperparameters[name]) == pytest.approx(value)
        step(new_model, changed, batch)
    step(model, modopt.Optimizer(dpsgd(0.3, 2.0, 0.7, 5, momentum=0.1), model), batch)  # rebuilt, other numbers
    assert len(traces) == 1

    # The compiled step reads the multiplier from its leaf: at 0 the seed no longer matters.
    silent = modopt.Optimizer(dpsgd(0.1, 1.0, 0.0, 0, momentum=0.9), model)
    a, _ = step(model, silent, batch)
    b, _ = step(model, modopt.Optimizer(dpsgd(0.1, 1.0, 0.0, 99, momentum=0.9), model), batch)
    assert eqx.tree_equal(a, b)
    assert len(traces) == 1


def test_orbax_resume_is_bit_exact(tmp_path):
    """N steps straight equal k steps, save, restore into a fresh optimizer, N - k steps: the
    PRNG key in the state round-trips, so the noise continues the same stream."""
    from modopt.integrations.orbax import CheckpointManager

    batch = batch_data()
    step = eqx.filter_jit(lambda m, o, b: o.step(m, per_example_grad(m, *b)))
    model = mlp()
    optimizer = modopt.Optimizer(dpsgd(0.1, 1.0, 1.1, 2024, momentum=0.9), model)
    for i in range(4):
        model, optimizer = step(model, optimizer, batch)
        if i == 1:
            with CheckpointManager(tmp_path) as manager:
                manager.save(2, model=model, optimizer=optimizer)
    fresh_model = mlp()
    fresh = modopt.Optimizer(dpsgd(0.1, 1.0, 1.1, 0, momentum=0.9), fresh_model)  # another seed: restored over
    with CheckpointManager(tmp_path) as manager:
        restored = manager.restore(model=fresh_model, optimizer=fresh)
    resumed_model, resumed = restored["model"], restored["optimizer"]
    key = resumed.state[0].rng_key
    assert jnp.issubdtype(key.dtype, jax.dtypes.prng_key)
    for _ in range(2):
        resumed_model, resumed = step(resumed_model, resumed, batch)
    for a, b in zip(jax.tree.leaves((resumed_model, resumed)), jax.tree.leaves((model, optimizer))):
        if eqx.is_array(a) and jnp.issubdtype(a.dtype, jax.dtypes.prng_key):
            assert np.array_equal(key_data(a), key_data(b))
        elif eqx.is_array(a):
            assert np.array_equal(np.asarray(a), np.asarray(b))


# ---- training -----------------------------------------------------------------------------

# The DP-SGD example of optax's documentation (MNIST) trains with learning rate 0.25,
# l2_norm_clip 1.5 and noise_multiplier 1.3; here on digits, with the digits example's batch
# size, data and model.
DP_LEARNING_RATE, DP_L2_NORM_CLIP, DP_NOISE_MULTIPLIER, DP_EPOCHS = 0.25, 1.5, 1.3, 10


def test_dpsgd_trains_digits():
    x_train, y_train, x_test, y_test = load_data(0)
    model = eqx.nn.MLP(64, 10, width_size=128, depth=2, key=jax.random.key(0))
    tx = dpsgd(DP_LEARNING_RATE, DP_L2_NORM_CLIP, DP_NOISE_MULTIPLIER, seed=1337)
    optimizer = modopt.Optimizer(tx, model)
    example_grad = jax.vmap(eqx.filter_grad(lambda m, x, y: loss_fn(m, x[None], y[None])), in_axes=(None, 0, 0))

    @eqx.filter_jit(donate="all")
    def train_step(model, optimizer, x, y):
        return optimizer.step(model, example_grad(model, x, y))

    steps = len(x_train) // BATCH_SIZE
    for epoch in range(DP_EPOCHS):
        order = np.random.default_rng([0, epoch]).permutation(len(x_train))
        for i in range(steps):
            idx = order[i * BATCH_SIZE : (i + 1) * BATCH_SIZE]
            model, optimizer = train_step(model, optimizer, jnp.asarray(x_train[idx]), jnp.asarray(y_train[idx]))
    test_accuracy = float(accuracy(model, jnp.asarray(x_test), jnp.asarray(y_test)))
    print(f"DP-SGD test accuracy {test_accuracy:.2%}")
    assert test_accuracy > 0.85, f"DP-SGD test accuracy {test_accuracy:.1%}"
