"""contrib's learning-rate-free and schedule-free optimizers: what the registry does not cover.

The registry (`registry/contrib_parameter_free.py`) runs schedule_free, prodigy, dadapt_adamw,
momo and momo_adam through the shared checks. Here, each against optax 0.2.8:
`schedule_free_eval_params` after some steps (pure API and `modopt.Optimizer`), the wrapper
around Adam and SGD with schedules and `state_dtype`, schedules and weight decay in the others;
and bad hyperparameters, missing arguments and complex parameters.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import modopt
from modopt.contrib import (
    DAdaptAdamWState,
    MomoAdamState,
    MomoState,
    ProdigyState,
    ScheduleFreeState,
    dadapt_adamw,
    momo,
    momo_adam,
    prodigy,
    schedule_free,
    schedule_free_adamw,
    schedule_free_eval_params,
    schedule_free_sgd,
)

STEPS = 4


def make_params(dtype=jnp.float32):
    k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
    return {
        "w": jax.random.normal(k1, (4, 3), dtype),
        "b": jax.random.normal(k2, (3,), dtype),
        "s": jax.random.normal(k3, (), dtype),
    }


def loss(params):
    return sum(0.5 * jnp.sum((x.astype(jnp.float32) - 1.0) ** 2) for x in jax.tree.leaves(params))


def grads_at(step, params):
    leaves, treedef = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.fold_in(jax.random.key(3), step), len(leaves))
    return treedef.unflatten([jax.random.normal(k, x.shape).astype(x.dtype) for k, x in zip(keys, leaves)])


def assert_trees_close(ours, theirs, what, tolerance=1e-6):
    """Same paths, shapes and dtypes; values close."""
    our_flat = jax.tree_util.tree_flatten_with_path(ours)[0]
    their_flat = jax.tree_util.tree_flatten_with_path(theirs)[0]
    our_paths = [jax.tree_util.keystr(p) for p, _ in our_flat]
    assert our_paths == [jax.tree_util.keystr(p) for p, _ in their_flat], f"{what}: structure differs"
    for path, (_, a), (_, b) in zip(our_paths, our_flat, their_flat):
        assert jnp.shape(a) == jnp.shape(b), f"{what} at {path}: shape"
        assert jnp.result_type(a) == jnp.result_type(b), f"{what} at {path}: {jnp.result_type(a)} vs {jnp.result_type(b)}"
        np.testing.assert_allclose(
            np.asarray(a, np.float64), np.asarray(b, np.float64), rtol=tolerance, atol=tolerance, err_msg=f"{what} at {path}"
        )


def run_parity(ours, theirs, params, *, value=False, eval_params=False, tolerance=1e-6):
    """`ours` against optax's `theirs` for STEPS updates, eager and jitted: updates, states, and
    with `eval_params` the evaluation parameters after each step."""
    expected, state, p = [], theirs.init(params), params
    expected_init = state
    for step in range(STEPS):
        extra = {"value": loss(p)} if value else {}
        updates, state = theirs.update(grads_at(step, params), state, p, **extra)
        p = optax.apply_updates(p, updates)
        evaluated = optax.contrib.schedule_free_eval_params(state, p) if eval_params else None
        expected.append((updates, state, evaluated))
    for jit in (False, True):
        update = jax.jit(ours.update) if jit else ours.update
        evaluate = jax.jit(schedule_free_eval_params) if jit else schedule_free_eval_params
        state, p = ours.init(params), params
        assert_trees_close(state, expected_init, "initial state", tolerance)
        for step, (their_updates, their_state, their_eval) in enumerate(expected):
            extra = {"value": loss(p)} if value else {}
            updates, state = update(grads_at(step, params), state, p, **extra)
            what = f"{'jitted' if jit else 'eager'} step {step}"
            assert_trees_close(updates, their_updates, f"updates, {what}", tolerance)
            assert_trees_close(state, their_state, f"state, {what}", tolerance)
            p = modopt.apply_updates(p, updates)
            if eval_params:
                assert_trees_close(evaluate(state, p), their_eval, f"eval params, {what}", tolerance)


# ---- schedule_free: parity and evaluation parameters -----------------------------------------


@pytest.mark.parametrize(
    "ours, theirs",
    [
        (
            lambda: schedule_free_adamw(0.1, warmup_steps=2, b1=0.95, b2=0.99, weight_decay=1e-2, weight_lr_power=1.0),
            lambda: optax.contrib.schedule_free_adamw(0.1, warmup_steps=2, b1=0.95, b2=0.99, weight_decay=1e-2, weight_lr_power=1.0),
        ),
        (
            lambda: schedule_free_sgd(0.3, b1=0.7, weight_decay=1e-2),
            lambda: optax.contrib.schedule_free_sgd(0.3, b1=0.7, weight_decay=1e-2),
        ),
        (  # Adam without momentum inside, the learning rate a warmup schedule in both places
            lambda: schedule_free(modopt.adam(modopt.linear_schedule(0.0, 0.1, 3), b1=0.0), modopt.linear_schedule(0.0, 0.1, 3)),
            lambda: optax.contrib.schedule_free(optax.adam(optax.linear_schedule(0.0, 0.1, 3), b1=0.0), optax.linear_schedule(0.0, 0.1, 3)),
        ),
        (  # SGD, with z kept in bfloat16
            lambda: schedule_free(modopt.sgd(0.2), 0.2, b1=0.5, weight_lr_power=0.0, state_dtype=jnp.bfloat16),
            lambda: optax.contrib.schedule_free(optax.sgd(0.2), 0.2, b1=0.5, weight_lr_power=0.0, state_dtype=jnp.bfloat16),
        ),
        (  # an optax base optimizer inside modopt's wrapper
            lambda: schedule_free(optax.adam(0.05, b1=0.0), 0.05),
            lambda: optax.contrib.schedule_free(optax.adam(0.05, b1=0.0), 0.05),
        ),
    ],
    ids=["adamw_warmup", "sgd_weight_decay", "adam_schedule", "sgd_bf16_state", "optax_adam_inside"],
)
def test_schedule_free_and_eval_params_match_optax(ours, theirs):
    run_parity(ours(), theirs(), make_params(), eval_params=True)


def test_schedule_free_eval_params_of_the_initial_state_are_the_params():
    """Before any step `y = z = x`: the evaluation parameters are the parameters."""
    params = make_params()
    evaluated = schedule_free_eval_params(schedule_free_sgd().init(params), params)
    assert_trees_close(evaluated, params, "eval params at init")


class Model(eqx.Module):
    """Trained float leaves, many of them small (Optimizer would group them for an elementwise
    transform), next to an integer leaf, a function and a static field it must pass through."""

    weight: jax.Array
    biases: list
    steps: jax.Array
    activation: object
    name: str = eqx.field(static=True)


def make_model():
    keys = jax.random.split(jax.random.key(5), 11)
    return Model(
        weight=jax.random.normal(keys[0], (6, 5)),
        biases=[jax.random.normal(k, (3,)) for k in keys[1:]],
        steps=jnp.asarray(7),
        activation=jax.nn.relu,
        name="model",
    )


@pytest.mark.parametrize(
    "make, make_theirs",
    [
        (lambda: schedule_free_adamw(0.1, warmup_steps=2), lambda: optax.contrib.schedule_free_adamw(0.1, warmup_steps=2)),
        (lambda: schedule_free_sgd(0.2), lambda: optax.contrib.schedule_free_sgd(0.2)),
    ],
    ids=["adamw", "sgd"],
)
def test_schedule_free_eval_params_of_an_optimizer(make, make_theirs):
    """`schedule_free_eval_params(optimizer.state, model)` is optax's evaluation point for the
    trained leaves, with the model's other leaves as they were; an optimizer around the state
    (a chain) works too, and so does passing the `Optimizer` itself."""
    model = make_model()
    params, rest = eqx.partition(model, eqx.is_inexact_array)
    theirs = make_theirs()
    their_state, their_params = theirs.init(params), params
    optimizer = modopt.Optimizer(make(), model)
    chained = modopt.Optimizer(modopt.chain(modopt.clip_by_global_norm(100.0), make()), model)

    @eqx.filter_jit
    def step(model, optimizer, grads):
        return optimizer.step(model, grads)

    for i in range(STEPS):
        grads = grads_at(i, params)
        updates, their_state = theirs.update(grads, their_state, their_params)
        their_params = optax.apply_updates(their_params, updates)
        model, optimizer = step(model, optimizer, grads)
    chained_model = make_model()
    for i in range(STEPS):
        chained_model, chained = step(chained_model, chained, grads_at(i, params))

    expected = optax.contrib.schedule_free_eval_params(their_state, their_params)
    assert isinstance(optimizer.state, ScheduleFreeState)
    for evaluated in (
        schedule_free_eval_params(optimizer.state, model),
        schedule_free_eval_params(optimizer, model),
        schedule_free_eval_params(chained.state, chained_model),
    ):
        assert isinstance(evaluated, Model) and evaluated.name == "model" and evaluated.activation is jax.nn.relu
        assert int(evaluated.steps) == 7
        assert_trees_close(eqx.filter(evaluated, eqx.is_inexact_array), expected, "eval model", tolerance=1e-5)


def test_schedule_free_b1_set_on_an_optimizer_is_recorded_for_evaluation():
    """After `set(b1=...)` and a step, the state records the new `b1`, and the parameters are
    `y = b1 x + (1 - b1) z` for the evaluation point `x` and that `b1`."""
    params = make_params()
    optimizer = modopt.Optimizer(schedule_free_sgd(0.2), params)
    params, optimizer = optimizer.step(params, grads_at(0, params))
    optimizer = optimizer.set(b1=0.6)
    params, optimizer = optimizer.step(params, grads_at(1, params))
    assert float(optimizer.state.b1) == pytest.approx(0.6)
    x = schedule_free_eval_params(optimizer.state, params)
    rebuilt = jax.tree.map(lambda xi, zi: 0.6 * xi + 0.4 * zi, x, optimizer.state.z)
    assert_trees_close(rebuilt, params, "y from x and z", tolerance=1e-6)


def test_schedule_free_eval_params_errors():
    params = make_params()
    with pytest.raises(ValueError, match="no ScheduleFreeState"):
        schedule_free_eval_params(modopt.adam(0.1).init(params), params)
    state = schedule_free_sgd().init(params)
    with pytest.raises(ValueError, match="differ in structure"):
        schedule_free_eval_params(state, {"w": params["w"]})


def test_schedule_free_reports_the_base_learning_rate():
    params = make_params()
    optimizer = modopt.Optimizer(schedule_free_adamw(0.1, warmup_steps=4), params)
    schedule = optax.linear_schedule(0.0, 0.1, 4)
    for i in range(3):
        assert float(optimizer.learning_rate) == pytest.approx(float(schedule(i)))
        params, optimizer = optimizer.step(params, grads_at(i, params))


# ---- prodigy, dadapt_adamw, momo, momo_adam: configurations beyond the registry's ------------


@pytest.mark.parametrize(
    "ours, theirs, value",
    [
        (
            lambda: prodigy(modopt.linear_schedule(1.0, 0.2, 5), eps=1e-6, estim_lr0=1e-4, estim_lr_coef=2.0),
            lambda: optax.contrib.prodigy(optax.linear_schedule(1.0, 0.2, 5), eps=1e-6, estim_lr0=1e-4, estim_lr_coef=2.0),
            False,
        ),
        (
            lambda: dadapt_adamw(modopt.linear_schedule(1.0, 0.2, 5), betas=(0.8, 0.99), eps=1e-6, estim_lr0=1e-4),
            lambda: optax.contrib.dadapt_adamw(optax.linear_schedule(1.0, 0.2, 5), betas=(0.8, 0.99), eps=1e-6, estim_lr0=1e-4),
            False,
        ),
        (
            lambda: momo(modopt.linear_schedule(1.0, 0.2, 5), beta=0.8, weight_decay=1e-2, lower_bound=0.1),
            lambda: optax.contrib.momo(optax.linear_schedule(1.0, 0.2, 5), beta=0.8, weight_decay=1e-2, lower_bound=0.1),
            True,
        ),
        (
            lambda: momo(0.5, weight_decay=1e-2, lower_bound=-1.0, adapt_lower_bound=True),
            lambda: optax.contrib.momo(0.5, weight_decay=1e-2, lower_bound=-1.0, adapt_lower_bound=True),
            True,
        ),
        (
            lambda: momo_adam(modopt.linear_schedule(0.5, 0.1, 5), b1=0.8, b2=0.99, eps=1e-6, weight_decay=1e-2),
            lambda: optax.contrib.momo_adam(optax.linear_schedule(0.5, 0.1, 5), b1=0.8, b2=0.99, eps=1e-6, weight_decay=1e-2),
            True,
        ),
    ],
    ids=["prodigy_schedule", "dadapt_schedule", "momo_schedule_weight_decay", "momo_adapt_weight_decay", "momo_adam_schedule"],
)
def test_matches_optax(ours, theirs, value):
    run_parity(ours(), theirs(), make_params(), value=value, tolerance=2e-6)


def test_state_types_and_fields():
    params = make_params()
    assert ScheduleFreeState._fields == ("b1", "weight_sum", "step_count", "max_lr", "base_optimizer_state", "z")
    assert isinstance(prodigy().init(params), ProdigyState)
    assert isinstance(dadapt_adamw().init(params), DAdaptAdamWState)
    assert isinstance(momo().init(params), MomoState)
    assert isinstance(momo_adam().init(params), MomoAdamState)
    for ours, theirs in [
        (ProdigyState, optax.contrib.ProdigyState),
        (DAdaptAdamWState, optax.contrib.DAdaptAdamWState),
        (MomoState, optax.contrib.MomoState),
        (MomoAdamState, optax.contrib.MomoAdamState),
        (ScheduleFreeState, optax.contrib.ScheduleFreeState),
    ]:
        assert ours._fields == theirs._fields


def test_prodigy_keeps_its_own_copy_of_the_initial_params():
    """`params0` must not alias the parameters: both are donated to a jitted step."""
    params = make_params()
    state = prodigy().init(params)
    for a, b in zip(jax.tree.leaves(state.params0), jax.tree.leaves(params)):
        assert a is not b
        np.testing.assert_array_equal(a, b)


def test_betas_set_by_name_without_retrace():
    """`betas` is one hyperparameter (a pair): `set` replaces it, and the new numbers are optax's."""
    params = make_params()
    traces = []

    @eqx.filter_jit
    def step(params, optimizer, grads):
        traces.append(None)
        return optimizer.step(params, grads)

    optimizer = modopt.Optimizer(dadapt_adamw(), params)
    changed = optimizer.set(betas=(0.8, 0.99))
    np.testing.assert_allclose(changed.hyperparameters["betas"], [0.8, 0.99])
    step(params, optimizer, grads_at(0, params))
    new_params, changed = step(params, changed, grads_at(0, params))
    assert len(traces) == 1
    theirs = optax.contrib.dadapt_adamw(betas=(0.8, 0.99))
    updates, _ = theirs.update(grads_at(0, params), theirs.init(params), params)
    assert_trees_close(new_params, optax.apply_updates(params, updates), "params after one step")


