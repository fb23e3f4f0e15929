"""State dtypes (`mu_dtype`, `nu_dtype`, `accumulator_dtype`, ...; see `modopt.fields.dtype`).

The registry drives the checks, so a new entry (or a new transform with state dtypes) is
covered without listing it here:

1. each dtype argument sets a part of the state to its dtype (and, over the registry, every
   argument of every transform sets some); the state keeps its dtypes through a step; with
   every state dtype float32, bfloat16 parameters leave no bfloat16 state (abstract
   evaluation, once per transform class and state structure);
2. float32 state dtypes make the arithmetic float32: bfloat16 gradients give the numbers that
   the same transform at its defaults gives for float32 gradients of the same values;
3. bfloat16 state dtypes give the float32 computation with the state rounded to bfloat16
   between steps (the transform at its defaults, its state rounded outside it), within one
   bfloat16 rounding, over a few steps;
4. where optax has the argument (`mu_dtype`, `accumulator_dtype`, `dtype_momentum`,
   `state_dtype`), the updates and state equal optax's;
5. a dtype that is not a floating one (complex ones pass, as in optax) is an error naming the
   argument and the transform.

Checks 2 and 3 run four copies of a transform in one jitted function, on the same float32
parameters and gradients of the same values (bfloat16 ones for check 2), so that the precision
of the state (and of the gradients it reads) is their only difference. Parameters stay float32
there: the arithmetic of a chain on bfloat16 parameters (weight decay, trust ratios) is outside
what state dtypes set. They run once for each class of transform that keeps state with dtypes,
on the first registry entry holding it (transforms before the optimizers built on them).
"""

from __future__ import annotations

import copy
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from registry import ENTRIES, Entry
from test_registry import SHAPES, make_grads, make_params, quadratic

import modopt
from modopt._core.base import AbstractComposite
from modopt._core.fields import canonical_dtype, dtype_field_names, validate_hyperparameters

STEPS = 2  # the second step reads the state the first stored
# Three leaves (a vector, a small matrix, one large enough for Adafactor's factors and Shampoo's
# blocks), where the entry accepts them: tracing and compiling cost grows with the leaves.
SMALL_SHAPES = {"matrix": (3, 5), "vector": (5,), "big": (130, 136)}
BF16_EPS = float(jnp.finfo(jnp.bfloat16).eps)  # 2**-7: one unit in the last place at 1


def state_dtypes(tx) -> tuple[str, ...]:
    return dtype_field_names(tx)


def with_dtypes(tx, **dtypes):
    """`tx` with some state dtypes changed: rebuilt by its constructor, or, where a custom
    `__init__` names its arguments otherwise, a copy with the static fields set (and checked)."""
    try:
        return dataclasses.replace(tx, **dtypes)
    except TypeError:
        new = copy.copy(tx)
        for name, dtype in dtypes.items():
            object.__setattr__(new, name, canonical_dtype(dtype))
        validate_hyperparameters(new)
        return new


def all_dtypes(tx, dtype):
    return with_dtypes(tx, **{name: dtype for name in state_dtypes(tx)})


def flat(tree):
    return [(jax.tree_util.keystr(p), leaf) for p, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]]


def dtypes_by_path(tree):
    return {path: jnp.result_type(leaf) for path, leaf in flat(tree)}


def state_classes(tx) -> frozenset[str]:
    """The classes of the transforms in `tx` (itself included) that keep state with dtypes."""
    found = set()

    def visit(node):
        if state_dtypes(node) and not isinstance(node, AbstractComposite):
            found.add(type(node).__name__)
        for part in node.parts():
            visit(part.transform)

    visit(tx)
    return frozenset(found)


def _declaring(tx, name: str) -> set[str]:
    """The classes of the transforms inside `tx` that declare the state dtype `name`."""
    found = set()
    for part in tx.parts():
        if name in state_dtypes(part.transform):
            found.add(type(part.transform).__name__)
        found |= _declaring(part.transform, name)
    return found


