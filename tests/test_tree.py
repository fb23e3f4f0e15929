"""`modopt.tree` and `modopt.tree_utils` against optax 0.2.8's `optax.tree` / `optax.tree_utils`.

Every function runs on the same inputs in both libraries (float32, bfloat16, complex, integer
leaves, `None` leaves, typed PRNG keys); `get`, `set`, `get_all_with_path` and `map_params` run
on modopt's states (adam, masked, chain, inject_hyperparams, multi_transform, named_chain, an
`Optimizer`, grouped or not) and are compared with optax's functions on optax's equivalent states.
"""

from __future__ import annotations

import inspect
import types
from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

import modopt

# ---- helpers ----------------------------------------------------------------------------


def numbers(x):
    """A leaf as a NumPy array that assert_allclose takes (bf16 widened, typed keys unwrapped)."""
    x = jnp.asarray(x)
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
        x = jax.random.key_data(x)
    if x.dtype == jnp.bfloat16:
        x = x.astype(jnp.float32)
    return np.asarray(x)


def entry(key):
    """A path entry of either library as plain data (their NamedTupleKey classes differ)."""
    if hasattr(key, "tuple_name"):
        return ("field", {"InjectStatefulHyperparamsState": "InjectHyperparamsState"}.get(key.tuple_name, key.tuple_name), key.name)
    if isinstance(key, jax.tree_util.DictKey):
        return ("key", key.key)
    if isinstance(key, jax.tree_util.SequenceKey):
        return ("index", key.idx)
    if isinstance(key, jax.tree_util.GetAttrKey):
        return ("attr", key.name)
    return ("other", str(key))


def leaves_by_path(tree):
    """`{path: leaf}`, with the same paths for a modopt and an optax state of one layout."""
    flat = jax.tree_util.tree_flatten_with_path(tree, is_leaf=lambda x: x is None)[0]
    return {tuple(entry(k) for k in path): leaf for path, leaf in flat}


def assert_same(ours, theirs, what=""):
    """Same leaves at the same paths, same dtypes, same numbers (float tolerance)."""
    ours, theirs = leaves_by_path(ours), leaves_by_path(theirs)
    assert list(ours) == list(theirs), f"{what}: paths differ\n{list(ours)}\n{list(theirs)}"
    for path, a in ours.items():
        b = theirs[path]
        if a is None or b is None or isinstance(a, (str, P)) or isinstance(b, (str, P)):
            assert a == b, f"{what} at {path}: {a!r} vs {b!r}"
            continue
        assert jnp.shape(a) == jnp.shape(b), f"{what} at {path}: shape {jnp.shape(a)} vs {jnp.shape(b)}"
        assert jnp.result_type(a) == jnp.result_type(b), f"{what} at {path}: {jnp.result_type(a)} vs {jnp.result_type(b)}"
        np.testing.assert_allclose(numbers(a), numbers(b), rtol=1e-6, atol=0, err_msg=f"{what} at {path}")


def assert_found_alike(ours, theirs, what=""):
    """Two `get_all_with_path` results: the same paths in the same order, the same values."""
    assert [tuple(map(entry, p)) for p, _ in ours] == [tuple(map(entry, p)) for p, _ in theirs], what
    for (_, a), (_, b) in zip(ours, theirs):
        assert_same(a, b, what)


# ---- names and signatures ---------------------------------------------------------------


def public(module):
    return {n for n, v in vars(module).items() if not n.startswith("_") and not isinstance(v, types.ModuleType)}


def test_tree_has_every_name_of_optax_tree():
    assert public(modopt.tree) == public(optax.tree)


def test_tree_utils_has_every_name_of_optax_tree_utils():
    assert public(modopt.tree_utils) == public(optax.tree_utils) - {"typing", "functools"}
    assert modopt.tree_map_params is modopt.tree.map_params
    assert callable(optax.tree_map_params)  # the top-level name modopt mirrors


def test_tree_utils_names_are_the_same_functions():
    for name in public(modopt.tree):
        assert getattr(modopt.tree_utils, f"tree_{name}") is getattr(modopt.tree, name), name


