"""The wrappers beyond the registry's shared checks: MultiSteps against an independent mean of
gradients, apply_if_finite's skipping and giving up, lookahead against optax (its params are
`LookaheadParams`, not the registry's dict), learning rates reported through wrappers,
`Optimizer.step` with wrappers and extra arguments, and bad input."""

from __future__ import annotations

import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P
from testing_transforms import ScaleByValueFn

import modopt

SHAPES = {"w": (3, 4), "b": (4,), "s": ()}


def make_params(seed=0):
    keys = jax.random.split(jax.random.key(seed), len(SHAPES))
    return {name: jax.random.normal(k, shape) for k, (name, shape) in zip(keys, SHAPES.items())}


def make_grads(step):
    return make_params(1000 + step)


def loss(params):
    return sum(jnp.sum((x - 1.0) ** 2) for x in jax.tree.leaves(params))


def assert_trees_close(ours, theirs, rtol=1e-6, atol=1e-6):
    our_flat = jax.tree_util.tree_flatten_with_path(ours)[0]
    their_flat = jax.tree_util.tree_flatten_with_path(theirs)[0]
    assert [jax.tree_util.keystr(p) for p, _ in our_flat] == [jax.tree_util.keystr(p) for p, _ in their_flat]
    for (path, a), (_, b) in zip(our_flat, their_flat):
        assert jnp.result_type(a) == jnp.result_type(b), jax.tree_util.keystr(path)
        np.testing.assert_allclose(
            np.asarray(a, np.float64),
            np.asarray(b, np.float64),
            rtol=rtol,
            atol=atol,
            err_msg=jax.tree_util.keystr(path),
        )


# --- MultiSteps -----------------------------------------------------------------------------------


@pytest.mark.parametrize("use_grad_mean", [True, False], ids=["mean", "sum"])
@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_multi_steps_is_one_inner_step_on_the_mean_of_k_gradients(use_grad_mean, jit):
    """Every k-th mini-step gives the inner optimizer's update of the mean (or sum) of the
    window's gradients, computed here in NumPy; the others give zeros and keep its state."""
    k, windows = 3, 2
    inner = modopt.adam(0.1)
    tx = modopt.MultiSteps(inner, k, use_grad_mean=use_grad_mean)
    update = jax.jit(tx.update) if jit else tx.update
    params = make_params()
    state = tx.init(params)
    inner_state = inner.init(params)
    for window in range(windows):
        grads = [make_grads(window * k + i) for i in range(k)]
        for i, g in enumerate(grads):
            updates, state = update(g, state, params)
            assert bool(tx.has_updated(state)) == (i == k - 1)
            if i < k - 1:
                assert all(not np.any(np.asarray(u)) for u in jax.tree.leaves(updates))
                assert_trees_close(state.inner_opt_state, inner_state)
        stacked = {name: np.stack([np.asarray(g[name], np.float64) for g in grads]) for name in SHAPES}
        combined = {
            name: (v.mean(0) if use_grad_mean else v.sum(0)).astype(np.float32) for name, v in stacked.items()
        }
        expected, inner_state = inner.update(jax.tree.map(jnp.asarray, combined), inner_state, params)
        assert_trees_close(updates, expected)
        assert_trees_close(state.inner_opt_state, inner_state)
        assert int(state.gradient_step) == window + 1 and int(state.mini_step) == 0
        params = modopt.apply_updates(params, updates)


def test_multi_steps_schedule_of_k_and_optax_protocol():
    """A schedule of the gradient step sets k; `gradient_transformation()` and `inner_opt` work as in optax."""
    k_of = modopt.piecewise_constant_schedule(2, {1: 2})  # 2 mini-steps, then 4
    tx = modopt.MultiSteps(modopt.sgd(0.1), k_of)
    assert tx.gradient_transformation() is tx and tx.inner_opt is tx.inner
    params = make_params()
    state = tx.init(params)
    emitted = []
    for step in range(6):
        _, state = jax.jit(tx.update)(make_grads(step), state, params)
        emitted.append(bool(tx.has_updated(state)))
    assert emitted == [False, True, False, False, False, True]
    chained = optax.chain(optax.clip(1.0), tx)  # optax accepts it as a transform
    chained.update(make_grads(0), chained.init(params), params)


def test_multi_steps_should_skip_update_fn_must_return_a_boolean_scalar():
    tx = modopt.MultiSteps(modopt.sgd(0.1), 2, should_skip_update_fn=lambda u, s, p: (jnp.zeros(()), ()))
    params = make_params()
    with pytest.raises(ValueError, match="boolean scalar"):
        tx.update(make_grads(0), tx.init(params), params)


