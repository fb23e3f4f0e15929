"""The rest of optax 0.2.8's top level, its `transforms` and `schedules` namespaces, and
`experimental.aggregating`, against optax 0.2.8 (what the registry's shared checks do not
cover: functions, type aliases, namespaces, extra behaviour), and the fixes for optax's own
tests run on modopt's objects: dtypes and keys through `inject_hyperparams`, callable masks,
`freeze`'s state, learning-rate annotations, `power_iteration` on pytrees."""

from __future__ import annotations

import dataclasses
import inspect
import types
import warnings
from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import optax.schedules
import optax.transforms
import pytest
from optax._src import base as optax_base
from optax.experimental import aggregating as optax_aggregating

import modopt
from modopt.experimental import aggregating


def assert_trees_equal(ours, theirs, rtol=0.0, atol=0.0):
    ours_flat, theirs_flat = (
        jax.tree_util.tree_flatten_with_path(ours)[0],
        jax.tree_util.tree_flatten_with_path(theirs)[0],
    )
    assert [jax.tree_util.keystr(p) for p, _ in ours_flat] == [
        jax.tree_util.keystr(p) for p, _ in theirs_flat
    ]
    for (path, a), (_, b) in zip(ours_flat, theirs_flat):
        assert jnp.shape(a) == jnp.shape(b) and jnp.result_type(a) == jnp.result_type(b), (
            jax.tree_util.keystr(path)
        )
        np.testing.assert_allclose(np.asarray(a, np.float64), np.asarray(b, np.float64), rtol=rtol, atol=atol)


# --------------------------------------------------------------------------------------------
# Namespaces and type aliases
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("namespace", ["transforms", "schedules"])
def test_namespaces_export_what_optax_exports(namespace):
    theirs, ours = getattr(optax, namespace), getattr(modopt, namespace)
    missing = sorted(n for n in dir(theirs) if not n.startswith("_") and not hasattr(ours, n))
    assert not missing
    listed = set(dir(ours))
    assert all(n in listed for n in dir(theirs) if not n.startswith("_"))


def test_namespace_combinators_are_the_combinators():
    """Re-exported, not copied: one object per name."""
    assert modopt.transforms.chain is modopt.chain is modopt.combinators.chain
    assert modopt.transforms.MaskedNode is modopt.combinators.MaskedNode
    assert modopt.transforms.freeze is modopt.freeze
    assert modopt.schedules.inject_hyperparams is modopt.inject_hyperparams
    assert modopt.schedules.InjectStatefulHyperparamsState is modopt.InjectStatefulHyperparamsState
    from modopt.transforms import ConditionFn, ShouldSkipUpdateFunction  # noqa: F401
    from modopt.schedules import inject_stateful_hyperparams  # noqa: F401

    with pytest.raises(AttributeError, match="no attribute 'adamm'"):
        modopt.transforms.adamm  # noqa: B018


def test_top_level_has_the_names_of_this_family():
    for name in [
        "signum",
        "scale_by_distance_over_gradients",
        "warmup_constant_schedule",
        "WrappedSchedule",
        "inject_stateful_hyperparams",
        "InjectStatefulHyperparamsState",
        "value_and_grad_from_state",
        "MultiTransformState",
        "MaskOrFn",
    ]:
        assert hasattr(modopt, name), name
    assert modopt.MultiTransformState is modopt.PartitionState
    assert isinstance(modopt.experimental.aggregating, types.ModuleType)


def test_type_aliases_equal_optax_aliases():
    """Built of the same members, they compare equal (`typing.Union` compares members)."""
    assert modopt.ScalarOrSchedule == optax_base.ScalarOrSchedule
    assert modopt.Schedule == optax_base.Schedule
    assert modopt.MaskOrFn == optax.MaskOrFn


def _learning_rate_annotation(fn):
    try:
        parameter = inspect.signature(fn).parameters.get("learning_rate")
    except (TypeError, ValueError):
        return None
    return None if parameter is None else parameter.annotation