@pytest.mark.parametrize("name", ["tree_scalar_mul", "tree_add_scalar_mul", "tree_l1_norm", "tree_l2_norm", "tree_linf_norm"])
def test_names_optax_deprecated_still_resolve_with_a_warning(name):
    x, y = make_tree(jnp.float32), make_tree(jnp.float32, seed=1)
    with pytest.warns(DeprecationWarning, match="deprecated"):
        ours = getattr(modopt.tree_utils, name)
    with pytest.warns(DeprecationWarning):
        theirs = getattr(optax.tree_utils, name)
    args = {"tree_scalar_mul": (0.5, x), "tree_add_scalar_mul": (x, 0.5, y)}.get(name, (x,))
    assert_same(ours(*args), theirs(*args), name)
    with pytest.raises(AttributeError, match="tree_nothing"):
        modopt.tree_utils.tree_nothing  # noqa: B018


@pytest.mark.parametrize("name", sorted(public(optax.tree)))
def test_signature_is_optax(name):
    ours = inspect.signature(getattr(modopt.tree, name)).parameters
    theirs = inspect.signature(getattr(optax.tree, name)).parameters
    assert [(p.name, p.kind, p.default) for p in ours.values()] == [
        (p.name, p.kind, p.default) for p in theirs.values()
    ]


def test_moment_helpers_are_modopts_own():
    """One definition per concept: the tree names are modopt's moment and tree helpers."""
    assert modopt.tree.update_moment is modopt.update_moment
    assert modopt.tree.bias_correction is modopt.bias_correction
    assert modopt.tree.update_infinity_moment is modopt.update_infinity_moment
    assert modopt.tree.update_moment_per_elem_norm is modopt.update_moment_per_elem_norm


# ---- arithmetic, reductions, casts: same inputs, same outputs ---------------------------


class Pair(NamedTuple):
    first: object
    second: object


def make_tree(dtype, seed=0, with_none=False):
    k1, k2, k3 = jax.random.split(jax.random.key(seed), 3)

    def draw(key, shape):
        if jnp.issubdtype(dtype, jnp.integer):
            return jax.random.randint(key, shape, -5, 6, dtype)
        if jnp.issubdtype(dtype, jnp.complexfloating):
            re, im = jax.random.normal(key, (2, *shape))
            return (re + 1j * im).astype(dtype)
        return jax.random.normal(key, shape).astype(dtype)

    tree = {"a": draw(k1, (3,)), "b": [draw(k2, (2, 2)), Pair(draw(k3, ()), draw(k1, (1, 2)))]}
    if with_none:
        tree["frozen"] = None
    return tree


KINDS = {
    "float32": dict(dtype=jnp.float32),
    "bfloat16": dict(dtype=jnp.bfloat16),
    "complex64": dict(dtype=jnp.complex64),
    "int32": dict(dtype=jnp.int32),
    "float32_with_none": dict(dtype=jnp.float32, with_none=True),
}

