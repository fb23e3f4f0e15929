"""Sophia and its Hutchinson estimator, GaLore, SAM and reduce_on_plateau (`modopt.contrib`).

The registry (`registry/contrib_second_order.py`) runs them through the shared checks. Here:
Sophia with an objective of an Equinox model, its win-rate printing and `mu_dtype`, against
optax; Hutchinson's estimate against the true Hessian diagonal of a quadratic (exact for a
diagonal Hessian, within its variance for a dense one); GaLore's shapes, its refreshes against
optax and NumPy's SVD, its sharding rule; SAM's two modes against optax, through
`Optimizer.step` with a model; reduce_on_plateau's scale after plateaus against optax and by
its rule; clear errors for bad input; the privacy names re-exported.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

import modopt
from modopt import contrib


def assert_trees_close(ours, theirs, what="", rtol=1e-6, atol=1e-6):
    our_flat = jax.tree_util.tree_flatten_with_path(ours)[0]
    their_flat = jax.tree_util.tree_flatten_with_path(theirs)[0]
    assert [jax.tree_util.keystr(p) for p, _ in our_flat] == [
        jax.tree_util.keystr(p) for p, _ in their_flat
    ], what
    for (path, a), (_, b) in zip(our_flat, their_flat):
        if jnp.issubdtype(jnp.result_type(a), jax.dtypes.prng_key):
            a = jax.random.key_data(a)
        if jnp.issubdtype(jnp.result_type(b), jax.dtypes.prng_key):
            b = jax.random.key_data(b)
        assert jnp.shape(a) == jnp.shape(b), f"{what} {jax.tree_util.keystr(path)}"
        assert jnp.result_type(a) == jnp.result_type(b), f"{what} {jax.tree_util.keystr(path)}"
        np.testing.assert_allclose(
            np.asarray(a, np.float64),
            np.asarray(b, np.float64),
            rtol=rtol,
            atol=atol,
            err_msg=f"{what} {jax.tree_util.keystr(path)}",
        )


def quadratic(params):
    def leaf(x):
        a = jnp.linspace(0.5, 1.5, x.size).reshape(x.shape)
        return 0.5 * jnp.sum(a * (x - 1.0) ** 2)

    return sum(leaf(x) for x in jax.tree.leaves(params))


def small_params():
    k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
    return {
        "w": jax.random.normal(k1, (6, 4)),
        "v": jax.random.normal(k2, (3, 8)),
        "b": jax.random.normal(k3, (4,)),
    }


def model_and_loss():
    """An MLP with an integer leaf that is not trained, and its loss on a fixed batch."""

    class Model(eqx.Module):
        mlp: eqx.nn.MLP
        steps: jax.Array

    model = Model(eqx.nn.MLP(3, 2, 8, 1, key=jax.random.key(1)), jnp.asarray(0))
    x = jax.random.normal(jax.random.key(2), (16, 3))
    y = jax.random.normal(jax.random.key(3), (16, 2))

    def loss(m):
        return jnp.mean((jax.vmap(m.mlp)(x) - y) ** 2)

    return model, loss


# --- Sophia ---------------------------------------------------------------------------------------


def test_sophia_with_an_objective_of_the_model_matches_optax():
    """`Optimizer.step(model, grads, obj_fn=f)` with `f` a function of the model equals optax's
    sophia on the trained leaves with `obj_fn` of those leaves, for steps crossing refreshes."""
    model, loss = model_and_loss()
    params, rest = eqx.partition(model, eqx.is_inexact_array)
    make = dict(update_interval=2, gamma=0.05, weight_decay=1e-3)
    optimizer = modopt.Optimizer(
        contrib.sophia(
            0.02, hessian_diagonal_fn=contrib.hutchinson_estimator_diag_hessian(jax.random.key(4)), **make
        ),
        model,
    )
    theirs = optax.contrib.sophia(
        0.02, hessian_diagonal_fn=optax.contrib.hutchinson_estimator_diag_hessian(jax.random.key(4)), **make
    )
    their_state = theirs.init(params)

    @eqx.filter_jit
    def step(model, optimizer):
        grads = eqx.filter_grad(loss)(model)
        return optimizer.step(model, grads, obj_fn=loss)

    @jax.jit
    def their_step(params, state):
        their_loss = lambda p: loss(eqx.combine(p, rest))  # noqa: E731
        updates, state = theirs.update(jax.grad(their_loss)(params), state, params, obj_fn=their_loss)
        return optax.apply_updates(params, updates), state

    for _ in range(5):
        model, optimizer = step(model, optimizer)
        params, their_state = their_step(params, their_state)
    assert_trees_close(eqx.filter(model, eqx.is_inexact_array), params, "params", rtol=1e-5, atol=1e-6)
    assert_trees_close(optimizer.state, their_state, "state", rtol=1e-5, atol=1e-6)
    assert int(model.steps) == 0


def test_sophia_mu_dtype_and_win_rate_printing_match_optax(capfd):
    params = small_params()
    obj = jax.tree_util.Partial(quadratic)
    make = dict(mu_dtype=jnp.bfloat16, verbose=True, print_win_rate_every_n_steps=2, update_interval=1)
    ours = contrib.sophia(0.1, hessian_diagonal_fn=contrib.hutchinson_estimator_diag_hessian(1), **make)
    theirs = optax.contrib.sophia(
        0.1, hessian_diagonal_fn=optax.contrib.hutchinson_estimator_diag_hessian(jax.random.key(1)), **make
    )
    outputs = []
    for tx in (ours, theirs):
        state, p, update = tx.init(params), params, jax.jit(tx.update)
        for _ in range(4):
            updates, state = update(jax.grad(quadratic)(p), state, p, obj_fn=obj)
            p = optax.apply_updates(p, updates)
        jax.effects_barrier()
        outputs.append((p, state, capfd.readouterr().out))
    (ours_p, our_state, our_out), (their_p, their_state, their_out) = outputs
    assert all(mu.dtype == jnp.bfloat16 for mu in jax.tree.leaves(our_state[0].mu))
    # optax rounds `b1 * mu` to bfloat16 before adding the gradient; modopt accumulates in
    # float32 and rounds once (see `modopt.fields.dtype`): the moments agree to a unit of
    # bfloat16, and the rest of the state and the parameters to what that moves.
    unit = float(jnp.finfo(jnp.bfloat16).eps)
    assert_trees_close(our_state[0].mu, their_state[0].mu, "state mu", rtol=unit, atol=unit)
    assert_trees_close(our_state[0]._replace(mu=()), their_state[0]._replace(mu=()), "state", rtol=1e-4, atol=1e-5)
    assert_trees_close(our_state[1:], their_state[1:], "state")
    assert_trees_close(ours_p, their_p, "params", rtol=1e-4, atol=1e-5)
    assert our_out.count("Sophia optimizer win rate") == 2  # at steps 2 and 4
    assert our_out == their_out


def test_sophia_and_hutchinson_errors():
    params = small_params()
    grads = jax.grad(quadratic)(params)
    tx = contrib.sophia(0.1)
    state = tx.init(params)
    with pytest.raises(TypeError, match="obj_fn"):
        tx.update(grads, state, params)
    with pytest.raises(TypeError, match="Invalid obj_fn: a float"):
        tx.update(grads, state, params, obj_fn=1.0)
    with pytest.raises(ValueError, match="Invalid obj_fn: it returned"):
        tx.update(grads, state, params, obj_fn=lambda p: (quadratic(p), 0.0))
    with pytest.raises(ValueError, match="needs the current parameters"):
        tx.update(grads, state, None, obj_fn=quadratic)
    optimizer = modopt.Optimizer(tx, params)
    with pytest.raises(TypeError, match="needs the extra argument `obj_fn`"):
        optimizer.step(params, grads)
    with pytest.raises(ValueError, match=r"Invalid update_interval: 0 \(must be an integer >= 1\)"):
        contrib.sophia(0.1, update_interval=0)
    with pytest.raises(ValueError, match=r"Invalid b2: 1.0"):
        contrib.sophia(0.1, b2=1.0)
    with pytest.raises(TypeError, match="hessian_diagonal_fn"):
        contrib.sophia(0.1, hessian_diagonal_fn=contrib.hutchinson_estimator_diag_hessian)
    with pytest.raises(TypeError, match="PRNG key"):
        contrib.hutchinson_estimator_diag_hessian("seed")


def test_sophia_hyperparameters_are_leaves_and_the_default_estimator_is_seed_0():
    tx = contrib.sophia(0.1)
    assert isinstance(tx.hessian_diagonal_fn, contrib.HutchinsonEstimatorDiagHessian)
    np.testing.assert_array_equal(
        jax.random.key_data(tx.hessian_diagonal_fn.random_seed), jax.random.PRNGKey(0)
    )
    names = modopt.hyperparameters(tx)
    assert {"gamma", "clip_threshold", "update_interval", "b1", "b2"} <= set(names)
    assert jax.tree_util.tree_leaves(tx)  # the key is a leaf too
    assert any(jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key) for leaf in jax.tree_util.tree_leaves(tx))


# --- Hutchinson's estimator -----------------------------------------------------------------------


def _estimates(matrix, draws, seed=0):
    """`draws` estimates of the Hessian diagonal of `0.5 x^T A x` (at a point where it is A)."""
    x = {"x": jnp.linspace(-1.0, 1.0, matrix.shape[0])}
    a = jnp.asarray(matrix, jnp.float32)
    obj = jax.tree_util.Partial(lambda p: 0.5 * p["x"] @ a @ p["x"])
    tx = contrib.hutchinson_estimator_diag_hessian(seed)

    def body(state, _):
        estimate, state = tx.update(x, state, x, obj_fn=obj)
        return state, estimate["x"]

    return np.asarray(jax.lax.scan(body, tx.init(x), length=draws)[1], np.float64)


def test_hutchinson_is_exact_for_a_diagonal_hessian():
    """With `H` diagonal, `z * (H z) = z**2 * diag(H) = diag(H)` for every draw of signs."""
    diagonal = np.array([0.5, -2.0, 3.0, 1e-3, 7.0])
    estimates = _estimates(np.diag(diagonal), draws=4)
    np.testing.assert_allclose(estimates, np.broadcast_to(diagonal, estimates.shape), rtol=1e-6)


def test_hutchinson_averages_to_the_diagonal_of_a_dense_hessian():
    """The mean of many estimates is within 4 standard errors of `diag(A)`; element i's
    variance is `sum_{j != i} A_ij**2` (the signs are independent Rademacher draws)."""
    rng = np.random.default_rng(0)
    b = rng.normal(size=(6, 6))
    matrix = (b + b.T) / 2 + np.diag([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    draws = 4000
    estimates = _estimates(matrix, draws)
    variance = (matrix**2).sum(axis=1) - np.diag(matrix) ** 2
    np.testing.assert_allclose(estimates.var(axis=0), variance, rtol=0.1)
    assert np.all(np.abs(estimates.mean(axis=0) - np.diag(matrix)) < 4 * np.sqrt(variance / draws))
    assert not np.allclose(estimates[0], np.diag(matrix), atol=0.1)  # one draw alone is noisy


def test_hutchinson_matches_optax_and_advances_its_key():
    params = small_params()
    obj = jax.tree_util.Partial(quadratic)
    ours, theirs = (
        contrib.hutchinson_estimator_diag_hessian(9),
        optax.contrib.hutchinson_estimator_diag_hessian(jax.random.key(9)),
    )
    s1, s2 = ours.init(params), theirs.init(params)
    for _ in range(2):
        e1, s1 = ours.update(params, s1, params, obj_fn=obj)
        e2, s2 = theirs.update(params, s2, params, obj_fn=obj)
        assert_trees_close(e1, e2, "estimate")
        assert_trees_close(s1, s2, "state")
    assert not np.array_equal(jax.random.key_data(s1.key), jax.random.key_data(ours.random_seed))


# --- GaLore ---------------------------------------------------------------------------------------


def test_galore_shapes_match_optax_and_the_paper():
    """(6, 4) with rank 2: rows projected, P (6, 2), moments (2, 4); (3, 8): columns, P (8, 2),
    moments (3, 2); the vector is not projected (P (0, 0), moments (4,))."""
    params = small_params()
    ours = contrib.galore(0.1, rank=2).init(params)
    theirs = optax.contrib.galore(0.1, rank=2).init(params)
    shapes = lambda tree: jax.tree.map(jnp.shape, tree)  # noqa: E731
    assert shapes(ours) == shapes(theirs)
    galore_state = ours[0]
    assert shapes(galore_state.projector) == {"w": (6, 2), "v": (8, 2), "b": (0, 0)}
    assert shapes(galore_state.base_optimizer_state.mu) == {"w": (2, 4), "v": (3, 2), "b": (4,)}
    # A rank above the matrix's is cut to min(m, n).
    big_rank = contrib.scale_by_galore(rank=100).init(params)
    assert shapes(big_rank.projector) == {"w": (6, 4), "v": (8, 3), "b": (0, 0)}


def test_galore_refreshes_projections_every_gap_steps_like_optax_and_numpy():
    """The projection is recomputed at steps 0, 3, 6 and kept in between; at a refresh `P P^T`
    is the projector onto the top singular vectors of that step's gradient (NumPy's SVD,
    independent of sign choices). Updates and states equal optax's at every step."""
    params = small_params()
    ours = contrib.scale_by_galore(rank=2, update_proj_gap=3, scale=0.5)
    theirs = optax.contrib.scale_by_galore(rank=2, update_proj_gap=3, scale=0.5)
    s1, s2 = ours.init(params), theirs.init(params)
    update = jax.jit(ours.update)
    previous = None
    for step in range(7):
        grads = jax.tree.map(lambda p: jnp.cos(p * (step + 1.0)), params)
        u1, s1 = update(grads, s1, params)
        u2, s2 = theirs.update(grads, s2, params)
        assert_trees_close(u1, u2, f"updates {step}", rtol=1e-5)
        assert_trees_close(s1, s2, f"state {step}", rtol=1e-5)
        if step % 3 == 0:
            for name, left in (("w", True), ("v", False)):
                g = np.asarray(grads[name], np.float64)
                u, _, vh = np.linalg.svd(g, full_matrices=False)
                basis = u[:, :2] if left else vh[:2].T
                p = np.asarray(s1.projector[name], np.float64)
                np.testing.assert_allclose(p @ p.T, basis @ basis.T, atol=1e-5)
        else:
            assert_trees_close(s1.projector, previous, f"kept projector {step}", rtol=0, atol=0)
        previous = s1.projector


