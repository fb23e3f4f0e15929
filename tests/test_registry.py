"""Shared checks run over every entry of the registry: parity with optax (eager and jitted),
one trace per configuration, dtype preservation, convergence on a quadratic (for entries
without an optax oracle), a sharding rule that places every state leaf on a (2, 4) mesh, and
bit-exact Orbax resume."""

from __future__ import annotations

import functools
import os
import subprocess
import sys

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import AbstractMesh, AxisType
from jax.sharding import PartitionSpec as P
from registry import ENTRIES, Entry

import modopt

STEPS = 5
EAGER_STEPS = 1  # eager runs op by op, compiling each new op (slow); the jitted run covers all STEPS
SHAPES = {"matrix": (3, 5), "vector": (5,), "scalar": (), "cube": (2, 3, 4), "big": (130, 136)}


def make_params(dtype=jnp.float32, shapes=SHAPES):
    """Matrix, vector, scalar and 3-d leaves, plus a matrix large enough for Adafactor to factor."""
    return copied(_params(dtype, tuple(shapes.items())))


def make_grads(step, params):
    leaves = sorted(params.items())
    return copied(_grads(step, tuple((name, p.shape) for name, p in leaves), tuple(p.dtype for _, p in leaves)))


# Drawn once per process (eagerly, each costs milliseconds); `make_params` and `make_grads` hand
# out copies, which a donated step may delete.
@functools.cache
def _params(dtype, shapes: tuple) -> dict:
    keys = jax.random.split(jax.random.key(0), len(shapes))
    return {name: jax.random.normal(k, shape, dtype) for k, (name, shape) in zip(keys, shapes)}


@functools.cache
def _grads(step: int, shapes: tuple, dtypes: tuple) -> dict:
    keys = jax.random.split(jax.random.fold_in(jax.random.key(1), step), len(shapes))
    return {name: jax.random.normal(k, shape, jnp.float32).astype(d) for k, (name, shape), d in zip(keys, shapes, dtypes)}


@jax.jit
def quadratic(params):
    """0.5 * sum_i a_i (x_i - 1)^2 with curvatures a in [0.5, 1.5] (jitted: it is computed
    eagerly at every step of every entry, for the entries that take the loss value)."""

    def leaf(x):
        a = jnp.linspace(0.5, 1.5, x.size).reshape(x.shape)
        return 0.5 * jnp.sum(a * (x.astype(jnp.float32) - 1.0) ** 2)

    return sum(leaf(x) for x in jax.tree.leaves(params))


def comparable(leaf):
    """A leaf as a NumPy array; a typed PRNG key as its key data."""
    if jnp.issubdtype(jnp.result_type(leaf), jax.dtypes.prng_key):
        return np.asarray(jax.random.key_data(leaf))
    return np.asarray(leaf)


def paths_and_leaves(tree):
    flat = jax.tree_util.tree_flatten_with_path(tree)[0]
    return [jax.tree_util.keystr(p) for p, _ in flat], [leaf for _, leaf in flat]


def assert_trees_close(ours, theirs, what, rtol=1e-6, atol=1e-6):
    our_paths, our_leaves = paths_and_leaves(ours)
    their_paths, their_leaves = paths_and_leaves(theirs)
    assert our_paths == their_paths, f"{what}: structure differs\n{our_paths}\n{their_paths}"
    for path, a, b in zip(our_paths, our_leaves, their_leaves):
        assert jnp.shape(a) == jnp.shape(b), f"{what} at {path}: shape {jnp.shape(a)} vs {jnp.shape(b)}"
        assert jnp.result_type(a) == jnp.result_type(b), f"{what} at {path}: dtype {jnp.result_type(a)} vs {jnp.result_type(b)}"
        a, b = comparable(a), comparable(b)
        # Results may differ by rounding, about one unit in the last place of the leaf's dtype.
        ulp = float(jnp.finfo(a.dtype).eps) if jnp.issubdtype(a.dtype, jnp.floating) else 0.0
        np.testing.assert_allclose(
            a.astype(np.float64), b.astype(np.float64), rtol=max(rtol, 2 * ulp), atol=max(atol, 2 * ulp), err_msg=f"{what} at {path}"
        )