def _select():
    """The entries with state dtypes, one per (class, state structure) for check 1, and one
    per class of transform keeping state (transforms first) for checks 2 and 3."""
    params = make_params()
    made = [(entry, entry.make()) for entry in ENTRIES]
    made = [(entry, tx) for entry, tx in made if state_dtypes(tx)]
    structures, numeric, covered = {}, [], set()
    for entry, tx in made:
        key = (type(tx).__name__, jax.tree_util.tree_structure(jax.eval_shape(tx.init, params)))
        structures.setdefault(key, (entry, tx))
    for entry, tx in sorted(structures.values(), key=lambda pair: isinstance(pair[1], AbstractComposite)):
        classes = state_classes(tx)
        if entry.partial_state_dtypes is None and classes - covered:
            numeric.append(entry)
            covered |= classes
    return [entry for entry, _ in made], [entry for entry, _ in structures.values()], numeric


WITH_STATE_DTYPES, BY_STRUCTURE, NUMERIC = _select()


def small_shapes(entry: Entry) -> dict:
    """`SMALL_SHAPES` if the entry's `init` takes them (its masks may name every registry
    leaf), else the registry's shapes."""
    try:
        jax.eval_shape(entry.make().init, make_params(shapes=SMALL_SHAPES))
    except Exception:  # noqa: BLE001 - any failure: the registry's full tree
        return SHAPES
    return SMALL_SHAPES


def one_step(entry: Entry, tx, params):
    """`(state after init, state after one update)`, abstractly evaluated."""
    grads = make_grads(0, params)
    extra = entry.args(quadratic(params), params)

    def run():
        state = tx.init(params)
        return state, tx.update(grads, state, params, **extra)[1]

    return jax.eval_shape(run)


def set_leaves(entry: Entry) -> dict[str, dict[str, jnp.dtype]]:
    """For each state dtype, the leaves it sets, with their dtypes: the initial state (float32
    params) with every state dtype float32 but that one, bfloat16, against all float32."""
    params = make_params(shapes=small_shapes(entry))
    high = all_dtypes(entry.make(), jnp.float32)
    base = dtypes_by_path(jax.eval_shape(high.init, params))
    found = {}
    for name in state_dtypes(high):
        low = dtypes_by_path(jax.eval_shape(with_dtypes(high, **{name: jnp.bfloat16}).init, params))
        found[name] = {path: low[path] for path in low if low[path] != base[path]}
    return found


@pytest.mark.parametrize("entry", BY_STRUCTURE, ids=str)
def test_state_dtypes_set_the_state_and_keep_it_through_steps(entry: Entry):
    """Each argument sets leaves to its dtype only; with all of them bfloat16 (float32 params)
    the state keeps its dtypes through a step; with all of them float32 on bfloat16 params no
    floating leaf stays bfloat16, unless the registry says they set only part of the state."""
    for name, leaves in set_leaves(entry).items():
        assert set(leaves.values()) <= {jnp.dtype(jnp.bfloat16)}, f"{entry}: {name}"
    shapes = small_shapes(entry)
    initial, stepped = one_step(entry, all_dtypes(entry.make(), jnp.bfloat16), make_params(shapes=shapes))
    assert dtypes_by_path(stepped) == dtypes_by_path(initial), f"{entry}: a step changes the state's dtypes"
    _, stepped = one_step(entry, all_dtypes(entry.make(), jnp.float32), make_params(jnp.bfloat16, shapes))
    low = [path for path, dtype in dtypes_by_path(stepped).items() if dtype == jnp.bfloat16]
    if entry.partial_state_dtypes is None:
        assert not low, f"{entry}: bfloat16 state left with every state dtype float32: {low}"
    else:
        assert low, f"{entry}: says its state dtypes set part of the state, but they set all of it"


