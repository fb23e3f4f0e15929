"""L-BFGS and the line searches on real problems, against optax 0.2.8.

The registry (`registry/linesearch.py`) runs the shared checks with random update
directions; here the directions are real gradients, so the searches succeed and their
success paths (bracketing, zooming, interpolation, the state's loss and gradient) are compared.
"""

from __future__ import annotations

import itertools
import re

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import modopt


def rosenbrock(x):
    """The (chained) Rosenbrock function; its minimum is 0, at x = (1, ..., 1)."""
    return jnp.sum(100.0 * (x[1:] - x[:-1] ** 2) ** 2 + (1.0 - x[:-1]) ** 2)


def strong(state):
    """`state` with its weakly typed scalars made strong. optax's line searches start with a
    weakly typed `info` and return a strongly typed one, so their jitted step compiled twice, for
    the same values; made strong from the start, once. The values and dtypes stay the same."""
    return jax.tree.map(lambda x: jnp.asarray(x, dtype=jnp.result_type(x)) if isinstance(x, jax.Array) else x, state)


def _stepper(tx, apply_updates, fn):
    @jax.jit
    def step(params, state):
        value, grad = jax.value_and_grad(fn)(params)
        updates, state = tx.update(grad, state, params, value=value, grad=grad, value_fn=fn)
        return apply_updates(params, updates), state

    return step


def iterations_to_minimum(tx, apply_updates, x0, tolerance=1e-6, max_iterations=300):
    """The number of steps until every coordinate is within `tolerance` of the minimizer (1, ..., 1)."""
    step, x, state = _stepper(tx, apply_updates, rosenbrock), x0, strong(tx.init(x0))
    for k in range(1, max_iterations + 1):
        x, state = step(x, state)
        if float(jnp.max(jnp.abs(x - 1.0))) <= tolerance:
            return k
    raise AssertionError(f"not within {tolerance} of the minimum after {max_iterations} steps: {x}")


@pytest.mark.parametrize(
    "x0",
    [jnp.array([-1.2, 1.0]), jnp.tile(jnp.array([-1.2, 1.0]), 5)],
    ids=["2d", "10d"],
)
def test_rosenbrock_in_as_many_iterations_as_optax(x0):
    ours = iterations_to_minimum(modopt.lbfgs(), modopt.apply_updates, x0)
    theirs = iterations_to_minimum(optax.lbfgs(), optax.apply_updates, x0)
    print(f"Rosenbrock {x0.size}-d from {x0[:2]}: modopt {ours}, optax {theirs} iterations")
    assert ours == theirs
    assert ours < (60 if x0.size == 2 else 150)


def assert_states_close(ours, theirs, what, rtol=1e-5, atol=1e-6):
    """Same field paths and dtypes; integers equal, floats close."""
    our_flat = jax.tree_util.tree_flatten_with_path(ours)[0]
    their_flat = jax.tree_util.tree_flatten_with_path(theirs)[0]
    assert [jax.tree_util.keystr(p) for p, _ in our_flat] == [
        jax.tree_util.keystr(p) for p, _ in their_flat
    ], what
    for (path, a), (_, b) in zip(our_flat, their_flat):
        where = f"{what} at {jax.tree_util.keystr(path)}"
        assert jnp.result_type(a) == jnp.result_type(b), where
        if jnp.issubdtype(jnp.result_type(a), jnp.integer):
            np.testing.assert_array_equal(a, b, err_msg=where)
        else:
            wide = np.complex128 if jnp.iscomplexobj(a) else np.float64
            np.testing.assert_allclose(np.asarray(a, wide), np.asarray(b, wide), rtol, atol, err_msg=where)