@pytest.mark.parametrize("namespace", ["", "contrib"])
def test_learning_rate_annotated_as_optax_where_optax_annotates_a_schedule(namespace):
    """optax's contrib tests run a schedule through an optimizer whose `learning_rate` is
    annotated `ScalarOrSchedule` or `Schedule`: modopt's constructors (classes and functions)
    annotate theirs so too, with the alias itself (not the string `from __future__ import
    annotations` leaves)."""
    theirs_ns = getattr(optax, namespace) if namespace else optax
    ours_ns = getattr(modopt, namespace) if namespace else modopt
    accepted = (optax_base.ScalarOrSchedule, optax_base.Schedule)
    checked = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        for name in dir(theirs_ns):
            theirs, ours = getattr(theirs_ns, name), getattr(ours_ns, name, None)
            if name.startswith("_") or ours is None or not callable(theirs):
                continue
            if _learning_rate_annotation(theirs) in accepted:
                checked.append(name)
                assert _learning_rate_annotation(ours) in accepted, name
    assert {"adam", "sgd", "nadam", "nadamw", "signum"} <= set(checked) or namespace


# --------------------------------------------------------------------------------------------
# unitwise_norm, unitwise_clip
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(), (5,), (1, 5, 1), (3, 4), (2, 3, 4), (2, 2, 3, 4), (1, 2, 2, 3, 4)])
def test_unitwise_norm_equals_optax(shape):
    x = jax.random.normal(jax.random.key(1), shape)
    np.testing.assert_array_equal(modopt.unitwise_norm(x), optax.transforms.unitwise_norm(x))
    if len(shape) >= 2:
        np.testing.assert_array_equal(
            modopt.unitwise_norm(x, axis=1), optax.transforms.unitwise_norm(x, axis=1)
        )


def test_unitwise_norm_needs_axis_beyond_rank_5():
    with pytest.raises(ValueError, match="pass `axis=`"):
        modopt.unitwise_norm(jnp.ones((2, 2, 2, 2, 2, 2)))
    np.testing.assert_allclose(modopt.unitwise_norm(jnp.ones((2, 2, 2, 2, 2, 2)), axis=(0, 1)), 2.0)


def test_unitwise_clip_equals_optax_and_checks_shapes():
    g = jax.random.normal(jax.random.key(2), (4, 3))
    norms = modopt.unitwise_norm(g)
    max_norm = jnp.full_like(norms, 1.0)
    np.testing.assert_array_equal(
        modopt.unitwise_clip(norms, max_norm, g), optax.transforms.unitwise_clip(norms, max_norm, g)
    )
    # Units above the bound end with norm `max_norm`, the others are unchanged.
    clipped = modopt.unitwise_clip(norms, max_norm, g)
    np.testing.assert_allclose(modopt.unitwise_norm(clipped), jnp.minimum(norms, 1.0), rtol=1e-6)
    with pytest.raises(ValueError, match="same shape"):
        modopt.unitwise_clip(norms, jnp.ones(3), g)


# --------------------------------------------------------------------------------------------
# value_and_grad_from_state
# --------------------------------------------------------------------------------------------


def _quadratic(x):
    return jnp.sum(jnp.arange(1.0, 4.0) * (x - 1.0) ** 2)


@pytest.mark.parametrize("library", [modopt, optax], ids=["modopt_state", "optax_state"])
def test_value_and_grad_from_state_on_lbfgs_states(library):
    """With modopt's and with optax's own lbfgs state, modopt's function gives optax's function's
    results, and the trajectory is that of `jax.value_and_grad`."""
    tx = library.lbfgs()
    ours, theirs = modopt.value_and_grad_from_state(_quadratic), optax.value_and_grad_from_state(_quadratic)

    @jax.jit
    def update(grad, state, params, value):
        updates, state = tx.update(grad, state, params, value=value, grad=grad, value_fn=_quadratic)
        return library.apply_updates(params, updates), state

    params = jnp.array([3.0, 2.0, -1.0])
    state = tx.init(params)
    direct_params, direct_state = params, state
    for _ in range(4):
        value, grad = ours(params, state=state)
        their_value, their_grad = theirs(params, state=state)
        np.testing.assert_array_equal(value, their_value)
        np.testing.assert_array_equal(grad, their_grad)
        np.testing.assert_allclose(grad, jax.grad(_quadratic)(params), rtol=1e-6)
        params, state = update(grad, state, params, value)
        # The same step from `jax.value_and_grad`.
        v, g = jax.value_and_grad(_quadratic)(direct_params)
        direct_params, direct_state = update(g, direct_state, direct_params, v)
        np.testing.assert_allclose(params, direct_params, rtol=1e-6)