ids = [e.name for e in ENTRIES]
WITH_ORACLE = [e for e in ENTRIES if e.oracle is not None]


def test_entries_without_optax_oracle_name_an_existing_reference_test():
    import os

    for entry in ENTRIES:
        if entry.oracle is None:
            path = os.path.join(os.path.dirname(__file__), entry.reference)
            assert os.path.exists(path), f"{entry}: its reference test {entry.reference} does not exist"


def oracle_trajectory(entry: Entry, params, compile):
    """optax's initial state, then (updates, state) at each of STEPS steps."""
    theirs = entry.oracle()
    update = compile(theirs.update)
    # Eager: an init makes zeros and ones, whose few small programs every entry shares.
    their_state, their_params = theirs.init(params), params
    expected = [their_state]
    for step in range(STEPS):
        grads = make_grads(step, params)
        their_updates, their_state = update(grads, their_state, their_params, **entry.args(quadratic(their_params), their_params))
        expected.append((their_updates, their_state))
        their_params = optax.apply_updates(their_params, their_updates)
    return expected


TRACES: dict[str, int] = {}  # traces of `jitted_update` and `donated_step`, by entry


def traces(entry: Entry) -> int:
    return TRACES.get(entry.name, 0)


@eqx.filter_jit
def _jitted_update(tx, grads, state, params, extra, name):
    TRACES[name] = TRACES.get(name, 0) + 1
    return tx.update(grads, state, params, **extra)


def jitted_update(tx, grads, state, params, entry):
    """`tx.update` in a jitted step that takes the transform as an argument, as a training step
    does (its hyperparameters are array leaves). The extra arguments are computed outside it, as
    optax's are. The arrays are committed to the device first, as Orbax restores them: the
    step compiles once however its arguments were made."""
    extra = entry.args(quadratic(params), params)
    return _jitted_update(*committed((tx, grads, state, params, extra)), entry.name)


def crosses_identity(tx, name, value) -> bool:
    """Whether `set(name=value)` moves the hyperparameter to or from the identity its field
    declares (`modopt.fields.hyperparameter`): the one change that compiles the step again."""
    from modopt._core.fields import field_identity
    from modopt._step.hyperparameters import _hyperparameter_index

    _, _, field = _hyperparameter_index(tx, all_paths=True, with_fields=True)[name]
    identity = None if field is None else field_identity(field)
    if identity is None:
        return False
    old = modopt.hyperparameters(tx)[name]
    return (float(np.asarray(old)) == identity) != (value == identity)


def copied(tree):
    """A copy of the arrays of `tree`, which a donated step would delete."""
    return jax.tree.map(lambda x: x.copy() if eqx.is_array(x) else x, tree)


def committed(tree):
    """`tree` with its arrays committed to the default device."""
    device = jax.devices()[0]
    return jax.tree.map(lambda x: jax.device_put(x, device) if eqx.is_array(x) else x, tree)