# Transforms whose states (line-search infos included) follow optax's on Rosenbrock's gradients.
ZOOM_CASES = {
    "lbfgs": (lambda: modopt.lbfgs(), lambda: optax.lbfgs()),
    "lbfgs_small_memory_unscaled": (
        lambda: modopt.lbfgs(memory_size=3, scale_init_precond=False),
        lambda: optax.lbfgs(memory_size=3, scale_init_precond=False),
    ),
    "sgd_zoom_keep": (
        lambda: modopt.chain(modopt.scale(-1.0), modopt.scale_by_zoom_linesearch(15)),
        lambda: optax.chain(optax.scale(-1.0), optax.scale_by_zoom_linesearch(15)),
    ),
    "sgd_zoom_capped_armijo_only": (
        lambda: modopt.chain(
            modopt.scale(-1.0),
            modopt.scale_by_zoom_linesearch(10, max_learning_rate=5e-3, approx_dec_rtol=None, curv_rtol=0.5),
        ),
        lambda: optax.chain(
            optax.scale(-1.0),
            optax.scale_by_zoom_linesearch(10, max_learning_rate=5e-3, approx_dec_rtol=None, curv_rtol=0.5),
        ),
    ),
    "lbfgs_backtracking": (
        lambda: modopt.lbfgs(linesearch=modopt.scale_by_backtracking_linesearch(20, store_grad=True)),
        lambda: optax.lbfgs(linesearch=optax.scale_by_backtracking_linesearch(20, store_grad=True)),
    ),
}


@pytest.mark.parametrize("case", list(ZOOM_CASES))
def test_states_and_linesearch_info_follow_optax(case):
    """12 steps on the 10-d Rosenbrock function: updates and whole states (the line search's
    step size, loss, gradient and `ZoomLinesearchInfo` counts and errors) equal optax's."""
    make_ours, make_theirs = ZOOM_CASES[case]
    ours, theirs = make_ours(), make_theirs()
    x0 = jnp.tile(jnp.array([-1.2, 1.0]), 5)
    our_step, their_step = (
        _stepper(ours, modopt.apply_updates, rosenbrock),
        _stepper(theirs, optax.apply_updates, rosenbrock),
    )
    our_x, their_x, our_state, their_state = x0, x0, ours.init(x0), theirs.init(x0)
    assert_states_close(our_state, their_state, f"{case} initial state")
    their_state = strong(their_state)
    searched = 0
    for k in range(12):
        our_x, our_state = our_step(our_x, our_state)
        their_x, their_state = their_step(their_x, their_state)
        assert_states_close(our_x, their_x, f"{case} params after step {k}")
        assert_states_close(our_state, their_state, f"{case} state after step {k}")
        info = our_state[-1].info
        searched += int(info.num_linesearch_steps)
        assert float(info.decrease_error) == 0.0, f"{case} step {k}: no sufficient decrease"
    assert searched >= 12
    if isinstance(our_state[-1], modopt.ScaleByZoomLinesearchState):
        assert isinstance(our_state[-1].info, modopt.ZoomLinesearchInfo)
        assert our_state[-1].info._fields == optax.ZoomLinesearchInfo._fields


def test_linesearch_info_types_match_optax():
    params = {"w": jnp.ones(3)}
    ours = modopt.scale_by_zoom_linesearch(5).init(params)
    theirs = optax.scale_by_zoom_linesearch(5).init(params)
    assert type(ours).__name__ == type(theirs).__name__ and ours._fields == theirs._fields
    assert type(ours.info).__name__ == "ZoomLinesearchInfo" and ours.info._fields == theirs.info._fields
    ours = modopt.scale_by_backtracking_linesearch(5).init(params)
    theirs = optax.scale_by_backtracking_linesearch(5).init(params)
    assert ours._fields == theirs._fields and ours.info._fields == theirs.info._fields
    assert (
        ours.grad is None
        and modopt.scale_by_backtracking_linesearch(5, store_grad=True).init(params).grad is not None
    )
    assert modopt.scale_by_lbfgs().init(params)._fields == optax.scale_by_lbfgs().init(params)._fields


def ill_conditioned(x):
    a = jnp.array([1.0, 3.0, 10.0, 0.5])
    return 0.5 * jnp.sum(a * (x - jnp.array([1.0, -2.0, 0.5, 3.0])) ** 2)