# name: (function of the namespace and two trees, kinds it does not apply to)
CASES = {
    "add": (lambda t, x, y: t.add(x, y), ()),
    "add_three": (lambda t, x, y: t.add(x, y, x), ()),
    "sub": (lambda t, x, y: t.sub(x, y), ()),
    "mul": (lambda t, x, y: t.mul(x, y), ()),
    "div": (lambda t, x, y: t.div(x, t.add(t.mul(y, y), t.ones_like(y))), ()),
    "scale": (lambda t, x, y: t.scale(0.5, x), ()),
    "add_scale": (lambda t, x, y: t.add_scale(x, 0.25, y), ()),
    "vdot": (lambda t, x, y: t.vdot(x, y), ()),
    "sum": (lambda t, x, y: t.sum(x), ()),
    "sum_associative": (lambda t, x, y: t.sum(x, associative_reduction=True), ()),
    "max": (lambda t, x, y: t.max(x), ("complex64",)),
    "min": (lambda t, x, y: t.min(x), ("complex64",)),
    "size": (lambda t, x, y: t.size(x), ()),
    "conj": (lambda t, x, y: t.conj(x), ()),
    "real": (lambda t, x, y: t.real(x), ()),
    "norm": (lambda t, x, y: t.norm(x), ()),
    "norm_2_squared": (lambda t, x, y: t.norm(x, ord=2, squared=True), ()),
    "norm_1": (lambda t, x, y: t.norm(x, ord=1), ()),
    "norm_1_squared": (lambda t, x, y: t.norm(x, ord=1, squared=True), ()),
    "norm_inf": (lambda t, x, y: t.norm(x, ord=jnp.inf), ()),
    "norm_inf_string": (lambda t, x, y: t.norm(x, ord="infinity", squared=True), ()),
    "batch_shape": (lambda t, x, y: t.batch_shape(x, (2, 1)), ()),
    "zeros_like": (lambda t, x, y: t.zeros_like(x), ()),
    "zeros_like_dtype": (lambda t, x, y: t.zeros_like(x, jnp.bfloat16), ()),
    "ones_like": (lambda t, x, y: t.ones_like(x), ()),
    "ones_like_dtype": (lambda t, x, y: t.ones_like(x, dtype=jnp.int8), ()),
    "full_like": (lambda t, x, y: t.full_like(x, 3), ()),
    "full_like_dtype": (lambda t, x, y: t.full_like(x, 2.5, dtype=jnp.float16), ()),
    "clip": (lambda t, x, y: t.clip(x, -0.5, 1), ("complex64",)),
    "clip_max_only": (lambda t, x, y: t.clip(x, max_value=0), ("complex64",)),
    "where_true": (lambda t, x, y: t.where(True, x, y), ()),
    "where_traced": (lambda t, x, y: t.where(jnp.asarray(False), x, y), ()),
    "allclose_same": (lambda t, x, y: t.allclose(x, x), ()),
    "allclose_other": (lambda t, x, y: t.allclose(x, y, rtol=0.5, atol=3.0), ()),
    "cast": (lambda t, x, y: t.cast(x, jnp.float16), ("complex64",)),
    "cast_none": (lambda t, x, y: t.cast(x, None), ()),
    "cast_like": (lambda t, x, y: t.cast_like(x, t.cast(y, jnp.bfloat16)), ("complex64",)),
    "dtype": (lambda t, x, y: t.dtype(x), ()),
    "update_moment": (lambda t, x, y: t.update_moment(x, y, 0.9, 2), ()),
    "update_moment_order_1": (lambda t, x, y: t.update_moment(x, y, 0.5, 1), ()),
    "update_moment_per_elem_norm": (lambda t, x, y: t.update_moment_per_elem_norm(x, y, 0.9, 2), ()),
    "update_moment_per_elem_norm_order_3": (lambda t, x, y: t.update_moment_per_elem_norm(x, y, 0.9, 3), ()),
    "update_infinity_moment": (lambda t, x, y: t.update_infinity_moment(x, y, 0.9, 1e-3), ("complex64",)),
    "bias_correction": (lambda t, x, y: t.bias_correction(y, 0.9, 3), ("int32",)),
}


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("case", list(CASES))
def test_same_result_as_optax(case, kind):
    fn, skipped_kinds = CASES[case]
    if kind in skipped_kinds:
        return  # undefined there (an order on complex numbers, a bias correction of integers)
    x, y = make_tree(seed=0, **KINDS[kind]), make_tree(seed=1, **KINDS[kind])
    ours, theirs = fn(modopt.tree, x, y), fn(optax.tree, x, y)
    if case == "dtype":
        assert ours == theirs
        return
    assert_same(ours, theirs, f"{case} on {kind}")


def test_same_results_under_jit():
    x, y = make_tree(jnp.float32), make_tree(jnp.float32, seed=1)
    for case in ("vdot", "norm", "norm_1", "norm_inf", "update_moment", "bias_correction", "allclose_other", "add_scale"):
        fn = CASES[case][0]
        assert_same(jax.jit(lambda a, b, fn=fn: fn(modopt.tree, a, b))(x, y), fn(optax.tree, x, y), case)


def test_empty_trees_as_optax():
    assert modopt.tree.dtype({}) == optax.tree.dtype({})
    for case in ("vdot", "sum", "max", "min", "size", "norm", "norm_1", "norm_inf", "allclose_same"):
        fn = CASES[case][0]
        ours, theirs = fn(modopt.tree, {}, {}), fn(optax.tree, {}, {})
        assert jnp.asarray(ours).dtype == jnp.asarray(theirs).dtype and np.all(ours == theirs), case


def test_leaves_without_elements_as_optax():
    tree = {"empty": jnp.zeros((0, 3)), "x": jnp.array([2.0, -7.0])}
    for name in ("max", "min", "sum", "size", "norm"):
        assert_same(getattr(modopt.tree, name)(tree), getattr(optax.tree, name)(tree), name)