@pytest.mark.parametrize("entry", ENTRIES, ids=ids)
def test_steps_parity_one_trace_and_orbax_resume(entry: Entry, tmp_path):
    """Per entry, one compiled step serves every check:

    - parity: the initial state (eager; under jit it is traced) and the updates and state of
      5 steps, jitted (and the first step eager), equal optax's, the state compared by field
      path (entries without an oracle: see `entry.reference`);
    - one trace: the step traces once for a transform rebuilt with the same configuration and
      for one with a hyperparameter changed by `set` (a second time only where the change moves
      it to or from its field's identity, compiled in as a constant);
    - Orbax: the transform and its state after 2 steps, saved and restored into fresh ones,
      take 3 more steps equal bit for bit to 5 uninterrupted steps, without a new trace.

    optax's steps are computed jitted (eagerly where a reference computes in NumPy), its
    initial state eagerly."""
    from modopt._step.hyperparameters import hyperparameters_with_state, set_hyperparameters_with_state
    from modopt.integrations.orbax import CheckpointManager

    params = make_params()
    expected = None
    if entry.oracle is not None:
        try:
            expected = oracle_trajectory(entry, params, jax.jit)
        except TypeError:  # a tracer made concrete or NumPy, or a function among the extra arguments
            expected = oracle_trajectory(entry, params, lambda f: f)

    def check(step, updates, state, mode):
        if expected is not None:
            their_updates, their_state = expected[step + 1]
            what = f"{entry} ({mode}) %s, step {step}"
            assert_trees_close(updates, their_updates, what % "updates", rtol=entry.tolerance, atol=entry.tolerance)
            assert_trees_close(state, their_state, what % "state", rtol=entry.tolerance, atol=entry.tolerance)

    # Eager: the initial state and the first step, op by op. Under jit the init is traced
    # (which is what jit adds to an eager run: tracers instead of arrays), not compiled.
    tx = entry.make()
    initial_state = tx.init(params)
    if expected is not None:
        assert_trees_close(initial_state, expected[0], f"{entry} initial state (eager)")
    shapes_and_dtypes = functools.partial(jax.tree.map, lambda x: (x.shape, x.dtype))
    assert shapes_and_dtypes(eqx.filter_eval_shape(tx.init, params)) == shapes_and_dtypes(initial_state), (
        f"{entry}: the init traced under jit gives another state than run eagerly"
    )
    grads = make_grads(0, params)
    if entry.eager:
        updates, state = tx.update(grads, initial_state, params, **entry.args(quadratic(params), params))
        check(0, updates, state, "eager")

    # Jitted, 5 steps from the same initial state, keeping the transform, state and parameters
    # after 2 of them.
    TRACES.pop(entry.name, None)
    tx, state, our_params = entry.make(), initial_state, params
    for step in range(STEPS):
        if step == 2:
            halfway = copied((tx, state, our_params))
        updates, state = jitted_update(tx, make_grads(step, params), state, our_params, entry)
        check(step, updates, state, "jitted")
        our_params = modopt.apply_updates(our_params, updates)
    straight = (state, our_params)
    assert traces(entry) == 1, f"{entry}: the step traced {traces(entry)} times in {STEPS} steps"

    jitted_update(entry.make(), grads, initial_state, params, entry)
    assert traces(entry) == 1, f"{entry}: rebuilding the same configuration retraced"
    if entry.change is not None:
        name, value = entry.change
        rebuilt = entry.make()
        changed, changed_state = set_hyperparameters_with_state(rebuilt, initial_state, **{name: value})
        assert float(hyperparameters_with_state(changed, changed_state)[name]) == pytest.approx(value, rel=1e-6)
        assert float(hyperparameters_with_state(rebuilt, initial_state)[name]) != pytest.approx(value, rel=1e-6)
        jitted_update(changed, grads, changed_state, params, entry)
        expected_traces = 1 + crosses_identity(rebuilt, name, value)
        assert traces(entry) == expected_traces, f"{entry}: changing {name} retraced" if expected_traces == 1 else (
            f"{entry}: setting {name} to or from its identity did not compile the step again"
        )
    traces_before_resume = traces(entry)

    with CheckpointManager(tmp_path, async_save=False) as manager:
        tx_2, state_2, params_2 = halfway
        manager.save(2, transform=tx_2, state=state_2, params=params_2)
        restored = manager.restore(
            2, transform=entry.make(), state=initial_state, params=jax.tree.map(jnp.zeros_like, params)
        )
    tx, state, our_params = restored["transform"], restored["state"], restored["params"]
    for step in range(2, STEPS):
        updates, state = jitted_update(tx, make_grads(step, params), state, our_params, entry)
        our_params = modopt.apply_updates(our_params, updates)
    assert traces(entry) == traces_before_resume, f"{entry}: the restored transform and state retraced"
    for (path, a), b in zip(jax.tree_util.tree_flatten_with_path((state, our_params))[0], jax.tree.leaves(straight)):
        assert np.array_equal(comparable(a), comparable(b)), f"{entry}: {jax.tree_util.keystr(path)} differs after resume"


def train_step(optimizer, params, grads, entry):
    return optimizer.step(params, grads, **entry.args(quadratic(params), params))