def test_value_and_grad_from_state_with_backtracking_store_grad_and_jit():
    tx = modopt.chain(modopt.sgd(1.0), modopt.scale_by_backtracking_linesearch(15, store_grad=True))
    value_and_grad = jax.jit(modopt.value_and_grad_from_state(_quadratic))
    params = jnp.array([1.0, 2.0, 3.0])
    state = tx.init(params)
    value, grad = value_and_grad(params, state=state)  # the stored value is inf: computed
    np.testing.assert_allclose(value, _quadratic(params))
    updates, state = tx.update(grad, state, params, value=value, grad=grad, value_fn=_quadratic)
    params = modopt.apply_updates(params, updates)
    # Now taken from the state, where the line search evaluated it.
    stored = modopt.tree.get(state, "value")
    value, grad = value_and_grad(params, state=state)
    np.testing.assert_array_equal(value, stored)
    np.testing.assert_allclose(value, _quadratic(params), rtol=1e-6)
    np.testing.assert_allclose(grad, jax.grad(_quadratic)(params), rtol=1e-5)


def test_value_and_grad_from_state_says_what_is_missing():
    tx = modopt.chain(modopt.sgd(1.0), modopt.scale_by_backtracking_linesearch(15))  # store_grad=False
    state = tx.init(jnp.ones(3))
    with pytest.raises(ValueError, match="store_grad=True"):
        modopt.value_and_grad_from_state(_quadratic)(jnp.ones(3), state=state)
    with pytest.raises(ValueError, match="no value"):
        modopt.value_and_grad_from_state(_quadratic)(jnp.ones(3), state=modopt.adam(0.1).init(jnp.ones(3)))


class _Regressor(eqx.Module):
    linear: eqx.nn.Linear
    calls: jax.Array  # an integer leaf: not trained
    scale: jax.Array  # a float leaf kept out of training by `wrt`

    def __call__(self, x):
        return self.scale * self.linear(x)


def test_value_and_grad_from_state_with_an_optimizer_holding_lbfgs():
    """`value_and_grad(model, x, y, state=optimizer)`: the loss of the model, the gradient of its
    trained leaves as `Optimizer.step` takes it; the steps are those of the pure transform on
    the trained leaves with `jax.value_and_grad`."""
    x = jax.random.normal(jax.random.key(0), (16, 3))
    y = x @ jnp.array([[1.0], [-2.0], [0.5]])
    model = _Regressor(eqx.nn.Linear(3, 1, key=jax.random.key(1)), jnp.array(0), jnp.array(1.5))

    def loss(model, x, y):
        return jnp.mean((jax.vmap(model)(x) - y) ** 2)

    wrt = _Regressor(linear=True, calls=False, scale=False)
    optimizer = modopt.Optimizer(modopt.lbfgs(), model, wrt=wrt)
    value_and_grad = modopt.value_and_grad_from_state(loss)

    @eqx.filter_jit
    def step(model, optimizer):
        value, grads = value_and_grad(model, x, y, state=optimizer)
        model, optimizer = optimizer.step(
            model, grads, value=value, grad=grads, value_fn=lambda m: loss(m, x, y)
        )
        return model, optimizer, value

    trained, rest = eqx.partition(model, wrt)
    pure = modopt.lbfgs()

    def params_loss(p):
        return loss(eqx.combine(p, rest), x, y)

    @eqx.filter_jit
    def pure_step(params, state):
        v, g = jax.value_and_grad(params_loss)(params)
        u, state = pure.update(g, state, params, value=v, grad=g, value_fn=params_loss)
        return modopt.apply_updates(params, u), state, v

    pure_params, pure_state = trained, pure.init(trained)
    for _ in range(5):
        model, optimizer, value = step(model, optimizer)
        pure_params, pure_state, v = pure_step(pure_params, pure_state)
        np.testing.assert_allclose(value, v, rtol=1e-5, atol=1e-9)
        assert_trees_equal(eqx.filter(model, wrt), pure_params, rtol=1e-5, atol=1e-6)
    assert float(model.scale) == 1.5 and int(model.calls) == 0
    assert float(loss(model, x, y)) < 0.1 * float(loss(eqx.combine(trained, rest), x, y))


# --------------------------------------------------------------------------------------------
# Stateful schedules and inject_stateful_hyperparams
# --------------------------------------------------------------------------------------------


class _TotalState(NamedTuple):
    total: jax.Array


class _Total:
    """A stateful schedule reading an extra argument: the sum of `addendum` so far."""

    def init(self):
        return _TotalState(jnp.zeros([], jnp.float32))

    def update(self, state, **extra_args):
        return _TotalState(state.total + extra_args["addendum"])

    def __call__(self, state, **extra_args):
        return state.total