@pytest.mark.parametrize("store_grad", [False, True])
def test_backtracking_descends_on_a_quadratic_like_optax(store_grad):
    """Gradient descent with backtracking decreases an ill-conditioned quadratic at every step,
    states equal to optax's, and reaches its minimum."""
    ours = modopt.chain(
        modopt.scale(-1.0), modopt.scale_by_backtracking_linesearch(30, store_grad=store_grad)
    )
    theirs = optax.chain(optax.scale(-1.0), optax.scale_by_backtracking_linesearch(30, store_grad=store_grad))
    our_step = _stepper(ours, modopt.apply_updates, ill_conditioned)
    their_step = _stepper(theirs, optax.apply_updates, ill_conditioned)
    x = their_x = jnp.zeros(4)
    state, their_state = ours.init(x), strong(theirs.init(x))
    losses = [float(ill_conditioned(x))]
    for k in range(200):
        x, state = our_step(x, state)
        losses.append(float(ill_conditioned(x)))
        if k < 20:
            their_x, their_state = their_step(their_x, their_state)
            assert_states_close(state, their_state, f"backtracking state after step {k}")
        if losses[-1] <= 1e-8 * losses[0]:
            break
        assert state[1].info.decrease_error == 0.0, f"step {k}: no sufficient decrease"
    assert all(b <= a for a, b in itertools.pairwise(losses))
    assert losses[-1] <= 1e-8 * losses[0], losses[-1]
    if store_grad:  # the state's gradient is the gradient at the new parameters
        np.testing.assert_allclose(state[1].grad, jax.grad(ill_conditioned)(x), atol=1e-6)


def test_lbfgs_no_linesearch_and_schedule_like_optax():
    schedule = optax.linear_schedule(0.5, 0.1, 10)
    for ours, theirs in [
        (modopt.lbfgs(learning_rate=0.5, linesearch=None), optax.lbfgs(learning_rate=0.5, linesearch=None)),
        (
            modopt.lbfgs(learning_rate=modopt.linear_schedule(0.5, 0.1, 10), linesearch=None),
            optax.lbfgs(learning_rate=schedule, linesearch=None),
        ),
    ]:
        x = their_x = jnp.zeros(4)
        state, their_state = ours.init(x), theirs.init(x)
        our_update, their_update = jax.jit(ours.update), jax.jit(theirs.update)
        for k in range(8):
            updates, state = our_update(jax.grad(ill_conditioned)(x), state, x)
            their_updates, their_state = their_update(
                jax.grad(ill_conditioned)(their_x), their_state, their_x
            )
            assert_states_close(updates, their_updates, f"updates {k}")
            assert_states_close(state, their_state, f"state {k}")
            x, their_x = x + updates, their_x + their_updates


def test_complex_parameters_like_optax():
    """L-BFGS's Hermitian products and the backtracking slope treat complex parameters as optax does."""

    def loss(z):
        return jnp.sum(jnp.abs(z - (1.0 + 2.0j)) ** 2 * jnp.arange(1.0, 4.0))

    ours = modopt.chain(
        modopt.scale_by_lbfgs(), modopt.scale(-1.0), modopt.scale_by_backtracking_linesearch(20)
    )
    theirs = optax.chain(
        optax.scale_by_lbfgs(), optax.scale(-1.0), optax.scale_by_backtracking_linesearch(20)
    )

    def stepper(tx):
        @jax.jit
        def step(z, state):
            value, grad = jax.value_and_grad(loss)(z)
            grad = jnp.conj(grad)  # the steepest-ascent direction for complex parameters
            updates, state = tx.update(grad, state, z, value=value, grad=grad, value_fn=loss)
            return z + updates, state

        return step

    z0 = jnp.zeros(3, jnp.complex64)
    z, their_z, state, their_state = z0, z0, ours.init(z0), strong(theirs.init(z0))
    our_step, their_step = stepper(ours), stepper(theirs)
    for k in range(6):
        z, state = our_step(z, state)
        their_z, their_state = their_step(their_z, their_state)
        assert_states_close(state, their_state, f"complex state {k}")
    assert float(loss(z)) < 1e-6


# ---- extra arguments --------------------------------------------------------------------


class Regressor(eqx.Module):
    """A small MLP with an integer leaf and a function field, which the optimizer leaves alone."""

    mlp: eqx.nn.MLP
    calls: jax.Array
    activation: object = eqx.field(static=True)

    def __call__(self, x):
        return self.activation(self.mlp(x))


def _data():
    x = jax.random.normal(jax.random.key(1), (32, 3))
    y = jnp.sin(x @ jnp.array([[1.0], [-0.5], [0.25]]))
    return x, y


def model_loss(model, x, y):
    return jnp.mean((jax.vmap(model)(x) - y) ** 2)