def test_every_state_dtype_argument_sets_some_state():
    """Each dtype argument of each transform class sets some leaf in at least one registry
    entry (in some configurations it has nothing to set, e.g. SGD's without momentum)."""
    effective: dict[tuple[str, str], bool] = {}
    for entry in WITH_STATE_DTYPES:
        tx = entry.make()
        # The arguments of the entry's transform, and of the transforms inside it that they are
        # passed on to (`shampoo`'s `nu_dtype` is `scale_by_shampoo`'s).
        keys = {name: [(cls, name) for cls in {type(tx).__name__, *_declaring(tx, name)}] for name in state_dtypes(tx)}
        if all(effective.get(key) for name_keys in keys.values() for key in name_keys):
            continue
        for name, leaves in set_leaves(entry).items():
            for key in keys[name]:
                effective[key] = effective.get(key, False) or bool(leaves)
    assert all(effective.values()), sorted(key for key, ok in effective.items() if not ok)


def _trajectories(entry: Entry):
    return _copies(entry.make(), small_shapes(entry), entry.args)


def _copies(tx, shapes, args, steps=STEPS, per_example=False):
    """Updates and states of four copies of the transform `tx` over the same float32
    parameters (those of `plain`) and gradients of the same values (with a leading batch axis
    of one example where the transform takes `per_example` gradients), `args(loss, params)`
    giving the extra arguments:

    - `plain`: every state dtype `None` (the parameters' float32), float32 gradients;
    - `wide`: every state dtype float32, bfloat16 gradients;
    - `low`: every state dtype bfloat16, float32 gradients;
    - `rounded`: `plain`, with the leaves of its state that are bfloat16 in `low` rounded to
      bfloat16 (and back) after each step: the float32 computation on a bfloat16 store.
    """
    plain = all_dtypes(tx, None)
    runs = {"plain": plain, "wide": all_dtypes(plain, jnp.float32), "low": all_dtypes(plain, jnp.bfloat16), "rounded": plain}
    params = make_params(shapes=shapes)
    grads = [make_grads(step, make_params(jnp.bfloat16, shapes)) for step in range(steps)]
    if per_example:
        grads = jax.tree.map(lambda g: g[None], grads)

    def round_like(state, low):
        def one(x, y):
            return x.astype(jnp.bfloat16).astype(x.dtype) if jnp.result_type(y) == jnp.bfloat16 else x

        return jax.tree.map(one, state, low)

    @jax.jit
    def run(params, grads):
        states = {name: tx.init(params) for name, tx in runs.items()}
        states["rounded"] = round_like(states["rounded"], states["low"])
        steps = []
        for g16 in grads:
            g32 = jax.tree.map(lambda g: g.astype(jnp.float32), g16)
            extra = args(quadratic(params), params)
            updates = {}
            for name, tx in runs.items():
                updates[name], states[name] = tx.update(g16 if name == "wide" else g32, states[name], params, **extra)
            states["rounded"] = round_like(states["rounded"], states["low"])
            steps.append((updates, dict(states)))
            params = modopt.apply_updates(params, updates["plain"])
        return steps

    return run(params, grads)


def _float_leaves(tree):
    return [(path, leaf) for path, leaf in flat(tree) if jnp.issubdtype(jnp.result_type(leaf), jnp.floating)]


def assert_close(ours, theirs, what, rtol, scales=None):
    """Leaf by leaf, to `rtol` of each element and of the leaf's largest (or of `scales`, a tree
    of numbers like `theirs`, where larger); a leaf that comes out in bfloat16 (MultiSteps hands
    its inner optimizer gradients in their own dtype) to one rounding of bfloat16."""
    ours, theirs = _float_leaves(ours), _float_leaves(theirs)
    assert [p for p, _ in ours] == [p for p, _ in theirs], f"{what}: structure differs"
    others = [0.0] * len(theirs) if scales is None else [float(s) for _, s in flat(scales)]
    for (path, a), (_, b), other in zip(ours, theirs, others):
        tolerance = max(rtol, BF16_EPS) if jnp.result_type(a) == jnp.bfloat16 else rtol
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        scale = max(np.max(np.abs(b), initial=0.0), other)
        np.testing.assert_allclose(a, b, rtol=tolerance, atol=tolerance * scale, err_msg=f"{what}{path}")


