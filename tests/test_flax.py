"""Flax adapters: the linen TrainState and the NNX optimizer against Flax's own with optax.

The sharded linen TrainState with logical axis rules is in `test_sharded.py`.
"""

from __future__ import annotations

import re
from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from flax.training import train_state as flax_train_state
from modopt.integrations.flax import NnxOptimizer, TrainState
from modopt.integrations.orbax import CheckpointManager
import pages
from testing_transforms import ScaleByValueFn

import modopt
from modopt import ExtraArg

X = jax.random.normal(jax.random.key(0), (16, 8))
Y = jnp.sin(X[:, :4])


class LinenMLP(nn.Module):
    @nn.compact
    def __call__(self, x):
        return nn.Dense(4)(nn.relu(nn.Dense(32)(x)))


class NnxMLP(nnx.Module):
    def __init__(self, rngs):
        self.hidden = nnx.Linear(8, 32, rngs=rngs)
        self.out = nnx.Linear(32, 4, rngs=rngs)

    def __call__(self, x):
        return self.out(nnx.relu(self.hidden(x)))


def linen_loss(params, apply_fn):
    return jnp.mean((apply_fn({"params": params}, X) - Y) ** 2)


def make_step(traces=None):
    @jax.jit
    def step(state):
        if traces is not None:
            traces.append(1)
        grads = jax.grad(linen_loss)(state.params, state.apply_fn)
        return state.apply_gradients(grads=grads)

    return step


def assert_trees_close(a, b, tolerance=1e-5):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=tolerance, atol=tolerance)


def test_linen_train_state_matches_flax_with_optax():
    model = LinenMLP()
    params = model.init(jax.random.key(1), X)["params"]
    ours = TrainState.create(apply_fn=model.apply, params=params, tx=modopt.adamw(1e-3, weight_decay=1e-2))
    theirs = flax_train_state.TrainState.create(
        apply_fn=model.apply, params=params, tx=optax.adamw(1e-3, weight_decay=1e-2)
    )
    step = make_step()
    for _ in range(50):
        ours, theirs = step(ours), step(theirs)
    assert int(ours.step) == int(theirs.step) == 50
    assert_trees_close(ours.params, theirs.params)
    assert_trees_close(ours.opt_state, theirs.opt_state)


def test_changing_the_learning_rate_does_not_retrace():
    model = LinenMLP()
    state = TrainState.create(apply_fn=model.apply, params=model.init(jax.random.key(1), X)["params"], tx=modopt.adam(1e-3))
    traces = []
    step = make_step(traces)
    state = step(state)
    for lr in (1e-4, 3e-4, 0.0):
        state = step(state.set(learning_rate=lr))
    assert len(traces) == 1
    assert float(state.hyperparameters["learning_rate"]) == 0.0


class ScaleByValueState(NamedTuple):
    last_value: jax.Array


class ScaleByValue(modopt.AbstractTransform):
    """Multiplies updates by the extra argument `value` (the loss), remembering it."""

    extra_args_spec = (ExtraArg("value", "the loss"),)

    def init(self, params):
        return ScaleByValueState(last_value=jnp.zeros([]))

    def update(self, updates, state, params=None, *, value, **extra_args):
        return jax.tree.map(lambda g: g * value, updates), ScaleByValueState(last_value=value)


def test_extra_arguments_reach_the_transform_and_fields_are_replaced():
    class StateWithStats(TrainState):
        batch_stats: dict

    params = {"w": jnp.ones(3)}
    tx = modopt.chain(ScaleByValue(), modopt.scale(-0.1))
    state = StateWithStats.create(apply_fn=None, params=params, tx=tx, batch_stats={"mean": jnp.zeros(3)})
    state = jax.jit(lambda s: s.apply_gradients(grads={"w": jnp.full(3, 2.0)}, value=jnp.array(0.5),
                                                batch_stats={"mean": jnp.ones(3)}))(state)
    np.testing.assert_allclose(state.params["w"], 1.0 - 0.1 * 2.0 * 0.5)
    assert float(state.opt_state[0].last_value) == 0.5
    np.testing.assert_array_equal(state.batch_stats["mean"], jnp.ones(3))
    assert isinstance(state, StateWithStats) and int(state.step) == 1


def test_train_state_resume_is_bit_exact(tmp_path):
    model = LinenMLP()
    make = lambda: TrainState.create(  # noqa: E731
        apply_fn=model.apply, params=model.init(jax.random.key(1), X)["params"],
        tx=modopt.chain(modopt.clip_by_global_norm(1.0), modopt.adamw(modopt.cosine_decay_schedule(1e-2, 20))),
    )
    step = make_step()
    state = make()
    for i in range(8):
        state = step(state)
        if i == 3:
            with CheckpointManager(tmp_path) as manager:
                manager.save(4, state=state)
    fresh = make()  # freshly created: `step` is the Python int 0, the hyperparameters are the code's
    with CheckpointManager(tmp_path) as manager:
        resumed = manager.restore(state=fresh)["state"]
    for _ in range(4):
        resumed = step(resumed)
    for a, b in zip(jax.tree.leaves(resumed), jax.tree.leaves(state), strict=True):
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes()