def test_optimizer_step_with_value_grad_and_value_fn_on_an_equinox_model():
    """`Optimizer.step(model, grads, value=, grad=, value_fn=)` with a loss of the model equals
    the pure transforms (modopt's and optax's) on the trainable leaves, and trains the model."""
    x, y = _data()
    model = Regressor(eqx.nn.MLP(3, 1, 8, 1, key=jax.random.key(0)), jnp.array(7), jnp.tanh)

    def loss_fn(model):
        return model_loss(model, x, y)

    @eqx.filter_jit
    def train_step(model, optimizer):
        value, grads = eqx.filter_value_and_grad(loss_fn)(model)
        model, optimizer = optimizer.step(model, grads, value=value, grad=grads, value_fn=loss_fn)
        return model, optimizer, value

    params, rest = eqx.partition(model, eqx.is_inexact_array)

    def params_loss(p):
        return loss_fn(eqx.combine(p, rest))

    pure, oracle = modopt.lbfgs(), optax.lbfgs()
    pure_step, oracle_step = (
        _stepper(pure, modopt.apply_updates, params_loss),
        _stepper(oracle, optax.apply_updates, params_loss),
    )
    pure_params, pure_state = params, pure.init(params)
    oracle_params, oracle_state = params, strong(oracle.init(params))

    optimizer = modopt.Optimizer(modopt.lbfgs(), model)
    start = float(loss_fn(model))
    for k in range(15):
        model, optimizer, _ = train_step(model, optimizer)
        pure_params, pure_state = pure_step(pure_params, pure_state)
        oracle_params, oracle_state = oracle_step(oracle_params, oracle_state)
        trained = eqx.filter(model, eqx.is_inexact_array)
        assert_states_close(trained, pure_params, f"model vs pure transform, step {k}", rtol=1e-6)
        assert_states_close(trained, oracle_params, f"model vs optax, step {k}")
    assert int(model.calls) == 7 and model.activation is jnp.tanh
    assert float(loss_fn(model)) < 0.2 * start
    info = optimizer.state[-1].info
    assert int(info.num_linesearch_steps) >= 1 and float(info.decrease_error) == 0.0


def test_missing_and_unknown_extra_arguments_are_named():
    params = {"w": jnp.ones(3)}
    grads = {"w": jnp.ones(3)}
    optimizer = modopt.Optimizer(modopt.lbfgs(), params)
    with pytest.raises(TypeError, match="needs the extra argument `value_fn`.*ScaleByZoomLinesearch"):
        optimizer.step(params, grads, value=jnp.asarray(3.0), grad=grads)
    tx = modopt.scale_by_backtracking_linesearch(5)
    state = tx.init(params)

    def fn(p):
        return jnp.sum(p["w"] ** 2)

    with pytest.raises(TypeError, match="`batch`, which `value_fn` does not take"):
        tx.update(grads, state, params, value=fn(params), grad=grads, value_fn=fn, batch=1.0)
    with pytest.raises(TypeError, match="needs the extra argument `grad`"):
        tx.update(grads, state, params, value=fn(params), value_fn=fn)
    with pytest.raises(ValueError, match="needs the current parameters"):
        tx.update(grads, state, value=fn(params), grad=grads, value_fn=fn)
    # No line search: no extra argument needed.
    assert modopt.declared_extra_args(modopt.lbfgs(linesearch=None)).args == {}
    declared = modopt.declared_extra_args(modopt.lbfgs()).args
    assert declared["grad"][0].like_params and declared["value_fn"][0].of_params


def test_remaining_extra_arguments_reach_value_fn_as_in_optax():
    """Data passed to `update` by keyword goes to `value_fn`, as optax's examples do."""
    x, y = jnp.array([3.0, 2.0, 1.0]), jnp.array(0.0)

    def fn(params, x, y):
        return optax.l2_loss(x.dot(params), y)

    for ours, theirs in [
        (
            modopt.chain(modopt.scale(-1.0), modopt.scale_by_zoom_linesearch(15)),
            optax.chain(optax.scale(-1.0), optax.scale_by_zoom_linesearch(15)),
        ),
        (
            modopt.chain(modopt.scale(-1.0), modopt.scale_by_backtracking_linesearch(15)),
            optax.chain(optax.scale(-1.0), optax.scale_by_backtracking_linesearch(15)),
        ),
    ]:

        def stepper(tx):
            @jax.jit
            def step(w, state, x, y):
                value, grad = jax.value_and_grad(fn)(w, x, y)
                updates, state = tx.update(grad, state, w, value=value, grad=grad, value_fn=fn, x=x, y=y)
                return w + updates, state

            return step

        params = their_params = jnp.array([1.0, 2.0, 3.0])
        state, their_state = ours.init(params), strong(theirs.init(params))
        our_step, their_step = stepper(ours), stepper(theirs)
        for _ in range(3):
            params, state = our_step(params, state, x, y)
            their_params, their_state = their_step(their_params, their_state, x, y)
            assert_states_close(state, their_state, "state")