@pytest.mark.parametrize("entry", ENTRIES, ids=ids)
def test_dtype_preserved(entry: Entry):
    """bf16 params and grads: updates have the dtypes optax gives (the params' dtype where optax
    lacks the algorithm), and params stay bf16.

    Dtypes are decided when a step is traced, so abstract evaluation checks ours without
    compiling, and optax's too where it traces (a reference that computes in NumPy runs)."""
    params = make_params(jnp.bfloat16)
    grads = make_grads(0, params)
    ours = entry.make()
    extra = entry.args(quadratic(params), params)

    def first_update(tx):
        return tx.update(grads, tx.init(params), params, **extra)[0]

    updates = jax.eval_shape(lambda: first_update(ours))
    if entry.oracle is None:
        their_updates = params
    else:
        try:
            their_updates = jax.eval_shape(lambda: first_update(entry.oracle()))
        except jax.errors.JAXTypeError:  # concretization or NumPy conversion of a tracer
            their_updates = first_update(entry.oracle())
    assert jax.tree.map(lambda x: x.dtype, updates) == jax.tree.map(lambda x: x.dtype, their_updates)
    optimizer = eqx.filter_eval_shape(modopt.Optimizer, ours, params)
    new_params, _ = eqx.filter_eval_shape(train_step, optimizer, params, grads, entry)
    assert all(p.dtype == jnp.bfloat16 for p in jax.tree.leaves(new_params))


# Entries with an optax oracle follow optax's steps (`test_parity_with_optax`), so their
# convergence is optax's; the others are checked for it here.
CONVERGING = [e for e in ENTRIES if e.converges and e.oracle is None]


@pytest.mark.parametrize("entry", CONVERGING, ids=[e.name for e in CONVERGING])
def test_converges_on_quadratic(entry: Entry):
    tx = entry.make()
    if not entry.descent:
        tx = modopt.chain(tx, modopt.scale(-entry.descent_lr))
    params = make_params()
    optimizer = modopt.Optimizer(tx, params)

    @eqx.filter_jit
    def run(params, optimizer):
        def body(carry, _):
            params, optimizer = carry
            return train_step(optimizer, params, jax.grad(quadratic)(params), entry), None

        return jax.lax.scan(body, (params, optimizer), length=entry.steps_to_converge)[0]

    start = quadratic(params)
    params, _ = run(params, optimizer)
    assert quadratic(params) < 0.05 * start, f"{entry}: loss {quadratic(params)} from {start}"


# The shapes of the sharded tests: the 4-way "model" axis divides every split dimension.
SHARDED_SHAPES = {"matrix": (6, 8), "vector": (8,), "scalar": (), "cube": (2, 3, 4), "big": (130, 136)}
SPECS = {"matrix": P(None, "model"), "vector": P("model"), "scalar": P(), "cube": P(None, None, "model"), "big": P(None, "model")}
MESH = AbstractMesh((2, 4), ("data", "model"), axis_types=(AxisType.Auto, AxisType.Auto))


@pytest.mark.parametrize("entry", ENTRIES, ids=ids)
def test_state_placed_on_a_mesh(entry: Entry):
    """Every state leaf gets a sharding on a (data, model) = (2, 4) mesh, with and without
    ZeRO-1: each spec has the leaf's rank and splits only dimensions its mesh axes divide
    (`shardings` checks both and names the path otherwise), and a leaf shaped like a
    parameter is split like it unless the transform's own rule says otherwise."""
    params = make_params(shapes=SHARDED_SHAPES)
    optimizer = eqx.filter_eval_shape(modopt.Optimizer, entry.make(), params)
    for zero_axis in (None, "data"):
        placed = modopt.sharding.shardings(optimizer, SPECS, mesh=MESH, zero_axis=zero_axis)
        leaves = jax.tree_util.tree_leaves(optimizer.state)
        shardings = jax.tree_util.tree_structure(optimizer.state).flatten_up_to(placed.state)
        assert len(shardings) == len(leaves)
        for leaf, sharding in zip(leaves, shardings):
            assert sharding.mesh is MESH
            sharding.shard_shape(leaf.shape)  # raises unless every split dimension divides
    if not entry.own_rule:
        placed = modopt.sharding.shardings(optimizer, SPECS, mesh=MESH)
        for path, sharding in jax.tree_util.tree_flatten_with_path(placed.state)[0]:
            leaf_name = next((name for name in SPECS if f"['{name}']" in jax.tree_util.keystr(path)), None)
            leaf = next(x for p, x in jax.tree_util.tree_flatten_with_path(optimizer.state)[0] if p == path)
            if leaf_name is not None and leaf.shape == SHARDED_SHAPES[leaf_name]:
                assert sharding.spec == SPECS[leaf_name], f"{entry}: state{jax.tree_util.keystr(path)} is {sharding.spec}"


