"""Interoperability with optax and Flax, with optax as the oracle.

- modopt transforms inside optax's combinators, and optax transforms inside modopt's;
- modopt's combinators (`chain`, `named_chain`, `masked`, `partition`) against optax's,
  step by step: the same updates and the same state (leaf values and field names);
- a modopt optimizer as the `tx` of Flax's `TrainState`, eagerly and inside `jax.jit`;
- the `GradientTransformation` protocol accepts both libraries' transforms.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import modopt

RTOL = 1e-5
ATOL = 1e-7
PARAM_ATOL = 1e-6
STEPS = 4


def _params():
    rng = np.random.default_rng(0)
    f = lambda *shape: jnp.asarray(rng.normal(size=shape).astype(np.float32))  # noqa: E731
    return {"w": f(3, 4), "b": f(4), "s": f(), "sub": {"k": f(2, 3, 2), "v": f(5)}}


def _grads(step):
    """Different gradients at every step (the same in every test), some large enough to clip."""
    rng = np.random.default_rng(100 + step)
    scale = 2.0 if step % 2 else 0.3
    return jax.tree_util.tree_map(
        lambda p: jnp.asarray((scale * rng.normal(size=p.shape)).astype(np.float32)), _params()
    )


def _paths_and_leaves(tree):
    """`[(path, leaf)]` of a state: the paths spell the field names, keys and indices."""
    flat, _ = jax.tree_util.tree_flatten_with_path(tree)
    return [(jax.tree_util.keystr(path), leaf) for path, leaf in flat]


def _assert_same_tree(ours, theirs, what, rtol=RTOL, atol=ATOL):
    ours_flat, theirs_flat = _paths_and_leaves(ours), _paths_and_leaves(theirs)
    ours_paths = [p for p, _ in ours_flat]
    theirs_paths = [p for p, _ in theirs_flat]
    assert ours_paths == theirs_paths, f"{what}: paths differ\n  modopt: {ours_paths}\n  optax:  {theirs_paths}"
    for (path, a), (_, b) in zip(ours_flat, theirs_flat):
        a, b = jnp.asarray(a), jnp.asarray(b)
        assert a.shape == b.shape, f"{what}{path}: shape {a.shape} vs {b.shape}"
        assert a.dtype == b.dtype, f"{what}{path}: dtype {a.dtype} vs {b.dtype}"
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol, err_msg=f"{what}{path}")


def _state_field_names(state):
    """The NamedTuple field names met along the state, in order (independent of leaves)."""
    names = []

    def visit(node):
        if isinstance(node, tuple) and hasattr(node, "_fields"):
            names.append(tuple(node._fields))
            for child in node:
                visit(child)
        elif isinstance(node, (tuple, list)):
            for child in node:
                visit(child)
        elif isinstance(node, dict):
            for key in sorted(node, key=str):
                visit(node[key])

    visit(state)
    return names


def _run_both(ours, theirs, steps=STEPS, extra_args=None, jit=False):
    """Runs two transforms side by side from the same params; checks updates and states."""
    params = _params()
    state, ostate = ours.init(params), theirs.init(params)
    _assert_same_tree(state, ostate, "init state")
    assert _state_field_names(state) == _state_field_names(ostate)
    update = jax.jit(ours.update) if jit else ours.update
    oparams = params
    for step in range(steps):
        grads = _grads(step)
        kwargs = extra_args(step) if extra_args else {}
        updates, state = update(grads, state, params, **kwargs)
        oupdates, ostate = theirs.update(grads, ostate, oparams, **kwargs)
        _assert_same_tree(updates, oupdates, f"updates at step {step}")
        _assert_same_tree(state, ostate, f"state at step {step}")
        assert _state_field_names(state) == _state_field_names(ostate)
        params = modopt.apply_updates(params, updates)
        oparams = optax.apply_updates(oparams, oupdates)
    # Parameters are O(1): `p + u` rounds at ~1e-7 absolute.
    _assert_same_tree(params, oparams, "params after training", atol=PARAM_ATOL)
    return params


# --------------------------------------------------------------------------------------------
# (a) modopt transforms inside optax's combinators
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("jit", [False, True])
def test_modopt_inside_optax_chain(jit):
    ours = optax.chain(modopt.clip_by_global_norm(1.0), modopt.adam(1e-2))
    theirs = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(1e-2))
    _run_both(ours, theirs, jit=jit)


def test_modopt_and_optax_mixed_inside_optax_chain():
    ours = optax.chain(modopt.scale_by_adam(b1=0.8), optax.add_decayed_weights(1e-2), modopt.scale(-1e-2))
    theirs = optax.chain(optax.scale_by_adam(b1=0.8), optax.add_decayed_weights(1e-2), optax.scale(-1e-2))
    _run_both(ours, theirs)


def test_modopt_inside_optax_masked_and_partition():
    mask = {"w": True, "b": False, "s": False, "sub": {"k": True, "v": False}}
    _run_both(optax.masked(modopt.adam(1e-2), mask), optax.masked(optax.adam(1e-2), mask))
    labels = {"w": "a", "b": "s", "s": "s", "sub": {"k": "a", "v": "s"}}
    _run_both(
        optax.partition({"a": modopt.adam(1e-2), "s": modopt.sgd(0.1, momentum=0.9)}, labels),
        optax.partition({"a": optax.adam(1e-2), "s": optax.sgd(0.1, momentum=0.9)}, labels),
    )


def test_modopt_with_schedule_inside_optax_chain():
    ours = optax.chain(modopt.clip_by_global_norm(1.0), modopt.adam(modopt.linear_schedule(1e-2, 1e-3, 3)))
    theirs = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(optax.linear_schedule(1e-2, 1e-3, 3)))
    _run_both(ours, theirs, jit=True)


# --------------------------------------------------------------------------------------------
# (b) optax transforms inside modopt's chain
# --------------------------------------------------------------------------------------------


def test_from_optax_inside_modopt_chain():
    ours = modopt.chain(modopt.from_optax(optax.scale_by_adam()), modopt.scale(-1e-2))
    theirs = optax.chain(optax.scale_by_adam(), optax.scale(-1e-2))
    _run_both(ours, theirs)
    _run_both(ours, theirs, jit=True)


def test_raw_optax_transform_inside_modopt_chain():
    # A component that is an optax transform is wrapped automatically.
    ours = modopt.chain(modopt.clip_by_global_norm(1.0), optax.scale_by_rms(), modopt.scale(-1e-2))
    theirs = optax.chain(optax.clip_by_global_norm(1.0), optax.scale_by_rms(), optax.scale(-1e-2))
    _run_both(ours, theirs)


def test_from_optax_is_a_modopt_transform():
    wrapped = modopt.from_optax(optax.sgd(0.1))
    assert isinstance(wrapped, modopt.AbstractTransform)
    # Wrapping a modopt transform returns it unchanged.
    adam = modopt.adam(1e-3)
    assert modopt.from_optax(adam) is adam
    with pytest.raises(TypeError, match="init"):
        modopt.from_optax(object())


def test_extra_args_reach_optax_transforms():
    # scale_by_polyak needs the loss `value`; modopt's own transforms ignore it.
    def value(step):
        return {"value": jnp.asarray(1.0 + 0.5 * step)}

    ours = modopt.chain(
        modopt.clip_by_global_norm(1.0), modopt.from_optax(optax.scale_by_polyak(max_learning_rate=0.5))
    )
    theirs = optax.chain(optax.clip_by_global_norm(1.0), optax.scale_by_polyak(max_learning_rate=0.5))
    _run_both(ours, theirs, extra_args=value)
    _run_both(ours, theirs, extra_args=value, jit=True)
    # Without from_optax, and after an optax transform that takes no extra arguments.
    ours = modopt.chain(optax.scale_by_rms(), optax.scale_by_polyak(), modopt.scale(-1.0))
    theirs = optax.chain(optax.scale_by_rms(), optax.scale_by_polyak(), optax.scale(-1.0))
    _run_both(ours, theirs, extra_args=value)


def test_extra_args_are_passed_unchanged():
    seen = []

    def init(params):
        return optax.EmptyState()

    def update(updates, state, params=None, **extra_args):
        seen.append(sorted(extra_args))
        scale = extra_args["factor"]
        return jax.tree_util.tree_map(lambda g: scale * g, updates), state

    recorder = optax.GradientTransformationExtraArgs(init, update)

    def plain_update(updates, state, params=None):  # takes no extra arguments at all
        return updates, state

    plain = optax.GradientTransformation(init, plain_update)
    tx = modopt.chain(modopt.scale_by_adam(), plain, modopt.from_optax(recorder))
    params = _params()
    state = tx.init(params)
    updates, _ = tx.update(_grads(0), state, params, factor=3.0, other="x")
    assert seen == [["factor", "other"]]
    # The same numbers as optax's chain with the same pieces.
    otx = optax.chain(optax.scale_by_adam(), plain, recorder)
    oupdates, _ = otx.update(_grads(0), otx.init(params), params, factor=3.0, other="x")
    _assert_same_tree(updates, oupdates, "recorder")


# --------------------------------------------------------------------------------------------
# (c) modopt's combinators against optax's, step by step
# --------------------------------------------------------------------------------------------

MASK = {"w": True, "b": False, "s": True, "sub": {"k": True, "v": False}}
PREFIX_MASK = {"w": True, "b": False, "s": False, "sub": True}
LABELS = {"w": "adam", "b": "sgd", "s": "frozen", "sub": {"k": "adam", "v": "sgd"}}


def _matrix_mask(params):
    return jax.tree_util.tree_map(lambda p: p.ndim >= 2, params)


def _labels_by_rank(params):
    return jax.tree_util.tree_map(lambda p: "adam" if p.ndim >= 2 else ("frozen" if p.ndim == 0 else "sgd"), params)


COMBINATOR_CASES = {
    "chain": lambda lib: lib.chain(lib.clip_by_global_norm(1.0), lib.scale_by_adam(), lib.scale(-1e-2)),
    "chain_nested": lambda lib: lib.chain(
        lib.chain(lib.clip(0.5), lib.trace(0.9)), lib.chain(lib.add_decayed_weights(1e-3), lib.scale(-0.1))
    ),
    "named_chain": lambda lib: lib.named_chain(
        ("clip", lib.clip_by_global_norm(0.5)), ("adam", lib.scale_by_adam()), ("lr", lib.scale(-1e-2))
    ),
    "masked_tree": lambda lib: lib.masked(lib.adam(1e-2), MASK),
    "masked_prefix": lambda lib: lib.masked(lib.chain(lib.trace(0.9), lib.scale(-0.1)), PREFIX_MASK),
    "masked_callable": lambda lib: lib.masked(lib.sgd(0.1, momentum=0.9), _matrix_mask),
    "masked_in_chain": lambda lib: lib.chain(
        lib.clip_by_global_norm(1.0), lib.masked(lib.add_decayed_weights(0.1), _matrix_mask), lib.adam(1e-2)
    ),
    "partition_tree": lambda lib: lib.partition(
        {"adam": lib.adam(1e-2), "sgd": lib.sgd(0.1, momentum=0.5), "frozen": lib.set_to_zero()}, LABELS
    ),
    "partition_callable": lambda lib: lib.partition(
        {"adam": lib.adam(1e-2), "sgd": lib.sgd(0.1), "frozen": lib.set_to_zero()}, _labels_by_rank
    ),
    "multi_transform": lambda lib: lib.multi_transform(
        {"adam": lib.chain(lib.clip(1.0), lib.adam(1e-2)), "sgd": lib.sgd(0.1), "frozen": lib.set_to_zero()},
        LABELS,
    ),
    "partition_unused_label": lambda lib: lib.partition(
        {"adam": lib.adam(1e-2), "sgd": lib.sgd(0.1), "frozen": lib.set_to_zero(), "unused": lib.sgd(1.0)},
        LABELS,
    ),
    "partition_nested": lambda lib: lib.chain(
        lib.clip_by_global_norm(2.0),
        lib.partition(
            {"adam": lib.masked(lib.adam(1e-2), _matrix_mask), "sgd": lib.sgd(0.1), "frozen": lib.set_to_zero()},
            _labels_by_rank,
        ),
    ),
}


@pytest.mark.parametrize("name", sorted(COMBINATOR_CASES))
def test_combinator_parity(name):
    build = COMBINATOR_CASES[name]
    _run_both(build(modopt), build(optax))


@pytest.mark.parametrize("name", ["named_chain", "masked_callable", "partition_tree"])
def test_combinator_parity_under_jit(name):
    build = COMBINATOR_CASES[name]
    _run_both(build(modopt), build(optax), jit=True)


def test_named_chain_state_is_keyed_by_name():
    tx = modopt.named_chain(("clip", modopt.clip_by_global_norm(1.0)), ("adam", modopt.adam(1e-2)))
    state = tx.init(_params())
    assert list(state.keys()) == ["clip", "adam"]
    ostate = optax.named_chain(("clip", optax.clip_by_global_norm(1.0)), ("adam", optax.adam(1e-2))).init(_params())
    assert list(state.keys()) == list(ostate.keys())


def test_masked_leaves_pass_through_unchanged():
    tx = modopt.masked(modopt.scale(-0.5), MASK)
    grads = _grads(1)
    updates, _ = tx.update(grads, tx.init(_params()))
    np.testing.assert_array_equal(updates["b"], grads["b"])
    np.testing.assert_array_equal(updates["sub"]["v"], grads["sub"]["v"])
    np.testing.assert_allclose(updates["w"], -0.5 * grads["w"], rtol=1e-6)


def test_partition_label_without_transform_is_a_clear_error():
    labels = {"w": "adam", "b": "sgd", "s": "missing", "sub": {"k": "adam", "v": "sgd"}}
    tx = modopt.partition({"adam": modopt.adam(1e-2), "sgd": modopt.sgd(0.1)}, labels)
    with pytest.raises(ValueError, match=r"missing.*no transform|no transform.*missing"):
        tx.init(_params())
    # optax refuses it too.
    with pytest.raises(ValueError):
        optax.partition({"adam": optax.adam(1e-2), "sgd": optax.sgd(0.1)}, labels).init(_params())
    # The same through a callable.
    tx = modopt.multi_transform({"adam": modopt.adam(1e-2)}, _labels_by_rank)
    with pytest.raises(ValueError, match="no transform"):
        tx.init(_params())


# --------------------------------------------------------------------------------------------
# (d) Flax TrainState
# --------------------------------------------------------------------------------------------


def _apply_fn(variables, x):
    return x @ variables["params"]["w"]


def _flax_pair(tx_modopt, tx_optax):
    from flax.training import train_state

    params = _params()
    ours = train_state.TrainState.create(apply_fn=_apply_fn, params=params, tx=tx_modopt)
    theirs = train_state.TrainState.create(apply_fn=_apply_fn, params=params, tx=tx_optax)
    return ours, theirs


def _check_train_states(ours, theirs, what):
    assert int(ours.step) == int(theirs.step)
    _assert_same_tree(ours.params, theirs.params, f"{what} params", atol=PARAM_ATOL)
    _assert_same_tree(ours.opt_state, theirs.opt_state, f"{what} opt_state")


def test_flax_train_state_eager():
    ours, theirs = _flax_pair(
        modopt.chain(modopt.clip_by_global_norm(1.0), modopt.adamw(1e-2, weight_decay=1e-2)),
        optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-2, weight_decay=1e-2)),
    )
    _check_train_states(ours, theirs, "create")
    for step in range(STEPS):
        ours = ours.apply_gradients(grads=_grads(step))
        theirs = theirs.apply_gradients(grads=_grads(step))
        _check_train_states(ours, theirs, f"step {step}")


def test_flax_train_state_inside_jit():
    traces = []

    @jax.jit
    def train_step(state, grads):
        traces.append(None)
        return state.apply_gradients(grads=grads)

    ours, theirs = _flax_pair(
        modopt.adam(modopt.warmup_cosine_decay_schedule(0.0, 1e-2, 2, 10)),
        optax.adam(optax.warmup_cosine_decay_schedule(0.0, 1e-2, 2, 10)),
    )
    for step in range(STEPS):
        ours = train_step(ours, _grads(step))
        theirs = theirs.apply_gradients(grads=_grads(step))
        _check_train_states(ours, theirs, f"jitted step {step}")
    n_traces = len(traces)
    # The modopt run compiled once (the optax run above was eager).
    assert n_traces == 1, n_traces
    # An equal, freshly built optimizer hashes and compares equal: no new compilation.
    again, again_theirs = _flax_pair(
        modopt.adam(modopt.warmup_cosine_decay_schedule(0.0, 1e-2, 2, 10)),
        optax.adam(optax.warmup_cosine_decay_schedule(0.0, 1e-2, 2, 10)),
    )
    again = train_step(again, _grads(0))
    assert len(traces) == 1
    _check_train_states(again, again_theirs.apply_gradients(grads=_grads(0)), "rebuilt optimizer")


def test_flax_train_state_matches_optax_under_jit():
    @jax.jit
    def train_step(state, grads):
        return state.apply_gradients(grads=grads)

    ours, theirs = _flax_pair(modopt.sgd(0.1, momentum=0.9, nesterov=True), optax.sgd(0.1, momentum=0.9, nesterov=True))
    for step in range(STEPS):
        ours = train_step(ours, _grads(step))
        theirs = train_step(theirs, _grads(step))
        _check_train_states(ours, theirs, f"jitted step {step}")


# --------------------------------------------------------------------------------------------
# (e) The protocol
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "tx",
    [
        modopt.adam(1e-3),
        modopt.chain(modopt.clip(1.0), modopt.sgd(0.1)),
        modopt.from_optax(optax.adam(1e-3)),
        optax.adam(1e-3),
        optax.scale_by_polyak(),
        optax.GradientTransformation(lambda p: (), lambda u, s, p=None: (u, s)),
    ],
    ids=["modopt.adam", "modopt.chain", "from_optax", "optax.adam", "optax.polyak", "optax.raw"],
)
def test_is_a_gradient_transformation(tx):
    assert isinstance(tx, modopt.GradientTransformation)


def test_modopt_transforms_take_extra_args():
    assert isinstance(modopt.adam(1e-3), modopt.GradientTransformationExtraArgs)
    tx = modopt.adam(1e-3)
    params = _params()
    updates, _ = tx.update(_grads(0), tx.init(params), params, value=jnp.asarray(1.0), unused="x")
    plain, _ = tx.update(_grads(0), tx.init(params), params)
    _assert_same_tree(updates, plain, "extra args ignored")


@pytest.mark.parametrize("thing", [object(), 1.0, "adam", lambda x: x])
def test_non_transforms_are_not_gradient_transformations(thing):
    assert not isinstance(thing, modopt.GradientTransformation)