def test_nnx_optimizer_matches_nnx_optimizer_with_optax_and_set_does_not_retrace():
    ours_model, their_model = NnxMLP(nnx.Rngs(0)), NnxMLP(nnx.Rngs(0))
    ours = NnxOptimizer(ours_model, modopt.adamw(1e-3, weight_decay=1e-2), wrt=nnx.Param)
    theirs = nnx.Optimizer(their_model, optax.adamw(1e-3, weight_decay=1e-2), wrt=nnx.Param)
    traces = []

    @nnx.jit
    def step(model, optimizer):
        traces.append(1)
        grads = nnx.grad(lambda m: jnp.mean((m(X) - Y) ** 2))(model)
        optimizer.update(model, grads)

    for _ in range(50):
        step(ours_model, ours)
        step(their_model, theirs)
    assert_trees_close(nnx.state(ours_model, nnx.Param), nnx.state(their_model, nnx.Param))
    assert int(ours.step.get_value()) == 50

    before = len(traces)
    ours.set(learning_rate=0.0)
    frozen = jax.tree.map(np.asarray, nnx.state(ours_model, nnx.Param))
    step(ours_model, ours)
    assert len(traces) == before  # the new learning rate is state: no retrace
    # AdamW scales the whole step, weight decay included, by the learning rate: nothing moves.
    for a, b in zip(jax.tree.leaves(nnx.state(ours_model, nnx.Param)), jax.tree.leaves(frozen), strict=True):
        np.testing.assert_array_equal(np.asarray(a), b)


def test_readme_flax_example_runs(capsys):
    import re

    section = pages.section("docs/guides/checkpoints.md", "Flax")
    (code,) = re.findall(r"```python\n(.*?)```", section, re.S)
    exec(compile(code, "docs/guides/checkpoints.md", "exec"), {})
    assert "1e-04" in capsys.readouterr().out


def test_value_fn_takes_the_params_in_linen_and_the_model_in_nnx():
    params = {"w": jnp.arange(3.0)}
    loss = lambda p: jnp.sum(p["w"] ** 2)  # noqa: E731
    state = TrainState.create(apply_fn=None, params=params, tx=ScaleByValueFn())
    state = jax.jit(lambda s: s.apply_gradients(grads=jax.grad(loss)(s.params), value_fn=loss))(state)
    np.testing.assert_allclose(state.params["w"], params["w"] - loss(params) * 2 * params["w"])
    with pytest.raises(TypeError, match="TrainState.apply_gradients needs the extra argument `value_fn`"):
        state.apply_gradients(grads=params)
    with pytest.raises(TypeError, match="got the extra argument `valeu`"):
        state.apply_gradients(grads=params, value_fn=loss, valeu=1.0)

    model = nnx.Linear(3, 2, rngs=nnx.Rngs(0))
    x = jnp.ones((4, 3))
    model_loss = lambda m: jnp.mean(m(x) ** 2)  # noqa: E731
    before = jax.tree.map(jnp.copy, nnx.as_pure(nnx.state(model, nnx.Param)))
    expected_factor = model_loss(model)
    grads = nnx.grad(model_loss)(model)
    optimizer = NnxOptimizer(model, ScaleByValueFn(), wrt=nnx.Param)
    optimizer.update(model, grads, value_fn=model_loss)
    after = nnx.as_pure(nnx.state(model, nnx.Param))
    for a, b, g in zip(jax.tree.leaves(after), jax.tree.leaves(before), jax.tree.leaves(nnx.as_pure(nnx.state(grads, nnx.Param)))):
        np.testing.assert_allclose(a, b - expected_factor * g, rtol=1e-6)


def test_importing_without_flax_says_how_to_install(monkeypatch):
    import importlib
    import sys

    monkeypatch.setitem(sys.modules, "flax", None)  # as if flax were not installed
    monkeypatch.delitem(sys.modules, "modopt.integrations.flax")
    with pytest.raises(ImportError, match=re.escape("modopt.integrations.flax needs flax: pip install 'modopt[flax]'")):
        importlib.import_module("modopt.integrations.flax")