@pytest.mark.parametrize("entry", NUMERIC, ids=str)
def test_state_precision_decides_the_numbers(entry: Entry):
    _check_precision(str(entry), _trajectories(entry), small_shapes(entry))


def _check_precision(entry: str, trajectories, shapes, wide=True, low_rtol=BF16_EPS):
    params_scale = jax.tree.map(lambda p: jnp.max(jnp.abs(p)), make_params(shapes=shapes))
    for step, (updates, states) in enumerate(trajectories):
        # Float32 state dtypes with bfloat16 gradients: the float32 computation.
        if wide:
            assert_close(updates["wide"], updates["plain"], f"{entry} float32 updates, step {step}: ", 1e-5)
            assert_close(states["wide"], states["plain"], f"{entry} float32 state, step {step}: ", 1e-5)
        # Bfloat16 state dtypes: the float32 computation, the state rounded to bfloat16 between
        # steps (one rounding may land on either side). The update may use the state as stored
        # (NovoGrad's, Schedule-Free's iterate `z`, as optax's) or before rounding: one bfloat16
        # rounding of the update, or of the parameters it moves (Schedule-Free's).
        assert_close(states["low"], states["rounded"], f"{entry} bfloat16 state, step {step}: ", BF16_EPS)
        what = f"{entry} bfloat16 updates, step {step}: "
        assert_close(updates["low"], updates["rounded"], what, low_rtol, params_scale)


# Transforms whose state dtypes set only part of their state in the registry's entries (so that
# the check above skips them), or that the registry wraps: the same check on a configuration of
# their own. L-BFGS's `memory_dtype` sets its memories of `s` and `y` (its last parameters and
# gradients keep the parameters' dtype), over three steps so that an older, rounded row is read;
# DP-SGD takes per-example gradients (the registry feeds it through a test wrapper); its
# aggregation (clipping, noise) works on the gradients as given, before the trace its
# `accumulator_dtype` sets, so only the bfloat16 check applies. L-BFGS uses its newest pair
# unrounded and reads the older ones as stored: its bfloat16 updates are those of the float32
# computation on the rounded memory, to float32 rounding. Each: (make, steps, per-example
# gradients, the float32 check applies, the bfloat16 updates' tolerance).
EXPLICIT = {
    "scale_by_lbfgs": (lambda: modopt.scale_by_lbfgs(memory_size=2), 3, False, True, 1e-5),
    "dpsgd": (lambda: modopt.dpsgd(0.1, 5.0, 1e-3, 3, momentum=0.9, nesterov=True), STEPS, True, False, BF16_EPS),
}


@pytest.mark.parametrize("name", list(EXPLICIT))
def test_state_precision_decides_the_numbers_outside_the_registry(name):
    make, steps, per_example, wide, low_rtol = EXPLICIT[name]
    shapes = {"matrix": (3, 5)}  # one leaf: each step compiles loops over the memory's rows
    trajectories = _copies(make(), shapes, lambda loss, params: {}, steps, per_example)
    assert any(jnp.result_type(leaf) == jnp.bfloat16 for _, leaf in flat(trajectories[-1][1]["low"]))
    _check_precision(name, trajectories, shapes, wide, low_rtol)