def test_galore_through_an_optimizer_with_a_3d_leaf_and_weight_decay():
    """Dimension numbers project the (2, 3, 4) leaf as a (2, 12) matrix; `galore` with weight
    decay and a mask equals optax's, through `Optimizer.step`."""
    params = {
        "w": jax.random.normal(jax.random.key(0), (5, 4)),
        "cube": jax.random.normal(jax.random.key(1), (2, 3, 4)),
    }
    dims = {"w": contrib.GaLoreDimensionNumbers(), "cube": contrib.GaLoreDimensionNumbers(0, (1, 2))}
    their_dims = {
        "w": optax.contrib.GaLoreDimensionNumbers(),
        "cube": optax.contrib.GaLoreDimensionNumbers(0, (1, 2)),
    }
    mask = {"w": True, "cube": False}
    tx = contrib.galore(
        0.1, rank=2, update_proj_gap=2, weight_decay=0.1, mask=mask, weight_dimension_numbers=dims
    )
    theirs = optax.contrib.galore(
        0.1, rank=2, update_proj_gap=2, weight_decay=0.1, mask=mask, weight_dimension_numbers=their_dims
    )
    optimizer, state, p = modopt.Optimizer(tx, params), theirs.init(params), params
    assert optimizer.state[0].projector["cube"].shape == (12, 2)
    step = eqx.filter_jit(lambda params, optimizer: optimizer.step(params, jax.grad(quadratic)(params)))
    ours_p = params
    for _ in range(4):
        ours_p, optimizer = step(ours_p, optimizer)
        updates, state = theirs.update(jax.grad(quadratic)(p), state, p)
        p = optax.apply_updates(p, updates)
    assert_trees_close(ours_p, p, "params", rtol=1e-5)
    assert_trees_close(optimizer.state, state, "state", rtol=1e-5)