@pytest.mark.parametrize("handler", [None, "promote", "highest", "lowest"])
def test_dtype_of_mixed_trees_as_optax(handler):
    for tree in (
        {"a": jnp.ones(2, jnp.float16), "b": jnp.ones(2, jnp.float32)},
        {"a": jnp.ones(2, jnp.bfloat16), "b": jnp.ones(2, jnp.float16)},
        {"a": jnp.ones(2, jnp.int32), "b": jnp.ones(2, jnp.uint32)},
        {"a": jnp.ones(2, jnp.int8), "b": 1.0},
    ):
        try:
            expected = optax.tree.dtype(tree, handler)
        except ValueError:
            with pytest.raises(ValueError):
                modopt.tree.dtype(tree, handler)
            continue
        assert modopt.tree.dtype(tree, handler) == expected


def test_bad_arguments_are_errors_as_in_optax():
    tree = {"a": jnp.ones(2)}
    for call in (lambda t: t.norm(tree, ord=3), lambda t: t.dtype(tree, "widest")):
        with pytest.raises(ValueError):
            call(optax.tree)
        with pytest.raises(ValueError, match="Invalid"):
            call(modopt.tree)
    with pytest.raises(ValueError, match="differ in shape"):
        modopt.tree.vdot({"a": jnp.ones((2, 3))}, {"a": jnp.ones((3, 2))})


# ---- random trees -----------------------------------------------------------------------


KEYS = {"typed": lambda: jax.random.key(3), "raw": lambda: jax.random.PRNGKey(3)}


@pytest.mark.parametrize("kind", list(KEYS))
def test_split_key_like_as_optax(kind):
    target = make_tree(jnp.float32, with_none=True)
    assert_same(modopt.tree.split_key_like(KEYS[kind](), target), optax.tree.split_key_like(KEYS[kind](), target))


@pytest.mark.parametrize("kind", list(KEYS))
def test_random_like_as_optax(kind):
    target = make_tree(jnp.float32)
    for kwargs in (
        {},
        {"dtype": jnp.bfloat16},
        {"sampler": jax.random.uniform},
        {"sampler": lambda key, shape, dtype: jax.random.bernoulli(key, 0.3, shape).astype(dtype)},
    ):
        ours = modopt.tree.random_like(KEYS[kind](), target, **kwargs)
        assert_same(ours, optax.tree.random_like(KEYS[kind](), target, **kwargs), str(kwargs))
    ints = make_tree(jnp.int32)
    assert_same(
        modopt.tree.random_like(KEYS[kind](), ints, jax.random.rademacher),
        optax.tree.random_like(KEYS[kind](), ints, jax.random.rademacher),
    )


def test_unwrap_random_key_data_as_optax():
    tree = {"typed": jax.random.split(jax.random.key(0), 3), "raw": jax.random.PRNGKey(1), "x": jnp.ones(2), "n": None}
    ours, theirs = modopt.tree.unwrap_random_key_data(tree), optax.tree.unwrap_random_key_data(tree)
    assert ours["typed"].dtype == jnp.uint32 and ours["typed"].shape == (3, 2)
    assert_same(ours, theirs)


def test_trees_with_typed_keys_as_optax():
    """Keys ride along in trees: selected, compared, counted as optax does."""
    a = {"key": jax.random.key(0), "x": jnp.ones(2)}
    b = {"key": jax.random.key(1), "x": jnp.zeros(2)}
    assert_same(modopt.tree.where(False, a, b), optax.tree.where(False, a, b))
    assert modopt.tree.size(a) == optax.tree.size(a)


# ---- states: modopt's and optax's equivalent ones ---------------------------------------


PARAMS = {"w": jnp.arange(6.0).reshape(3, 2) / 6, "b": jnp.array([0.5, -1.0])}
GRADS = {"w": jnp.linspace(-1.0, 1.0, 6).reshape(3, 2), "b": jnp.array([0.25, 2.0])}
LABELS = {"w": "x", "b": "y"}
MASK = {"w": True, "b": False}