def test_wrapped_schedule_equals_optax():
    schedule = modopt.linear_schedule(0.5, 0.1, 6)
    ours, theirs = (
        modopt.WrappedSchedule(schedule),
        optax.schedules.WrappedSchedule(optax.linear_schedule(0.5, 0.1, 6)),
    )
    state, their_state = ours.init(), theirs.init()
    for _ in range(8):
        np.testing.assert_array_equal(ours(state), theirs(their_state))
        np.testing.assert_array_equal(state.count, their_state.count)
        state, their_state = ours.update(state, loss=1.0), theirs.update(their_state, loss=1.0)
    assert isinstance(ours, modopt.StatefulSchedule) and isinstance(_Total(), modopt.StatefulSchedule)
    assert not isinstance(schedule, modopt.StatefulSchedule)


@pytest.mark.parametrize("maker", ["inject_hyperparams", "inject_stateful_hyperparams"])
def test_stateful_schedule_with_extra_args_equals_optax(maker):
    """A schedule reading extra arguments, through `inject_hyperparams` (which then keeps
    optax's four-field state) and `inject_stateful_hyperparams`, jitted, as optax."""
    grads = params = (jnp.ones(3), jnp.full((2,), 2.0))
    schedule = _Total()
    ours = getattr(modopt, maker)(modopt.scale)(step_size=schedule)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        theirs = getattr(optax, maker)(optax.scale)(step_size=schedule)
    assert isinstance(ours, modopt.InjectStatefulHyperparams)
    state, their_state = jax.jit(ours.init)(params), jax.jit(theirs.init)(params)
    assert type(state).__name__ == type(their_state).__name__ == "InjectStatefulHyperparamsState"
    update, their_update = jax.jit(ours.update), jax.jit(theirs.update)  # each compiled once
    for k in range(3):
        extra = {"addendum": jnp.float32(0.3 * (k + 1))}
        updates, state = update(grads, state, params, **extra)
        their_updates, their_state = their_update(grads, their_state, params, **extra)
        assert_trees_equal(updates, their_updates)
        assert_trees_equal(state, their_state)
    np.testing.assert_allclose(state.hyperparams_states["step_size"].total, 1.8, rtol=1e-6)