def test_galore_sharding_rule():
    """Projections and projected moments split the axis they share with the parameter as the
    parameter splits it; a merged group keeps its first axis's split only."""
    params = {"a": jnp.zeros((6, 4)), "b": jnp.zeros((4,)), "c": jnp.zeros((3, 8)), "d": jnp.zeros((2, 3, 4))}
    D = contrib.GaLoreDimensionNumbers
    tx = contrib.scale_by_galore(
        rank=2, weight_dimension_numbers=lambda p: {"a": D(1, 0), "b": None, "c": D(), "d": D(0, (1, 2))}
    )
    specs = tx.state_specs(
        params, {"a": P("x", None), "b": P("x"), "c": P(None, "y"), "d": P("x", None, "y")}
    )
    # a: rows = axis 1 (4), columns = axis 0 (6): m < n, so P is (6, 2), split like axis 0.
    assert specs.projector == {"a": P("x", None), "b": P(), "c": P("y", None), "d": P(None, None)}
    assert specs.base_optimizer_state.mu == {
        "a": P(None, None),
        "b": P("x"),
        "c": P(None, None),
        "d": P("x", None),
    }
    assert specs.count == P()
    specs = tx.state_specs(params, {"a": P(), "b": P(), "c": P(), "d": P(None, "x", None)})
    assert specs.projector["d"] == P("x", None)  # columns (1, 2): axis 1 split, axis 2 not