def test_unknown_apply_gradients_keyword_is_an_error():
    state = TrainState.create(apply_fn=None, params={"w": jnp.ones(3)}, tx=modopt.adam(1e-3))
    with pytest.raises(TypeError, match="got the extra argument `misspelled_field`, which no transform of Adam reads"):
        state.apply_gradients(grads={"w": jnp.ones(3)}, misspelled_field=3)


# ---- gradients and `wrt` checked before anything changes (the messages: test_bad_input.py) ----


def _linear_grads(model):
    return nnx.grad(lambda m: jnp.sum(m(jnp.ones(3)) ** 2))(model)


def test_train_state_rejects_a_batched_gradient_at_trace_time_with_the_state_donated():
    state = TrainState.create(apply_fn=None, params={"kernel": jnp.ones((3, 2)), "bias": jnp.zeros(2)}, tx=modopt.adam(1e-3))
    step = jax.jit(lambda s, g: s.apply_gradients(grads=g), donate_argnums=0)
    with pytest.raises(ValueError, match=re.escape("The gradient at ['kernel'] has shape (5, 3, 2), but the parameter has shape (3, 2).")):
        step(state, {"kernel": jnp.ones((5, 3, 2)), "bias": jnp.zeros(2)})
    # Raised while tracing: nothing was donated, and the same state still steps.
    assert not state.params["kernel"].is_deleted() and state.params["kernel"].shape == (3, 2)
    new = step(state, {"kernel": jnp.ones((3, 2)), "bias": jnp.zeros(2)})
    assert new.params["kernel"].shape == (3, 2) and int(new.step) == 1


def test_nnx_update_rejects_a_batched_gradient_under_nnx_jit_and_changes_nothing():
    model = nnx.Linear(3, 2, rngs=nnx.Rngs(0))
    optimizer = NnxOptimizer(model, modopt.adam(1e-3))
    grads = _linear_grads(model)
    before = jax.tree.map(np.asarray, nnx.as_pure(nnx.state((model, optimizer))))
    step = nnx.jit(lambda m, o, g: o.update(m, g))
    batched = jax.tree.map(lambda g: jnp.stack([g] * 5), nnx.state(grads))
    batched["bias"] = grads["bias"]  # only the kernel is wrong
    with pytest.raises(ValueError, match=re.escape("The gradient at ['kernel'] has shape (5, 3, 2), but the parameter has shape (3, 2).")):
        step(model, optimizer, batched)
    after = jax.tree.map(np.asarray, nnx.as_pure(nnx.state((model, optimizer))))
    for a, b in zip(jax.tree.leaves(after), jax.tree.leaves(before), strict=True):
        np.testing.assert_array_equal(a, b)
    step(model, optimizer, grads)
    assert model.kernel.get_value().shape == (3, 2) and int(optimizer.step.get_value()) == 1


def test_nnx_wrt_selecting_no_floating_variable_is_an_error_naming_what_the_model_holds():
    class Net(nnx.Module):
        def __init__(self, rngs):
            self.linear = nnx.Linear(3, 2, rngs=rngs)
            self.rngs = rngs

    net = Net(nnx.Rngs(0))
    for wrt, name in [(None, "None"), (nnx.BatchStat, "nnx.BatchStat"), (nnx.RngState, "nnx.RngState")]:
        with pytest.raises(ValueError) as error:
            NnxOptimizer(net, modopt.adam(1e-3), wrt=wrt)
        assert str(error.value).startswith(f"NnxOptimizer: wrt={name} selects no floating-point variable of the model (Net)")
        assert "The model holds 2 Param (['linear']['bias'] (float32), ['linear']['kernel'] (float32)); 1 RngCount" in str(error.value)
    # BatchStat variables are floating: selecting them is allowed.
    NnxOptimizer(nnx.BatchNorm(2, rngs=nnx.Rngs(0)), modopt.sgd(0.1), wrt=nnx.BatchStat)


def test_nnx_wrt_filter_trains_exactly_what_it_selects():
    model = nnx.Linear(3, 2, rngs=nnx.Rngs(0))
    kernel, bias = np.asarray(model.kernel.get_value()), np.asarray(model.bias.get_value())
    optimizer = NnxOptimizer(model, modopt.sgd(0.1), wrt=nnx.All(nnx.Param, nnx.PathContains("kernel")))
    # The default `nnx.grad` also differentiates the bias: that gradient is left out, as in Flax.
    optimizer.update(model, _linear_grads(model))
    # d/dK sum((x K + b)^2) = 2 x^T (x K + b), with x = ones(3).
    expected = kernel - 0.1 * 2 * np.outer(np.ones(3), np.ones(3) @ kernel + bias)
    np.testing.assert_allclose(model.kernel.get_value(), expected, rtol=1e-6)
    np.testing.assert_array_equal(model.bias.get_value(), bias)