# The documented training step (`Optimizer.step`, model and optimizer donated) on entries of
# every kind of state: the per-entry checks above use the transform's own step, which this
# one wraps.
DONATED = ["adamw", "noisy_sgd", "inject_adamw_static_mask", "lbfgs", "partition", "shampoo", "quantized_state_adamw",
           "schedule_free_adamw", "sam_opaque", "reduce_on_plateau"]  # fmt: skip


@eqx.filter_jit(donate="all-except-first")
def donated_step(grads, optimizer, params, entry):
    TRACES[entry.name] = traces(entry) + 1
    return train_step(optimizer, params, grads, entry)


def test_donated_optimizer_step_one_trace_and_bit_exact_orbax_resume(tmp_path):
    """One trace of the donated `Optimizer.step` serves an optimizer rebuilt with the same
    configuration, one with a hyperparameter changed by `set`, and one restored from Orbax.
    One checkpoint holds the optimizers after 2 steps; restored into fresh optimizers, 2 more
    steps equal 4 uninterrupted steps bit for bit."""
    if os.environ.get("MODOPT_DONATED_STEP_PROCESS") != "1":
        # In a process of its own: in a long-lived test worker an XLA compilation of a donated
        # step crashed (a segmentation fault) three times, never in a process of its own.
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
                   f"{__file__}::test_donated_optimizer_step_one_trace_and_bit_exact_orbax_resume"]  # fmt: skip
        env = {**os.environ, "MODOPT_DONATED_STEP_PROCESS": "1"}
        result = subprocess.run(command, capture_output=True, text=True, timeout=900, env=env)
        assert result.returncode == 0, f"{result.stdout[-6000:]}\n{result.stderr[-3000:]}"
        assert "1 passed" in result.stdout, result.stdout[-2000:]
        return
    from modopt.integrations.orbax import CheckpointManager
    from registry import BY_NAME

    entries = [BY_NAME[name] for name in DONATED]
    straight, halfway, params_at = {}, {}, {}
    for entry in entries:
        params = make_params()
        optimizer = modopt.Optimizer(entry.make(), params)
        for i in range(4):
            params, optimizer = donated_step(make_grads(i, params), optimizer, params, entry)
            if i == 1:
                halfway[entry.name], params_at[entry.name] = copied(optimizer), copied(params)
        straight[entry.name] = (params, optimizer)
        donated_step(make_grads(0, params), modopt.Optimizer(entry.make(), make_params()), make_params(), entry)
        assert traces(entry) == 1, f"{entry}: rebuilding the same configuration retraced"
        if entry.change is not None:
            name, value = entry.change
            changed = modopt.Optimizer(entry.make(), make_params()).set(**{name: value})
            assert float(changed.hyperparameters[name]) == pytest.approx(value, rel=1e-6)
            donated_step(make_grads(0, params), changed, make_params(), entry)
            assert traces(entry) == 1, f"{entry}: changing {name} retraced"
    with CheckpointManager(tmp_path) as manager:
        manager.save(2, optimizers=halfway, params=params_at)
        fresh = {e.name: modopt.Optimizer(e.make(), make_params()) for e in entries}
        zeros = {e.name: jax.tree.map(jnp.zeros_like, make_params()) for e in entries}
        restored = manager.restore(2, optimizers=fresh, params=zeros)
    for entry in entries:
        params, optimizer = restored["params"][entry.name], restored["optimizers"][entry.name]
        for i in range(2, 4):
            params, optimizer = donated_step(make_grads(i, params), optimizer, params, entry)
        assert traces(entry) == 1, f"{entry}: the restored optimizer retraced"
        expected = straight[entry.name]
        for (path, a), b in zip(jax.tree_util.tree_flatten_with_path((params, optimizer))[0], jax.tree.leaves(expected)):
            assert np.array_equal(comparable(a), comparable(b)), f"{entry}: {jax.tree_util.keystr(path)} differs after resume"