def test_skip_functions_match_optax():
    grads = make_grads(0)
    grads["b"] = grads["b"].at[1].set(jnp.inf).at[2].set(jnp.nan)
    for ours, theirs in [
        (modopt.skip_not_finite, optax.skip_not_finite),
        (
            functools.partial(modopt.skip_large_updates, max_squared_norm=10.0),
            functools.partial(optax.skip_large_updates, max_squared_norm=10.0),
        ),
    ]:
        for g in (grads, make_grads(1)):
            skip, info = ours(g, jnp.zeros([], jnp.int32), None)
            their_skip, their_info = theirs(g, jnp.zeros([], jnp.int32), None)
            assert bool(skip) == bool(their_skip)
            assert_trees_close(info, their_info)


# --- apply_if_finite ------------------------------------------------------------------------------


def _with_nan(grads):
    return {**grads, "b": grads["b"].at[0].set(jnp.nan)}


def test_apply_if_finite_skips_and_counts_a_nan_step():
    inner = modopt.adam(0.1)
    tx = modopt.apply_if_finite(inner, max_consecutive_errors=3)
    params = make_params()
    state = tx.init(params)
    updates, state = jax.jit(tx.update)(make_grads(0), state, params)
    before = state.inner_state
    updates, state = jax.jit(tx.update)(_with_nan(make_grads(1)), state, params)
    assert all(not np.any(np.asarray(u)) for u in jax.tree.leaves(updates))
    assert_trees_close(state.inner_state, before)
    assert (int(state.notfinite_count), bool(state.last_finite), int(state.total_notfinite)) == (1, False, 1)
    updates, state = jax.jit(tx.update)(make_grads(2), state, params)
    assert (int(state.notfinite_count), bool(state.last_finite), int(state.total_notfinite)) == (0, True, 1)
    # The inner optimizer took its second step, as if the NaN step never happened.
    _, expected = inner.update(make_grads(0), inner.init(params), params)
    expected_updates, expected = inner.update(make_grads(2), expected, params)
    assert_trees_close(updates, expected_updates)
    assert_trees_close(state.inner_state, expected)


def test_apply_if_finite_gives_up_after_max_consecutive_errors_as_optax_does():
    ours = modopt.apply_if_finite(modopt.sgd(0.1, momentum=0.9), max_consecutive_errors=2)
    theirs = optax.apply_if_finite(optax.sgd(0.1, momentum=0.9), max_consecutive_errors=2)
    params = make_params()
    state, their_state = ours.init(params), theirs.init(params)
    let_through = []
    for step in range(5):
        grads = make_grads(step) if step == 0 else _with_nan(make_grads(step))
        updates, state = jax.jit(ours.update)(grads, state, params)
        their_updates, their_state = theirs.update(grads, their_state, params)
        assert_trees_close(updates, their_updates)
        assert_trees_close(state, their_state)
        let_through.append(bool(np.isnan(np.asarray(updates["b"])).any()))
    assert let_through == [False, False, False, True, True]  # errors 1 and 2 dropped, then given up
    assert int(state.total_notfinite) == 4


# --- lookahead ------------------------------------------------------------------------------------


@pytest.mark.parametrize("reset_state", [False, True], ids=["keep", "reset"])
@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_lookahead_matches_optax(reset_state, jit):
    ours = modopt.lookahead(modopt.adam(0.05), sync_period=3, slow_step_size=0.5, reset_state=reset_state)
    theirs = optax.lookahead(optax.adam(0.05), sync_period=3, slow_step_size=0.5, reset_state=reset_state)
    params = modopt.LookaheadParams.init_synced(make_params())
    their_params = optax.LookaheadParams.init_synced(make_params())
    update = jax.jit(ours.update) if jit else ours.update
    state, their_state = ours.init(params), theirs.init(their_params)
    assert type(state).__name__ == "LookaheadState" and state._fields == their_state._fields
    assert_trees_close(state, their_state)
    for step in range(7):
        grads = jax.grad(loss)(params.fast)
        updates, state = update(grads, state, params)
        their_updates, their_state = theirs.update(
            jax.grad(loss)(their_params.fast), their_state, their_params
        )
        assert_trees_close(tuple(updates), tuple(their_updates))
        assert_trees_close(state, their_state)
        params = modopt.apply_updates(params, updates)
        their_params = optax.apply_updates(their_params, their_updates)
    assert_trees_close(tuple(params), tuple(their_params))