def test_inject_stateful_hyperparams_with_an_optax_factory_and_numbers():
    params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
    ours = modopt.inject_stateful_hyperparams(optax.sgd)(
        learning_rate=optax.linear_schedule(0.1, 0.01, 4), momentum=0.9
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        theirs = optax.inject_stateful_hyperparams(optax.sgd)(
            learning_rate=optax.linear_schedule(0.1, 0.01, 4), momentum=0.9
        )
    state, their_state = ours.init(params), theirs.init(params)
    for k in range(5):
        grads = jax.tree.map(lambda p: jnp.cos(p + k), params)
        updates, state = ours.update(grads, state, params)
        their_updates, their_state = theirs.update(grads, their_state, params)
        assert_trees_equal(updates, their_updates, rtol=1e-6)
    assert_trees_equal(state, their_state, rtol=1e-6)
    # The numbers live in the state, as with inject_hyperparams: `Optimizer.set` writes there.
    optimizer = modopt.Optimizer(
        modopt.inject_stateful_hyperparams(modopt.sgd)(learning_rate=0.1, momentum=0.9), params
    )
    assert float(optimizer.set(momentum=0.5).state.hyperparams["momentum"]) == 0.5
    assert set(optimizer.state.hyperparams_states) == set()


# --------------------------------------------------------------------------------------------
# inject_hyperparams: dtypes and keys as values (optax's inject_hyperparams around modopt's)
# --------------------------------------------------------------------------------------------

PARAMS = [jnp.ones((2, 3)), jnp.full((4,), -0.5)]


def _run(tx, steps=2):
    # One jitted update for every step: a `jax.jit` made anew each step compiled it again.
    update = jax.jit(tx.update)
    state = jax.jit(tx.init)(PARAMS)
    for k in range(steps):
        grads = jax.tree.map(lambda p: jnp.sin(p + k), PARAMS)
        updates, state = update(grads, state, PARAMS)
    return updates, state


def test_optax_inject_hyperparams_passes_a_dtype_as_an_array():
    """optax calls `jnp.bfloat16` as a schedule and passes the factory its value, a traced
    array: modopt takes an array where a dtype goes as its dtype. The steps are those of
    modopt's `inject_hyperparams`, which passes the dtype itself (both hold `b1` as an array
    in the state)."""
    updates, state = _run(optax.inject_hyperparams(modopt.scale_by_adam)(b1=0.9, mu_dtype=jnp.bfloat16))
    direct_updates, direct_state = _run(
        modopt.inject_hyperparams(modopt.scale_by_adam)(b1=0.9, mu_dtype=jnp.bfloat16)
    )
    assert all(m.dtype == jnp.bfloat16 for m in state.inner_state.mu)
    assert_trees_equal(updates, direct_updates)
    assert_trees_equal(state.inner_state, direct_state.inner_state)
    # A dtype default of the factory (adafactor's `dtype_momentum=jnp.float32`) too.
    injected = optax.inject_hyperparams(modopt.adafactor, static_args="min_dim_size_to_factor")(momentum=0.9)
    direct = modopt.inject_hyperparams(modopt.adafactor, static_args="min_dim_size_to_factor")(momentum=0.9)
    assert_trees_equal(_run(injected)[0], _run(direct)[0])
    assert modopt.fields.canonical_dtype(jnp.zeros(2, jnp.bfloat16)) == jnp.bfloat16


def test_modopt_inject_hyperparams_passes_dtypes_through():
    tx = modopt.inject_hyperparams(modopt.adafactor, static_args="min_dim_size_to_factor")(momentum=0.9)
    _, state = _run(tx)
    assert "dtype_momentum" not in state.hyperparams and "momentum" in state.hyperparams
    tx = modopt.inject_hyperparams(modopt.scale_by_adam)(mu_dtype=jnp.bfloat16)
    assert all(m.dtype == jnp.bfloat16 for m in _run(tx)[1].inner_state.mu)


@pytest.mark.parametrize(
    "key",
    [0, jax.random.PRNGKey(3), jax.random.key(3)],
    ids=["seed", "raw_uint32_key", "typed_key"],
)
@pytest.mark.parametrize(
    "injector", [optax.inject_hyperparams, modopt.inject_hyperparams], ids=["optax", "modopt"]
)
def test_inject_hyperparams_passes_a_key_traced(injector, key):
    """A seed or a key reaches the factory as a traced array under `jit`; the noise is that of
    the factory called with the key directly."""
    tx = injector(modopt.noisy_sgd)(learning_rate=0.1, eta=0.01, key=key)
    updates, _ = _run(tx)
    direct, _ = _run(modopt.noisy_sgd(learning_rate=0.1, eta=0.01, key=key))
    assert_trees_equal(updates, direct)


# --------------------------------------------------------------------------------------------
# Masks: callable pytrees shaped like the model are trees
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass
class _CallableTree:
    w: object

    def __call__(self, x):
        return self.w.dot(x)


jax.tree_util.register_pytree_node(_CallableTree, lambda m: ((m.w,), None), lambda _, c: _CallableTree(*c))


class _Model(eqx.Module):
    weight: jax.Array
    bias: jax.Array

    def __call__(self, x):
        return self.weight @ x + self.bias


def test_callable_pytree_and_equinox_module_masks_are_trees():
    """optax's rule: a mask is a function when every leaf is callable. A callable pytree or an
    Equinox model used as a mask (its leaves bools) is a tree, not called."""
    model = _CallableTree(jnp.array([1.0, 2.0, 3.0]))
    ours, theirs = (
        modopt.masked(modopt.sgd(0.1), _CallableTree(False)),
        optax.masked(optax.sgd(0.1), _CallableTree(False)),
    )
    updates, _ = ours.update(model, ours.init(model), model)
    their_updates, _ = theirs.update(model, theirs.init(model), model)
    np.testing.assert_array_equal(updates.w, their_updates.w)
    np.testing.assert_array_equal(updates.w, model.w)  # masked out: passed through

    net = _Model(jnp.ones((2, 2)), jnp.ones(2))
    mask = _Model(True, False)  # an Equinox module shaped like the model, bools for leaves
    tx = modopt.add_decayed_weights(0.5, mask=mask)
    updates, _ = tx.update(jax.tree.map(jnp.zeros_like, net), tx.init(net), net)
    np.testing.assert_array_equal(updates.weight, 0.5) and np.testing.assert_array_equal(updates.bias, 0.0)
    # A function stays a function, also an Equinox module whose leaves are functions.
    assert modopt._core.fields._is_function(lambda p: p) and modopt._core.fields._is_function(modopt.weight_decay_mask)
    assert not modopt._core.fields._is_function(mask) and not modopt._core.fields._is_function(_CallableTree(False))


# --------------------------------------------------------------------------------------------
# freeze and selective_transform: optax's state structure
# --------------------------------------------------------------------------------------------

NESTED = {
    "layer1": {"w": jnp.ones((2, 2)), "b": jnp.ones(2)},
    "layer2": {"w": jnp.full((2, 2), 2.0)},
    "misc": jnp.ones(()),
}
FREEZE_MASKS = {
    "bool": True,
    "array_bool": jnp.array(True),
    "prefix": {"layer1": True, "layer2": False, "misc": False},
    "full": {"layer1": {"w": True, "b": False}, "layer2": {"w": False}, "misc": True},
    "array_leaves": {"layer1": jnp.array(True), "layer2": jnp.array(False), "misc": jnp.array(False)},
}


def _structure(tree):
    """Paths, class names and field names: the structure with classes named, not compared by
    identity (modopt's state classes are its own)."""
    leaves = jax.tree_util.tree_flatten_with_path(tree, is_leaf=lambda x: x is None)[0]
    names = []

    def visit(node):
        if isinstance(node, tuple) and hasattr(node, "_fields"):
            names.append((type(node).__name__, node._fields))
            for child in node:
                visit(child)
        elif isinstance(node, (tuple, list)):
            for child in node:
                visit(child)
        elif isinstance(node, dict):
            for key in sorted(node):
                visit(node[key])

    visit(tree)
    return [jax.tree_util.keystr(p) for p, _ in leaves], names


@pytest.mark.parametrize("mask", list(FREEZE_MASKS.values()), ids=list(FREEZE_MASKS))
def test_freeze_state_and_updates_are_optax(mask):
    pairs = [
        (modopt.freeze(mask), optax.transforms.freeze(mask)),
        (
            modopt.chain(modopt.adam(0.1), modopt.freeze(mask)),
            optax.chain(optax.adam(0.1), optax.transforms.freeze(mask)),
        ),
        (
            modopt.selective_transform(modopt.sgd(0.1, momentum=0.9), freeze_mask=mask),
            optax.transforms.selective_transform(optax.sgd(0.1, momentum=0.9), freeze_mask=mask),
        ),
    ]
    grads = jax.tree.map(lambda p: p + 0.5, NESTED)
    for ours, theirs in pairs:
        state, their_state = ours.init(NESTED), theirs.init(NESTED)
        assert _structure(state) == _structure(their_state)
        for _ in range(2):
            updates, state = ours.update(grads, state, NESTED)
            their_updates, their_state = theirs.update(grads, their_state, NESTED)
            assert_trees_equal(updates, their_updates, rtol=1e-6)
            assert _structure(state) == _structure(their_state)
            assert_trees_equal(*[jax.tree.leaves(s) for s in (state, their_state)], rtol=1e-6)


def test_freeze_state_reads_as_optax_state():
    """Code ported from optax that inspects `freeze`'s state: its classes are modopt's own (a
    library that does not import optax cannot share optax's), with optax's names and fields, so
    equality, fields and `optax.tree.get` work as on optax's state. A tree-structure comparison
    with an optax-built state (chex's `assert_trees_all_equal`) compares the classes themselves:
    it fails for every modopt state, as in optax's own `test_freeze_updates` when optax's
    `EmptyState` is not swapped for modopt's."""
    for mask in FREEZE_MASKS.values():
        ours, theirs = modopt.freeze(mask).init(NESTED), optax.transforms.freeze(mask).init(NESTED)
        assert ours == theirs and ours.inner_state == optax.EmptyState()
        assert (type(ours).__name__, ours._fields) == (type(theirs).__name__, theirs._fields)
        assert type(ours.inner_state).__name__ == "EmptyState" and ours.inner_state._fields == ()
        assert optax.tree.get(ours, "inner_state") == optax.tree.get(theirs, "inner_state")


def test_selective_transform_takes_a_mask_function():
    """A departure: optax 0.2.8 maps its label function over a function `freeze_mask`, which
    freezes everything; modopt calls it on the parameters."""
    mask_fn = lambda params: jax.tree.map(lambda x: x.ndim > 1, params)  # noqa: E731
    tx = modopt.selective_transform(modopt.sgd(0.1), freeze_mask=mask_fn)
    updates, _ = tx.update(NESTED, tx.init(NESTED), NESTED)
    np.testing.assert_array_equal(updates["layer1"]["w"], 0.0)
    np.testing.assert_allclose(updates["layer1"]["b"], -0.1)


# --------------------------------------------------------------------------------------------
# power_iteration on pytrees
# --------------------------------------------------------------------------------------------


def test_power_iteration_on_a_pytree_operator_equals_optax():
    """A matrix-vector product on a dict of arrays, with a pytree `v0`: optax 0.2.8's
    eigenpair (modopt returns it as `(eigenvector, eigenvalue)`, the seeds' order)."""
    a = jnp.diag(jnp.array([4.0, 1.0, 0.5]))
    b = jnp.array([[2.0, 0.5], [0.5, 1.0]])

    def matvec(v):
        return {"a": a @ v["a"], "b": b @ v["b"]}

    v0 = {"a": jnp.ones(3), "b": jnp.ones(2)}
    vector, value = modopt.power_iteration(matvec, v0=v0, num_iters=200)
    their_value, their_vector = optax.power_iteration(matvec, v0=v0, num_iters=200)
    np.testing.assert_allclose(value, their_value, rtol=1e-5)
    np.testing.assert_allclose(value, 4.0, rtol=1e-5)
    assert jax.tree.structure(vector) == jax.tree.structure(v0)
    for ours, theirs in zip(jax.tree.leaves(vector), jax.tree.leaves(their_vector)):
        np.testing.assert_allclose(jnp.abs(ours), jnp.abs(theirs), atol=1e-4)


# --------------------------------------------------------------------------------------------
# experimental.aggregating
# --------------------------------------------------------------------------------------------


def _per_element(k, params, n=4):
    return jax.tree.map(lambda p: jnp.stack([jnp.cos(p * (i + 1) + k) for i in range(n)]), params)


AGG_PARAMS = {"w": jnp.linspace(-1.0, 1.0, 6).reshape(2, 3), "b": jnp.array([0.5, -0.5])}


@pytest.mark.parametrize(
    "build",
    [
        lambda lib: lib.add_mean_variance_to_opt(_sgd(lib), ema_decay=0.9, accumulation_steps=2),
        lambda lib: lib.add_mean_variance_to_opt(_sgd(lib), ema_decay=0.0, per_elt_axis=0),
        lambda lib: lib.process(_identity(lib), lib.average_incrementally_updates(0, 3), _sgd(lib)),
        lambda lib: lib.process(_identity(lib), lib.average_per_element_updates(), _sgd(lib)),
    ],
    ids=["mean_variance_accumulated", "mean_variance", "average_accumulated", "average"],
)
def test_aggregators_equal_optax(build):
    ours, theirs = build(aggregating), build(optax_aggregating)
    assert isinstance(ours, aggregating.Aggregator) == isinstance(theirs, optax_aggregating.Aggregator)
    state, their_state = ours.init(AGG_PARAMS), theirs.init(AGG_PARAMS)
    assert _structure(state)[0] == _structure(their_state)[0]
    update = jax.jit(ours.update)
    for k in range(5):
        grads = _per_element(k, AGG_PARAMS)
        updates, state = update(grads, state)
        their_updates, their_state = theirs.update(grads, their_state)
        assert_trees_equal(updates, their_updates, rtol=1e-6, atol=1e-7)
        assert_trees_equal(jax.tree.leaves(state), jax.tree.leaves(their_state), rtol=1e-6, atol=1e-7)
        try:
            ours_stats = aggregating.get_unbiased_mean_and_variance_ema(state)
        except ValueError:
            continue
        their_stats = optax_aggregating.get_unbiased_mean_and_variance_ema(their_state)
        assert_trees_equal(ours_stats, their_stats, rtol=1e-5, atol=1e-7)


def _sgd(lib):
    return (modopt if lib is aggregating else optax).sgd(0.1)


def _identity(lib):
    return (modopt if lib is aggregating else optax).identity()


def test_mean_variance_statistics_are_the_batch_statistics():
    """Independent of optax: with one micro-batch and no averaging over time, the tracked
    mean and variance are NumPy's mean and unbiased variance of the per-element gradients."""
    opt = aggregating.add_mean_variance_to_opt(modopt.sgd(0.1), ema_decay=0.0)
    grads = _per_element(0, AGG_PARAMS, n=5)
    _, state = opt.update(grads, opt.init(AGG_PARAMS))
    mean, variance = aggregating.get_unbiased_mean_and_variance_ema(state)
    for name in AGG_PARAMS:
        g = np.asarray(grads[name], np.float64)
        np.testing.assert_allclose(mean[name], g.mean(0), rtol=1e-6)
        np.testing.assert_allclose(variance[name], g.var(0, ddof=1), rtol=1e-5)
    # Over two micro-batches the combined statistics are those of the ten elements.
    opt = aggregating.add_mean_variance_to_opt(modopt.sgd(0.1), ema_decay=0.0, accumulation_steps=2)
    state = opt.init(AGG_PARAMS)
    first, second = _per_element(0, AGG_PARAMS, n=5), _per_element(7, AGG_PARAMS, n=5)
    for grads in (first, second):
        _, state = opt.update(grads, state)
    mean, variance = aggregating.get_unbiased_mean_and_variance_ema(state)
    for name in AGG_PARAMS:
        g = np.concatenate([np.asarray(first[name], np.float64), np.asarray(second[name], np.float64)])
        np.testing.assert_allclose(mean[name], g.mean(0), rtol=1e-5)
        np.testing.assert_allclose(variance[name], g.var(0, ddof=1), rtol=1e-5)


def test_aggregating_in_bfloat16_with_accumulation():
    """A departure: over several micro-batches optax 0.2.8's tracker turns bfloat16 averages to
    float32, which its `process` rejects; modopt keeps the averages' dtype."""
    params = jax.tree.map(lambda p: p.astype(jnp.bfloat16), AGG_PARAMS)
    grads = jax.tree.map(lambda g: g.astype(jnp.bfloat16), _per_element(0, AGG_PARAMS))
    theirs = optax_aggregating.add_mean_variance_to_opt(optax.sgd(0.1), accumulation_steps=2)
    with pytest.raises(TypeError, match="cond branches"):
        theirs.update(grads, theirs.init(params))
    ours = aggregating.add_mean_variance_to_opt(modopt.sgd(0.1), accumulation_steps=2)
    state = ours.init(params)
    for _ in range(2):
        updates, state = ours.update(grads, state)
    assert all(u.dtype == jnp.bfloat16 for u in jax.tree.leaves(updates))
    assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(modopt.tree.get(state, "variance_grads_ema")))