# ---- errors -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: schedule_free(modopt.sgd(0.1), 0.1, b1=0.0), r"Invalid b1: 0.0 \(must be in \(0, 1\]\)"),
        (lambda: schedule_free(modopt.sgd(0.1), -0.1), r"Invalid learning_rate: -0.1"),
        (lambda: schedule_free(modopt.sgd, 0.1), r"got the class Sgd"),
        (lambda: schedule_free_adamw(b2=1.0), r"Invalid b2: 1.0 \(must be in \[0, 1\)\)"),
        (lambda: schedule_free_sgd(warmup_steps=0), r"Invalid warmup_steps: 0 \(must be an integer >= 1\)"),
        (lambda: schedule_free_sgd(warmup_steps=2.5), r"Invalid warmup_steps: 2.5"),
        (lambda: schedule_free_sgd(modopt.linear_schedule(1.0, 0.5, 10), warmup_steps=3), r"must be a number"),
        (lambda: schedule_free_sgd(weight_lr_power=-1.0), r"Invalid weight_lr_power: -1.0"),
        (lambda: prodigy(betas=(0.9, 1.0)), r"Invalid betas: \[0.9 1. \] \(must be in \[0, 1\)\)"),
        (lambda: prodigy(betas=(0.9, 0.99, 0.999)), r"Invalid betas: shape \(3,\) \(must be a pair"),
        (lambda: prodigy(beta3=1.5), r"Invalid beta3: 1.5 \(must be in \[0, 1\]\)"),
        (lambda: prodigy(estim_lr0=0.0), r"Invalid estim_lr0: 0.0 \(must be > 0\)"),
        (lambda: prodigy(eps=-1.0), r"Invalid eps: -1.0"),
        (lambda: dadapt_adamw(betas=0.9), r"Invalid betas: (0.9 of )?shape \(\)"),
        (lambda: momo(beta=1.0), r"Invalid beta: 1.0 \(must be in \[0, 1\)\)"),
        (lambda: momo(weight_decay=-0.1), r"Invalid weight_decay: -0.1 \(must be >= 0\)"),
        (lambda: momo_adam(lower_bound=float("nan")), r"Invalid lower_bound: nan \(must be finite\)"),
    ],
)
def test_invalid_hyperparameters(make, message):
    with pytest.raises((ValueError, TypeError), match=message):
        make()


@pytest.mark.parametrize("make", [prodigy, dadapt_adamw, momo, momo_adam, schedule_free_sgd])
def test_update_needs_params(make):
    tx = make()
    params = make_params()
    with pytest.raises(ValueError, match="needs the current parameters"):
        tx.update(grads_at(0, params), tx.init(params), value=1.0)


@pytest.mark.parametrize("make", [momo, momo_adam])
def test_momo_needs_the_loss_value(make):
    params = make_params()
    tx = make()
    state = tx.init(params)
    with pytest.raises(TypeError, match="needs the extra argument `value`"):
        tx.update(grads_at(0, params), state, params)
    with pytest.raises(ValueError, match="got None"):
        tx.update(grads_at(0, params), state, params, value=None)
    optimizer = modopt.Optimizer(tx, params)
    with pytest.raises(TypeError, match="Optimizer.step needs the extra argument `value`"):
        optimizer.step(params, grads_at(0, params))


@pytest.mark.parametrize("make", [prodigy, dadapt_adamw, momo, momo_adam])
def test_complex_params_are_rejected(make):
    params = {"z": jnp.ones(3, jnp.complex64)}
    with pytest.raises(ValueError, match=r"supports real parameters only; the parameter at \['z'\]"):
        make().init(params)