def test_lookahead_synchronizes_every_sync_period_steps():
    tx = modopt.lookahead(modopt.sgd(0.1), sync_period=2, slow_step_size=0.5)
    params = modopt.LookaheadParams.init_synced(make_params())
    assert all(a is not b for a, b in zip(jax.tree.leaves(params.fast), jax.tree.leaves(params.slow)))
    state = tx.init(params.fast)  # the fast parameters alone are accepted, as in optax
    fast_before = params.fast
    for step in range(2):
        updates, state = tx.update(jax.grad(loss)(params.fast), state, params)
        params = modopt.apply_updates(params, updates)
        if step == 0:
            assert_trees_close(params.slow, fast_before)  # slow waits
    assert_trees_close(params.fast, params.slow)  # synchronized


def test_lookahead_in_an_optimizer_with_model_shaped_gradients_and_extra_arguments():
    """`Optimizer.step` on a `LookaheadParams` model: gradients of a loss of `model.fast` have
    zeros at `slow`; the fast optimizer gets the extra argument (a function of the params)."""
    tx = modopt.lookahead(ScaleByValueFn(), sync_period=2, slow_step_size=0.5)
    model = modopt.LookaheadParams.init_synced(make_params())
    optimizer = modopt.Optimizer(tx, model)
    start = loss(model.fast)
    value_fn = lambda m: 0.1 * loss(m.fast) / start
    step = eqx.filter_jit(lambda m, o: o.step(m, jax.grad(lambda m: loss(m.fast))(m), value_fn=value_fn))
    reference, ref_state = model, tx.init(model)
    for _ in range(3):
        model, optimizer = step(model, optimizer)
        updates, ref_state = tx.update(
            jax.grad(loss)(reference.fast), ref_state, reference, value_fn=value_fn
        )
        reference = modopt.apply_updates(reference, updates)
        # By hand: the fast optimizer's step is -value_fn * g, at the fast parameters.
    assert_trees_close(tuple(model), tuple(reference))
    assert loss(model.fast) < start


def test_lookahead_needs_lookahead_params():
    tx = modopt.lookahead(modopt.sgd(0.1), 2, 0.5)
    params = make_params()
    with pytest.raises(TypeError, match="LookaheadParams"):
        tx.update(make_grads(0), tx.init(params), params)
    with pytest.raises(ValueError, match="needs the current parameters"):
        tx.update(make_grads(0), tx.init(params))


def test_lookahead_hyperparameters_change_without_retrace():
    traces = []

    @jax.jit
    def update(tx, grads, state, params):
        traces.append(None)
        return tx.update(grads, state, params)

    params = modopt.LookaheadParams.init_synced(make_params())
    tx = modopt.lookahead(modopt.sgd(0.1), 2, 0.5)
    state = tx.init(params)
    _, state = update(tx, make_grads(0), state, params)
    _, state = update(
        modopt.set_hyperparameters(tx, sync_period=3, slow_step_size=0.25), make_grads(1), state, params
    )
    assert len(traces) == 1


def test_lookahead_state_follows_the_fast_parameters():
    abstract = {"w": jax.ShapeDtypeStruct((4, 8), jnp.float32)}
    params = modopt.LookaheadParams(fast=abstract, slow=abstract)
    specs = modopt.LookaheadParams(fast={"w": P(None, "model")}, slow={"w": P(None, "model")})
    tx = modopt.lookahead(modopt.adafactor(0.1, min_dim_size_to_factor=2), 2, 0.5)
    placed = tx.state_specs(params, specs)
    assert placed.steps_since_sync == P()
    assert placed.fast_state == modopt.adafactor(0.1, min_dim_size_to_factor=2).state_specs(
        params.fast, specs.fast
    )


# --- learning rates through wrappers --------------------------------------------------------------


def _schedule():
    return modopt.linear_schedule(1.0, 0.0, 10)


def _run(tx, steps, grads_at=make_grads):
    params = make_params()
    optimizer = modopt.Optimizer(tx, params)
    step = eqx.filter_jit(lambda p, o, g: o.step(p, g))
    for i in range(steps):
        params, optimizer = step(params, optimizer, grads_at(i))
    return optimizer


def test_multi_steps_reports_the_inner_optimizers_learning_rate():
    optimizer = _run(modopt.MultiSteps(modopt.adam(_schedule()), 4), 5)
    assert float(optimizer.learning_rate) == pytest.approx(float(_schedule()(1)))  # inner count 1, not 5
    assert float(optimizer.learning_rate) == pytest.approx(0.9)