# ---- hyperparameters ----------------------------------------------------------------------


def test_hyperparameters_are_leaves_and_sizes_are_static():
    tx = modopt.lbfgs()
    names = modopt.hyperparameters(tx)
    for name in ("learning_rate", "max_learning_rate", "tol", "slope_rtol", "curv_rtol", "approx_dec_rtol"):
        assert name in names
    assert float(names["approx_dec_rtol"]) == pytest.approx(1e-6)
    assert modopt.scale_by_zoom_linesearch(3, approx_dec_rtol=None).approx_dec_rtol is None
    changed = modopt.set_hyperparameters(tx, curv_rtol=0.5)
    assert float(changed.linesearch.curv_rtol) == 0.5
    assert jax.tree_util.tree_structure(changed) == jax.tree_util.tree_structure(tx)
    assert jax.tree_util.tree_structure(modopt.lbfgs(memory_size=3)) != jax.tree_util.tree_structure(tx)
    assert modopt.lbfgs(linesearch=None).linesearch == modopt.identity()


@pytest.mark.parametrize(
    "make, message",
    [
        (
            lambda: modopt.scale_by_lbfgs(memory_size=0),
            "Invalid memory_size: 0 (must be an integer >= 1) in ScaleByLBFGS.",
        ),
        (
            lambda: modopt.lbfgs(memory_size=0),
            "Invalid memory_size: 0 (must be an integer >= 1) in ScaleByLBFGS.",
        ),
        (
            lambda: modopt.scale_by_zoom_linesearch(0),
            "Invalid max_linesearch_steps: 0 (must be an integer >= 1)",
        ),
        (
            lambda: modopt.scale_by_zoom_linesearch(5, max_learning_rate=0.0),
            "Invalid max_learning_rate: 0.0 (must be > 0)",
        ),
        (
            lambda: modopt.scale_by_zoom_linesearch(5, slope_rtol=1.0),
            "Invalid slope_rtol: 1.0 (must be in [0, 1))",
        ),
        (
            lambda: modopt.scale_by_zoom_linesearch(5, initial_guess_strategy="two"),
            "Invalid initial_guess_strategy: 'two'",
        ),
        (
            lambda: modopt.scale_by_zoom_linesearch(5, approx_dec_rtol=-1.0),
            "Invalid approx_dec_rtol: -1.0 (must be >= 0)",
        ),
        (lambda: modopt.scale_by_backtracking_linesearch(-1), "Invalid max_backtracking_steps: -1"),
        (
            lambda: modopt.scale_by_backtracking_linesearch(5, decrease_factor=1.0),
            "Invalid decrease_factor: 1.0 (must be in (0, 1))",
        ),
        (
            lambda: modopt.scale_by_backtracking_linesearch(5, increase_factor=0.5),
            "Invalid increase_factor: 0.5 (must be >= 1)",
        ),
        (lambda: modopt.lbfgs(linesearch="zoom"), "lbfgs linesearch: expected a gradient transformation"),
    ],
)
def test_invalid_hyperparameters(make, message):
    with pytest.raises((ValueError, TypeError), match=re.escape(message)):
        make()


def test_a_grad_not_shaped_like_the_params_is_named():
    params = {"w": jnp.ones(3), "b": jnp.ones(2)}
    tx = modopt.scale_by_zoom_linesearch(5)

    def fn(p):
        return jnp.sum(p["w"] ** 2)

    with pytest.raises(
        ValueError, match=re.escape("`grad` at ['b'] has shape (3,), but the parameter has shape (2,)")
    ):
        tx.update(
            params, tx.init(params), params, value=1.0, grad={"w": jnp.ones(3), "b": jnp.ones(3)}, value_fn=fn
        )
    with pytest.raises(ValueError, match="`grad` does not have the structure of the params"):
        tx.update(params, tx.init(params), params, value=1.0, grad={"w": jnp.ones(3)}, value_fn=fn)