@pytest.mark.parametrize(
    ("make", "error", "message"),
    [
        (lambda: contrib.galore(0.1, rank=2.0), TypeError, "Invalid rank: 2.0 of type float"),
        (lambda: contrib.scale_by_galore(rank=0), ValueError, r"Invalid rank: 0 \(must be >= 1\)"),
        (lambda: contrib.scale_by_galore(update_proj_gap=0), ValueError, "Invalid update_proj_gap"),
        (
            lambda: contrib.scale_by_galore(
                weight_dimension_numbers={"w": None, "v": None, "b": contrib.GaLoreDimensionNumbers()}
            ).init(small_params()),
            ValueError,
            r"rank >= 2; the one at \['b'\] has shape \(4,\)",
        ),
        (
            lambda: contrib.scale_by_galore(weight_dimension_numbers={"w": None}).init(small_params()),
            ValueError,
            "must be shaped like the parameters",
        ),
        (
            lambda: contrib.scale_by_galore(
                weight_dimension_numbers=contrib.GaLoreDimensionNumbers(0, 0)
            ).init(small_params()),
            ValueError,
            r"overlap for the parameter at \['b'\]|overlap for the parameter at \['v'\]",
        ),
        (
            lambda: contrib.scale_by_galore(weight_dimension_numbers={"w": 3, "v": None, "b": None}).init(
                small_params()
            ),
            ValueError,
            r"has 3 for the parameter at \['w'\]",
        ),
        (lambda: contrib.galore(0.1, base_optimizer=optax.adam), TypeError, "galore: base_optimizer"),
    ],
)
def test_galore_errors(make, error, message):
    with pytest.raises(error, match=message):
        make()