def test_apply_if_finite_reports_the_rate_of_the_steps_really_taken():
    grads_at = lambda i: _with_nan(make_grads(i)) if i in (1, 2) else make_grads(i)
    optimizer = _run(modopt.apply_if_finite(modopt.sgd(_schedule()), 5), 4, grads_at)
    assert float(optimizer.learning_rate) == pytest.approx(float(_schedule()(2)))


@pytest.mark.parametrize(
    "wrap", [modopt.conditionally_mask, modopt.conditionally_transform, modopt.maybe_update]
)
def test_conditional_wrappers_report_the_inner_rate(wrap):
    optimizer = _run(wrap(modopt.sgd(_schedule()), lambda step: step % 2 == 0), 5)  # inner ran at 0, 2, 4
    assert float(optimizer.learning_rate) == pytest.approx(float(_schedule()(3)))


def test_lookahead_reports_the_fast_optimizers_rate():
    tx = modopt.lookahead(modopt.sgd(_schedule()), 2, 0.5)
    model = modopt.LookaheadParams.init_synced(make_params())
    optimizer = modopt.Optimizer(tx, model)
    for _ in range(3):
        model, optimizer = optimizer.step(model, jax.grad(lambda m: loss(m.fast))(model))
    assert float(optimizer.learning_rate) == pytest.approx(float(_schedule()(3)))


# --- Optimizer.step with wrappers and extra arguments ---------------------------------------------


@pytest.mark.parametrize(
    "wrap",
    [
        lambda tx: modopt.MultiSteps(tx, 2),
        lambda tx: modopt.apply_if_finite(tx, 2),
        lambda tx: modopt.conditionally_mask(tx, lambda step: step % 2 == 0),
        lambda tx: modopt.conditionally_transform(tx, lambda step: step >= 1),
    ],
    ids=["multi_steps", "apply_if_finite", "conditionally_mask", "conditionally_transform"],
)
def test_optimizer_step_passes_extra_arguments_through_wrappers(wrap):
    """A function of the model reaches the wrapped transform, as in direct calls of `update`;
    leaving it out is a clear error."""
    tx = wrap(ScaleByValueFn())
    model = make_params()
    optimizer = modopt.Optimizer(tx, model)
    value_fn = lambda m: loss(m) / 100.0
    step = eqx.filter_jit(lambda m, o: o.step(m, jax.grad(loss)(m), value_fn=value_fn))
    reference, state = model, tx.init(model)
    for _ in range(4):
        model, optimizer = step(model, optimizer)
        updates, state = tx.update(jax.grad(loss)(reference), state, reference, value_fn=value_fn)
        reference = modopt.apply_updates(reference, updates)
    assert_trees_close(model, reference)
    assert not np.allclose(np.asarray(model["w"]), np.asarray(make_params()["w"]))
    with pytest.raises(TypeError, match="value_fn"):
        optimizer.step(model, jax.grad(loss)(model))


def test_condition_reads_forwarded_extra_arguments():
    calls = []

    def above(step, value):
        calls.append(value)
        return value > 5.0

    tx = modopt.conditionally_mask(modopt.polyak_sgd(), above, forward_extra_args=True)
    params = make_params()
    state = tx.init(params)
    updates, state = tx.update(make_grads(0), state, params, value=jnp.asarray(1.0))
    assert calls and all(not np.any(np.asarray(u)) for u in jax.tree.leaves(updates))
    updates, state = tx.update(make_grads(0), state, params, value=jnp.asarray(10.0))
    assert any(np.any(np.asarray(u)) for u in jax.tree.leaves(updates))


def test_maybe_update_is_conditionally_transform():
    tx = modopt.maybe_update(modopt.scale(2.0), lambda step: step == 1)
    assert isinstance(tx, modopt.ConditionallyTransform)
    params = make_params()
    state = tx.init(params)
    assert isinstance(state, modopt.ConditionallyTransformState)
    grads = make_grads(0)
    first, state = tx.update(grads, state, params)
    second, state = tx.update(grads, state, params)
    assert_trees_close(first, grads)
    assert_trees_close(second, jax.tree.map(lambda g: 2 * g, grads))


def test_apply_every_sums_and_emits_every_k_steps():
    tx = modopt.apply_every(3)
    params = make_params()
    state = tx.init(params)
    total = jax.tree.map(jnp.zeros_like, params)
    for step in range(6):
        grads = make_grads(step)
        total = jax.tree.map(jnp.add, total, grads)
        updates, state = jax.jit(tx.update)(grads, state, params)
        if step % 3 == 2:
            assert_trees_close(updates, total, rtol=1e-6)
            total = jax.tree.map(jnp.zeros_like, params)
        else:
            assert all(not np.any(np.asarray(u)) for u in jax.tree.leaves(updates))