STATE_CASES = {
    "adam": (lambda m: m.adam(0.1)),
    "masked": (lambda m: m.masked(m.adam(0.1), MASK)),
    "chain": (lambda m: m.chain(m.add_noise(0.01, 0.55, 0), m.scale_by_adam(), m.scale(-0.1))),
    "inject_hyperparams": (lambda m: m.inject_hyperparams(m.adam)(learning_rate=0.1, b1=0.8)),
    "multi_transform": (lambda m: m.multi_transform({"x": m.adam(0.1), "y": m.sgd(0.1, momentum=0.9)}, LABELS)),
    "named_chain": (lambda m: m.named_chain(("clip", m.clip_by_global_norm(1.0)), ("adam", m.adam(0.1)))),
    "adamw_masked": (lambda m: m.adamw(0.1, weight_decay=0.1, mask=MASK)),
}


def stepped_states(case):
    """modopt's and optax's state of one optimizer after one step on the same gradients."""
    ours_tx, theirs_tx = STATE_CASES[case](modopt), STATE_CASES[case](optax)
    _, ours = ours_tx.update(GRADS, ours_tx.init(PARAMS), PARAMS)
    _, theirs = theirs_tx.update(GRADS, theirs_tx.init(PARAMS), PARAMS)
    return ours_tx, ours, theirs_tx, theirs


KEYS_TO_FIND = ["count", "mu", "nu", "trace", "inner_state", "inner_states", "hyperparams", "learning_rate",
                "b1", "x", "adam", "rng_key", "ScaleByAdamState", "MaskedState", "EmptyState", "TraceState", "nothing"]


def in_adam_state(path, value):
    return bool(path) and getattr(path[-1], "tuple_name", None) == "ScaleByAdamState"


@pytest.mark.parametrize("case", list(STATE_CASES))
def test_get_all_with_path_and_get_on_states_as_optax(case):
    _, ours, _, theirs = stepped_states(case)
    for key in KEYS_TO_FIND:
        found = modopt.tree.get_all_with_path(ours, key)
        assert_found_alike(found, optax.tree.get_all_with_path(theirs, key), f"{case}: {key}")
        assert_found_alike(
            modopt.tree.get_all_with_path(ours, key, in_adam_state),
            optax.tree.get_all_with_path(theirs, key, in_adam_state),
            f"{case}: {key} filtered",
        )
        if len(found) > 1:
            with pytest.raises(KeyError):
                modopt.tree.get(ours, key)
            with pytest.raises(KeyError):
                optax.tree.get(theirs, key)
        else:
            assert_same(modopt.tree.get(ours, key, default="absent"), optax.tree.get(theirs, key, default="absent"), key)
        assert_same(
            modopt.tree.get(ours, key, filtering=in_adam_state),
            optax.tree.get(theirs, key, filtering=in_adam_state),
            f"{case}: get {key} filtered",
        )


@pytest.mark.parametrize("case", list(STATE_CASES))
def test_optax_get_on_modopt_states(case):
    """optax's own functions read modopt's states (NamedTuples and dicts, as optax's)."""
    _, ours, _, theirs = stepped_states(case)
    for key in KEYS_TO_FIND:
        assert_found_alike(optax.tree.get_all_with_path(ours, key), optax.tree.get_all_with_path(theirs, key), key)


SETS = {
    "count": lambda: jnp.asarray(7),
    "mu": lambda: jax.tree.map(lambda p: p + 1.0, PARAMS),
    "learning_rate": lambda: jnp.asarray(0.5),
    "b1": lambda: jnp.asarray(0.5),
    "ScaleByAdamState": lambda: "replaced",
}


@pytest.mark.parametrize("case", list(STATE_CASES))
def test_set_on_states_as_optax(case):
    _, ours, _, theirs = stepped_states(case)
    for key, value in SETS.items():
        if not optax.tree.get_all_with_path(theirs, key):
            with pytest.raises(KeyError):
                modopt.tree.set(ours, **{key: value()})
            continue
        if case == "inject_hyperparams" and key == "count":
            continue  # optax's quirk, see test_set_replaces_every_value_the_key_names
        assert_same(modopt.tree.set(ours, **{key: value()}), optax.tree.set(theirs, **{key: value()}), f"{case}: {key}")
        if optax.tree.get_all_with_path(theirs, key, in_adam_state):
            assert_same(
                modopt.tree.set(ours, in_adam_state, **{key: value()}),
                optax.tree.set(theirs, in_adam_state, **{key: value()}),
                f"{case}: {key} filtered",
            )