def test_galore_base_optimizer_gets_no_params():
    params = small_params()
    tx = contrib.scale_by_galore(rank=2, base_optimizer=modopt.adamw(0.1))
    with pytest.raises(ValueError, match="needs the current parameters"):
        tx.update(params, tx.init(params), params)


# --- SAM ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("sync_period", "reset_state"), [(3, False), (2, True)])
def test_sam_transparent_matches_optax(sync_period, reset_state):
    params = small_params()
    make = dict(sync_period=sync_period, reset_state=reset_state)
    ours = contrib.sam(
        modopt.sgd(0.1, momentum=0.9), modopt.chain(contrib.normalize(), modopt.adam(0.05)), **make
    )
    theirs = optax.contrib.sam(
        optax.sgd(0.1, momentum=0.9), optax.chain(optax.contrib.normalize(), optax.adam(0.05)), **make
    )
    s1, s2, p1, p2 = ours.init(params), theirs.init(params), params, params
    update = jax.jit(ours.update)
    for step in range(2 * sync_period + 1):
        u1, s1 = update(jax.grad(quadratic)(p1), s1, p1)
        u2, s2 = theirs.update(jax.grad(quadratic)(p2), s2, p2)
        assert_trees_close(u1, u2, f"updates {step}")
        assert_trees_close(s1, s2, f"state {step}")
        if step % sync_period == 0:  # a cycle starts: the true parameters are cached
            assert_trees_close(s1.cache, p1, "the cache", rtol=0, atol=0)
        p1, p2 = optax.apply_updates(p1, u1), optax.apply_updates(p2, u2)