# --- bad input ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "make, message",
    [
        (
            lambda: modopt.MultiSteps(modopt.sgd(0.1), 0),
            "Invalid every_k_schedule: 0 (must be an integer >= 1) in MultiSteps.",
        ),
        (
            lambda: modopt.MultiSteps(modopt.sgd(0.1), 2.5),
            "Invalid every_k_schedule: 2.5 (must be an integer >= 1) in MultiSteps.",
        ),
        (lambda: modopt.apply_every(0), "Invalid k: 0 (must be an integer >= 1) in ApplyEveryK."),
        (
            lambda: modopt.apply_if_finite(modopt.sgd(0.1), -1),
            "Invalid max_consecutive_errors: -1 (must be an integer >= 0) in ApplyIfFinite.",
        ),
        (
            lambda: modopt.lookahead(modopt.sgd(0.1), 0, 0.5),
            "Invalid sync_period: 0 (must be an integer >= 1) in Lookahead.",
        ),
        (
            lambda: modopt.lookahead(modopt.sgd(0.1), 2, 1.5),
            "Invalid slow_step_size: 1.5 (must be in [0, 1]) in Lookahead.",
        ),
    ],
)
def test_invalid_hyperparameters(make, message):
    with pytest.raises(ValueError, match=__import__("re").escape(message)):
        make()


def test_a_wrapper_takes_an_optax_transform():
    tx = modopt.apply_if_finite(optax.sgd(0.1), 2)
    params = make_params()
    updates, _ = tx.update(make_grads(0), tx.init(params), params)
    assert_trees_close(updates, jax.tree.map(lambda g: -0.1 * g, make_grads(0)))


def test_skipped_steps_are_reported():
    """`skipped_last_step` (read by `with_diagnostics`): dropped non-finite steps, and the
    mini-steps MultiSteps holds back or rejects."""
    params = make_params()
    finite = modopt.apply_if_finite(modopt.sgd(0.1), 1)
    state = finite.init(params)
    seen = []
    for grads in (make_grads(0), _with_nan(make_grads(1)), _with_nan(make_grads(2)), make_grads(3)):
        _, state = finite.update(grads, state, params)
        seen.append(bool(finite.skipped_last_step(state)))
    assert seen == [False, True, False, False]  # the second NaN in a row is let through
    multi = modopt.MultiSteps(modopt.sgd(0.1), 2, should_skip_update_fn=modopt.skip_not_finite)
    state = multi.init(params)
    seen = []
    for grads in (make_grads(0), make_grads(1), _with_nan(make_grads(2)), make_grads(3), make_grads(4)):
        _, state = multi.update(grads, state, params)
        seen.append(bool(multi.skipped_last_step(state)))
    assert seen == [True, False, True, True, False]


def test_diagnostics_count_the_steps_apply_if_finite_skips():
    """`Optimizer.diagnostics` behind `apply_if_finite`: a NaN step is counted as skipped and
    changes nothing; on a taken SGD step the effective learning rate is the learning rate."""
    params = make_params()
    optimizer = modopt.Optimizer(modopt.with_diagnostics(modopt.apply_if_finite(modopt.sgd(0.1), 5)), params)
    step = eqx.filter_jit(lambda optimizer, params, grads: optimizer.step(params, grads))
    params, optimizer = step(optimizer, params, make_grads(0))
    before = params
    params, optimizer = step(optimizer, params, _with_nan(make_grads(1)))
    assert_trees_close(params, before, rtol=0, atol=0)
    seen = optimizer.diagnostics
    assert (int(seen["steps"]), int(seen["skipped_steps"])) == (2, 1)
    assert np.isnan(float(seen["grad_norm"])) and float(seen["update_norm"]) == 0.0
    params, optimizer = step(optimizer, params, make_grads(2))
    seen = optimizer.diagnostics
    grad_norm = np.sqrt(sum(np.sum(np.asarray(g, np.float64) ** 2) for g in jax.tree.leaves(make_grads(2))))
    assert (int(seen["steps"]), int(seen["skipped_steps"])) == (3, 1)
    np.testing.assert_allclose(float(seen["grad_norm"]), grad_norm, rtol=1e-6)
    np.testing.assert_allclose(float(seen["learning_rate"]), 0.1, rtol=1e-7)
    np.testing.assert_allclose(float(seen["effective_learning_rate"]), 0.1, rtol=1e-6)