# --- 4. optax's own state dtypes ------------------------------------------------------------------
bf16 = jnp.bfloat16
OPTAX_PAIRS = {
    "scale_by_adam": (lambda: modopt.scale_by_adam(mu_dtype=bf16), lambda: optax.scale_by_adam(mu_dtype=bf16)),
    "amsgrad": (lambda: modopt.amsgrad(0.05, mu_dtype=bf16), lambda: optax.amsgrad(0.05, mu_dtype=bf16)),
    "lion": (lambda: modopt.lion(0.05, mu_dtype=bf16), lambda: optax.lion(0.05, mu_dtype=bf16)),
    "scale_by_novograd": (
        lambda: modopt.scale_by_novograd(mu_dtype=bf16),
        lambda: optax.scale_by_novograd(mu_dtype=bf16),
    ),
    "sgd_nesterov": (
        lambda: modopt.sgd(0.1, 0.9, nesterov=True, accumulator_dtype=bf16),
        lambda: optax.sgd(0.1, 0.9, nesterov=True, accumulator_dtype=bf16),
    ),
    "ema": (lambda: modopt.ema(0.9, accumulator_dtype=bf16), lambda: optax.ema(0.9, accumulator_dtype=bf16)),
    "muon": (lambda: modopt.contrib.muon(0.02, mu_dtype=bf16), lambda: optax.contrib.muon(0.02, mu_dtype=bf16)),
    "ademamix": (
        lambda: modopt.contrib.ademamix(0.05, mu_dtype=bf16),
        lambda: optax.contrib.ademamix(0.05, mu_dtype=bf16),
    ),
    "adopt": (lambda: modopt.contrib.adopt(0.05, mu_dtype=bf16), lambda: optax.contrib.adopt(0.05, mu_dtype=bf16)),
    "schedule_free_adamw": (
        lambda: modopt.contrib.schedule_free_adamw(0.05, state_dtype=bf16),
        lambda: optax.contrib.schedule_free_adamw(0.05, state_dtype=bf16),
    ),
}


# optax 0.2.8's AdEMAMix stores its moments in the gradients' dtype after the first step (its
# `mu_dtype` sets the initial state only); ours keep `mu_dtype` (see `scale_by_ademamix`).
KEEPS_OPTAX_DTYPES = {name: name != "ademamix" for name in OPTAX_PAIRS}


@pytest.mark.parametrize("name", list(OPTAX_PAIRS))
def test_optax_state_dtypes_give_optax_numbers(name):
    """bfloat16 state on float32 params: both compute in float32 and round the state; they
    agree to a unit of bfloat16 of each leaf (optax rounds `decay * state` to bfloat16 before
    adding the gradient, ours does not; one rounding may land on either side). A state that
    rounds the other way may flip the sign of a near-zero interpolation (Lion's update): at
    most one element in a thousand of an update may differ beyond that."""
    ours, theirs = (make() for make in OPTAX_PAIRS[name])
    params = make_params()
    grads = [make_grads(step, params) for step in range(STEPS)]

    @jax.jit
    def run(params, grads):
        out = []
        for tx, apply in ((ours, modopt.apply_updates), (theirs, optax.apply_updates)):
            p, state, steps = params, tx.init(params), []
            for g in grads:
                updates, state = tx.update(g, state, p)
                steps.append((updates, state))
                p = apply(p, updates)
            out.append(steps)
        return out

    ours_steps, theirs_steps = run(params, grads)
    for step, (a, b) in enumerate(zip(ours_steps, theirs_steps)):
        for what, x, y in (("updates", a[0], b[0]), ("state", a[1], b[1])):
            x, y = flat(x), flat(y)
            assert [p for p, _ in x] == [p for p, _ in y], f"{name} {what}: structure differs"
            for (path, u), (_, v) in zip(x, y):
                where = f"{name} {what}{path}, step {step}"
                if KEEPS_OPTAX_DTYPES[name]:
                    assert jnp.result_type(u) == jnp.result_type(v), f"{where}: dtype"
                u, v = np.asarray(u, np.float64), np.asarray(v, np.float64)
                bound = BF16_EPS * (np.abs(v) + np.max(np.abs(v), initial=0.0))
                outside = np.abs(u - v) > bound
                allowed = u.size // 1000 if what == "updates" else 0
                assert outside.sum() <= allowed, f"{where}: {outside.sum()} of {u.size} elements differ, by up to {np.max(np.abs(u - v))}"