def test_set_keeps_types_and_replaces_named_states():
    state = modopt.named_chain(("clip", modopt.clip_by_global_norm(1.0)), ("adam", modopt.adam(0.1))).init(PARAMS)
    new = modopt.tree.set(state, count=jnp.asarray(3))
    assert type(new) is type(state) and list(new) == ["clip", "adam"]  # an OrderedDict, in order
    assert type(new["adam"][0]).__name__ == "ScaleByAdamState" and int(new["adam"][0].count) == 3
    empty = modopt.tree.set(state, ScaleByAdamState=None)
    assert empty["adam"][0] is None


def test_set_replaces_every_value_the_key_names():
    """The documented departure: every value `get_all_with_path` finds is replaced. optax 0.2.8
    skips a value inside another node holding the key when a node between them does not."""
    tx, otx = modopt.inject_hyperparams(modopt.adam)(learning_rate=0.1), optax.inject_hyperparams(optax.adam)(learning_rate=0.1)
    ours, theirs = tx.init(PARAMS), otx.init(PARAMS)
    new = modopt.tree.set(ours, count=jnp.asarray(4))
    assert [int(v) for _, v in modopt.tree.get_all_with_path(new, "count")] == [4, 4]
    assert [int(v) for _, v in optax.tree.get_all_with_path(optax.tree.set(theirs, count=4), "count")] == [4, 0]
    # With a filter, both replace the one chosen.
    outer = lambda path, value: getattr(path[-1], "tuple_name", "").startswith("Inject")  # noqa: E731
    assert_same(modopt.tree.set(ours, outer, count=jnp.asarray(4)), optax.tree.set(theirs, outer, count=jnp.asarray(4)))


def test_set_with_nothing_found_is_a_key_error_as_in_optax():
    state = modopt.adam(0.1).init(PARAMS)
    with pytest.raises(KeyError, match="'momentum'"):
        modopt.tree.set(state, momentum=1)
    with pytest.raises(KeyError, match="filtering"):
        modopt.tree.set(state, lambda path, value: False, count=1)


# ---- map_params ---------------------------------------------------------------------------


SPECS = {"w": P("data", None), "b": P()}


def doubled(leaf, *rest):
    return leaf * 2 + 1


@pytest.mark.parametrize("case", list(STATE_CASES))
def test_map_params_on_states_as_optax(case):
    tx, ours, otx, theirs = stepped_states(case)
    # Without `rest`: the same in both.
    assert_same(
        modopt.tree.map_params(tx, doubled, ours, transform_non_params=str),
        optax.tree.map_params(otx, doubled, theirs, transform_non_params=str),
        case,
    )
    # With `rest`: optax needs `is_leaf` at masked nodes and passes them to `f`; modopt keeps them.
    def spec(leaf, s):
        return leaf if isinstance(leaf, (optax.MaskedNode, modopt.MaskedNode)) else s

    theirs_specs = optax.tree.map_params(
        otx, spec, theirs, SPECS, transform_non_params=lambda _: P(),
        is_leaf=lambda x: isinstance(x, optax.MaskedNode),
    )
    ours_specs = modopt.tree.map_params(tx, spec, ours, SPECS, transform_non_params=lambda _: P())
    assert_same(
        jax.tree.map(str, ours_specs, is_leaf=lambda x: isinstance(x, P)),
        jax.tree.map(str, theirs_specs, is_leaf=lambda x: isinstance(x, P)),
        case,
    )
    # optax's `is_leaf` convention works in modopt too.
    ours_optax_way = modopt.tree.map_params(
        tx, spec, ours, SPECS, transform_non_params=lambda _: P(), is_leaf=lambda x: isinstance(x, modopt.MaskedNode)
    )
    assert jax.tree.structure(ours_optax_way, is_leaf=lambda x: isinstance(x, P)) == jax.tree.structure(
        ours_specs, is_leaf=lambda x: isinstance(x, P)
    )


@pytest.mark.parametrize("case", ["masked", "multi_transform", "adamw_masked", "adam", "inject_hyperparams"])
def test_optax_map_params_on_modopt_states(case):
    """optax.tree.map_params on modopt's states, masked ones included, gives what it gives on
    optax's (modopt's masked and partition `init` take its stand-in for the parameters)."""
    tx, ours, otx, theirs = stepped_states(case)
    assert_same(
        optax.tree.map_params(tx, doubled, ours, transform_non_params=str),
        optax.tree.map_params(otx, doubled, theirs, transform_non_params=str),
        case,
    )