def test_sam_opaque_through_an_optimizer_with_a_model_matches_optax():
    """`grad_fn` given as a function of the model (returning model-shaped gradients) reaches
    SAM as a function of the trained leaves; the numbers are optax's opaque SAM's."""
    model, loss = model_and_loss()
    params, rest = eqx.partition(model, eqx.is_inexact_array)
    ours = contrib.sam(
        modopt.adam(0.02),
        modopt.chain(contrib.normalize(), modopt.sgd(0.05)),
        sync_period=3,
        opaque_mode=True,
    )
    theirs = optax.contrib.sam(
        optax.adam(0.02),
        optax.chain(optax.contrib.normalize(), optax.sgd(0.05)),
        sync_period=3,
        opaque_mode=True,
    )
    optimizer, state = modopt.Optimizer(ours, model), theirs.init(params)
    assert optimizer.state.cache is None

    @eqx.filter_jit
    def step(model, optimizer):
        grads = eqx.filter_grad(loss)(model)
        return optimizer.step(model, grads, grad_fn=lambda m, i: eqx.filter_grad(loss)(m))

    their_loss = lambda p: loss(eqx.combine(p, rest))  # noqa: E731
    for _ in range(3):
        model, optimizer = step(model, optimizer)
        updates, state = theirs.update(
            jax.grad(their_loss)(params), state, params, grad_fn=lambda p, i: jax.grad(their_loss)(p)
        )
        params = optax.apply_updates(params, updates)
    assert_trees_close(eqx.filter(model, eqx.is_inexact_array), params, "params", rtol=1e-5)
    assert_trees_close(optimizer.state, state, "state", rtol=1e-5)


def test_sam_opaque_calls_grad_fn_once_per_adversarial_step():
    params = small_params()
    calls = []

    def grad_fn(p, i):
        calls.append(i)
        return jax.grad(quadratic)(p)

    tx = contrib.sam(
        modopt.sgd(0.1), modopt.chain(contrib.normalize(), modopt.sgd(0.05)), sync_period=4, opaque_mode=True
    )
    tx.update(jax.grad(quadratic)(params), tx.init(params), params, grad_fn=grad_fn)
    assert calls == [0, 1, 2]


def test_sam_errors_and_rule():
    params = small_params()
    opaque = contrib.sam(modopt.sgd(0.1), modopt.sgd(0.05), opaque_mode=True)
    with pytest.raises(TypeError, match="needs the extra argument `grad_fn` with opaque_mode=True"):
        opaque.update(params, opaque.init(params), params)
    with pytest.raises(ValueError, match=r"Invalid sync_period: 0 \(must be an integer >= 1\)"):
        contrib.sam(modopt.sgd(0.1), modopt.sgd(0.05), sync_period=0)
    with pytest.raises(TypeError, match="got the class"):
        contrib.sam(modopt.sgd, modopt.sgd(0.05))
    specs = {"w": P(None, "x"), "v": P("x", None), "b": P()}
    rule = contrib.sam(modopt.adam(0.1), modopt.sgd(0.05)).state_specs(params, specs)
    assert rule.cache == specs and rule.steps_since_sync == P()
    assert rule.opt_state[0].mu == specs
    assert opaque.state_specs(params, specs).cache is None


def test_normalize_matches_optax():
    params = small_params()
    ours, _ = contrib.normalize().update(params, contrib.normalize().init(params))
    theirs, _ = optax.contrib.normalize().update(params, optax.contrib.normalize().init(params))
    assert_trees_close(ours, theirs)
    norm = np.sqrt(sum(float(jnp.sum(x**2)) for x in jax.tree.leaves(ours)))
    assert norm == pytest.approx(1.0, rel=1e-6)


# --- reduce_on_plateau ----------------------------------------------------------------------------


def _run_plateau(tx, values, params):
    state, scales, update = tx.init(params), [], jax.jit(tx.update)
    for value in values:
        updates, state = update(params, state, params, value=jnp.asarray(value))
        scales.append(float(state.scale))
        np.testing.assert_allclose(updates["w"], state.scale * params["w"], rtol=1e-6)
    return scales, state