# --- 5. bad dtypes --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "make, argument, owner",
    [
        (lambda d: modopt.scale_by_adam(mu_dtype=d), "mu_dtype", "ScaleByAdam"),
        (lambda d: modopt.adam(1e-3, nu_dtype=d), "nu_dtype", "Adam"),
        (lambda d: modopt.sgd(0.1, 0.9, accumulator_dtype=d), "accumulator_dtype", "Sgd"),
        (lambda d: modopt.sm3(0.1, nu_dtype=d), "nu_dtype", "Sm3"),
        (lambda d: modopt.trax.Adam(1e-3, mu_dtype=d), "mu_dtype", "Adam"),
    ],
    ids=["scale_by_adam", "adam", "sgd", "sm3", "trax_adam"],
)
@pytest.mark.parametrize(
    "dtype, why",
    [(jnp.int32, "int32 is not a floating dtype"), (jnp.bool_, "bool is not a floating dtype"), ("float33", "'float33' is not a dtype")],
    ids=["int32", "bool", "float33"],
)
def test_a_bad_state_dtype_is_an_error_naming_it(make, argument, owner, dtype, why):
    with pytest.raises(ValueError, match=rf"^Invalid {argument}: {why} \(must be a floating dtype .*, or None for the default\) in {owner}\.$"):
        make(dtype)


# --- 6. lookahead's slow parameters ---------------------------------------------------------------
def test_lookahead_slow_parameters_in_bfloat16_are_the_float32_ones_rounded():
    """`LookaheadParams.init_synced(params, slow_dtype=bfloat16)`: the slow copy is bfloat16 and
    follows the float32 lookahead whose slow parameters are rounded to bfloat16 after each step
    (two synchronizations in four steps); the fast ones restart from the unrounded value."""
    tx = modopt.lookahead(modopt.sgd(0.1, 0.9), sync_period=2, slow_step_size=0.5)
    params = make_params(shapes={"matrix": (3, 5)})
    low, plain = modopt.LookaheadParams.init_synced(params, jnp.bfloat16), modopt.LookaheadParams.init_synced(params)
    assert jnp.result_type(low.slow["matrix"]) == jnp.bfloat16 and low.slow["matrix"] is not params["matrix"]

    @jax.jit
    def run(low, plain):
        states, out = (tx.init(low), tx.init(plain)), []
        for step in range(4):
            grads = make_grads(step, params)
            (u_low, s_low), (u_plain, s_plain) = tx.update(grads, states[0], low), tx.update(grads, states[1], plain)
            low, plain, states = modopt.apply_updates(low, u_low), modopt.apply_updates(plain, u_plain), (s_low, s_plain)
            plain = plain._replace(slow=jax.tree.map(lambda x: x.astype(jnp.bfloat16).astype(x.dtype), plain.slow))
            out.append((low, plain))
        return out

    for step, (ours, oracle) in enumerate(run(low, plain)):
        assert jnp.result_type(ours.slow["matrix"]) == jnp.bfloat16
        assert_close(ours, oracle, f"lookahead step {step}: ", 1e-6)


def test_a_bad_slow_dtype_is_an_error_naming_it():
    with pytest.raises(ValueError, match=r"^Invalid slow_dtype: int32 is not a floating dtype .* in LookaheadParams\.init_synced\.$"):
        modopt.LookaheadParams.init_synced({"w": jnp.zeros(3)}, jnp.int32)


# --- 7. per-element statistics over micro-batches -------------------------------------------------
def test_per_element_statistics_over_micro_batches_are_the_float32_ones_on_a_rounded_store():
    """`get_per_element_mean_and_sum_sq_diff_grads`' running statistics (an aggregator of
    per-element gradients, which the registry reaches only through a wrapper) with bfloat16
    `mu_dtype` and `nu_dtype`: the float32 statistics rounded to bfloat16 between micro-batches,
    the combined ones (at the third) within a rounding of bfloat16."""
    from modopt.experimental.aggregating import PerElementMeanAndSumSqDiffGrads

    low = PerElementMeanAndSumSqDiffGrads(0, 3, mu_dtype=jnp.bfloat16, nu_dtype=jnp.bfloat16)
    plain = PerElementMeanAndSumSqDiffGrads(0, 3)
    params = {"w": jnp.zeros((3, 5))}
    batches = [{"w": jax.random.normal(jax.random.key(step), (4, 3, 5))} for step in range(3)]

    def rounded(state):
        fields = ("mean_grads", "sum_sq_diff_grads")
        return state._replace(**{f: jax.tree.map(lambda x: x.astype(jnp.bfloat16).astype(x.dtype), getattr(state, f)) for f in fields})

    @jax.jit
    def run():
        states, out = (low.init(params), plain.init(params)), []
        for batch in batches:
            (o_low, s_low), (o_plain, s_plain) = low.update(batch, states[0]), plain.update(batch, states[1])
            states = (s_low, rounded(s_plain))
            out.append(((o_low, s_low), (o_plain, states[1])))
        return out

    for step, (ours, oracle) in enumerate(run()):
        assert jnp.result_type(ours[1].mean_grads["w"]) == jnp.bfloat16
        assert_close(ours, oracle, f"per-element statistics, micro-batch {step}: ", BF16_EPS)