def test_map_params_takes_an_init_function_and_rejects_other_things():
    tx = modopt.adam(0.1)
    state = tx.init(PARAMS)
    assert_same(modopt.tree.map_params(tx.init, doubled, state), modopt.tree.map_params(tx, doubled, state))
    with pytest.raises(TypeError, match="initable"):
        modopt.tree.map_params(3, doubled, state)


# ---- an Optimizer's state: through Equinox modules, grouped or not ----------------------


class Model(eqx.Module):
    layers: list
    steps: jax.Array  # an integer leaf: not trained, no state
    name: str = eqx.field(static=True, default="m")


def make_model(n_small=10):
    keys = jax.random.split(jax.random.key(0), n_small + 1)
    small = [jax.random.normal(k, (3,)) for k in keys[:n_small]]
    return Model(layers=[jax.random.normal(keys[-1], (40, 40)), *small], steps=jnp.asarray(0))


def model_grads(model):
    return jax.tree.map(lambda x: jnp.cos(x) if eqx.is_inexact_array(x) else None, model)


def test_get_and_set_through_an_optimizer():
    model = make_model()
    optimizer = modopt.Optimizer(modopt.adam(1e-2), model, group_small_leaves=False)
    model, optimizer = optimizer.step(model, model_grads(model))
    trained = eqx.filter(model, eqx.is_inexact_array)
    otx = optax.adam(1e-2)
    _, theirs = otx.update(model_grads(make_model()), otx.init(eqx.filter(make_model(), eqx.is_inexact_array)))
    # The moments, found through the module: as optax's on the trained leaves.
    assert_same(modopt.tree.get(optimizer, "mu"), optax.tree.get(theirs, "mu"))
    assert_same(modopt.tree.get(optimizer, "nu"), optax.tree.get(theirs, "nu"))
    assert jax.tree.structure(modopt.tree.get(optimizer, "mu")) == jax.tree.structure(trained)
    # `count` is a field of the Optimizer module and of Adam's state.
    found = modopt.tree.get_all_with_path(optimizer, "count")
    assert [jax.tree_util.keystr(path) for path, _ in found] == ["Optimizer.count", "Optimizer.state[0]ScaleByAdamState.count"]
    with pytest.raises(KeyError, match="multiple"):
        modopt.tree.get(optimizer, "count")
    assert_same(modopt.tree.get(optimizer, "count", filtering=in_adam_state), optax.tree.get(theirs, "count"))
    # A hyperparameter field of the transform module.
    assert float(modopt.tree.get(optimizer, "learning_rate")) == pytest.approx(1e-2)
    # Set: the Optimizer stays an Optimizer (static fields kept) and steps with the new state.
    zeroed = modopt.tree.set(optimizer, in_adam_state, mu=jax.tree.map(jnp.zeros_like, trained))
    assert type(zeroed) is modopt.Optimizer and zeroed.signature is optimizer.signature
    assert float(modopt.tree.norm(modopt.tree.get(zeroed, "mu"))) == 0.0
    assert int(zeroed.count) == 1
    step = jax.jit(lambda m, o, g: o.step(m, g))
    _, after = step(model, zeroed, model_grads(model))
    assert int(after.count) == 2
    # optax's function reads through the module too (not its fields, only the NamedTuples in it).
    assert_same(optax.tree.get(optimizer, "mu"), optax.tree.get(theirs, "mu"))


def test_map_params_on_an_optimizer_as_optax():
    model = make_model()
    optimizer = modopt.Optimizer(modopt.adam(1e-2), model, group_small_leaves=False)
    _, optimizer = optimizer.step(model, model_grads(model))
    otx = optax.adam(1e-2)
    trained = eqx.filter(model, eqx.is_inexact_array)
    _, theirs = otx.update(model_grads(model), otx.init(trained))
    # `rest` shaped like the whole model (its integer leaf too): the untrained places are skipped.
    model_specs = jax.tree.map(lambda x: P(*([None] * jnp.ndim(x))), model)
    ours = modopt.tree.map_params(optimizer, lambda p, s: str(s), optimizer.state, model_specs, transform_non_params=str)
    trained_specs = eqx.filter(model_specs, jax.tree.map(eqx.is_inexact_array, model), is_leaf=lambda x: isinstance(x, P))
    expected = optax.tree.map_params(otx, lambda p, s: str(s), theirs, trained_specs, transform_non_params=str)
    assert_same(ours, expected)
    assert_same(modopt.tree.map_params(optimizer, doubled, optimizer.state), optax.tree.map_params(otx, doubled, theirs))