@pytest.mark.parametrize(
    "linesearch",
    [
        modopt.scale_by_zoom_linesearch(4, verbose=True),
        modopt.scale_by_backtracking_linesearch(4, verbose=True),
    ],
    ids=["zoom", "backtracking"],
)
def test_verbose_reports_a_failed_search(linesearch, capfd):
    """An ascent direction: no step size decreases the loss, and `verbose=True` says so."""
    params = jnp.array([1.0, 2.0])

    def fn(x):
        return jnp.sum(x**2)

    value, grad = jax.value_and_grad(fn)(params)
    updates, state = jax.jit(linesearch.update)(
        grad, linesearch.init(params), params, value=value, grad=grad, value_fn=jax.tree_util.Partial(fn)
    )
    jax.effects_barrier()
    assert float(state.info.decrease_error) > 0.0
    assert "linesearch" in capfd.readouterr().out
    assert updates.shape == params.shape


SHARDED = r"""
import os, sys
sys.path.insert(0, {tests!r})
import sharded_worker as w  # sets the device count before jax is imported
import equinox as eqx, jax, jax.numpy as jnp
import modopt
from registry.linesearch import _quadratic

# Sharded inner products sum in another order; L-BFGS's gradient differences y = g1 - g0
# cancel, most after the first, short step, which amplifies that rounding to ~1e-5.
TOLERANCE = 1e-4


def step(params, optimizer):
    value, grads = jax.value_and_grad(_quadratic)(params)
    return optimizer.step(params, grads, value=value, grad=grads, value_fn=_quadratic)

for tx in (modopt.lbfgs(), modopt.lbfgs(memory_size=3, linesearch=modopt.scale_by_backtracking_linesearch(15))):
    reference, ref_opt = w.make_params(), modopt.Optimizer(tx, w.make_params())
    for _ in range(w.STEPS):
        reference, ref_opt = eqx.filter_jit(step)(reference, ref_opt)
    mesh = w.make_mesh("auto")
    param_shardings = w.named(mesh, w.SPECS)
    abstract = eqx.filter_eval_shape(modopt.Optimizer, tx, w.make_params())
    # With ZeRO-1 only: on Auto axes its layout is the plain one with "data" added where a
    # dimension allows, and nothing in the step depends on the layout (see
    # `sharded_worker.registry_entry`); both layouts are derived and checked abstractly in
    # `test_registry.test_state_placed_on_a_mesh`.
    shardings = modopt.sharding.shardings(abstract, param_shardings, zero_axis="data")
    params = jax.device_put(w.make_params(), param_shardings)
    optimizer = jax.jit(lambda p: modopt.Optimizer(tx, p), out_shardings=shardings)(params)
    sharded_step = jax.jit(step, out_shardings=(param_shardings, shardings), donate_argnums=(0, 1))
    for _ in range(w.STEPS):
        params, optimizer = sharded_step(params, optimizer)
        jax.block_until_ready((params, optimizer))
    w.assert_placed(optimizer.state, shardings.state, "state")
    assert any("data" in str(s.spec) for s in jax.tree.leaves(shardings.state)), "ZeRO-1 split nothing"
    w.assert_close(params, reference, "params", TOLERANCE)
    w.assert_close(optimizer.state, ref_opt.state, "state", TOLERANCE)
    print("ok", type(tx.linesearch).__name__)
"""


def test_lbfgs_with_line_searches_on_8_devices():
    """L-BFGS with each line search on a (2, 4) mesh with ZeRO-1, with real gradients: the
    state lands as derived and the steps equal one device's."""
    import os
    import subprocess
    import sys

    tests = os.path.dirname(__file__)
    env = {**os.environ, "MODOPT_TEST_DEVICES": "8"}
    result = subprocess.run(
        [sys.executable, "-c", SHARDED.format(tests=tests)],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert result.returncode == 0, result.stderr[-6000:]
    assert "ok ScaleByZoomLinesearch" in result.stdout and "ok ScaleByBacktrackingLinesearch" in result.stdout