def test_aggregator_from_functions_and_errors():
    average = aggregating.Aggregator(
        init=modopt.init_empty_state,
        update=lambda updates, state, params=None: (jax.tree.map(lambda u: u.mean(0), updates), state),
    )
    assert average.takes_per_example_updates()
    opt = aggregating.process(modopt.identity(), average, modopt.sgd(1.0))
    assert isinstance(opt, aggregating.Aggregator)
    grads = _per_element(0, AGG_PARAMS)
    updates, _ = opt.update(grads, opt.init(AGG_PARAMS))
    assert_trees_equal(updates, jax.tree.map(lambda g: -g.mean(0), grads), rtol=1e-6)
    # Through an Optimizer, which takes per-element gradients for it.
    optimizer = modopt.Optimizer(opt, AGG_PARAMS)
    new_params, _ = optimizer.step(AGG_PARAMS, grads)
    assert_trees_equal(new_params, jax.tree.map(lambda p, g: p - g.mean(0), AGG_PARAMS, grads), rtol=1e-6)
    assert not isinstance(
        aggregating.process(modopt.identity(), modopt.identity(), modopt.sgd(1.0)), aggregating.Aggregator
    )
    with pytest.raises(ValueError, match="accumulation_steps: 0"):
        aggregating.accumulate_avg_updates(0)
    assert isinstance(aggregating.accumulate_avg_updates(1), modopt.Identity)
    with pytest.raises(ValueError, match="same batch size"):
        aggregating.get_batch_size_from_per_elt_updates({"a": jnp.ones((3, 2)), "b": jnp.ones((4,))}, 0)
    assert aggregating.get_batch_size_from_per_elt_updates({"a": jnp.ones((3, 2, 5))}, [0, 1]) == 6
    with pytest.raises(ValueError, match="PerElementMeanAndVarianceEMAState"):
        aggregating.get_unbiased_mean_and_variance_ema(modopt.adam(0.1).init(AGG_PARAMS))
    with pytest.raises(TypeError, match="sum_sq_diff_grads"):
        tracker = aggregating.track_per_element_mean_and_variance_with_ema()
        tracker.update(AGG_PARAMS, tracker.init(AGG_PARAMS))