def test_nnx_integer_variables_that_wrt_selects_are_never_updated():
    """As in `modopt.Optimizer`: a `wrt` selecting an integer variable trains only the floating
    ones; the integer one gets no state and keeps its value."""

    class Count(nnx.Variable):
        pass

    class Net(nnx.Module):
        def __init__(self):
            self.linear = nnx.Linear(3, 2, rngs=nnx.Rngs(0))
            self.seen = Count(jnp.array(7, jnp.int32))

    net = Net()
    optimizer = NnxOptimizer(net, modopt.sgd(0.1), wrt=nnx.Any(nnx.Param, Count))
    assert len(jax.tree.leaves(nnx.as_pure(optimizer.opt_state))) == 0  # plain SGD: no state at all
    kernel = np.asarray(net.linear.kernel.get_value())
    grads = nnx.grad(lambda n: jnp.sum(n.linear(jnp.ones(3)) ** 2))(net)
    optimizer.update(net, grads)
    np.testing.assert_allclose(net.linear.kernel.get_value(), kernel - 0.1 * np.asarray(grads.linear.kernel.get_value()), rtol=1e-6)
    assert int(net.seen.get_value()) == 7

def test_nnx_update_takes_the_pure_state_of_the_gradients_as_it_is():
    model = nnx.Linear(3, 2, rngs=nnx.Rngs(0))
    before = jax.tree.map(np.asarray, nnx.as_pure(nnx.state(model, nnx.Param)))
    grads = nnx.as_pure(_linear_grads(model))  # plain arrays: no variable type for `wrt` to filter by
    NnxOptimizer(model, modopt.sgd(0.1)).update(model, grads)
    for name in ("kernel", "bias"):
        np.testing.assert_allclose(getattr(model, name).get_value(), before[name] - 0.1 * np.asarray(grads[name]), rtol=1e-6)


def test_per_example_gradients_reach_dpsgd_through_both_adapters():
    """With no noise and a clip no example reaches, DP-SGD is SGD on the mean gradient."""
    tx = modopt.dpsgd(0.1, l2_norm_clip=1e6, noise_multiplier=0.0, seed=0)
    per_example = jax.random.normal(jax.random.key(3), (4, 3))
    state = TrainState.create(apply_fn=None, params={"w": jnp.arange(3.0)}, tx=tx)
    state = jax.jit(lambda s, g: s.apply_gradients(grads=g))(state, {"w": per_example})
    np.testing.assert_allclose(state.params["w"], np.arange(3.0) - 0.1 * np.mean(per_example, 0), rtol=1e-6)
    with pytest.raises(ValueError, match=re.escape("Compute them with `jax.vmap(jax.grad(loss), in_axes=(None, 0, 0))(state.params, x, y)`")):
        state.apply_gradients(grads={"w": per_example[0]})

    model = nnx.Linear(3, 2, rngs=nnx.Rngs(0))
    optimizer = NnxOptimizer(model, tx)
    before = jax.tree.map(np.asarray, nnx.as_pure(nnx.state(model, nnx.Param)))

    @nnx.jit
    def step(model, optimizer, x):
        grads = nnx.vmap(nnx.grad(lambda m, xi: jnp.sum(m(xi) ** 2)), in_axes=(None, 0))(model, x)
        optimizer.update(model, grads)
        return nnx.as_pure(nnx.state(grads, nnx.Param))

    grads = step(model, optimizer, jax.random.normal(jax.random.key(4), (4, 3)))
    for name in ("kernel", "bias"):
        expected = before[name] - 0.1 * np.mean(grads[name], 0)
        np.testing.assert_allclose(getattr(model, name).get_value(), expected, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match=re.escape("Compute them with `nnx.vmap(nnx.grad(loss), in_axes=(None, 0))(model, x)`")):
        optimizer.update(model, jax.tree.map(lambda g: g[0], grads))


def test_nnx_mask_built_from_the_pure_state_selects_by_path():
    model = nnx.Linear(3, 2, rngs=nnx.Rngs(0))
    model.bias.set_value(jnp.ones(2))
    kernel = np.asarray(model.kernel.get_value())
    mask = jax.tree.map(lambda p: p.ndim > 1, nnx.as_pure(nnx.state(model, nnx.Param)))
    optimizer = NnxOptimizer(model, modopt.chain(modopt.masked(modopt.add_decayed_weights(0.5), mask), modopt.sgd(0.1)))
    optimizer.update(model, jax.tree.map(jnp.zeros_like, nnx.state(model, nnx.Param)))
    np.testing.assert_allclose(model.kernel.get_value(), kernel * (1 - 0.1 * 0.5), rtol=1e-6)  # decayed
    np.testing.assert_array_equal(model.bias.get_value(), np.ones(2))  # masked out