def test_dtypes_that_cannot_be_passed_on_are_errors_naming_them():
    with pytest.raises(ValueError, match=r"^Invalid nu_dtype: bfloat16 \(the base_optimizer ScaleByLion takes no nu_dtype"):
        modopt.contrib.galore(0.1, base_optimizer=modopt.scale_by_lion(), nu_dtype=jnp.bfloat16)
    with pytest.raises(ValueError, match=r"^Invalid mu_dtype: float32 with momentum_in_bfloat16=True"):
        modopt.trax.Adafactor(do_momentum=True, momentum_in_bfloat16=True, mu_dtype=jnp.float32)


# --- complex parameters with a real state dtype -----------------------------------------------
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32], ids=["bfloat16", "float32"])
@pytest.mark.parametrize(
    "make",
    [
        lambda lib, d: lib.sgd(0.1, momentum=0.9, accumulator_dtype=d),
        lambda lib, d: lib.adam(0.1, mu_dtype=d),
        lambda lib, d: lib.adamw(0.1, mu_dtype=d),
    ],
    ids=["sgd", "adam", "adamw"],
)
def test_a_real_state_dtype_keeps_complex_state_complex(make, dtype):
    """A departure from optax (its `test_explicit_dtype` 24-29): optax casts a complex momentum
    to the real dtype, dropping the imaginary part (JAX warns that this cast will become an
    error). Ours stays complex, of the precision the dtype names: on complex leaves the steps
    and states are optax's with a `complex64` state dtype; on real leaves optax's with `dtype`
    (to a unit of bfloat16)."""
    rng = np.random.default_rng(0)
    params = {"z": jnp.asarray(rng.normal(size=(3, 4)) + 1j * rng.normal(size=(3, 4)), jnp.complex64),
              "r": jnp.asarray(rng.normal(size=5), jnp.float32)}  # fmt: skip
    grads = [
        jax.tree.map(lambda x: x * (0.5 + k) + (0.3j * k if x.dtype == jnp.complex64 else 0), params)
        for k in range(3)
    ]

    def run(tx, apply, keys=("z", "r")):
        p, state = {k: params[k] for k in keys}, tx.init({k: params[k] for k in keys})
        for g in grads:
            updates, state = tx.update({k: g[k] for k in keys}, state, p)
            p = apply(p, updates)
        return p, state

    ours = run(make(modopt, dtype), modopt.apply_updates)
    oracles = {
        "z": run(make(optax, jnp.complex64), optax.apply_updates, ["z"]),
        "r": run(make(optax, dtype), optax.apply_updates, ["r"]),
    }
    assert any(jnp.iscomplexobj(leaf) for path, leaf in flat(ours[1]) if "'z'" in path)
    for path, leaf in flat(ours):
        key = "z" if "'z'" in path else "r"
        expected = dict(flat(oracles[key]))[path]
        assert jnp.result_type(leaf) == jnp.result_type(expected), path
        # On real leaves a bfloat16 state may round one unit apart from optax's (see check 4).
        rtol = 2 * BF16_EPS if key == "r" and dtype == jnp.bfloat16 else 1e-6
        pair = (np.asarray(x, np.complex128) for x in (leaf, expected))
        np.testing.assert_allclose(*pair, rtol=rtol, atol=1e-7, err_msg=path)