def test_reduce_on_plateau_factor_after_a_plateau_matches_optax():
    """Improving values keep the scale; `patience` values without improvement multiply it by
    `factor`; the cooldown then ignores values; `min_scale` bounds it. Step by step as optax."""
    params = {"w": jnp.ones((2, 3))}
    values = [5.0, 4.0, 3.0, 3.0, 3.0, 3.0, 3.0, 3.0, 3.0, 3.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0]
    make = dict(factor=0.5, patience=2, cooldown=1, min_scale=0.2)
    scales, state = _run_plateau(contrib.reduce_on_plateau(**make), values, params)
    their_scales, their_state = _run_plateau(optax.contrib.reduce_on_plateau(**make), values, params)
    assert scales == their_scales
    assert_trees_close(state, their_state)
    # By the rule: the plateau starts at the 4th value; 2 values without improvement -> 0.5
    # (5th value), a cooldown of 1 value, then 2 more -> 0.25 (8th), then 0.2 (the floor).
    assert scales[:4] == [1.0, 1.0, 1.0, 1.0]
    assert scales[4] == 0.5 and scales[7] == 0.25 and min(scales) == pytest.approx(0.2)


def test_reduce_on_plateau_accumulates_values_and_tolerances():
    params = {"w": jnp.ones(3)}
    make = dict(factor=0.1, patience=1, accumulation_size=3, rtol=0.0, atol=0.5)
    values = [3.0, 1.0, 2.0, 2.0, 1.8, 1.9, 0.0, 0.1, 0.2]  # averages 2.0, 1.9 (< 2 - 0.5? no), 0.1
    scales, state = _run_plateau(contrib.reduce_on_plateau(**make), values, params)
    their_scales, _ = _run_plateau(optax.contrib.reduce_on_plateau(**make), values, params)
    assert scales == their_scales
    assert scales == pytest.approx([1, 1, 1, 1, 1, 0.1, 0.1, 0.1, 0.1])
    assert float(state.best_value) == pytest.approx(0.1)


def test_reduce_on_plateau_state_dtypes_follow_the_params():
    params = {"low": jnp.ones(2, jnp.bfloat16), "high": jnp.ones(2, jnp.float32)}
    ours, theirs = contrib.reduce_on_plateau().init(params), optax.contrib.reduce_on_plateau().init(params)
    assert_trees_close(ours, theirs)
    assert ours.scale.dtype == jnp.bfloat16 and ours.best_value.dtype == jnp.float32


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"factor": 1.0}, r"Invalid factor: 1.0 \(must be in \(0, 1\)\)"),
        ({"factor": 0.0}, r"Invalid factor: 0.0"),
        ({"rtol": 0.0, "atol": 0.0}, "both are 0"),
        ({"rtol": 1.5}, r"Invalid rtol: 1.5 \(must be in \[0, 1\]\)"),
        ({"atol": -1.0}, r"Invalid atol"),
        ({"accumulation_size": 0}, r"Invalid accumulation_size: 0"),
        ({"cooldown": 1.5}, r"Invalid cooldown: 1.5 \(must be an integer >= 0\)"),
    ],
)
def test_reduce_on_plateau_invalid_hyperparameters(kwargs, message):
    with pytest.raises(ValueError, match=message):
        contrib.reduce_on_plateau(**kwargs)


def test_reduce_on_plateau_needs_a_scalar_value():
    params = {"w": jnp.ones(3)}
    tx = contrib.reduce_on_plateau()
    with pytest.raises(TypeError, match="needs the extra argument `value`"):
        tx.update(params, tx.init(params), params)
    with pytest.raises(ValueError, match="must be a scalar"):
        tx.update(params, tx.init(params), params, value=jnp.ones(2))
    optimizer = modopt.Optimizer(modopt.chain(modopt.sgd(0.1), tx), params)
    with pytest.raises(TypeError, match="needs the extra argument `value`"):
        optimizer.step(params, params)


# --- re-exports -----------------------------------------------------------------------------------


def test_privacy_names_are_reexported_in_contrib():
    assert contrib.dpsgd is modopt.dpsgd
    assert contrib.differentially_private_aggregate is modopt.differentially_private_aggregate
    assert contrib.DifferentiallyPrivateAggregateState is modopt.DifferentiallyPrivateAggregateState
    assert contrib.NormalizeState is modopt.EmptyState