def test_map_params_on_a_grouped_optimizer():
    """A grouped state: f sees the parameters' layout; arrays of the leaves' shapes are packed
    back (a state this optimizer steps with, as the ungrouped one does), other results stay
    in the parameters' layout."""
    model = make_model()
    grouped = modopt.Optimizer(modopt.adam(1e-2), model)
    flat = modopt.Optimizer(modopt.adam(1e-2), model, group_small_leaves=False)
    assert grouped.groups is not None and flat.groups is None
    _, grouped = grouped.step(model, model_grads(model))
    _, flat = flat.step(model, model_grads(model))
    halve = lambda p: p * 0.5  # noqa: E731
    grouped = eqx.tree_at(lambda o: o.state, grouped, modopt.tree.map_params(grouped, halve, grouped.state))
    flat = eqx.tree_at(lambda o: o.state, flat, modopt.tree.map_params(flat, halve, flat.state))
    assert jax.tree.structure(grouped.state) != jax.tree.structure(flat.state)  # still packed
    new_grouped, _ = grouped.step(model, model_grads(model))
    new_flat, _ = flat.step(model, model_grads(model))
    assert_same(new_grouped, new_flat, "a step after map_params")
    # Reading: shapes and specs come out in the parameters' layout, as for the ungrouped state.
    model_specs = jax.tree.map(lambda x: P(*([None] * jnp.ndim(x))), model)
    for f, rest in ((lambda p: str(jnp.shape(p)), ()), (lambda p, s: str(s), (model_specs,))):
        ours = modopt.tree.map_params(grouped, f, grouped.state, *rest, transform_non_params=str)
        assert_same(ours, modopt.tree.map_params(flat, f, flat.state, *rest, transform_non_params=str))
    # Moments in their own dtype (not the parameters') are cut from the buffers as they are.
    mixed = modopt.Optimizer(modopt.adam(1e-2, mu_dtype=jnp.bfloat16), model)
    mu = modopt.tree.map_params(mixed, lambda p: str(p.dtype), mixed.state, transform_non_params=str)[0].mu
    assert {leaf for leaf in jax.tree.leaves(mu)} == {"bfloat16"}


def test_map_params_on_a_grouped_state_without_the_optimizer_says_so():
    model = make_model()
    grouped = modopt.Optimizer(modopt.adam(1e-2), model)
    with pytest.raises(ValueError, match="grouped"):
        modopt.tree.map_params(grouped, doubled, modopt.adam(1e-2).init(eqx.filter(model, eqx.is_inexact_array)))
    model_specs = jax.tree.map(lambda x: P(), model)
    with pytest.raises(ValueError, match="pass the Optimizer itself"):
        modopt.tree.map_params(grouped.tx, lambda p, s: s, grouped.state, model_specs)


# ---- other named nodes: Equinox modules anywhere in a tree -------------------------------


class Box(eqx.Module):
    a: object
    b: object
    tag: str = eqx.field(static=True, default="t")


def test_modules_are_searched_by_field_name():
    tree = {"box": Box(a=jnp.ones(2), b={"a": 3}), "other": [Pair(first=1, second=Box(a=None, b=2))]}
    found = modopt.tree.get_all_with_path(tree, "a")
    assert [jax.tree_util.keystr(p) for p, _ in found] == ["['box']Box.a", "['other'][0]Pair.secondBox.a", "['box']Box.b['a']"]
    assert isinstance(found[0][0][-1], modopt.tree_utils.NamedTupleKey)
    assert modopt.tree.get(tree, "Pair").first == 1
    assert modopt.tree.get(tree, "tag") is None  # a static field is structure, not a value
    new = modopt.tree.set(tree, a=0)
    assert type(new["box"]) is Box and new["box"].tag == "t"
    assert [v for _, v in modopt.tree.get_all_with_path(new, "a")] == [0, 0, 0]  # the dict's entry too
    assert new["box"].b == {"a": 0} and new["other"][0].second.b == 2
